"""The shim fork server (runner.ShimPool): shims forked from one warm process behave like shims
started on their own: each runs its job in the attempt's folder with the job's environment, in a
session of its own, records its exit, and outlives the server and the process that asked for it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from fleet_tui.scheduler.procs import shim
from fleet_tui.scheduler.procs.invoke import ForkedShim, ShimPool, ShimProcess
from fleet_tui.scheduler.procs.runner import read_json, spawn_shim
from helpers import in_a_niced_thread

pytestmark = pytest.mark.timeout(60)


def _wait(cond: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], **extra}


def test_forked_shims_run_their_jobs_and_record_their_exits(tmp_path: Path) -> None:
    pool = ShimPool()
    pool.fill()
    try:
        shims = []
        for i in range(3):
            adir = tmp_path / f"a{i}"
            cmd = f'echo "$WHO in $PWD"; exit {i}'
            p = spawn_shim(
                adir, tmp_path, ["sh", "-c", cmd], _env(WHO=f"job{i}"), None, 5.0, time.time() + 60, pool=pool
            )
            assert isinstance(p, ForkedShim)  # forked by the server, not started on its own
            assert shim.proc_start_ticks(p.pid) in (p.start_ticks, None)
            shims.append((adir, p))
        for i, (adir, p) in enumerate(shims):
            _wait(lambda p=p: p.poll() is not None, f"shim {i} to end")
            exit_info = json.loads((adir / "exit.json").read_text())
            assert (exit_info["exit_code"], exit_info["reason"]) == (i, "exited")
            assert (adir / "stdout.jsonl").read_text() == f"job{i} in {tmp_path}\n"
            assert json.loads((adir / "shim.json").read_text())["pid"] == p.pid
            assert not (adir / "shim.log").exists()  # made only for a shim that fails
    finally:
        pool.close()


def test_a_failing_forked_shim_leaves_its_traceback_in_shim_log(tmp_path: Path) -> None:
    pool = ShimPool()
    pool.fill()
    try:
        adir = tmp_path / "a"
        adir.mkdir()
        (adir / "stdout.jsonl").mkdir()  # its output file cannot be opened
        p = spawn_shim(adir, tmp_path, ["sh", "-c", "true"], _env(), None, 5.0, time.time() + 60, pool=pool)
        assert isinstance(p, ForkedShim)
        _wait(lambda: p.poll() is not None, "the shim to end")
        _wait(lambda: "IsADirectoryError" in _text(adir / "shim.log"), "the traceback in shim.log")
    finally:
        pool.close()


def _stop(shims: Sequence[tuple[Path, ShimProcess]], pool: ShimPool) -> None:
    """Stop every shim (SIGTERM: each stops its agent), wait for them, close the pool."""
    for _, p in shims:
        os.kill(p.pid, 15)
    for _, p in shims:
        _wait(lambda p=p: p.poll() is not None, "the shim to stop")
    pool.close()


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_a_forked_shim_outlives_its_server_and_stops_on_request(tmp_path: Path) -> None:
    pool = ShimPool()
    pool.fill()
    adir = tmp_path / "a"
    p = spawn_shim(adir, tmp_path, ["sleep", "60"], _env(), None, 1.0, time.time() + 60, pool=pool)
    try:
        assert isinstance(p, ForkedShim)
        _wait(lambda: "agent_pid" in (read_json(adir / "shim.json") or {}), "the agent")
        server = pool.server
        assert server is not None
        # outside our session and process group (a terminal's signals miss it), in the server's
        assert os.getpgid(p.pid) == p.pid and os.getsid(p.pid) == server.pid != os.getsid(0)
        pool.close()  # the engine goes away: its server exits, the shim and its agent stay
        assert server.poll() is not None
        assert p.poll() is None
        os.kill(p.pid, 15)  # a stop request: the shim stops its agent and records why
        _wait(lambda: p.poll() is not None, "the shim to stop")
        assert json.loads((adir / "exit.json").read_text())["reason"] == "stopped"
    finally:
        p.kill()


def test_without_a_server_the_shim_starts_on_its_own(tmp_path: Path) -> None:
    pool = ShimPool()
    pool.fill()
    assert pool.server is not None
    pool.server.kill()  # the server died: the next attempt still starts, and a new server is up
    pool.server.wait()
    adir = tmp_path / "a"
    p = spawn_shim(adir, tmp_path, ["true"], _env(), None, 1.0, time.time() + 60, pool=pool)
    try:
        assert not isinstance(p, ForkedShim)
        _wait(lambda: p.poll() is not None, "the shim to end")
        assert json.loads((adir / "exit.json").read_text())["exit_code"] == 0
        assert pool.server is not None and pool.server.poll() is None
    finally:
        pool.close()


def _waiting_shims(pool: ShimPool, gone: frozenset[int] = frozenset()) -> set[int]:
    """The shims the server forked ahead of their jobs (once none of ``gone`` is among them)."""
    import psutil

    assert pool.server is not None
    server = psutil.Process(pool.server.pid)

    def live() -> set[int]:  # a shim that ended stays the server's child until it is reaped
        out = set()
        for c in server.children():
            try:
                if c.status() != psutil.STATUS_ZOMBIE:
                    out.add(c.pid)
            except psutil.NoSuchProcess:
                continue
        return out

    _wait(lambda: len(live()) == pool.ahead and not live() & gone, "the server's waiting shims")
    return live()


def test_the_server_forks_shims_ahead_and_they_go_with_the_server(tmp_path: Path) -> None:
    """A job costs a pipe write: the shim that takes it was forked (in a process group of its
    own) before the job came. Without a job, a waiting shim ends with its server: nothing is left."""
    import psutil

    pool = ShimPool()
    pool.fill()
    try:
        ahead = _waiting_shims(pool)
        assert all(os.getpgid(pid) == pid for pid in ahead)
        adir = tmp_path / "a"
        p = spawn_shim(adir, tmp_path, ["true"], _env(), None, 1.0, time.time() + 60, pool=pool)
        assert p.pid in ahead  # the job went to a shim forked before it
        _wait(lambda: p.poll() is not None, "the shim to end")
        assert json.loads((adir / "exit.json").read_text())["exit_code"] == 0
        waiting = _waiting_shims(pool, gone=frozenset({p.pid}))  # another one forked in its place
        assert p.pid not in waiting and len(waiting - ahead) == 1
    finally:
        pool.close()
    _wait(
        lambda: all(
            not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie" for pid in waiting
        ),
        "the waiting shims to end with their server",
    )


def test_an_engines_server_keeps_a_shim_forked_ahead_per_slot(tmp_path: Path) -> None:
    """Slots freed together each find a shim already forked: an engine's pool keeps one per
    slot (two at the least, eight at the most), not two for any number of slots."""
    assert [ShimPool.for_home(tmp_path, n).ahead for n in (1, 2, 4, 6, 8, 32)] == [2, 2, 4, 6, 8, 8]
    pool = ShimPool.for_home(tmp_path, 4)
    pool.fill()
    try:
        assert len(_waiting_shims(pool)) == 4
    finally:
        pool.close()


def test_a_waiting_shim_killed_by_someone_is_passed_over(tmp_path: Path) -> None:
    import psutil

    pool = ShimPool()
    pool.fill()
    try:
        ahead = _waiting_shims(pool)
        for pid in ahead:
            os.kill(pid, 9)
        for pid in ahead:
            _wait(lambda pid=pid: not psutil.pid_exists(pid), "the server to reap it")
        adir = tmp_path / "a"
        p = spawn_shim(
            adir, tmp_path, ["sh", "-c", "echo ok"], _env(), None, 1.0, time.time() + 60, pool=pool
        )
        assert isinstance(p, ForkedShim) and p.pid not in ahead
        _wait(lambda: p.poll() is not None, "the shim to end")
        assert (adir / "stdout.jsonl").read_text() == "ok\n"
    finally:
        pool.close()


def test_a_pooled_shim_sends_its_exit_record_down_its_done_pipe_and_closes_it(tmp_path: Path) -> None:
    """Its supervisor hears of the end from the pipe, before the process is torn down, and has
    the exit record from it (the file holds the same, written first); the agent never holds the
    pipe (nor any other of the server's files): only stdin, stdout, stderr."""
    pool = ShimPool()
    pool.fill()
    try:
        adir = tmp_path / "a"
        p = spawn_shim(
            adir,
            tmp_path,
            ["sh", "-c", "ls /proc/$$/fd; exit 3"],
            _env(),
            None,
            1.0,
            time.time() + 60,
            pool=pool,
        )
        assert isinstance(p, ForkedShim) and p.done_fd is not None
        sent = b""
        while chunk := os.read(p.done_fd, 4096):  # until every writer is gone
            sent += chunk
        assert json.loads(sent) == json.loads((adir / "exit.json").read_text())
        assert json.loads(sent)["exit_code"] == 3
        assert (adir / "stdout.jsonl").read_text().split() == ["0", "1", "2"]
        os.close(p.done_fd)
    finally:
        pool.close()


async def test_the_runner_takes_a_pooled_shims_exit_record_from_its_done_pipe(tmp_path: Path) -> None:
    """No file read between an agent's end and its slot's next start: the exit record comes
    with the pipe's close (here the file is gone before the runner looks, and it still knows)."""
    from fleet_tui.coders.base import get_coder
    from fleet_tui.scheduler.procs.runner import AttemptRunner, RunLimits

    pool = ShimPool()
    pool.fill()
    try:
        adir = tmp_path / "a"
        p = spawn_shim(adir, tmp_path, ["sh", "-c", "exit 3"], _env(), None, 1.0, time.time() + 60, pool=pool)
        assert isinstance(p, ForkedShim)
        _wait(lambda: (adir / "exit.json").exists() and p.poll() is not None, "the shim to end")
        (adir / "exit.json").unlink()

        async def sink(events: object, offset: int) -> None:
            pass

        runner = AttemptRunner(
            task_id="t", attempt=1, attempt_dir=adir, coder=get_coder("shell"),
            limits=RunLimits(stall_s=None, timeout_s=None), popen=p, sink=sink,
        )  # fmt: skip
        result = await runner.run()
        assert (result.exit_code, result.exit_reason) == (3, "exited")
    finally:
        pool.close()


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no session scheduling groups here")
def test_a_fleets_agents_share_one_niced_scheduling_group(tmp_path: Path) -> None:
    """Where sessions are scheduling groups (autogroup), the CPU is shared between sessions
    first and a process's own niceness only weighs inside its session. Every agent of a pool is
    in one session (the server's), in a process group of its own, and that group is niced: the
    whole fleet weighs as one niced program against ours, however many agents run."""
    pool = ShimPool(nice=7)  # an engine's pool runs at its agents' niceness
    pool.fill()
    try:
        cmd = "cat /proc/self/autogroup; awk '{print $19, $5, $6}' /proc/$$/stat; sleep 60"
        shims = []
        for name in ("a", "b", "c"):
            adir = tmp_path / name
            p = spawn_shim(
                adir, tmp_path, ["sh", "-c", cmd], _env(), None, 0.5, time.time() + 60, pool=pool, nice=7
            )
            assert isinstance(p, ForkedShim)
            shims.append((adir, p))
        for adir, _ in shims:
            _wait(lambda adir=adir: len(_text(adir / "stdout.jsonl").splitlines()) == 2, "the agent's lines")
        seen = [(adir / "stdout.jsonl").read_text().splitlines() for adir, _ in shims]
        groups = {group for group, _ in seen}
        assert len(groups) == 1, groups  # one scheduling group for the three of them
        (group,) = groups
        assert group.endswith(" nice 7"), group
        assert group != Path("/proc/self/autogroup").read_text().strip()  # not ours
        for (adir, _), (_, own) in zip(shims, seen, strict=True):
            nice, pgrp, sid = (int(x) for x in own.split())
            # written once the agent runs, so it can come after the agent's first lines
            _wait(lambda adir=adir: "agent_pid" in (read_json(adir / "shim.json") or {}), "the shim's record")
            shim = read_json(adir / "shim.json")
            assert shim is not None
            assert nice == 7
            # each agent a process group of its own: a kill or a pause hits it alone
            assert pgrp == shim["agent_pid"]
            assert pool.server is not None and sid == pool.server.pid
    finally:
        _stop(shims, pool)


def test_a_server_started_from_a_niced_thread_runs_at_its_agents_niceness_not_above(tmp_path: Path) -> None:
    """The cockpit's engine thread runs niced (app/hosted.py), and the server it starts inherits
    that: the agents' niceness is a target, not a step on top of it (5 + 3 would be 8)."""

    def start() -> ShimPool:
        pool = ShimPool(nice=5)
        pool.fill()
        return pool

    pool = in_a_niced_thread(3, start)
    try:
        assert pool.server is not None
        server = pool.server.pid
        _wait(lambda: os.getpriority(os.PRIO_PROCESS, server) == 5, "the server at niceness 5")
        adir = tmp_path / "a"
        spawn_shim(
            adir, tmp_path, ["sh", "-c", "awk '{print $19}' /proc/$$/stat"], _env(), None, 0.5,
            time.time() + 60, pool=pool, nice=5,
        )  # fmt: skip
        _wait(lambda: _text(adir / "stdout.jsonl").strip(), "the agent's niceness")
        assert int((adir / "stdout.jsonl").read_text()) == 5
    finally:
        pool.close()


def test_the_server_runs_at_its_agents_niceness_and_starts_again_at_a_new_one(tmp_path: Path) -> None:
    """The server (forking the next shim, making spare folders) and its waiting shims run at the
    agents' niceness: at 0 they outweighed the agent just started. A job asking for another
    niceness (agent_nice changed under a running engine) is started on its own at it, and the
    server again at the new niceness, for the jobs after it."""
    pool = ShimPool(nice=3)
    pool.fill()
    shims = []
    try:
        assert pool.server is not None
        first = pool.server.pid
        _wait(lambda: os.getpriority(os.PRIO_PROCESS, first) == 3, "the server at niceness 3")

        def spawn(name: str, nice: int) -> ShimProcess:
            adir = tmp_path / name
            p = spawn_shim(
                adir, tmp_path, ["sh", "-c", "awk '{print $19}' /proc/$$/stat; sleep 60"], _env(), None, 0.5,
                time.time() + 60, pool=pool, nice=nice,
            )  # fmt: skip
            shims.append((adir, p))
            _wait(lambda: _text(adir / "stdout.jsonl").strip(), "the agent's niceness")
            assert int((adir / "stdout.jsonl").read_text()) == nice
            return p

        assert isinstance(spawn("same", 3), ForkedShim)
        assert not isinstance(spawn("lower", 1), ForkedShim)  # on its own: a forked one stays at 3
        assert pool.server is not None and pool.server.pid != first
        assert pool.nice == 1
        server = pool.server.pid
        _wait(lambda: os.getpriority(os.PRIO_PROCESS, server) == 1, "the new server at niceness 1")
        assert isinstance(spawn("next", 1), ForkedShim)
    finally:
        _stop(shims, pool)
