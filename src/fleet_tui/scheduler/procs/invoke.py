"""One way to run a coder: its command goes to a shim, for attempts and reviewers alike.

Why it exists: an agent process is only ever started by the shim (shim.py), which records it in
``shim.json``, writes its output to ``stdout.jsonl``/``stderr.log`` and its end to ``exit.json``,
fences it with the ``lease`` file and kills its whole tree. ``Invocation`` is what to run (argv,
environment, stdin, working directory, attempt directory); ``shim_command`` prepares the attempt
directory and builds the shim's command line. It is then started one of two ways:

- ``start``: an attempt. The shim runs detached (forked by a pool's server, in the server's
  session: the fleet's one scheduling group; without a server, in a session of its own), so it
  outlives a crashed engine that a restarted one adopts it back from.
- ``run``: a reviewer (or any one-off run whose result is waited for). The same shim is hosted by
  a keeper (owned.py), so it dies with its owner, on a timeout or on a cancel; the call blocks
  until it ended and returns what the shim recorded.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fleet_tui.scheduler.private import user_umask
from fleet_tui.scheduler.procs import attemptdir, spares
from fleet_tui.scheduler.procs import shim as shimmod
from fleet_tui.scheduler.procs.attemptdir import ExitInfo, ShimInfo
from fleet_tui.scheduler.procs.owned import run_owned

SHIM_PATH = str(Path(shimmod.__file__).resolve())
#: the shim runs as an imported module (its bytecode is cached; a script is compiled every time)
#: from its own folder, without site-packages: python starts in milliseconds
SHIM_BOOT = (
    f"import sys; sys.path.insert(0, {str(Path(SHIM_PATH).parent)!r}); import shim; sys.exit(shim.main())"
)


@dataclass(frozen=True)
class Invocation:
    """A coder's command, ready for a shim: what runs, with what, where, and where its files go."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    stdin: bytes | None
    workdir: Path
    attempt_dir: Path
    #: a file that already holds ``stdin`` (the prompt file, for a coder that reads its prompt
    #: on stdin): handed to the agent as it is instead of being written again
    stdin_file: Path | None = None


@dataclass(frozen=True)
class Ran:
    """What a waited-for run left: the shim's records and how the wait ended."""

    exit: ExitInfo | None  # None: the shim left no exit record (it was killed)
    shim: ShimInfo | None
    timed_out: bool = False
    cancelled: bool = False
    host_pid: int = 0  # the keeper's pid: the process group of the shim


def environment(
    fleet: Mapping[str, str],
    *layers: Mapping[str, str],
    drop: Iterable[str] = (),
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """An agent's environment: ``base`` (this process's) without ``drop``, then the ``FLEET_*``
    variables, then each layer (the task's ``env``, then the coder's) over the one before."""
    dropped = set(drop)
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in dropped}
    env.update(fleet)
    for layer in layers:
        env.update(layer)
    return env


def shim_args(
    attempt_dir: Path,
    workdir: Path,
    argv: list[str],
    stdin_file: Path | None,
    grace_s: float,
    nice: int = 0,
    lease_until: float | None = None,
) -> list[str]:
    """The shim's command line (after the interpreter) for one agent; ``lease_until``: the
    first lease, which the shim writes once its agent runs (unless its supervisor was first)."""
    args = [
        "--dir",
        str(attempt_dir),
        "--cwd",
        str(workdir),
        "--grace",
        str(grace_s),
        "--lease-file",
        str(attempt_dir / attemptdir.LEASE),
    ]
    if stdin_file is not None:
        args += ["--stdin-file", str(stdin_file)]
    if nice > 0:
        args += ["--nice", str(nice)]
    if lease_until is not None:
        args += ["--lease-until", f"{lease_until:.3f}"]
    args += ["--umask", oct(user_umask())]  # fleet-tui's files are private; the agent's are the user's
    return [*args, "--", *argv]


def shim_command(inv: Invocation, grace_s: float, lease_deadline: float, nice: int = 0) -> list[str]:
    """Prepare ``inv``'s attempt directory (its stdin file) and return the shim's arguments for
    it (the shim writes the first lease: one file less before the agent starts)."""
    adir = inv.attempt_dir
    adir.mkdir(parents=True, exist_ok=True)
    stdin_file = inv.stdin_file
    if stdin_file is None and inv.stdin is not None:
        stdin_file = adir / attemptdir.STDIN
        stdin_file.write_bytes(inv.stdin)
    return shim_args(adir, inv.workdir, list(inv.argv), stdin_file, grace_s, nice, lease_deadline)


