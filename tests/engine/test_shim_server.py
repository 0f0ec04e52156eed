"""The shim fork server (runner.ShimPool): shims forked from one warm process behave like shims
started on their own: each runs its job in the attempt's folder with the job's environment, in a
session of its own, records its exit, and outlives the server and the process that asked for it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from fleet_tui.scheduler.procs import shim
from fleet_tui.scheduler.procs.invoke import ForkedShim, ShimPool
from fleet_tui.scheduler.procs.runner import read_json, spawn_shim

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
    finally:
        pool.close()


def test_a_forked_shim_outlives_its_server_and_stops_on_request(tmp_path: Path) -> None:
    pool = ShimPool()
    pool.fill()
    adir = tmp_path / "a"
    p = spawn_shim(adir, tmp_path, ["sleep", "60"], _env(), None, 1.0, time.time() + 60, pool=pool)
    try:
        assert isinstance(p, ForkedShim)
        _wait(lambda: "agent_pid" in (read_json(adir / "shim.json") or {}), "the agent")
        assert os.getsid(p.pid) == p.pid  # a session of its own: terminal signals miss it
        server = pool.server
        pool.close()  # the engine goes away: its server exits, the shim and its agent stay
        assert server is not None and server.poll() is not None
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
