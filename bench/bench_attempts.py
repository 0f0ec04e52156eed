"""Per-attempt overhead: N tasks of `true` and N tasks of `sleep 0.1` at concurrency 4 through
`fleet-tui run --until-idle`, each beside `xargs -P 4` running the same commands, in one run.

The fleet runs with the DEFAULT configuration (an empty fleet home: the load, memory and disk
gates as a user gets them; ``--gate-off`` lifts the load gate to tell its share apart). For
`true` it prints the time against xargs (goal <= 10x) and the overhead per attempt per slot
((fleet - xargs) / N * 4; goal <= 15 ms), also net of an empty `run --until-idle` (the start-up
and shut-down of the process, measured in the same run). For `sleep 0.1` it prints the
throughput ratio xargs_time / fleet_time (1.0 = as fast as xargs; goal >= 0.9).

Every fleet home and the file-cost probe's files are kept until the last figure is measured, and
deleted together at the end. On a journal-less ext4 (this development machine's) a file deleted
less than about 30 s ago makes every new file dearer: the kernel skips such inodes one by one,
reading the inode table to find them. Deleting each run's home as it ended made the next run pay
for the last one's ~1,800 files (300 x `true`: 2.16-2.41 s and 12.4-12.9 ms of CPU per attempt,
against 1.53-1.64 s and 8.5-9.0 ms with nothing deleted between runs); a user's fleet deletes
nothing while it runs.

Each figure is taken in paired rounds (``--rounds``, 5 by default): xargs, then the fleet, then
the next pair, each pair's ratio printed, and the median of the rounds given as the run's figure
(with the lowest and the highest). One pair alone said more about the machine's moment than about
the fleet: on this shared 2-core machine xargs' 0.1 s for 200 × `true` moves by half from one
second to the next, and the fleet's CPU per attempt by a third (4.7-9.0 ms in one session's runs
minutes apart, with the same code).

    python bench/bench_attempts.py [--tasks 200] [--concurrency 4] [--rounds 5]
                                   [--only true|sleep] [--gate-off]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = [sys.executable, "-m", "fleet_tui"]
TIMEOUT_S = 600.0  # a fleet run held longer than this by a gate (the load gate on a busy machine) is cut


def cpu_children() -> float:
    """CPU seconds of this process's finished children (and the descendants they waited for)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def xargs(command: str, n: int, p: int) -> tuple[float, float]:
    """(seconds, CPU seconds) of xargs running n times `command`."""
    c0, t0 = cpu_children(), time.perf_counter()
    subprocess.run(f"seq {n} | xargs -P {p} -I{{}} sh -c '{command}'", shell=True, check=True)
    return time.perf_counter() - t0, cpu_children() - c0


def fleet(command: str, n: int, p: int, gate_off: bool, scratch: Path) -> tuple[float, float]:
    """(seconds, CPU seconds) for `run --until-idle` to drain n tasks of `command` (loading them
    is not counted); the CPU is the engine's and its shims'. The home is made in ``scratch``
    and left there (see the module's docstring)."""
    tmp = Path(tempfile.mkdtemp(dir=scratch))
    home = tmp / "home"
    home.mkdir()  # no config.toml: the defaults
    if gate_off:
        (home / "config.toml").write_text("max_load_per_core = 1000.0\n")
    lines = ["[defaults]", 'coder = "shell"', f'command = "{command}"', ""]
    for i in range(n):
        lines += ["[[task]]", f'name = "b{i:04d}"', 'prompt = "x"', ""]
    (tmp / "t.toml").write_text("\n".join(lines))
    env = dict(os.environ, FLEET_HOME=str(home))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed fleet-tui has its bytecode cached
    subprocess.run([*FLEET, "load", str(tmp / "t.toml")], check=True, env=env, capture_output=True)
    c0, t0 = cpu_children(), time.perf_counter()
    run = [*FLEET, "run", "--until-idle", "--max-concurrent", str(p)]
    try:
        subprocess.run(run, check=True, env=env, capture_output=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"  warning: stopped after {TIMEOUT_S:.0f} s (a gate held? `fleet-tui plan` says why)")
    secs, cpu = time.perf_counter() - t0, cpu_children() - c0
    out = subprocess.run([*FLEET, "status", "--json"], check=True, env=env, capture_output=True, text=True)
    done = sum(1 for t in json.loads(out.stdout or "[]") if isinstance(t, dict) and t.get("status") == "done")
    if n and done != n:
        print(f"  warning: {done}/{n} tasks done", file=sys.stderr)
    return secs, cpu


