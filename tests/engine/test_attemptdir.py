"""The attempt-directory contract (attemptdir/attemptfiles), the process-tree helpers (proctree)
and the one way a coder runs (invoke): attempts and reviewers both under a shim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fleet_tui.scheduler.procs import attemptdir, attemptfiles, invoke, proctree
from fleet_tui.scheduler.procs.attemptdir import ExitInfo, ExitReason, ShimInfo
from fleet_tui.scheduler.procs.invoke import Invocation
from helpers import pid_alive, wait_for

pytestmark = pytest.mark.timeout(60)

PROCS = Path(attemptdir.__file__).parent


# -- readers and writers ----------------------------------------------------------------------


def test_shim_info_round_trips_and_matches_what_the_shim_writes(tmp_path: Path) -> None:
    info = ShimInfo(pid=123, start_ticks=456, started_at=1.5, agent_pid=789, agent_start_ticks=1011)
    attemptdir.write_shim(tmp_path, info)
    assert attemptdir.read_shim(tmp_path) == info
    raw = json.loads((tmp_path / "shim.json").read_text())
    assert raw == {
        "pid": 123,
        "start_ticks": 456,
        "started_at": 1.5,
        "agent_pid": 789,
        "agent_start_ticks": 1011,
    }
    # before the agent started: no agent fields
    attemptdir.write_shim(tmp_path, ShimInfo(pid=5, start_ticks=None, started_at=2.0))
    assert json.loads((tmp_path / "shim.json").read_text()) == {
        "pid": 5,
        "start_ticks": None,
        "started_at": 2.0,
    }
    assert attemptdir.read_shim(tmp_path) == ShimInfo(pid=5, started_at=2.0)


def test_exit_info_round_trips_with_the_values_stored_on_disk(tmp_path: Path) -> None:
    info = ExitInfo(exit_code=137, reason=ExitReason.STOPPED, signal=9, killed_descendants=2, ended_at=3.0)
    attemptdir.write_exit(tmp_path, info)
    assert attemptdir.read_exit(tmp_path) == info
    assert attemptdir.has_exit(tmp_path)
    raw = json.loads((tmp_path / "exit.json").read_text())
    assert raw["reason"] == "stopped" and raw["exit_code"] == 137
    assert [r.value for r in ExitReason] == [
        "exited",
        "stopped",
        "lease_expired",
        "spawn_failed",
        "crashed",
    ]


def test_exit_is_written_into_the_reserved_space(tmp_path: Path) -> None:
    attemptfiles.reserve_exit(str(tmp_path))
    assert (tmp_path / attemptdir.EXIT_RESERVED).stat().st_size == attemptfiles.EXIT_RESERVE
    attemptdir.write_exit(tmp_path, ExitInfo(exit_code=0, ended_at=1.0))
    assert not (tmp_path / attemptdir.EXIT_RESERVED).exists()
    assert attemptdir.read_exit(tmp_path) == ExitInfo(exit_code=0, ended_at=1.0)  # padding is blanks


@pytest.mark.parametrize(
    "content",
    [None, "", "{", "[1, 2]", '"text"', "null", "\x00\xff garbage", '{"start_ticks": 1}', '{"pid": "x"}'],
)
def test_missing_or_garbled_shim_json_reads_as_none(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / "shim.json").write_text(content)
    assert attemptdir.read_shim(tmp_path) is None


def test_shim_json_with_odd_fields_keeps_what_it_can(tmp_path: Path) -> None:
    (tmp_path / "shim.json").write_text(
        '{"pid": 7, "start_ticks": "x", "started_at": true, "agent_pid": 0, "extra": [1]}'
    )
    assert attemptdir.read_shim(tmp_path) == ShimInfo(pid=7)


@pytest.mark.parametrize("content", [None, "", "{", "[]", "{}garbage"])
def test_missing_or_garbled_exit_json_reads_as_none(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / "exit.json").write_text(content)
    assert attemptdir.read_exit(tmp_path) is None


def test_exit_json_with_odd_fields(tmp_path: Path) -> None:
    (tmp_path / "exit.json").write_text('{"exit_code": null, "reason": "from_the_future", "signal": "9"}')
    assert attemptdir.read_exit(tmp_path) == ExitInfo(exit_code=None, reason=ExitReason.EXITED, signal=9)
    (tmp_path / "exit.json").write_text("{}")
    assert attemptdir.read_exit(tmp_path) == ExitInfo(exit_code=None)


def test_lease_reads_and_writes(tmp_path: Path) -> None:
    assert attemptdir.read_lease(tmp_path) is None
    attemptdir.write_lease(tmp_path, 1234.5)
    assert attemptdir.read_lease(tmp_path) == 1234.5
    (tmp_path / "lease").write_text("soon")
    assert attemptdir.read_lease(tmp_path) is None
    (tmp_path / "lease").write_text("")
    assert attemptdir.read_lease(tmp_path) is None
    with pytest.raises(OSError):
        attemptdir.write_lease(tmp_path / "missing", 1.0)


def test_a_small_file_is_written_into_and_cut_to_what_was_written(tmp_path: Path) -> None:
    """``write_into`` writes into an attempt's files as they are (a spare folder's come empty) with
    no truncation first: a missing file is made, an empty one filled, and one that held more is
    cut to the bytes just written."""
    p = tmp_path / "prompt.txt"
    attemptfiles.write_into(str(p), b"a first, longer prompt\n")
    assert p.read_bytes() == b"a first, longer prompt\n"
    attemptfiles.write_into(str(p), b"short\n")
    assert p.read_bytes() == b"short\n"
    p.write_bytes(b"")
    attemptfiles.write_into(str(p), b"x" * 70_000)  # more than one write may take
    assert p.read_bytes() == b"x" * 70_000
    attemptfiles.write_json(str(tmp_path / "shim.json"), {"pid": 1, "note": "a\nb"})
    attemptfiles.write_json(str(tmp_path / "shim.json"), {"pid": 2})
    assert json.loads((tmp_path / "shim.json").read_text()) == {"pid": 2}


def test_the_shim_and_its_siblings_import_bare_and_cheap() -> None:
    """The shim runs from its folder without the package; what it imports must stay cheap (no
    json, re, enum, dataclasses, typing) and attemptdir must import bare too."""
    code = (
        f"import sys; sys.path.insert(0, {str(PROCS)!r}); import shim; "
        "heavy = sorted({'json', 're', 'enum', 'dataclasses', 'typing', 'fleet_tui'} & set(sys.modules)); "
        "import attemptdir; print(','.join(heavy), attemptdir.ExitReason('stopped').name)"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["STOPPED"], out.stdout + out.stderr


# -- process trees -------------------------------------------------------------------------------


def test_tree_finds_escaped_descendants_and_kill_tree_stops_them(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    p = subprocess.Popen(
        ["/bin/sh", "-c", f"trap '' TERM; setsid sleep 300 & echo $! >> {pids}; sleep 300 & wait"],
        start_new_session=True,
    )
    try:
        wait_for(lambda: pids.exists() and pids.read_text().strip(), 10, what="the tree")
        escaped = int(pids.read_text())
        wait_for(lambda: len(proctree.tree(p.pid)) >= 2, 10, what="two descendants")
        assert escaped in dict(proctree.tree(p.pid))
        assert proctree.alive(p.pid, proctree.proc_start_ticks(p.pid))
        assert not proctree.alive(p.pid, (proctree.proc_start_ticks(p.pid) or 0) + 1)  # a reused pid

        def find() -> list[proctree.Proc]:
            return proctree.tree(p.pid, group=p.pid)

        proctree.kill_tree(find, 0.3, reap=p.poll)
        assert find() == []
        p.wait(5)
        wait_for(lambda: not pid_alive(escaped), 5, what="the escaped one to die")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# -- one way to run a coder ----------------------------------------------------------------------


def test_run_puts_the_command_under_a_shim_owned_by_a_keeper(tmp_path: Path) -> None:
    adir = tmp_path / "run"
    inv = Invocation(
        ("/bin/sh", "-c", "echo $PPID; cat; echo oops >&2; exit 4"), dict(os.environ), b"in\n", tmp_path, adir
    )
    ran = invoke.run(inv, timeout_s=30)
    assert ran.shim is not None and ran.exit is not None
    lines = (adir / attemptdir.STDOUT).read_text().split()
    assert lines == [str(ran.shim.pid), "in"]  # the command's parent is the shim
    assert (adir / attemptdir.STDERR).read_text() == "oops\n"
    assert (ran.exit.exit_code, ran.exit.reason, ran.timed_out, ran.cancelled) == (
        4,
        ExitReason.EXITED,
        False,
        False,
    )
    assert attemptdir.read_lease(adir) is not None


def test_run_cancelled_stops_the_shim_and_its_agent(tmp_path: Path) -> None:
    adir = tmp_path / "run"
    cancel = threading.Event()
    inv = Invocation(("/bin/sh", "-c", "trap '' TERM; sleep 300"), dict(os.environ), None, tmp_path, adir)
    out: list[invoke.Ran] = []
    th = threading.Thread(
        target=lambda: out.append(invoke.run(inv, timeout_s=None, cancel=cancel, grace_s=0.3))
    )
    th.start()
    shim = wait_for(lambda: (s := attemptdir.read_shim(adir)) and s.agent_pid and s, 10, what="the agent")
    cancel.set()
    th.join(20)
    assert out and out[0].cancelled
    wait_for(lambda: not pid_alive(shim.agent_pid or 0) and not pid_alive(shim.pid), 5, what="both to die")


def test_a_spawn_failure_is_recorded_by_the_shim(tmp_path: Path) -> None:
    adir = tmp_path / "run"
    ran = invoke.run(Invocation(("/no/such/agent",), dict(os.environ), None, tmp_path, adir), timeout_s=30)
    assert ran.exit is not None and ran.exit.reason == ExitReason.SPAWN_FAILED and ran.exit.exit_code == 127
    assert ran.exit.error


def test_environment_layers() -> None:
    env = invoke.environment(
        {"FLEET_TASK_ID": "t1"},
        {"A": "task"},
        {"A": "coder", "B": "b"},
        drop=("SECRET",),
        base={"SECRET": "s", "A": "0", "HOME": "/h"},
    )
    assert env == {"HOME": "/h", "FLEET_TASK_ID": "t1", "A": "coder", "B": "b"}


def test_a_reviewer_runs_under_a_shim(tmp_path: Path) -> None:
    from fleet_tui.config import Config
    from fleet_tui.scheduler.model import Task, TaskSpec
    from fleet_tui.scheduler.policy.review import make_reviewer
    from fleet_tui.scheduler.states import TaskStatus

    task = Task(
        id="rv9", spec=TaskSpec(name="rv", prompt="p", coder="sim"), status=TaskStatus.VERIFYING, attempt=1
    )
    reply = make_reviewer(tmp_path / "home", task, Config())("Review.\n@sim say=PASS", None, None, tmp_path)
    assert reply.startswith("PASS")
    review = tmp_path / "home" / "tasks" / "rv9" / "reviews" / "1"
    shim, end = attemptdir.read_shim(review), attemptdir.read_exit(review)
    assert shim is not None and shim.agent_pid and shim.agent_pid != shim.pid
    assert end is not None and (end.exit_code, end.reason) == (0, ExitReason.EXITED)
    assert "PASS" in (review / attemptdir.STDOUT).read_text()
    assert (review / attemptdir.PROMPT).read_text().startswith("Review.")


def test_the_attempt_guard_recognises_the_shims_command_line() -> None:
    from fleet_tui.scheduler.procs.attempt_guard import SHIM_MARKERS

    assert any(m in invoke.SHIM_BOOT.encode() for m in SHIM_MARKERS)


def test_a_killed_keepers_shim_and_agent_are_reaped_at_the_next_start(tmp_path: Path) -> None:
    """``kill -9`` of the keeper hosting a reviewer's shim: the next engine's reap_stale kills the
    shim and the agent it started in a session of its own."""
    import signal

    from fleet_tui.scheduler.procs.owned import reap_stale

    home, adir = tmp_path / "home", tmp_path / "run"
    inv = Invocation(("/bin/sh", "-c", "sleep 300"), dict(os.environ), None, tmp_path, adir)
    th = threading.Thread(target=lambda: invoke.run(inv, timeout_s=None, home=home), daemon=True)
    th.start()
    shim = wait_for(lambda: (s := attemptdir.read_shim(adir)) and s.agent_pid and s, 10, what="the agent")
    keeper = json.loads(next((home / "children").glob("*.json")).read_text())
    os.kill(keeper["keeper_pid"], signal.SIGKILL)
    th.join(10)
    assert pid_alive(shim.agent_pid or 0)  # left behind...
    assert reap_stale(home) >= 2  # ...until an engine starts on this home: the shim and its agent
    wait_for(lambda: not pid_alive(shim.agent_pid or 0) and not pid_alive(shim.pid), 5, what="both to die")


def test_an_attempt_folder_is_made_in_a_new_home_and_beside_earlier_ones(tmp_path: Path) -> None:
    from fleet_tui.scheduler.attempts.launch import _make_attempt_dir, attempt_dir

    home = tmp_path / "home"  # not even the home exists yet
    first = attempt_dir(home, "t-1", 1)
    _make_attempt_dir(first)
    assert first.is_dir()
    (first / "keep").write_text("x")
    second = attempt_dir(home, "t-1", 2)
    _make_attempt_dir(second)
    _make_attempt_dir(first)  # made again (an adopted attempt): nothing in it is lost
    assert second.is_dir() and (first / "keep").read_text() == "x"


def test_a_process_is_alive_while_it_runs_and_not_once_it_is_a_zombie_or_gone() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ticks = proctree.proc_start_ticks(p.pid)
    assert ticks is not None
    assert proctree.alive(p.pid, ticks) and proctree.alive(p.pid, None)
    assert not proctree.alive(p.pid, ticks - 1)  # another process under a reused pid
    assert p.stdin is not None
    p.stdin.close()
    wait_for(lambda: proctree.proc_state(p.pid) == "Z", 10, what="the zombie (exited, not reaped)")
    assert not proctree.alive(p.pid, ticks) and not proctree.alive(p.pid, None)
    p.wait(timeout=10)
    assert not proctree.alive(p.pid, ticks)
