"""The per-attempt agent host process: it owns the agent so nothing is ever orphaned.

The supervisor starts one shim per attempt (``python -I shim.py --dir ATTEMPT_DIR ... -- ARGV``)
away from its own session and process group (forked by the pool's server, in the server's
session; or, without a server, in a session of its own), so the shim outlives a supervisor that
crashes and a terminal's signals miss it. The shim:

- makes itself a child subreaper, so grandchildren that escape with ``setsid`` are re-parented
  to it and can still be found and killed;
- starts the agent in a process group of its own, stdin from a file or /dev/null, in the shim's
  session: every agent forked through one server shares that session, and so the kernel's
  scheduling group for it (autogroup), niced to the agents' niceness: a fleet weighs against the
  user's other programs as one niced program, not as one full share per agent;
- writes the agent's raw stdout to ``stdout.jsonl`` and stderr to ``stderr.log`` (never lost,
  can be re-normalized) and, at the end, its exit status to ``exit.json`` (atomically);
- on SIGTERM (a stop request) sends SIGTERM to the agent's group, waits the grace period,
  SIGKILLs the group, then kills every remaining descendant (checking each pid's start time so a
  reused pid is never hit);
- fences itself: it stops the agent when the deadline in the ``lease`` file passes, i.e. when no
  supervisor has refreshed it, which happens before the store's lease expires — so a task
  reclaimed elsewhere never has two live agents;
- records its own pid and start time in ``shim.json`` so a restarted supervisor can adopt it.

Standard library only, and only modules that are cheap to import (no argparse, json, re, enum or
dataclasses: they cost more than the interpreter's own startup): it starts in a few milliseconds.
Its two siblings follow the same rule and are imported bare when it runs from this folder:
``attemptfiles`` (the attempt directory's file names and writers; ``attemptdir`` reads them back,
typed) and ``proctree`` (walking and killing process trees).
"""

from __future__ import annotations

import os
import select

try:  # the C module: `signal` itself imports enum, which costs more than the interpreter's startup
    import _signal as signal
except ImportError:  # pragma: no cover - not CPython
    import signal
import sys
import time

try:
    from . import attemptfiles as files
    from . import proctree, spares
except ImportError:  # run as a bare module from this folder (invoke.SHIM_BOOT): no package
    import attemptfiles as files  # type: ignore[no-redef]
    import proctree  # type: ignore[no-redef]
    import spares  # type: ignore[no-redef]

# the shim's helpers, under the names other code and tests know them by
alive = proctree.alive
descendants = proctree.descendants
proc_start_ticks = proctree.proc_start_ticks
dump_json = files.dump_json
write_json = files.write_json


