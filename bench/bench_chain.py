"""A long dependency chain: N `true` shell tasks, each after the one before, through
`fleet-tui run --until-idle` (default config), against `sh -c true` run N times in a row in the
same run (the baseline: the cost of the commands themselves).

Prints tasks/s (goal: >= 50) and the ratio baseline_time / fleet_time.
Usage: python bench/bench_chain.py [N]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = [sys.executable, "-m", "fleet_tui"]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        home = tmp / "home"
        home.mkdir()
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
        subprocess.run([*FLEET, "run", "--until-idle", "-q"], check=True, env=env, capture_output=True)
        fleet_s = time.perf_counter() - t0
    print(f"chain of {n} `true` tasks")
    print(f"sh -c true x{n}      : {base_s:7.2f} s  ({n / base_s:7.1f} /s)")
    print(f"fleet-tui run        : {fleet_s:7.2f} s  ({n / fleet_s:7.1f} tasks/s, goal >= 50)")
    print(f"ratio (baseline/fleet): {base_s / fleet_s:.3f}   tasks/s / 50: {n / fleet_s / 50:.2f}")


if __name__ == "__main__":
    main()
