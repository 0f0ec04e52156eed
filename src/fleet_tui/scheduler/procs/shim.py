"""The per-attempt agent host process: it owns the agent so nothing is ever orphaned.

The supervisor starts one shim per attempt (``python -I shim.py --dir ATTEMPT_DIR ... -- ARGV``)
in its own session, so the shim outlives a supervisor that crashes. The shim:

- makes itself a child subreaper, so grandchildren that escape with ``setsid`` are re-parented
  to it and can still be found and killed;
- starts the agent in a new session (its own process group), stdin from a file or /dev/null;
- writes the agent's raw stdout to ``stdout.jsonl`` and stderr to ``stderr.log`` (never lost,
  can be re-normalized) and, at the end, its exit status to ``exit.json`` (atomically);
- on SIGTERM (a stop request) sends SIGTERM to the agent's group, waits the grace period,
  SIGKILLs the group, then kills every remaining descendant (checking each pid's start time so a
  reused pid is never hit);
- fences itself: it stops the agent when the deadline in the ``lease`` file passes, i.e. when no
  supervisor has refreshed it, which happens before the store's lease expires — so a task
  reclaimed elsewhere never has two live agents;
- records its own pid and start time in ``shim.json`` so a restarted supervisor can adopt it.

Standard library only, and only modules that are cheap to import (no argparse, json or re: they
cost more than the interpreter's own startup): it starts in a few milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import select

try:  # the C module: `signal` itself imports enum, which costs more than the interpreter's startup
    import _signal as signal
except ImportError:  # pragma: no cover - not CPython
    import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # the command name may contain spaces and parentheses: split after the last ')'
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()[0].decode()


def alive(pid: int, ticks: int | None) -> bool:
    """True when ``pid`` runs and is the same process (same start time), not a zombie."""
    now = proc_start_ticks(pid)
    if now is None or (ticks is not None and now != ticks):
        return False
    return proc_state(pid) not in ("Z", "X", None)


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        try:
            ppid = int(rest[1])
        except (IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def descendants(root: int) -> list[tuple[int, int | None]]:
    """Every descendant of ``root`` as (pid, start ticks)."""
    kids = children_map()
    out: list[tuple[int, int | None]] = []
    stack = list(kids.get(root, []))
    while stack:
        pid = stack.pop()
        out.append((pid, proc_start_ticks(pid)))
        stack.extend(kids.get(pid, []))
    return out


def _json_value(v: object) -> str:
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    out = ['"']
    for ch in str(v):
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def dump_json(data: dict[str, object]) -> str:
    """JSON for a flat dict of scalars (the json module is too slow to import here)."""
    return "{" + ", ".join(f"{_json_value(k)}: {_json_value(v)}" for k, v in data.items()) + "}"


def write_json(path: str, data: dict[str, object], *, durable: bool = False) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(dump_json(data))
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


EXIT_RESERVE = 4096  # bytes set aside for exit.json while the disk still has room


def reserve_exit(dir: str) -> None:
    """Set aside the space of ``exit.json`` before the agent starts (``exit.json.reserved``):
    an agent that fills the disk cannot make its own exit status unwritable."""
    path = os.path.join(dir, "exit.json.reserved")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:  # the blocks allocated at once, without waiting for the disk (no fsync)
                os.posix_fallocate(fd, 0, EXIT_RESERVE)
            except OSError:  # a file system without it: written out, which allocates them
                os.write(fd, b" " * EXIT_RESERVE)
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass


def write_exit(dir: str, data: dict[str, object]) -> None:
    """Write ``exit.json`` durably: into the reserved space when there is one (no new blocks
    needed), else as a new file; on a full disk the record is kept in memory and written as soon
    as there is room — the shim stays until then, so the runner waits for it instead of calling
    the attempt a crash."""
    text = dump_json(data).encode()
    path = os.path.join(dir, "exit.json")
    reserved = os.path.join(dir, "exit.json.reserved")
    delay = 0.2
    while True:
        try:
            if len(text) <= EXIT_RESERVE and os.path.exists(reserved):
                fd = os.open(reserved, os.O_WRONLY)
                try:
                    os.pwrite(fd, text + b" " * (EXIT_RESERVE - len(text)), 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(reserved, path)
            else:
                write_json(path, data, durable=True)
            return
        except OSError:
            if not os.path.isdir(dir):
                return  # the attempt's folder is gone: nobody will read it
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def has_children(pid: int) -> bool:
    """Cheap check through /proc/PID/task/*/children; falls back to a full scan."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                if fh.read().strip():
                    return True
        return False
    except OSError:
        return bool(descendants(pid))


def read_deadline(path: str) -> float | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return float(fh.read().strip() or "nan")
    except (OSError, ValueError):
        return None


class Shim:
    def __init__(self, args: Args) -> None:
        self.dir: str = args.dir
        self.grace: float = args.grace
        self.lease_file: str | None = args.lease_file
        self.argv: list[str] = args.argv
        self.env: dict[str, str] = args.env if args.env is not None else dict(os.environ)
        self.cwd: str = args.cwd
        self.stdin_file: str | None = args.stdin_file
        self.nice: int = args.nice
        self.umask: int | None = args.umask
        self.stop_requested = False
        self.stop_reason = "exited"
        self.pid = os.getpid()
        self.agent_pid: int | None = None
        self.agent_status: int | None = None

    def reap_zombies(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.agent_pid:
                self.agent_status = _

    def kill_tree(self, pgid: int | None) -> int:
        """TERM the agent's group, wait the grace, KILL the group, KILL every descendant."""
        victims = descendants(self.pid)
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except OSError:
                pass
        for pid, ticks in victims:  # escaped (setsid) descendants get the TERM too
            if alive(pid, ticks):
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            self.reap_zombies()
            if not any(alive(p, t) for p, t in descendants(self.pid)):
                break
            time.sleep(0.05)
        killed = 0
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        for _ in range(3):  # descendants may fork while we look: sweep until none
            found = [(p, t) for p, t in descendants(self.pid) if alive(p, t)]
            if not found:
                break
            for pid, ticks in found:
                if proc_start_ticks(pid) == ticks:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed += 1
                    except OSError:
                        pass
            time.sleep(0.02)
            self.reap_zombies()
        self.reap_zombies()
        return killed

    def run(self) -> int:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        info: dict[str, object] = {
            "pid": self.pid,
            "start_ticks": proc_start_ticks(self.pid),
            "started_at": time.time(),
        }
        write_json(os.path.join(self.dir, "shim.json"), info)
        reserve_exit(self.dir)

        def on_term(signum: int, frame: object) -> None:
            self.stop_requested = True
            self.stop_reason = "stopped"

        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

        out_fd = os.open(
            os.path.join(self.dir, "stdout.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        err_fd = os.open(os.path.join(self.dir, "stderr.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        in_fd = os.open(self.stdin_file or os.devnull, os.O_RDONLY)
        try:
            # posix_spawn (vfork+exec) is several times faster than fork+exec from Python; the
            # agent gets its own session, default signal handlers and the shim's cwd.
            os.chdir(self.cwd)
            if self.nice > 0:  # the agent inherits it; the shim only waits
                os.nice(self.nice)
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
                setsid=True,
                setsigdef=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE),
            )
            if own_umask is not None:
                os.umask(own_umask)
        except (OSError, ValueError) as e:  # ValueError: a NUL byte in an argument or variable
            os.write(err_fd, f"fleet-tui shim: cannot start {self.argv[0]!r}: {e}\n".encode())
            write_exit(
                self.dir,
                {
                    "exit_code": 127,
                    "signal": None,
                    "reason": "spawn_failed",
                    "error": str(e),
                    "ended_at": time.time(),
                },
            )
            return 1
        os.close(in_fd)
        os.close(out_fd)
        os.close(err_fd)
        self.agent_pid = pid
        info.update(agent_pid=pid, agent_start_ticks=proc_start_ticks(pid))
        write_json(os.path.join(self.dir, "shim.json"), info)

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
                deadline = read_deadline(self.lease_file)
                # a lease file that stays unreadable (its home was deleted) counts as expired:
                # nobody can renew it, so nobody supervises this agent
                unreadable = unreadable + 1 if deadline is None else 0
                if (deadline is not None and now > deadline) or unreadable >= 6:
                    self.stop_requested = True
                    self.stop_reason = "lease_expired"
        killed = 0
        if status is None:  # stop requested or lease expired: the agent is still alive
            killed = self.kill_tree(pid)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                status = self.agent_status
        else:
            # the agent exited; anything it left behind must not outlive the attempt
            if has_children(self.pid):
                killed = self.kill_tree(None)
        exit_code = sig = None
        if status is not None:
            if os.WIFEXITED(status):
                exit_code = os.WEXITSTATUS(status)
            elif os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                exit_code = 128 + sig
        write_exit(
            self.dir,
            {
                "exit_code": exit_code,
                "signal": sig,
                "reason": self.stop_reason,
                "killed_descendants": killed,
                "ended_at": time.time(),
            },
        )
        return 0


class Args:
    """The shim's command line: --dir D --cwd C [--grace S] [--lease-file F] [--stdin-file F] -- ARGV."""

    def __init__(self, argv: list[str]) -> None:
        self.dir = ""
        self.cwd = ""
        self.grace = 5.0
        self.lease_file: str | None = None
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


def read_job(fd: int = 0) -> tuple[list[str], dict[str, str]]:
    """A warm shim's job as written by :func:`encode_job`."""
    header = bytearray()
    while not header.endswith(b"\n"):
        ch = os.read(fd, 1)
        if not ch or len(header) > 20:
            raise EOFError
        header += ch
    return decode_job(_read_exact(fd, int(header)))


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


def encode_job(argv: list[str], env: dict[str, str]) -> bytes:
    """A job for a warm shim: every string length-prefixed, so no value can run into another
    (a NUL or a newline in a prompt stays inside its own argument)."""
    items = [str(len(argv)), *argv]
    for k, v in env.items():
        items += [k, v]
    body = b"".join(
        str(len(b)).encode() + b"\n" + b for b in (x.encode("utf-8", "surrogateescape") for x in items)
    )
    return str(len(body)).encode() + b"\n" + body


def _serve(job: list[str], env: dict[str, str]) -> int:
    """Run one job handed over a pipe: stdin from /dev/null, output to the attempt's shim.log."""
    parsed = Args(job)
    parsed.env = env
    log = os.open(os.path.join(parsed.dir, "shim.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    return Shim(parsed).run()


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def zygote() -> int:
    """A fork server: reads jobs from stdin and forks one shim per job (in a session of its own),
    answering each with ``PID START_TICKS`` on stdout. Forking this small, already started
    process costs about a millisecond; a new interpreter costs ten or more. It reaps the shims it
    forked; when the supervisor goes away (stdin closes) it exits and the shims live on."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select below
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        _reap_children()
        if 0 not in ready:
            continue
        try:
            job, env = read_job(0)
        except (EOFError, ValueError, OSError):
            return 0
        pid = os.fork()
        if pid == 0:  # the shim: nothing of the server's may leak into it
            code = 1
            try:
                os.setsid()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                code = _serve(job, env)
            except BaseException:
                import traceback  # only on a failure: to shim.log once _serve has opened it

                traceback.print_exc()
            finally:
                os._exit(code)
        os.write(1, f"{pid} {proc_start_ticks(pid) or 0}\n".encode())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--zygote"]:
        return zygote()
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