class Shim:
    def __init__(self, args: Args) -> None:
        self.dir: str = args.dir
        self.grace: float = args.grace
        self.lease_file: str | None = args.lease_file
        self.lease_until: float | None = args.lease_until
        self.argv: list[str] = args.argv
        self.env: dict[str, str] = args.env if args.env is not None else dict(os.environ)
        self.cwd: str = args.cwd
        self.stdin_file: str | None = args.stdin_file
        self.nice: int = args.nice
        self.umask: int | None = args.umask
        self.stop_requested = False
        self.stop_reason = files.EXITED
        self.pid = os.getpid()
        self.agent_pid: int | None = None
        self.agent_status: int | None = None
        #: a pipe only this shim writes to: closed once exit.json is written, so its supervisor
        #: hears of the end at once (not after the whole process is torn down)
        self.done_fd: int | None = None

    def reap_zombies(self) -> None:
        proctree.reap_children(self._reaped)

    def _reaped(self, pid: int, status: int) -> None:
        if pid == self.agent_pid:
            self.agent_status = status

    def kill_tree(self, pgid: int | None) -> int:
        """TERM the agent's group, wait the grace, KILL the group, KILL every descendant."""
        return proctree.kill_tree(
            lambda: proctree.tree(self.pid), self.grace, pgid=pgid, reap=self.reap_zombies
        )

    def run(self) -> int:
        proctree.become_subreaper()
        started_at = time.time()
        shim_json = os.path.join(self.dir, files.SHIM_JSON)

        def on_term(signum: int, frame: object) -> None:
            self.stop_requested = True
            self.stop_reason = files.STOPPED

        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

        out_fd = os.open(os.path.join(self.dir, files.STDOUT), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        err_fd = os.open(os.path.join(self.dir, files.STDERR), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        in_fd = os.open(self.stdin_file or os.devnull, os.O_RDONLY)
        try:
            # posix_spawn (vfork+exec) is several times faster than fork+exec from Python; the
            # agent gets a process group of its own (in the shim's session: the fleet's one
            # scheduling group), default signal handlers and the shim's cwd.
            os.chdir(self.cwd)
            if self.nice > 0:  # the agent inherits it; the shim only waits
                # a shim forked by the pool's server has it already: the server runs at it
                proctree.nice_at_least(self.nice)
                # its session's scheduling group too, where the kernel has them: the fleet's,
                # shared by every agent of the server. Before the agent starts, not after: an
                # agent that started first ran its first steps at the group's old niceness
                proctree.set_autogroup_nice(os.getpid(), self.nice)
            # fleet-tui's own files are private; the agent gets the user's umask for its work
            own_umask = os.umask(self.umask) if self.umask is not None else None
            pid = os.posix_spawnp(
                self.argv[0],
                self.argv,
                self.env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, in_fd, 0),
                    (os.POSIX_SPAWN_DUP2, out_fd, 1),
                    (os.POSIX_SPAWN_DUP2, err_fd, 2),
                ],
                setpgroup=0,
                setsigdef=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE),
            )
            if own_umask is not None:
                os.umask(own_umask)
        except (OSError, ValueError) as e:  # ValueError: a NUL byte in an argument or variable
            os.write(err_fd, f"fleet-tui shim: cannot start {self.argv[0]!r}: {e}\n".encode())
            self.record_exit(files.exit_record(127, None, files.SPAWN_FAILED, time.time(), error=str(e)))
            return 1
        os.close(in_fd)
        os.close(out_fd)
        os.close(err_fd)
        self.agent_pid = pid
        if self.lease_file and self.lease_until is not None:  # the first lease: after the agent
            files.first_lease(self.lease_file, self.lease_until)
        # the exit record's space, set aside before the agent could have filled the disk (it
        # has barely started); after it, not before: one file creation less before it starts
        files.reserve_exit(self.dir)
        # written once the agent runs (its supervisor knows the shim's pid from its start, and a
        # supervisor that adopts it needs the agent's too): one file write before the agent less
        ticks, agent_ticks = proctree.proc_start_ticks(self.pid), proctree.proc_start_ticks(pid)
        files.write_json(shim_json, files.shim_record(self.pid, ticks, started_at, pid, agent_ticks))

        try:
            pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        status: int | None = None
        last_lease_check = 0.0
        unreadable = 0
        while status is None:
            if self.stop_requested:
                break
            fds = [wake_r] if pidfd is None else [pidfd, wake_r]
            ready, _, _ = select.select(fds, [], [], 0.5 if pidfd is not None else 0.02)
            if wake_r in ready:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
            if self.stop_requested:
                break
            try:
                wpid, wstatus = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                wpid, wstatus = pid, 0
            if wpid == pid:
                status = wstatus
                break
            self.reap_zombies()
            now = time.time()
            if self.lease_file and now - last_lease_check >= 0.5:
                last_lease_check = now
                deadline = files.read_deadline(self.lease_file)
                # a lease file that stays unreadable (its home was deleted) counts as expired:
                # nobody can renew it, so nobody supervises this agent
                unreadable = unreadable + 1 if deadline is None else 0
                if (deadline is not None and now > deadline) or unreadable >= 6:
                    self.stop_requested = True
                    self.stop_reason = files.LEASE_EXPIRED
        killed = 0
        if status is None:  # stop requested or lease expired: the agent is still alive
            killed = self.kill_tree(pid)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                status = self.agent_status
        else:
            # the agent exited; anything it left behind must not outlive the attempt
            if proctree.has_children(self.pid):
                killed = self.kill_tree(None)
        exit_code = sig = None
        if status is not None:
            if os.WIFEXITED(status):
                exit_code = os.WEXITSTATUS(status)
            elif os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                exit_code = 128 + sig
        self.record_exit(files.exit_record(exit_code, sig, self.stop_reason, time.time(), killed))
        return 0

    def record_exit(self, record: dict[str, object]) -> None:
        """The exit record, to ``exit.json`` and, for a shim from the pool, down its done pipe,
        which then closes: the supervisor has it from the pipe it waits on, with no file to read
        between an agent's end and the next agent's start (a file written first, so a record
        in the pipe is always on disk too: an engine that adopts the attempt reads the file).
        One write of at most ``PIPE_BUF`` bytes reaches the reader whole or not at all; a
        longer record (a long error) goes by the file only."""
        text = files.write_exit(self.dir, record)
        if self.done_fd is None:
            return
        try:
            if len(text) <= select.PIPE_BUF:
                os.write(self.done_fd, text)
        except OSError:  # the supervisor went away: it reads the file, or its adopter does
            pass
        os.close(self.done_fd)
        self.done_fd = None


