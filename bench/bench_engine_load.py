"""The engine's CPU per agent line under a loud fleet: N simulated agents each writing R events/s
for S seconds (`@sim burst=R seconds=S`) through a headless `fleet-tui run --until-idle`.

Every line an agent writes is read, normalized into events, stored, fanned out to the watchers
(the loop detector, notifications) and counted against the task's tokens and cost; with 32 loud
agents that is thousands of lines a second on the engine's one thread, and in the cockpit the
same thread shares the interpreter with the screen. This prints the engine process's own CPU
(its threads, not the agents' or the shims': read from ``RUSAGE_SELF`` as it exits) per line
its agents wrote, against a baseline measured in the same run on the same lines: each line of
every attempt's ``stdout.jsonl`` parsed with ``json.loads`` and inserted into a SQLite table of
the same shape, in batches, in WAL mode (the least any engine must do with a line: read it and
keep it).

The load gate is lifted and the memory and disk floors lowered, as in ``bench_cockpit.py``:
32 agents on 2 cores would otherwise be held back by the gate, which is what it is for.

Usage: python bench/bench_engine_load.py [--agents 32] [--rate 200] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: runs ``fleet-tui`` and says, as the process exits, how much CPU its own threads used
ENGINE = (
    "import atexit, resource, sys\n"
    "def said():\n"
    "    ru = resource.getrusage(resource.RUSAGE_SELF)\n"
    "    print(f'engine-cpu {ru.ru_utime + ru.ru_stime:.6f}', file=sys.stderr)\n"
    "atexit.register(said)\n"
    "from fleet_tui.cli import entry\n"
    "sys.argv[0] = 'fleet-tui'\n"
    "entry()\n"
)


def fleet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", ENGINE, *args], env=env, capture_output=True, text=True, check=True
    )


def baseline_cpu(lines: list[bytes], db_path: Path) -> float:
    """CPU seconds to parse every line and insert it, 100 rows a transaction."""
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(
        "CREATE TABLE events (id INTEGER PRIMARY KEY, task_id TEXT, attempt INTEGER, seq INTEGER,"
        " ts REAL, kind TEXT, text TEXT, payload TEXT)"
    )
    db.execute("CREATE UNIQUE INDEX ev_key ON events (task_id, attempt, seq)")
    c0 = time.process_time()
    for start in range(0, len(lines), 100):
        rows = []
        for i, line in enumerate(lines[start : start + 100], start):
            obj = json.loads(line)
            rows.append(("t", 1, i, time.time(), str(obj.get("type")), None, line.decode()))
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO events(task_id, attempt, seq, ts, kind, text, payload) VALUES (?,?,?,?,?,?,?)", rows
        )
        db.execute("COMMIT")
    cpu = time.process_time() - c0
    db.close()
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        home, work = tmp / "home", tmp / "work"
        home.mkdir()
        work.mkdir()
        (home / "config.toml").write_text(
            f"default_coder = 'sim'\nmax_concurrent = {args.agents}\nmax_load_per_core = 1000.0\n"
            "mem_floor_gib = 0.1\ndisk_floor_gib = 0.1\n"
        )
        prompt = f"Emit events.\\n@sim window=1000000000 burst={args.rate} seconds={args.seconds}\\n"
        tasks = ["[defaults]", 'coder = "sim"', f'cwd = "{work}"', ""]
        for i in range(args.agents):
            tasks += ["[[task]]", f'name = "burst-{i:02d}"', f'prompt = "{prompt}"', ""]
        (tmp / "t.toml").write_text("\n".join(tasks))
        env = {k: v for k, v in os.environ.items() if k not in ("FLEET_STORE", "PYTHONDONTWRITEBYTECODE")}
        env["FLEET_HOME"] = str(home)
        fleet(env, "load", str(tmp / "t.toml"))
        print(
            f"{args.agents} agents x {args.rate} events/s x {args.seconds:g} s, headless "
            f"`run --until-idle`; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        t0 = time.perf_counter()
        run = fleet(env, "run", "--until-idle", "--quiet")
        wall = time.perf_counter() - t0
        cpu = float(run.stderr.rsplit("engine-cpu ", 1)[1].split()[0])
        lines = [
            line
            for out in sorted((home / "tasks").glob("*/attempts/*/stdout.jsonl"))
            for line in out.read_bytes().splitlines()
            if line.strip()
        ]
        if not lines:
            raise SystemExit("no agent wrote a line: see `fleet-tui status` in " + str(home))
        base = baseline_cpu(lines, tmp / "baseline.db")
        per, per_base = cpu / len(lines) * 1e6, base / len(lines) * 1e6
        print(f"  lines written by the agents      {len(lines)} in {wall:.1f} s")
        share = f"{cpu / wall:.0%} of a core"
        print(f"  engine CPU                       {cpu:.2f} s: {per:.1f} us per line ({share})")
        print(f"  baseline (json.loads + INSERT)   {base:.2f} s: {per_base:.1f} us per line")
        print(f"  ratio engine / baseline          {per / per_base:.1f}x")


if __name__ == "__main__":
    main()
