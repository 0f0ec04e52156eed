"""Idle engine CPU: `fleet-tui run` with nothing to do, measured from /proc over a window.

Two cases, each against its goal (issue 14) and a bare idle Python process measured in the
same run (``python -c "import time; time.sleep(...)"``):

* an empty home (goal: <= 0.3 % of a core);
* 10,000 queued tasks that cannot start (they need a tag this host lacks; goal: <= 1 %);
* the same 10,000 held by the memory gate instead (``mem_floor_gib`` far above the machine's
  memory) while another program allocates and frees 300 MB every second, as on a machine short
  of memory, where the free figure in every task's reason moves all the time (the same goal).

Prints CPU % of one core and the ratio to the goal (<= 1.0 meets it).
Usage: python bench/bench_idle.py [SECONDS] [QUEUED]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = [sys.executable, "-m", "fleet_tui"]
#: another program's memory coming and going: 300 MB allocated (and touched) for a second, freed
#: for a second
CHURN = (
    "import time\nwhile True:\n    b = bytearray(300 << 20)\n    time.sleep(1)\n    del b\n    time.sleep(1)"
)
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its reaped children, in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def measure(cmd: list[str], env: dict[str, str], warmup: float, window: float) -> float:
    """CPU % of one core that ``cmd`` uses over ``window`` seconds after ``warmup``."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(warmup)
        if proc.poll() is not None:
            raise SystemExit(f"{cmd} exited early ({proc.returncode})")
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(window)
        c1, t1 = cpu_seconds(proc.pid), time.monotonic()
        return 100.0 * (c1 - c0) / (t1 - t0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def queued_home(home: Path, n: int, default: str = "", config: str = "") -> dict[str, str]:
    """A fleet home with ``n`` queued `true` tasks (``default``: one more ``[defaults]`` line,
    ``config``: its config.toml), loaded; the environment that runs on it."""
    home.mkdir()
    if config:
        (home / "config.toml").write_text(config)
    lines = ["[defaults]", 'coder = "shell"', 'command = "true"', default, ""]
    for i in range(n):
        lines += ["[[task]]", f'name = "q{i:05d}"', 'prompt = "x"', ""]
    (home.parent / f"{home.name}.toml").write_text("\n".join(lines))
    env = dict(os.environ, FLEET_HOME=str(home))
    subprocess.run(
        [*FLEET, "load", str(home.parent / f"{home.name}.toml")], check=True, env=env, capture_output=True
    )
    return env


def main() -> None:
    window = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    queued = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bare = measure([sys.executable, "-c", "import time; time.sleep(1e6)"], dict(os.environ), 2.0, window)

        empty = tmp / "empty"
        empty.mkdir()
        env = dict(os.environ, FLEET_HOME=str(empty))
        idle = measure([*FLEET, "run", "-q"], env, 5.0, window)

        env = queued_home(tmp / "full", queued, default='requires = ["no-such-tag"]')
        busy = measure([*FLEET, "run", "-q"], env, 10.0, window)

        env = queued_home(tmp / "memory", queued, config="mem_floor_gib = 100000.0\n")
        churn = subprocess.Popen([sys.executable, "-c", CHURN])
        try:
            gated = measure([*FLEET, "run", "-q"], env, 10.0, window)
        finally:
            churn.kill()
            churn.wait()

    print(f"window {window:.0f} s per case")
    print(f"bare idle python          : {bare:6.2f} % of a core")
    print(f"run, empty home           : {idle:6.2f} %  ratio to goal 0.3 %: {idle / 0.3:6.2f}")
    print(f"run, {queued} queued held : {busy:6.2f} %  ratio to goal 1 %  : {busy / 1.0:6.2f}")
    print(f"run, {queued} held by memory, another program's 300 MB coming and going:")
    print(f"                            {gated:6.2f} %  ratio to goal 1 %  : {gated / 1.0:6.2f}")


if __name__ == "__main__":
    main()
