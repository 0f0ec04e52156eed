"""What the bwrap sandbox adds to starting an agent: the launcher and bwrap, around `true`.

Measured in the same run: `true` alone, a bare `python -I -S -c pass` (the launcher is one such
interpreter), bwrap alone with the policy's mounts, the whole sandboxed start (launcher + bwrap),
and the same with a network allowlist (the proxy relay adds a second interpreter inside). Prints
medians and the sandboxed start as a ratio of the bare interpreter. Goal: under 3x.
Usage: python bench/bench_sandbox.py [N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from fleet_tui.scheduler.sandbox import bwrap as sb
from fleet_tui.scheduler.sandbox import policy as sbp


def sample(commands: Sequence[Sequence[str]], n: int, cwd: Path) -> list[list[float]]:
    """Each command ``n`` times, interleaved (one of each per round), so every round of samples
    meets the same machine load: the machines are shared and their load moves within seconds."""
    out: list[list[float]] = [[] for _ in commands]
    for _ in range(n):
        for i, argv in enumerate(commands):
            t0 = time.perf_counter()
            subprocess.run(list(argv), check=True, cwd=cwd)
            out[i].append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    ok, detail = sb.probe()
    if not ok:
        sys.exit(detail)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        work, run_dir, fleet, home = root / "work", root / "fleet" / "run", root / "fleet", root / "home"
        for p in (work, run_dir / "cfg", home):
            p.mkdir(parents=True)
        policy = sbp.build_policy(workdir=work, run_dir=run_dir, fleet_home=fleet, user_home=str(home))
        fenced = sbp.build_policy(
            workdir=work, run_dir=run_dir, fleet_home=fleet, user_home=str(home), network=("a.test",)
        )
        py = os.path.realpath(sys.executable)
        names = ["true", "python -I -S -c pass", "bwrap alone", "sandboxed (launcher + bwrap)",
                 "sandboxed, allowlist"]  # fmt: skip
        commands = [
            ["true"],
            [py, "-I", "-S", "-c", "pass"],
            sb.bwrap_argv(policy, ["true"], str(root)),
            sbp.wrap(policy, run_dir, ["true"]),
            sbp.wrap(fenced, run_dir / "cfg", ["true"]),
        ]
        times = sample(commands, n, work)
    rows = [(name, statistics.median(xs)) for name, xs in zip(names, times, strict=True)]
    ratios = [s / b for s, b in zip(times[3], times[1], strict=True)]
    for name, ms in rows:
        print(f"{name:<30} {ms:7.1f} ms")
    print(
        f"sandboxed start / bare interpreter (median of per-round ratios): {statistics.median(ratios):.2f}x"
    )
    print("goal: under 3x")


if __name__ == "__main__":
    main()
