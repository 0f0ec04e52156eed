"""Per-attempt overhead: N tasks of `true` and N tasks of `sleep 0.1` at concurrency 4 through
`fleet-tui run --until-idle`, each beside `xargs -P 4` running the same commands, in one run.

The fleet runs with the DEFAULT configuration (an empty fleet home: the load, memory and disk
gates as a user gets them). For `true` it prints the overhead per attempt per slot
((fleet - xargs) / N * 4; goal <= 15 ms) and the time ratio (goal <= 10x xargs); for `sleep 0.1`
the throughput ratio xargs_time / fleet_time (1.0 = as fast as xargs; goal >= 0.9).

    python bench/bench_attempts.py [--tasks 200] [--concurrency 4] [--only true|sleep]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = [sys.executable, "-m", "fleet_tui"]


def xargs(command: str, n: int, p: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(f"seq {n} | xargs -P {p} -I{{}} sh -c '{command}'", shell=True, check=True)
    return time.perf_counter() - t0


def fleet(command: str, n: int, p: int) -> float:
    """Seconds for `run --until-idle` to drain n tasks of `command` (loading them is not timed)."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        home = tmp / "home"
        home.mkdir()  # no config.toml: the defaults
        lines = ["[defaults]", 'coder = "shell"', f'command = "{command}"', ""]
        for i in range(n):
            lines += ["[[task]]", f'name = "b{i:04d}"', 'prompt = "x"', ""]
        (tmp / "t.toml").write_text("\n".join(lines))
        env = dict(os.environ, FLEET_HOME=str(home))
        subprocess.run([*FLEET, "load", str(tmp / "t.toml")], check=True, env=env, capture_output=True)
        t0 = time.perf_counter()
        subprocess.run(
            [*FLEET, "run", "--until-idle", "--max-concurrent", str(p)],
            check=True,
            env=env,
            capture_output=True,
        )
        secs = time.perf_counter() - t0
        out = subprocess.run(
            [*FLEET, "status", "--json"], check=True, env=env, capture_output=True, text=True
        )
        done = out.stdout.count('"status": "done"')
        if done != n:
            print(f"  warning: {done}/{n} tasks done", file=sys.stderr)
    return secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--only", choices=("true", "sleep"))
    args = ap.parse_args()
    n, p = args.tasks, args.concurrency
    print(f"tasks={n} concurrency={p} (default config); load average {os.getloadavg()[0]:.1f}")
    if args.only in (None, "true"):
        x, f = xargs("true", n, p), fleet("true", n, p)
        per = (f - x) / n * p * 1000
        print(f"{n} x true      : fleet {f:6.2f} s, xargs {x:5.2f} s: {f / x:5.1f}x xargs (goal <= 10x),")
        print(f"                  overhead {per:5.1f} ms per attempt per slot (goal <= 15 ms)")
    if args.only in (None, "sleep"):
        x, f = xargs("sleep 0.1", n, p), fleet("sleep 0.1", n, p)
        print(
            f"{n} x sleep 0.1 : fleet {f:6.2f} s, xargs {x:5.2f} s: ratio xargs/fleet {x / f:.2f} (goal >= 0.9)"
        )


if __name__ == "__main__":
    main()
