"""Progress in bulk and on a busy machine (issue 14), through the real `fleet-tui` command with the
default config:

* a 1500-task chain of `true` drains (planning costs in proportion to change, not to the queue);
* with CPU load of twice the cores from busy loops started (and stopped) by the test, ten shell
  tasks all finish: the load gate never stops the first agent, and `plan` says that it holds
  back the others.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import by_name, fleet, wait_for

#: busy loops end by themselves after this long, whatever happens to the test
BUSY_LIMIT_S = 900


def default_home(home: Path) -> Path:
    """A home with an empty config.toml: every setting at its default (the load gate included)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("")
    return home


def task_file(path: Path, n: int, chain: bool) -> Path:
    lines = ["[defaults]", 'coder = "shell"', 'command = "true"', ""]
    for i in range(n):
        lines += ["[[task]]", f'name = "t{i:05d}"', 'prompt = "x"']
        if chain and i:
            lines.append(f'depends_on = ["t{i - 1:05d}"]')
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def load_per_core() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0]) / (os.cpu_count() or 1)


@pytest.fixture
def busy_loops() -> Iterator[list[subprocess.Popen[bytes]]]:
    """CPU load of twice the cores and one more: busy loops that stop at the test's end (or
    after BUSY_LIMIT_S on their own). Twice the cores alone settles the load average right at the
    default gate (2.0 per core) on a quiet machine; the one more puts it over, as on a busy box.

    The loops run at niceness 19: the load average counts a runnable process whatever its
    niceness, so the gate sees the same busy machine, while the tests that run beside this one
    (pytest-xdist) are not starved for the two minutes the load takes to climb."""
    code = (
        "import os, time\nos.nice(19)\n"
        f"end = time.monotonic() + {BUSY_LIMIT_S}\nwhile time.monotonic() < end:\n    pass\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
        for _ in range(2 * (os.cpu_count() or 1) + 1)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)


@pytest.mark.timeout(1800)
def test_a_1500_task_chain_drains(tmp_path: Path) -> None:
    home = default_home(tmp_path / "home")
    fleet(home, "load", str(task_file(tmp_path / "chain.toml", 1500, chain=True)))
    p = fleet(home, "run", "--until-idle", "--quiet", timeout=1700)
    assert p.returncode == 0, p.stderr
    tasks = by_name(home)
    assert len(tasks) == 1500
    assert {t["status"] for t in tasks.values()} == {"done"}


@pytest.mark.timeout(1200)
def test_ten_shell_tasks_finish_under_cpu_load_of_twice_the_cores(
    tmp_path: Path, busy_loops: list[subprocess.Popen[bytes]]
) -> None:
    home = default_home(tmp_path / "home")
    fleet(home, "load", str(task_file(tmp_path / "ten.toml", 10, chain=False)))
    # the 1-minute load average climbs over the default gate (2.0 per core) within a minute or two
    wait_for(lambda: load_per_core() > 2.2, timeout=300, interval=1.0, what="the load over the gate")
    plan = fleet(home, "plan").stdout
    assert plan.count(": would start") == 1, plan  # the first agent runs whatever the load
    assert "one agent at a time" in plan, plan  # the load gate holds back the second and later
    run = fleet(home, "run", "--until-idle", "--quiet", timeout=1100)
    assert run.returncode == 0, run.stderr
    assert all(b.poll() is None for b in busy_loops)  # the load lasted the whole run
    assert {t["status"] for t in by_name(home).values()} == {"done"}
