"""ask_human start-up: the time from starting the MCP command to its ``initialize`` reply.

p50 and p99 over N starts (default 20) of the command every coder registers
(``mcp_stdio.command()``: ``python -I -S .../mcp_stdio.py``), beside a bare ``python -c pass`` measured in the
same run, and (for reference, 3 starts) the SDK server started directly, which is what coders ran
before. Each start gets the environment of a real attempt (fleet home, task, attempt), a client
``initialize`` request on stdin, and is timed until the reply line arrives; then stdin is closed.
Goal: p99 <= 150 ms (an agent CLI that defers MCP tools finds ask_human from its first turn).
Usage: python bench/bench_ask_human.py [N]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from fleet_tui.scheduler.humans import mcp_stdio

LEAN = list(mcp_stdio.command())
SDK = [sys.executable, "-m", "fleet_tui.scheduler.humans.mcp_ask_human"]
INIT = (
    json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"},
            },
        }
    )
    + "\n"
).encode()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def time_to_initialize(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    pipe = subprocess.PIPE
    proc = subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(INIT)
    proc.stdin.flush()
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    reply = json.loads(line)
    assert reply.get("id") == 0 and "result" in reply, reply
    proc.stdin.close()
    proc.wait(timeout=30)
    return elapsed


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, FLEET_HOME=home, FLEET_TASK_ID="t-bench", FLEET_ATTEMPT="1")
        bare, lean = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            bare.append(time.perf_counter() - t0)
            lean.append(time_to_initialize(LEAN, env))
        sdk = [time_to_initialize(SDK, env) for _ in range(3)]
    ms = 1000.0
    print(f"starts: {n} (SDK server directly: {len(sdk)})")
    print(f"python -c pass        p50 {pct(bare, 50) * ms:7.1f} ms  p99 {pct(bare, 99) * ms:7.1f} ms")
    print(f"ask_human (lean)      p50 {pct(lean, 50) * ms:7.1f} ms  p99 {pct(lean, 99) * ms:7.1f} ms")
    print(f"SDK server directly   p50 {statistics.median(sdk) * ms:7.1f} ms  max {max(sdk) * ms:7.1f} ms")
    print(f"lean p50 / bare p50: {pct(lean, 50) / pct(bare, 50):.1f}x")
    print(f"SDK p50 / lean p50: {statistics.median(sdk) / pct(lean, 50):.1f}x")
    verdict = "met" if pct(lean, 99) <= 0.150 else "MISSED"
    print(f"goal p99 <= 150 ms: {verdict}")


if __name__ == "__main__":
    main()