class Args:
    """The shim's command line: --dir D --cwd C [--grace S] [--lease-file F] [--stdin-file F] -- ARGV."""

    def __init__(self, argv: list[str]) -> None:
        self.dir = ""
        self.cwd = ""
        self.grace = 5.0
        self.lease_file: str | None = None
        self.lease_until: float | None = None
        self.stdin_file: str | None = None
        self.nice = 0
        self.umask: int | None = None
        self.argv: list[str] = []
        self.env: dict[str, str] | None = None
        i = 0
        while i < len(argv):
            a = argv[i]
            if a == "--":
                self.argv = argv[i + 1 :]
                break
            if i + 1 >= len(argv):
                raise SystemExit(f"fleet-tui shim: {a} needs a value")
            v = argv[i + 1]
            if a == "--dir":
                self.dir = v
            elif a == "--cwd":
                self.cwd = v
            elif a == "--grace":
                self.grace = float(v)
            elif a == "--lease-file":
                self.lease_file = v
            elif a == "--lease-until":
                self.lease_until = float(v)
            elif a == "--stdin-file":
                self.stdin_file = v
            elif a == "--nice":
                self.nice = int(v)
            elif a == "--umask":
                self.umask = int(v, 8)
            else:
                raise SystemExit(f"fleet-tui shim: unknown option {a}")
            i += 2
        if not self.dir or not self.cwd or not self.argv:
            raise SystemExit("usage: shim.py --dir D --cwd C [--grace S] [--lease-file F] -- ARGV...")


