"""Helper programs owned like agents: setup commands, verifiers, reviewers, merges.

Every program fleet-tui starts besides an agent goes through ``run_owned``: it runs under the
keeper (keeper.py), so its whole process tree dies when the engine dies (``kill -9`` included),
when it times out, or when the task is killed, cancelled or the engine shuts down (``cancel``,
a ``threading.Event`` the caller sets). Output goes through files, so a grandchild that keeps a
pipe open cannot hang us. While it runs, a pid file under ``<home>/children`` names it;
``reap_stale`` (called when an engine starts and when it adopts) kills the trees whose keeper
is gone, which only a ``kill -9`` of the keeper itself can leave behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from fleet_tui.scheduler.private import user_umask
from fleet_tui.scheduler.procs import proctree
from fleet_tui.scheduler.procs.attemptdir import read_json, read_shim

OUTPUT_CAP = 256 * 1024


@dataclass(frozen=True)
class OwnedResult:
    """How a child process the fleet owns (a verifier, git) ended, with its output."""

    exit_code: int | None  # None when it timed out or was cancelled
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    cancelled: bool = False
    pid: int = 0  # the keeper's pid: the process group of the program and its children


def children_dir(home: Path | None) -> Path | None:
    return None if home is None else Path(home) / "children"


def _tail(fh: IO[bytes], cap: int) -> bytes:
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(0, size - cap))
    return fh.read()


def run_owned(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout_s: float | None = None,
    cancel: threading.Event | None = None,
    home: Path | None = None,
    grace_s: float = 5.0,
    merge_stderr: bool = False,
    cap: int = OUTPUT_CAP,
    own_umask: bool = False,
    nice: int = 0,
) -> OwnedResult:
    """Run ``argv`` under a keeper and wait for it (blocking: call it from a worker thread, which
    stays alive while the program runs — the kernel's parent-death signal watches that thread).

    The program gets the user's umask, unless ``own_umask`` (a host such as the shim, whose own
    files stay private and which sets the user's umask for what it starts), and runs at niceness
    ``nice`` (its session's scheduling group too; 0 leaves it as it is).

    Raises OSError when the keeper cannot start (a missing ``cwd``)."""
    pidfile = ""
    cdir = children_dir(home)
    if cdir is not None:
        try:
            cdir.mkdir(parents=True, exist_ok=True)
            pidfile = str(cdir / f"{os.getpid()}-{os.urandom(4).hex()}.json")
        except OSError:
            pidfile = ""
    keeper = [
        sys.executable,
        "-I",
        "-m",
        "fleet_tui.scheduler.procs.keeper",
        str(os.getpid()),
        str(grace_s),
        pidfile,
        ""
        if own_umask
        else oct(user_umask()),  # fleet-tui's own files are private; the command's are the user's
        str(max(0, nice)),
        "--",
        *argv,
    ]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
        if stdin is not None:
            inp.write(stdin)
            inp.seek(0)
        p = subprocess.Popen(
            keeper,
            cwd=str(cwd),
            env=env,
            stdin=inp if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=out if merge_stderr else err,
            start_new_session=True,
            close_fds=True,
        )
        timed_out = cancelled = False
        try:
            waited = 0.0
            while True:
                try:
                    p.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    waited += 0.1
                if cancel is not None and cancel.is_set():
                    cancelled = True
                elif timeout_s is not None and waited >= timeout_s:
                    timed_out = True
                if cancelled or timed_out:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(timeout=grace_s + 5)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                    break
        finally:
            if p.poll() is None:  # an exception above: never leave it behind
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=grace_s + 5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        code = None if (timed_out or cancelled) else p.returncode
        return OwnedResult(code, _tail(out, cap), _tail(err, cap), timed_out, cancelled, p.pid)


def _kill_tree(pid: int, ticks: int | None) -> int:
    """Kill the process group led by ``pid`` (members started after it) and the descendants of
    them all (a member that is a subreaper, such as a shim, holds its agent's session)."""

    def find() -> list[proctree.Proc]:
        procs = proctree.group_members(pid, since_ticks=ticks)
        roots = [p for p, _ in procs if p != pid]
        if proctree.alive(pid, ticks):  # a reused pid's children are not ours
            roots.append(pid)
        procs += proctree.descendants(0, *roots)
        return [(p, t) for p, t in dict(procs).items() if p != os.getpid() and proctree.alive(p, t)]

    return proctree.kill_tree(find, 0)


def reap_stale(home: Path) -> int:
    """Kill the helper trees whose keeper is gone (a ``kill -9`` of the keeper); returns how many
    processes were killed. A live keeper means a live owner: its entry is left alone."""
    cdir = children_dir(home)
    if cdir is None or not cdir.is_dir():
        return 0
    killed = 0
    for f in cdir.glob("*.json"):
        info = read_json(f)
        if info is None:
            continue
        if proctree.alive(int(info.get("keeper_pid") or 0), info.get("keeper_ticks")):
            continue
        killed += _kill_tree(int(info.get("keeper_pid") or 0), info.get("keeper_ticks"))
        f.unlink(missing_ok=True)
    return killed


#: how long ``reap_attempt`` waits for a shim known to be ending to be gone
DYING_S = 2.0


def reap_attempt(attempt_dir: Path, dying_s: float = 0.0) -> int:
    """Kill what a dead shim left of its agent (``shim.json``: pid + start time) before the attempt
    is started again: the agent's process group and its descendants. Returns how many died.

    ``dying_s``: the caller saw the shim end (its done pipe closed without an exit record), so
    wait up to that long for it to be gone. A killed process closes its files, and so wakes its
    supervisor, before the kernel marks it a zombie; a niced shim can be preempted in between by
    the supervisor it just woke, which then found it "alive", left its agent running and started
    the next attempt beside it (seen once in CI)."""
    info = read_shim(attempt_dir)
    if info is None:
        return 0
    deadline = time.monotonic() + dying_s
    while proctree.alive(info.pid, info.start_ticks):
        if time.monotonic() >= deadline:
            return 0  # the shim still owns it
        time.sleep(0.005)
    if not info.agent_pid:
        return 0
    return _kill_tree(info.agent_pid, info.agent_start_ticks)