class ShimProcess(Protocol):
    """What the engine holds of a started shim: a ``subprocess.Popen`` or a ``ForkedShim``."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


class ForkedShim:
    """A shim forked by the pool's server (not a child of this process): watched through /proc."""

    def __init__(self, pid: int, start_ticks: int | None, done_fd: int | None = None) -> None:
        self._pid = pid
        self.start_ticks = start_ticks
        self.returncode: int | None = None
        #: readable (at its end) once the shim wrote its exit record, or died: its supervisor
        #: (the runner) waits on it and closes it
        self.done_fd = done_fd

    @property
    def pid(self) -> int:
        return self._pid

    def poll(self) -> int | None:
        """None while it runs; 0 once it ended (its server reaps it and keeps the status)."""
        if self.returncode is None and not shimmod.alive(self._pid, self.start_ticks):
            self.returncode = 0
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except OSError:
                pass


class ShimPool:
    """A fork server for shims, started ahead of time (interpreter up, modules imported). It
    forks shims before they are needed, each waiting for its job on a pipe of its own, and hands
    each pipe's writing end to this process over a Unix socket: starting an agent then costs a
    pipe write, with no round trip to the server (the fork, about a millisecond, and the shim's
    first steps happen while the agents run; a new interpreter would cost ten or more, in CPU as
    much as in time). When this process dies the socket and the pipes close: the server and its
    waiting shims exit, the shims that took a job live on. When the server is gone,
    ``spawn_shim`` starts the shim directly.

    The server runs in a session of its own, and its shims and their agents stay in it (each in
    a process group of its own): where the kernel shares the CPU between sessions first
    (autogroup), the whole fleet is one scheduling group, niced to the agents' niceness, and
    weighs against the cockpit and the user's other programs as one program, not one per
    agent.

    The server runs at the agents' niceness (``nice``), and so does every shim it forks: inside
    the fleet's group the server (forking the next shim, making spare folders) at niceness 0
    outweighed 3:1 the agent just started at 5, which needs neither (200 x ``sleep 0.1`` at 4
    slots: 5.67-5.74 s against 5.76-5.84 s, paired runs). A shim asked for another niceness than
    the server's (``agent_nice`` changed under a running engine) is started directly, and the
    server is started again at the new niceness."""

    #: shims forked ahead of their jobs, at the least: slots freed together need not wait for a
    #: fork. An engine's pool keeps one per slot, up to ``AHEAD_MOST`` (``for_home``)
    AHEAD = 2
    AHEAD_MOST = 8
    ANSWER_S = 60.0  # no waiting shim from the server, or no job read by one, within this: given up

    def __init__(
        self, ahead: int = AHEAD, spare_root: str | None = None, spares: int = 0, nice: int = 0
    ) -> None:
        #: how many shims the server keeps forked ahead of their jobs
        self.ahead = max(1, ahead)
        #: the niceness the server, and so every shim it forks, runs at: the agents'
        self.nice = nice
        #: where the server keeps ``spares`` attempt folders ready (spares.py); None: it keeps none
        self.spare_root = spare_root
        self.spares = spares
        self.server: subprocess.Popen[bytes] | None = None
        self.closed = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    @classmethod
    def for_home(cls, home: Path, max_concurrent: int, nice: int = 0) -> ShimPool:
        """The pool an engine on ``home`` runs its attempts with (its server keeps two spare
        attempt folders per slot ready, up to ``spares.MOST``), at the agents' niceness ``nice``,
        not started yet (``fill``). One per slot ran out under short tasks: the server makes
        them in rounds (``SPARES_AFTER_S`` after a start), and 4 slots of `true` took 37 % of
        their attempts' folders while none was ready (6 % with two per slot).

        Its server keeps a shim forked ahead per slot (at least ``AHEAD``, at most
        ``AHEAD_MOST``): with two for 4 slots of `true`, a start waited more than a millisecond
        for the server's next fork in 37-50 of 200 (the server runs niced, behind the agents);
        with four, 23-31 did, and 200 attempts took 1.31-1.63 s against 1.56-1.74 s (in turn)."""
        return cls(
            nice=nice,
            ahead=min(max(cls.AHEAD, max_concurrent), cls.AHEAD_MOST),
            spare_root=str(home / spares.SPARE_DIR),
            spares=min(2 * max_concurrent, spares.MOST),
        )

    def fill(self) -> None:
        with self._lock:
            if self.closed or (self.server is not None and self.server.poll() is None):
                return
            self._let_go()
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            cmd = [sys.executable, "-I", "-S", "-c", SHIM_BOOT, "--zygote", str(self.ahead), str(self.nice)]
            if self.spare_root is not None and self.spares > 0:
                cmd += [self.spare_root, str(self.spares)]
            try:
                self.server = subprocess.Popen(
                    cmd,
                    stdin=theirs.fileno(),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                )
            except BaseException:
                mine.close()
                raise
            finally:
                theirs.close()
            self._sock = mine

    def _let_go(self) -> None:
        """Drop a server that is gone (its socket; the shims it forked ahead exit with it)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _waiting(self) -> tuple[int, int, int, int] | None:
        """A shim forked ahead: ``(pid, start ticks, its job pipe, its done pipe)``; None when
        the server is gone or sends none in time."""
        sock, p = self._sock, self.server
        if sock is None or p is None:
            return None
        deadline = time.monotonic() + self.ANSWER_S
        while not select.select([sock], [], [], 1.0)[0]:
            if p.poll() is not None or time.monotonic() > deadline:
                return None
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 64, 2, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return None
        try:
            pid, ticks = (int(x) for x in msg.split())
            job_w, done_r = fds
        except ValueError:
            for fd in fds:
                os.close(fd)
            return None
        return pid, ticks, job_w, done_r

    def spawn(self, args: list[str], env: dict[str, str], nice: int = 0) -> ForkedShim | None:
        """A shim forked by the server for these shim arguments, or None (start it directly)."""
        frame = shimmod.encode_job(args, env)
        with self._lock:
            p = self.server
            if p is None or self._sock is None or p.poll() is not None:
                return None
            if nice != self.nice:  # its shims cannot lower theirs: a new server, at this one
                self.nice = nice
                self._drop(p)
                return None
            for _ in range(self.ahead + 1):
                got = self._waiting()
                if got is None:  # the server is gone: start this one directly, and a new server
                    self._drop(p)
                    return None
                pid, ticks, job_w, done_r = got
                taken = _hand_over(job_w, frame, self.ANSWER_S)
                with contextlib.suppress(OSError):  # the next one (after: its fork must not
                    self._sock.send(b"n")  # take a core from this shim's first steps)
                if taken:
                    return ForkedShim(pid, ticks or None, done_r)
                os.close(done_r)
                # that shim died before it took the job (someone killed it): the next one
            return None

    def _drop(self, p: subprocess.Popen[bytes]) -> None:
        """Be done with server ``p`` (under the lock): the next ``fill`` starts a new one."""
        p.kill()
        self.server = None
        self._let_go()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            p, self.server = self.server, None
            self._let_go()
        if p is None:
            return
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def _hand_over(job_w: int, frame: bytes, timeout_s: float) -> bool:
    """A job (``encode_job``) to a shim waiting on its pipe; False (nothing taken: a job read in
    part is never run) when the shim is gone, or reads nothing within ``timeout_s``."""
    data = frame
    deadline = time.monotonic() + timeout_s
    try:
        os.set_blocking(job_w, False)
        while data:
            try:
                data = data[os.write(job_w, data) :]
            except BlockingIOError:  # a job larger than the pipe: the shim reads it as it comes
                if time.monotonic() > deadline:
                    return False
                select.select([], [job_w], [], 1.0)
        return True
    except OSError:
        return False
    finally:
        os.close(job_w)


def start(
    inv: Invocation,
    *,
    grace_s: float,
    lease_deadline: float,
    pool: ShimPool | None = None,
    nice: int = 0,
) -> ShimProcess:
    """Start an attempt's shim away from this process's session (forked by the pool's server,
    in the server's session, when there is one; else in a session of its own); it survives this
    process, which renews its lease while it supervises it."""
    args = shim_command(inv, grace_s, lease_deadline, nice)
    env = dict(inv.env)
    forked = pool.spawn(args, env, nice) if pool is not None else None
    if forked is not None:
        return forked
    log = open(inv.attempt_dir / attemptdir.SHIM_LOG, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", SHIM_BOOT, *args],
            cwd=str(inv.workdir),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()
        if pool is not None:
            pool.fill()  # the server died: a new one for the next attempt


def run(
    inv: Invocation,
    *,
    timeout_s: float | None,
    cancel: threading.Event | None = None,
    home: Path | None = None,
    grace_s: float = 5.0,
    nice: int = 0,
) -> Ran:
    """Run ``inv`` under a shim hosted by a keeper and wait for it (blocking: call it from a
    worker thread). Its whole tree is stopped on a timeout, on ``cancel`` and when this process
    dies; nothing renews the lease, which runs until well after the timeout as a last fence.

    Raises OSError when the keeper cannot start (a missing working directory)."""
    far = (timeout_s if timeout_s is not None else 24 * 3600.0) + grace_s + 60.0
    args = shim_command(inv, grace_s, time.time() + far, nice)  # the agent (and its session) niced
    r = run_owned(
        [sys.executable, "-I", "-S", "-c", SHIM_BOOT, *args],
        cwd=inv.workdir,
        env=dict(inv.env),
        timeout_s=timeout_s,
        cancel=cancel,
        home=home,
        grace_s=grace_s + 2.0,  # the shim's own grace first, so it can still record the end
        merge_stderr=True,
        own_umask=True,  # the shim's files are private; it gives the agent the user's umask
    )
    if r.stdout:
        with open(inv.attempt_dir / attemptdir.SHIM_LOG, "ab") as log:
            log.write(r.stdout)
    return Ran(
        exit=attemptdir.read_exit(inv.attempt_dir),
        shim=attemptdir.read_shim(inv.attempt_dir),
        timed_out=r.timed_out,
        cancelled=r.cancelled,
        host_pid=r.pid,
    )