def file_cost_us(scratch: Path, n: int = 200) -> float:
    """CPU microseconds to make one new file beside the fleet's homes (an attempt makes about
    nine files and folders; on a journal-less ext4 one costs 17-450 us, on tmpfs ~2 us): what
    this machine's file system adds to every attempt, printed beside the figures it explains.
    The files stay in ``scratch`` until the end: deleted now, they would make the runs measured
    next dearer (the module's docstring)."""
    d = tempfile.mkdtemp(dir=scratch)
    c0 = time.process_time()
    for i in range(n):
        os.close(os.open(os.path.join(d, f"f{i}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return (time.process_time() - c0) / n * 1e6


def speed_ms() -> float:
    """Milliseconds of CPU for a fixed loop of Python (the least of three): the machine's speed at
    the moment, printed at the start and the end. On this shared 2-core machine the same loop
    took from 35 to 50 ms within an hour, while seven runs of the same code measured 13.3-23.9
    ms per attempt per slot (not in step with it: bench/README.md's notes, 2026-12-08)."""
    best = float("inf")
    for _ in range(3):
        c0 = time.process_time()
        sum(range(3_000_000))
        best = min(best, time.process_time() - c0)
    return best * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5, help="paired rounds (xargs, then the fleet) per figure")
    ap.add_argument("--only", choices=("true", "sleep"))
    ap.add_argument("--gate-off", action="store_true", help="lift the load gate (max_load_per_core)")
    args = ap.parse_args()
    n, p = args.tasks, args.concurrency
    config = "load gate lifted" if args.gate_off else "default config"
    load = os.getloadavg()[0]
    print(
        f"tasks={n} concurrency={p} rounds={args.rounds} ({config});"
        f" load average {load:.1f} on {os.cpu_count()} cores; a fixed Python loop {speed_ms():.0f} ms"
    )
    with tempfile.TemporaryDirectory() as d:  # every home and probe file, deleted at the end
        measure(args, n, p, Path(d))
    print(f"load average at the end {os.getloadavg()[0]:.1f}; the fixed Python loop {speed_ms():.0f} ms")


def spread(values: list[float], fmt: str) -> str:
    """The median of ``values``, then their lowest and highest: ``8.1 (7.2-9.0)``."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def measure(args: argparse.Namespace, n: int, p: int, scratch: Path) -> None:
    """Print every figure, each fleet's home and the probe's files made in ``scratch``."""
    cost = file_cost_us(scratch)
    print(f"a new file here costs {cost:.0f} us of CPU (an attempt makes about nine)")
    rounds = max(1, args.rounds)
    if args.only in (None, "true"):
        ratios, pers, nets, cpus, empties = [], [], [], [], []
        for i in range(rounds):
            empty, empty_cpu = fleet("true", 0, p, args.gate_off, scratch)
            (x, x_cpu), (f, f_cpu) = xargs("true", n, p), fleet("true", n, p, args.gate_off, scratch)
            ratios.append(f / x)
            pers.append((f - x) / n * p * 1000)
            nets.append((f - empty - x) / n * p * 1000)
            cpus.append((f_cpu - empty_cpu - x_cpu) / n * 1000)
            empties.append(empty)
            print(
                f"  round {i + 1}: {n} x true: fleet {f:5.2f} s, xargs {x:4.2f} s: {f / x:5.1f}x;"
                f" {pers[-1]:5.1f} ms per attempt per slot ({nets[-1]:4.1f} net of an empty run of"
                f" {empty:.2f} s); CPU {cpus[-1]:4.1f} ms per attempt beyond xargs' ({x_cpu / n * 1000:.1f})"
            )
        print(f"{n} x true      : {spread(ratios, '.1f')}x xargs, median of {rounds} rounds (goal <= 10x)")
        print(f"                  overhead {spread(pers, '.1f')} ms per attempt per slot (goal <= 15 ms);")
        print(f"                  {spread(nets, '.1f')} ms net of an empty run ({spread(empties, '.2f')} s)")
        print(f"                  CPU {spread(cpus, '.1f')} ms per attempt beyond xargs' (engine and shims)")
    if args.only in (None, "sleep"):
        ratios = []
        for i in range(rounds):
            (x, _), (f, _) = xargs("sleep 0.1", n, p), fleet("sleep 0.1", n, p, args.gate_off, scratch)
            ratios.append(x / f)
            print(
                f"  round {i + 1}: {n} x sleep 0.1: fleet {f:5.2f} s, xargs {x:5.2f} s:"
                f" ratio xargs/fleet {x / f:.2f}"
            )
        print(
            f"{n} x sleep 0.1 : ratio xargs/fleet {spread(ratios, '.2f')},"
            f" median of {rounds} rounds (goal >= 0.9)"
        )


if __name__ == "__main__":
    main()
