"""A long dependency chain: N `true` shell tasks, each after the one before, through
`fleet-tui run --until-idle` (default config), against `sh -c true` run N times in a row in the
same run (the baseline: the cost of the commands themselves).

Prints tasks/s (goal: >= 50) and the ratio baseline_time / fleet_time.
Usage: python bench/bench_chain.py [N] [lift]   (``lift``: max_load_per_core = 1000, for comparing
with a fleet-tui whose load gate stops everything on a busy machine)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = [sys.executable, "-m", "fleet_tui"]
#: the longest run measured (a slow engine is measured on what it finished by then)
LIMIT_S = 600.0


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        home = tmp / "home"
        home.mkdir()
        if "lift" in sys.argv[2:]:
            (home / "config.toml").write_text("max_load_per_core = 1000.0\n")
        lines = ["[defaults]", 'coder = "shell"', 'command = "true"', ""]
        for i in range(n):
            lines += ["[[task]]", f'name = "c{i:05d}"', 'prompt = "x"']
            if i:
                lines.append(f'depends_on = ["c{i - 1:05d}"]')
            lines.append("")
        (tmp / "t.toml").write_text("\n".join(lines))
        env = dict(os.environ, FLEET_HOME=str(home))
        subprocess.run([*FLEET, "load", str(tmp / "t.toml")], check=True, env=env, capture_output=True)

        t0 = time.perf_counter()
        for _ in range(n):
            subprocess.run(["sh", "-c", "true"], check=True)
        base_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        try:
            run = [*FLEET, "run", "--until-idle", "-q"]
            subprocess.run(run, check=True, env=env, capture_output=True, timeout=LIMIT_S)
            done = n
        except subprocess.TimeoutExpired:  # a slow engine: the rate of what it finished
            out = subprocess.run([*FLEET, "status", "--json"], env=env, capture_output=True, text=True)
            done = sum(1 for t in json.loads(out.stdout or "[]") if t["status"] == "done")
            print(f"stopped after {LIMIT_S:.0f} s with {done} of {n} done")
        fleet_s = time.perf_counter() - t0
        n_all, n = n, max(done, 1)
        base_s = base_s * n / n_all
    print(f"chain of {n} `true` tasks")
    print(f"sh -c true x{n}      : {base_s:7.2f} s  ({n / base_s:7.1f} /s)")
    print(f"fleet-tui run        : {fleet_s:7.2f} s  ({n / fleet_s:7.1f} tasks/s, goal >= 50)")
    print(f"ratio (baseline/fleet): {base_s / fleet_s:.3f}   tasks/s / 50: {n / fleet_s / 50:.2f}")


if __name__ == "__main__":
    main()
