"""Add-to-spawn latency: the time from `fleet-tui add` returning to the agent process starting,
p50 and p99, beside the startup time of a bare Python interpreter measured in the same run.

The agent is a shell command that records the time it started; a running `fleet-tui run` engine
picks each task up. "Returned" is the moment `add` prints the new id (the task is committed then;
the process still has its interpreter teardown ahead, during which the agent may already run).
Goal: p50 under 3x the bare interpreter's startup.
Usage: python bench/bench_latency.py [N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = [sys.executable, "-m", "fleet_tui"]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    bare = []
    for _ in range(max(10, n // 2)):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        home = tmp / "home"
        home.mkdir()
        (home / "config.toml").write_text("max_load_per_core = 1000.0\nmem_floor_gib = 0.1\n")
        env = dict(os.environ, FLEET_HOME=str(home))
        eng = subprocess.Popen([*FLEET, "run"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.5)  # let the engine come up (a benchmark, not a test)
            lat = []
            for i in range(n):
                mark = tmp / f"m{i}"
                cmd = f"date +%s.%N > {mark}"
                add = subprocess.Popen(
                    [*FLEET, "add", "x", "--name", f"l{i}", "--command", cmd, "--cwd", str(tmp)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
                assert add.stdout is not None
                add.stdout.readline()  # the id is printed once the task is committed: add "returned"
                returned = time.time()
                add.wait()
                deadline = time.time() + 30
                while not (mark.exists() and mark.read_text().strip()) and time.time() < deadline:
                    time.sleep(0.002)
                lat.append(float(mark.read_text()) - returned)
        finally:
            eng.terminate()
            eng.wait(timeout=30)
    b50 = statistics.median(bare)
    print(f"bare python startup   p50 {b50 * 1000:7.1f} ms")
    p50, p99 = pct(lat, 50) * 1000, pct(lat, 99) * 1000
    print(f"add -> agent started  p50 {p50:7.1f} ms   p99 {p99:7.1f} ms  (n={n})")
    print(f"ratio p50/bare (goal < 3): {pct(lat, 50) / b50:.1f}")


if __name__ == "__main__":
    main()