def _read_exact(fd: int, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def read_frame(fd: int = 0) -> bytes:
    """One job's body as written by :func:`encode_job` (its length line read, not kept). A shim's
    job pipe carries one job, so what comes with the length line is the start of its body."""
    head = bytearray()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            raise EOFError
        head += chunk
        nl = head.find(b"\n")
        if 0 <= nl <= 20:
            break
        if nl > 20 or len(head) > 20:
            raise ValueError("not a job's length line")
    line, _, body = bytes(head).partition(b"\n")
    n = int(line)
    if len(body) > n:
        raise ValueError("more than one job in the pipe")
    return body + _read_exact(fd, n - len(body))


def read_job(fd: int = 0) -> tuple[list[str], dict[str, str]]:
    """A warm shim's job as written by :func:`encode_job`."""
    return decode_job(read_frame(fd))


def _fields(body: bytes) -> list[str]:
    """``<length>\n<bytes>`` fields, one after another: a value is its bytes, whatever they hold."""
    out: list[str] = []
    i = 0
    while i < len(body):
        nl = body.index(b"\n", i)
        n = int(body[i:nl])
        if n < 0 or nl + 1 + n > len(body):
            raise ValueError("truncated job")
        out.append(body[nl + 1 : nl + 1 + n].decode("utf-8", "surrogateescape"))
        i = nl + 1 + n
    return out


def decode_job(body: bytes) -> tuple[list[str], dict[str, str]]:
    """The body of a job: the argv count, the argv, then env keys and values, each a field."""
    fields = _fields(body)
    if not fields:
        raise ValueError("empty job")
    n_argv = int(fields[0])
    argv = fields[1 : 1 + n_argv]
    rest = fields[1 + n_argv :]
    if len(argv) != n_argv or len(rest) % 2:
        raise ValueError("malformed job")
    return argv, dict(zip(rest[::2], rest[1::2], strict=True))


#: ``encode_job``'s encoded environment variables, by (name, value): an agent's environment is
#: mostly the engine's own, the same for every agent (emptied when it holds ``_PAIRS_MOST``)
_pairs: dict[tuple[str, str], bytes] = {}
_PAIRS_MOST = 4096


def _field(x: str) -> bytes:
    b = x.encode("utf-8", "surrogateescape")
    return b"%d\n%b" % (len(b), b)


def encode_job(argv: list[str], env: dict[str, str]) -> bytes:
    """A job for a warm shim: every string length-prefixed, so no value can run into another
    (a NUL or a newline in a prompt stays inside its own argument). Each variable is encoded
    once (``_pairs``): the 40-odd variables an agent inherits took 28 us an attempt to encode,
    on the thread that starts it."""
    parts = [_field(str(len(argv))), *(_field(a) for a in argv)]
    if len(_pairs) > _PAIRS_MOST:  # the per-attempt values (an attempt's folder, its task) pile up
        _pairs.clear()
    for pair in env.items():
        enc = _pairs.get(pair)
        if enc is None:
            enc = _pairs[pair] = _field(pair[0]) + _field(pair[1])
        parts.append(enc)
    body = b"".join(parts)
    return b"%d\n%b" % (len(body), body)


def _serve(job: list[str], env: dict[str, str], done_fd: int | None = None) -> int:
    """Run one job handed over a pipe, stdin from /dev/null. The shim says what it must in the
    agent's stderr.log; its own traceback, should it fail, goes to the attempt's shim.log, made
    only then (a file made for every attempt costs ~0.1 ms of CPU on some file systems)."""
    parsed = Args(job)
    parsed.env = env
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    shim = Shim(parsed)
    shim.done_fd = done_fd
    try:
        return shim.run()
    except Exception:
        _log_failure(parsed.dir)
        raise


def _log_failure(attempt_dir: str) -> None:
    """The current exception's traceback, to the attempt's shim.log."""
    import traceback  # only on a failure

    try:
        fd = os.open(os.path.join(attempt_dir, files.SHIM_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        return
    with os.fdopen(fd, "w") as fh:
        traceback.print_exc(file=fh)


def _fork_shim(wake_r: int, wake_w: int) -> tuple[int, int, int, int]:
    """A shim forked ahead of its job: ``(pid, start ticks, write end of its job pipe, read end
    of its done pipe)``. It sets itself up at once (a process group of its own in the server's
    session, the server's signals and files let go) and waits for one job on the pipe; a pipe
    closed without one (the server went away) ends it. Once its exit record is written it sends
    the record down the done pipe and closes it (``Shim.record_exit``)."""
    job_r, job_w = os.pipe()
    done_r, done_w = os.pipe()  # not inherited by the agent (close-on-exec)
    pid = os.fork()
    if pid == 0:  # the shim: nothing of the server's may leak into it
        code = 1
        try:
            os.close(job_w)
            os.close(done_r)
            # a group of its own (nothing that signals the server's group reaches it), but the
            # server's session: one scheduling group for the whole fleet (see the docstring)
            os.setpgid(0, 0)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake_r)
            os.close(wake_w)
            null = os.open(os.devnull, os.O_RDWR)  # the server's pipes to its supervisor: not ours
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.close(null)
            try:
                job, env = read_job(job_r)
            except (EOFError, ValueError, OSError):
                os._exit(0)
            os.close(job_r)
            code = _serve(job, env, done_w)
        except BaseException:
            pass  # _serve wrote a failure's traceback to the attempt's shim.log
        finally:
            os._exit(code)
    os.close(job_r)
    os.close(done_w)
    return pid, proctree.proc_start_ticks(pid) or 0, job_w, done_r


#: how long after a start the fork server makes its spares again (spares.py): the nine new
#: files and folders cost milliseconds of CPU on some disks, which the agent just started (and
#: its shim) need more on a machine with few cores; the fork of the next shim is not delayed
SPARES_AFTER_S = 0.02


def zygote(ahead: int = 1, spare_root: str | None = None, spare_count: int = 0, nice: int = 0) -> int:
    """A fork server on a Unix socket (its stdin) to its supervisor: it keeps ``ahead`` shims
    forked ahead of their jobs, each waiting on a pipe of its own, and sends the supervisor each
    one's pid, start ticks and the pipe's writing end; the supervisor writes a job straight into
    a pipe, then asks for another (``n``). Forking this small, already started process costs
    about a millisecond; a new interpreter costs ten or more. It reaps the shims it forked; when
    the supervisor goes away (the socket closes) it exits, and so do the shims still waiting (their
    pipes close); the others live on. With ``spare_root`` it also keeps ``spare_count`` attempt
    folders ready there (spares.py), after the shims: both while the agents run. It runs at the
    agents' niceness ``nice``, and so do the shims it forks (invoke.ShimPool says why)."""
    # the C module, not ``socket``: that one imports enum, selectors and a dozen more (a fifth
    # more memory in the server), and every shim forked from it pays for those pages: a
    # copy-on-write fault for each it writes, and its share of the unmapping when it exits
    import _socket  # the server only: a shim needs none

    if nice > 0:
        proctree.nice_at_least(nice)

    proctree.preload_prctl()  # every shim makes itself a subreaper: inherit ctypes, don't import it
    sock = _socket.socket(fileno=0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select below

    def send_one() -> None:
        pid, ticks, job_w, done_r = _fork_shim(wake_r, wake_w)
        try:
            # what socket.send_fds sends: the message, and both ends as one SCM_RIGHTS array
            rights = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in (job_w, done_r))
            sock.sendmsg([f"{pid} {ticks}".encode()], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        finally:
            os.close(job_w)  # the supervisor's copies are the only ones: its end ends the shim
            os.close(done_r)

    try:
        for _ in range(ahead):
            send_one()
        # when to make spares (those taken since the last round; at first, all of them)
        due = time.monotonic() + SPARES_AFTER_S if spare_root else None
        while True:
            timeout = None if due is None else max(0.0, due - time.monotonic())
            ready, _, _ = select.select([sock.fileno(), wake_r], [], [], timeout)
            if due is not None and time.monotonic() >= due:
                due = None
                spares.top_up(spare_root or "", spare_count)
            if wake_r in ready:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
            proctree.reap_children()
            if sock.fileno() not in ready:
                continue
            asked = sock.recv(64)
            if not asked:
                return 0
            for _ in range(asked.count(b"n")):
                send_one()
            if spare_root and due is None:  # not now: the agent just started needs the cores
                due = time.monotonic() + SPARES_AFTER_S
    except OSError:  # the supervisor went away while a shim was being sent
        return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--zygote"]:  # --zygote AHEAD [NICE [SPARE_ROOT SPARE_COUNT]]
        ahead = int(args[1]) if len(args) > 1 else 1
        nice = int(args[2]) if len(args) > 2 else 0
        root, count = (args[3], int(args[4])) if len(args) > 4 else (None, 0)
        code = zygote(ahead, root, count, nice)
        # out at once: the server has nothing to flush or clean (its output goes nowhere, its
        # spare folders are whole), and its supervisor waits for it to end (ShimPool.close):
        # the interpreter's own teardown took most of the 8 ms an engine's stop spent there
        os._exit(code)
    if args == ["--warm"]:
        # started ahead of time with everything imported; waits for its job on stdin. A supervisor
        # that dies before handing one over closes the pipe, and the warm shim just exits.
        try:
            job, env = read_job(0)
        except (EOFError, ValueError, OSError):
            return 0
        return _serve(job, env)
    return Shim(Args(args)).run()


if __name__ == "__main__":
    sys.exit(main())
