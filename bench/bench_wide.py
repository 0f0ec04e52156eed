"""A wide queue: starts per second while 10,000 `true` shell tasks wait, against the same
starts from a queue of just the tasks measured (the baseline, measured in the same run).

Planning must cost in proportion to what changed, not to the queue's length (issue 14): each
start used to walk the whole queue three times (44 starts/s at 10,000 queued against ~110 from a
short queue, here). Both fleets run `fleet-tui run` (default config, 4 slots) in a home of their
own; the time is from the first task done to the K-th (K = 400 by default), read from the
store's file as the run goes, so start-up, loading and shutting down are not counted.

Prints each rate and the ratio wide/short (goal: >= 0.8).
Usage: python bench/bench_wide.py [QUEUED] [K]
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = [sys.executable, "-m", "fleet_tui"]
#: the longest a measured stretch may take (a slow engine is measured on what it finished)
LIMIT_S = 300.0
GOAL = 0.8


def done_count(db: Path) -> int:
    """How many tasks are done, read from the store's file (its own connection, read only)."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return 0
    try:
        return int(con.execute("SELECT count(*) FROM tasks WHERE status = 'done'").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        con.close()


def rate(tmp: Path, name: str, queued: int, k: int) -> float:
    """Tasks done per second between the first done and the ``k``-th, ``queued`` in the queue."""
    home = tmp / name
    home.mkdir()
    lines = ["[defaults]", 'coder = "shell"', 'command = "true"', ""]
    for i in range(queued):
        lines += ["[[task]]", f'name = "w{i:05d}"', 'prompt = "x"', ""]
    (tmp / f"{name}.toml").write_text("\n".join(lines))
    env = dict(os.environ, FLEET_HOME=str(home))
    subprocess.run([*FLEET, "load", str(tmp / f"{name}.toml")], check=True, env=env, capture_output=True)
    db = home / "fleet.db"
    run = subprocess.Popen(
        [*FLEET, "run", "--max-concurrent", "4", "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + LIMIT_S
        while done_count(db) < 1:
            if time.monotonic() > deadline or run.poll() is not None:
                raise SystemExit(f"{name}: no task done")
            time.sleep(0.02)
        t0, first = time.perf_counter(), done_count(db)
        done = first
        while done < k and time.monotonic() < deadline:
            time.sleep(0.05)
            done = done_count(db)
        return (done - first) / (time.perf_counter() - t0)
    finally:
        run.terminate()
        run.wait(timeout=60)


def main() -> None:
    queued = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        short = rate(tmp, "short", k + 20, k)  # the baseline: a queue of just the tasks measured
        wide = rate(tmp, "wide", queued, k)
    print(f"{k} `true` tasks at 4 slots, default config, timed from the first done to the {k}th")
    print(f"from a queue of {k + 20:6d} : {short:7.1f} tasks/s (baseline)")
    print(f"from a queue of {queued:6d} : {wide:7.1f} tasks/s")
    met = "met" if wide / short >= GOAL else "NOT met"
    print(f"ratio wide/short: {wide / short:.2f}  (goal >= {GOAL}: {met})")


if __name__ == "__main__":
    main()
