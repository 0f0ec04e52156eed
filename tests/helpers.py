"""Shared test helpers: run the real `fleet-tui` command, wait on conditions (never bare sleeps)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

FLEET = [sys.executable, "-m", "fleet_tui"]


def fleet_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["FLEET_HOME"] = str(home)
    env.pop("FLEET_STORE", None)
    env.update(extra)
    return env


def quiet_home(home: Path) -> Path:
    """A home whose load gate cannot hold tests back: the machine is shared and its load average
    is whatever other tests left behind. Tests of the load gate set their own config."""
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "config.toml"
    if not cfg.exists():
        cfg.write_text("max_load_per_core = 1000.0\nmem_floor_gib = 0.1\ndisk_floor_gib = 0.1\n")
    return home


def fleet(
    home: Path,
    *args: str,
    check: bool = True,
    timeout: float = 120,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `fleet-tui --home HOME ARGS...` to completion."""
    quiet_home(home)
    p = subprocess.run(
        [*FLEET, "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env or fleet_env(home),
        stdin=subprocess.DEVNULL,
    )
    if check and p.returncode != 0:
        raise AssertionError(
            f"fleet-tui {' '.join(args)} exited {p.returncode}\nstdout:{p.stdout}\nstderr:{p.stderr}"
        )
    return p


def fleet_bg(
    home: Path,
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> subprocess.Popen[bytes]:
    quiet_home(home)
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [*FLEET, "--home", str(home), *args],
        cwd=cwd,
        env=env or fleet_env(home),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
    )


def status(home: Path) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(fleet(home, "status", "--json").stdout)
    return data


def by_name(home: Path) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in status(home)}


def wait_for(
    cond: Callable[[], T], timeout: float = 60.0, interval: float = 0.1, what: str = "condition"
) -> T:
    """Poll ``cond`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def shim_record(attempt: Path, timeout: float = 30.0) -> dict[str, Any]:
    """The attempt's ``shim.json`` once it names the agent. The shim writes it after the agent
    started (one write less before the agent), so an agent's first output or a task's "running"
    can come before it: wait for the record, never read it at once."""

    def read() -> dict[str, Any] | None:
        try:
            data = json.loads((attempt / "shim.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and "agent_pid" in data else None

    found = wait_for(read, timeout, what=f"{attempt / 'shim.json'} naming the agent")
    assert found is not None
    return found


def in_a_niced_thread(step: int, fn: Callable[[], T], at_most: int = 5) -> T:
    """``fn()`` on a thread of its own whose niceness is this process's plus ``step`` (Linux: a
    thread's own, inherited by what it starts), as the cockpit's engine thread runs; skips the
    test where that would pass ``at_most`` (this process runs niced already) or off Linux."""
    import pytest

    if not sys.platform.startswith("linux"):
        pytest.skip("a thread's own niceness is Linux's")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base + step > at_most:
        pytest.skip("this test's process runs niced already")
    out: list[T] = []

    def run() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), base + step)
        out.append(fn())

    th = threading.Thread(target=run)
    th.start()
    th.join(60)
    assert out, "the niced thread did not finish"
    return out[0]
