"""Crashes at each step of an attempt (issue 12, points 3-6), through real `fleet-tui` processes.

Each test kills something with SIGKILL (or asks for a stop) at the named moment and checks that
no process is left behind, nothing runs twice at once, and the task ends where it should.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import by_name, fleet, fleet_bg, pid_alive, shim_record, wait_for

pytestmark = pytest.mark.timeout(120)


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_kill9_run_during_verification_then_restart_verifies_once_and_finishes(tmp_path: Path) -> None:
    """Point 3 (and 5 for verifiers): the verifier dies with its engine; a restarted engine adopts
    the ``verifying`` task, runs the verification again once and finishes the task."""
    home, vlog, flag = tmp_path / "home", tmp_path / "verify.log", tmp_path / "first"
    verify = (
        f"echo $$ >> {vlog}; if [ ! -e {flag} ]; then touch {flag}; sleep 300 & echo $! >> {vlog}; wait; fi"
    )
    fleet(home, "add", "v", "--name", "v", "--cwd", str(tmp_path), "--command", "true", "--verify", verify)
    fleet(home, "add", "other", "--name", "other", "--cwd", str(tmp_path), "--command", "sleep 3")
    run1 = fleet_bg(home, "run", "--max-concurrent", "2", log=tmp_path / "run1.log")
    wait_for(lambda: len(_pids(vlog)) == 2, 30, what="the first verifier to start")
    assert by_name(home)["v"]["status"] == "verifying"
    first = _pids(vlog)
    run1.kill()
    run1.wait(timeout=10)
    # the verifier and its child go with their engine, not to ppid 1
    wait_for(lambda: not any(pid_alive(p) for p in first), 10, what="the first verifier's tree to die")
    run2 = fleet_bg(home, "run", "--until-idle", "--max-concurrent", "2", log=tmp_path / "run2.log")
    assert run2.wait(timeout=60) == 0, (tmp_path / "run2.log").read_text()
    st = by_name(home)
    assert st["v"]["status"] == "done", st["v"]
    assert st["v"]["attempt"] == 1
    assert st["other"]["status"] == "done"
    assert len(_pids(vlog)) == 3  # first run (shell + its sleep), then exactly one more
    again = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run3.log")
    assert again.wait(timeout=60) == 0, (tmp_path / "run3.log").read_text()


def test_kill9_shim_kills_its_agent_before_the_next_attempt(tmp_path: Path) -> None:
    """Point 4: the agent of a shim killed with SIGKILL (and its children) are dead before attempt
    2 starts in the same folder."""
    home, log = tmp_path / "home", tmp_path / "agents.log"
    cmd = (
        f'echo "$FLEET_ATTEMPT $$" >> {log}; '
        f'if [ "$FLEET_ATTEMPT" = 1 ]; then sleep 300 & echo "child $!" >> {log}; wait; fi; '
        f"for p in $(cat {tmp_path}/first.pids 2>/dev/null); do "
        f"grep -qs '^State:[[:space:]]*[RSDTt]' /proc/$p/status && echo \"alive $p\" >> {log}; done; true"
    )
    fleet(home, "add", "s", "--name", "s", "--cwd", str(tmp_path), "--command", cmd)
    run = fleet_bg(home, "run", log=tmp_path / "run.log")
    try:
        wait_for(lambda: log.exists() and "child" in log.read_text(), 30, what="attempt 1 and its child")
        first = [int(line.split()[1]) for line in log.read_text().splitlines()]
        (tmp_path / "first.pids").write_text(" ".join(map(str, first)))
        t = by_name(home)["s"]
        shim = shim_record(home / "tasks" / t["id"] / "attempts" / "1")
        os.kill(shim["pid"], signal.SIGKILL)
        wait_for(lambda: by_name(home)["s"]["status"] == "done", 60, what="the task to finish")
        lines = log.read_text().splitlines()
        assert [x for x in lines if x.startswith("alive")] == [], lines  # seen from attempt 2
        assert not any(pid_alive(p) for p in first)
        assert by_name(home)["s"]["attempt"] == 2
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


def test_kill9_run_during_worktree_setup_kills_the_setup(tmp_path: Path) -> None:
    """Point 5: a setup command dies with the engine that started it (its children too)."""
    repo, home, log = tmp_path / "repo", tmp_path / "home", tmp_path / "setup.log"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init")
    fleet(home, "config", "set", "worktree_setup", f"echo $$ >> {log}; sleep 300 & echo $! >> {log}; wait")
    fleet(home, "add", "w", "--name", "w", "--cwd", str(repo), "--git-ref", "main", "--command", "true")
    run = fleet_bg(home, "run", log=tmp_path / "run.log")
    wait_for(lambda: len(_pids(log)) == 2, 30, what="the setup to start")
    setup = _pids(log)
    run.kill()
    run.wait(timeout=10)
    wait_for(lambda: not any(pid_alive(p) for p in setup), 10, what="the setup's tree to die")


@pytest.mark.parametrize("verb", ["kill", "cancel", "sigterm"])
def test_stopping_during_verification_stops_the_verifier_within_the_grace(tmp_path: Path, verb: str) -> None:
    """Point 6: kill, cancel and a shutdown stop a running verifier within the grace period, and the
    task ends as the stop says (never ``done``)."""
    home, vlog = tmp_path / "home", tmp_path / "verify.log"
    fleet(home, "config", "set", "kill_grace_s", "2")
    verify = f"echo $$ >> {vlog}; sleep 300 & echo $! >> {vlog}; wait"
    fleet(home, "add", "v", "--name", "v", "--cwd", str(tmp_path), "--command", "true", "--verify", verify)
    run = fleet_bg(home, "run", log=tmp_path / "run.log")
    try:
        wait_for(lambda: len(_pids(vlog)) == 2, 30, what="the verifier to start")
        tree = _pids(vlog)
        started = time.monotonic()
        if verb == "sigterm":
            run.send_signal(signal.SIGTERM)
            assert run.wait(timeout=20) == 0
        else:
            fleet(home, verb, "v", timeout=30)
        wait_for(lambda: not any(pid_alive(p) for p in tree), 10, what="the verifier's tree to die")
        assert time.monotonic() - started < 2 + 8
        st = by_name(home)["v"]
        expected = {
            "kill": ("needs_human", "killed_by_user"),
            "cancel": ("cancelled", "cancelled by user"),
            "sigterm": ("verifying", None),  # left for the next engine, which verifies again
        }[verb]
        assert (st["status"], st["reason"]) == expected, st
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
