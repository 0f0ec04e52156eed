"""Helper programs run under a keeper (owned.py / keeper.py): cancel, timeout, output, and the
trees a killed keeper leaves behind, reaped by the next engine."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from fleet_tui.scheduler.procs.owned import OwnedResult, reap_stale, run_owned
from helpers import in_a_niced_thread, pid_alive, wait_for

pytestmark = pytest.mark.timeout(60)


def test_output_exit_code_and_stdin(tmp_path: Path) -> None:
    r = run_owned(["/bin/sh", "-c", "cat; echo err >&2; exit 3"], cwd=tmp_path, stdin=b"hello\n")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.cancelled) == (
        3,
        b"hello\n",
        b"err\n",
        False,
        False,
    )


def test_cancel_stops_the_whole_tree_within_the_grace(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    cancel = threading.Event()
    out: list[OwnedResult] = []
    th = threading.Thread(
        target=lambda: out.append(
            run_owned(
                ["/bin/sh", "-c", f"trap '' TERM; sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"],
                cwd=tmp_path,
                cancel=cancel,
                grace_s=0.5,
            )
        )
    )
    th.start()
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, 10, what="the tree")
    tree = [int(x) for x in pids.read_text().split()]
    started = time.monotonic()
    cancel.set()
    th.join(10)
    assert out and out[0].cancelled and out[0].exit_code is None
    assert time.monotonic() - started < 5
    wait_for(lambda: not any(pid_alive(p) for p in tree), 5, what="the tree to die")


def test_a_killed_keepers_tree_is_reaped_at_the_next_start(tmp_path: Path) -> None:
    home, pids = tmp_path / "home", tmp_path / "pids"
    th = threading.Thread(
        target=lambda: run_owned(
            ["/bin/sh", "-c", f"sleep 300 & echo $! >> {pids}; wait"], cwd=tmp_path, home=home
        ),
        daemon=True,
    )
    th.start()
    wait_for(lambda: list((home / "children").glob("*.json")) and pids.exists(), 10, what="the pid file")
    info = json.loads(next((home / "children").glob("*.json")).read_text())
    child = int(pids.read_text())
    os.kill(info["keeper_pid"], signal.SIGKILL)  # the keeper itself dies without a word
    th.join(10)
    assert pid_alive(child)  # left behind...
    assert reap_stale(home) >= 1  # ...until an engine starts on this home
    wait_for(lambda: not pid_alive(child), 5, what="the leftover to die")
    assert list((home / "children").glob("*.json")) == []


def test_the_command_gets_the_users_umask(tmp_path: Path) -> None:
    from fleet_tui.scheduler.private import user_umask

    r = run_owned(["/bin/sh", "-c", "umask"], cwd=tmp_path)
    assert int(r.stdout.decode().strip(), 8) == user_umask()


def test_a_dying_shims_agent_is_reaped_once_the_shim_is_gone(tmp_path: Path) -> None:
    """A killed shim wakes its supervisor (its files close) before the kernel marks it a zombie:
    the supervisor may find it still "alive". Told the shim is ending, ``reap_attempt`` waits for
    it to be gone and then kills its agent; not told, it leaves the agent to its shim, as it
    must for a shim that lives. The stand-in shim ends by itself once released."""
    import subprocess

    from fleet_tui.scheduler.procs import proctree
    from fleet_tui.scheduler.procs.attemptfiles import shim_record
    from fleet_tui.scheduler.procs.owned import reap_attempt

    release = tmp_path / "release"
    shim = subprocess.Popen(["/bin/sh", "-c", f"while [ ! -e {release} ]; do sleep 0.01; done"])
    agent = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        rec = shim_record(
            shim.pid,
            proctree.proc_start_ticks(shim.pid),
            time.time(),
            agent.pid,
            proctree.proc_start_ticks(agent.pid),
        )
        (tmp_path / "shim.json").write_text(json.dumps(rec))
        assert reap_attempt(tmp_path) == 0 and agent.poll() is None  # a live shim owns its agent
        ended = threading.Timer(0.2, release.touch)
        ended.start()
        assert reap_attempt(tmp_path, dying_s=30.0) >= 1
        ended.join()
        assert agent.wait(timeout=30) == -signal.SIGKILL
    finally:
        release.touch()
        shim.wait(timeout=30)
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def test_a_program_run_from_a_niced_thread_runs_at_its_niceness_not_above(tmp_path: Path) -> None:
    """Verifiers and setup commands run at the agents' niceness: from the cockpit's engine
    thread, which runs niced itself (app/hosted.py), a step on top of it niced them twice."""
    r = in_a_niced_thread(
        3, lambda: run_owned(["awk", "{print $19}", "/proc/self/stat"], cwd=tmp_path, nice=5)
    )
    assert r.exit_code == 0 and int(r.stdout) == 5
