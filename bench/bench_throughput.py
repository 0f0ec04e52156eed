"""Trivial-task throughput: N tasks of `sleep 0.1` at concurrency 4 through `fleet-tui run
--until-idle`, against `xargs -P 4` running the same commands, in the same run.

Prints the ratio xargs_time / fleet_time (1.0 = as fast as xargs; the goal is >= 0.8).
Usage: python bench/bench_throughput.py [N]
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
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        home = tmp / "home"
        home.mkdir()
        (home / "config.toml").write_text("max_load_per_core = 1000.0\nmem_floor_gib = 0.1\n")
        lines = ["[defaults]", 'coder = "shell"', 'command = "sleep 0.1"', ""]
        for i in range(n):
            lines += ["[[task]]", f'name = "b{i:04d}"', 'prompt = "x"', ""]
        (tmp / "t.toml").write_text("\n".join(lines))
        env = dict(os.environ, FLEET_HOME=str(home))
        subprocess.run([*FLEET, "load", str(tmp / "t.toml")], check=True, env=env, capture_output=True)

        t0 = time.perf_counter()
        subprocess.run(f"seq {n} | xargs -P 4 -I{{}} sh -c 'sleep 0.1'", shell=True, check=True)
        xargs_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        subprocess.run(
            [*FLEET, "run", "--until-idle", "--max-concurrent", "4"], check=True, env=env, capture_output=True
        )
        fleet_s = time.perf_counter() - t0
    print(f"tasks={n} concurrency=4")
    print(f"xargs -P 4      : {xargs_s:7.2f} s  ({n / xargs_s:6.1f} tasks/s)")
    print(f"fleet-tui run   : {fleet_s:7.2f} s  ({n / fleet_s:6.1f} tasks/s)")
    print(f"ratio (xargs/fleet, goal >= 0.8): {xargs_s / fleet_s:.2f}")


if __name__ == "__main__":
    main()
