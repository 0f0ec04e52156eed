"""The sandbox's small runtime programs: the launcher outside, the relays inside.

Why it exists apart from ``sandbox.py``: these run once per sandboxed attempt (and per ask_human
call), as bare scripts (``python -I -S sandbox_run.py ...``), so they import only C modules and
``os`` — no ``socket``, ``subprocess``, ``json`` or ``dataclasses``, which together cost more than
the interpreter's own start-up — and start in a few milliseconds, like the shim. ``sandbox.py``
decides *what* a sandbox is; this only runs one.

- ``launch ARGS_FILE``: runs outside the sandbox, as the shim's agent process (in its process
  group, so the shim's stop, pause and kill reach everything below it). It serves ask_human (a
  unix socket; each connection runs the real ask_human command here, outside, with the store's
  address, the connection as its stdio), the allowlist proxy when there is one, then runs bwrap
  and exits as bwrap does. ``ARGS_FILE`` is written by ``sandbox.write_launch``.
- ``mcp-relay SOCKET``: the ask_human "server" an agent starts inside: stdio to the socket.
- ``relay-tcp PORT SOCKET -- ARGV``: with an allowlist the sandbox has no network; this listens
  on its own loopback (the agent's ``HTTPS_PROXY``), forwards each connection to the proxy's
  socket, runs ARGV and exits with its status.
"""

from __future__ import annotations

# C modules: `socket` and `signal` import enum, which costs more than the interpreter's start-up
import _signal as signal
import _socket as sock
import _thread as thread
import os
import sys
import time

TYPE_CHECKING = False  # `typing` costs an import; mypy reads this name the same way
if TYPE_CHECKING:
    from collections.abc import Callable

#: the placeholder for the sockets' folder outside in the launcher's bwrap command
SOCKETS_PLACEHOLDER = "@FLEET_SANDBOX_SOCKETS@"
MAGIC = "fleet-sandbox-1"
#: what a child gets back at their defaults (Python ignores SIGPIPE; our stop handlers are ours)
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)


def _quiet_stop() -> None:
    """A handler, not SIG_IGN (which children would inherit): a stop reaches the agent directly;
    this process stays to serve it until it is gone."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: None)


def _exit_like(status: int) -> int:
    """Exit the way a child ended: its code, or its signal re-raised on ourselves."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


# --------------------------------------------------------------------------------------------
# Byte pumps


def _pump(src: sock.socket, dst: sock.socket, done: thread.LockType | None = None) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(sock.SHUT_WR)
        except OSError:
            pass
        if done is not None:
            done.release()


def _splice(a: sock.socket, b: sock.socket) -> None:
    """Copy both ways until both sides closed, then close both."""
    done = thread.allocate_lock()
    done.acquire()
    thread.start_new_thread(_pump, (b, a, done))
    _pump(a, b)
    done.acquire()
    a.close()
    b.close()


def _accept(listener: sock.socket) -> sock.socket | None:
    try:
        fd, _ = listener._accept()  # type: ignore[attr-defined]
    except OSError:
        return None
    return sock.socket(fileno=fd)


def _serve(listener: sock.socket, handle: Callable[[sock.socket], None]) -> None:
    while True:
        conn = _accept(listener)
        if conn is None:
            return
        thread.start_new_thread(handle, (conn,))


def _listen_unix(path: str) -> sock.socket:
    s = sock.socket(sock.AF_UNIX, sock.SOCK_STREAM)
    s.bind(path)
    s.listen(16)
    return s


# --------------------------------------------------------------------------------------------
# The allowlist proxy (outside the sandbox)


def host_allowed(host: str, allow: tuple[str, ...] | list[str]) -> bool:
    """``host`` is listed, or matches a ``*.domain`` entry (which covers the domain too)."""
    h = host.strip().rstrip(".").lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    for entry in allow:
        e = entry.strip().rstrip(".").lower()
        if h == e or (e.startswith("*.") and (h.endswith(e[1:]) or h == e[2:])):
            return True
    return False


def _split_host_port(hostport: str, default: int) -> tuple[str, int]:
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    else:
        host, port = hostport, ""
    return host, int(port) if port.isdigit() else default


def _connect(host: str, port: int) -> sock.socket:
    last: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, addr in sock.getaddrinfo(host, port, 0, sock.SOCK_STREAM):
        s = sock.socket(family, kind, proto)
        s.settimeout(30)
        try:
            s.connect(addr)
        except OSError as e:
            s.close()
            last = e
            continue
        s.settimeout(None)
        return s
    raise last


def _reply(conn: sock.socket, status: str, text: str) -> None:
    body = text.encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    try:
        conn.sendall(head.encode() + body)
    except OSError:
        pass
    conn.close()


def _proxy_conn(conn: sock.socket, allow: list[str]) -> None:
    """One proxied connection: ``CONNECT host:port`` or an absolute-URI HTTP request."""
    try:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(65536)
            if not chunk or len(head) > 65536:
                conn.close()
                return
            head += chunk
        line, _, rest = head.partition(b"\r\n")
        method, target, version = [*line.decode("latin-1").split(" "), "", ""][:3]
        if method.upper() == "CONNECT":
            host, port = _split_host_port(target, 443)
            forward = b""
        else:
            scheme, _, after = target.partition("://")
            hostport, slash, path = after.partition("/")
            host, port = _split_host_port(hostport, 443 if scheme.lower() == "https" else 80)
            forward = f"{method} /{path if slash else ''} {version}\r\n".encode("latin-1") + rest
        if not host or not host_allowed(host, allow):
            _reply(
                conn,
                "403 Forbidden",
                f"fleet-tui sandbox: {host or target!r} is not in this task's network allowlist\n",
            )
            return
        try:
            up = _connect(host, port)
        except OSError as e:
            _reply(conn, "502 Bad Gateway", f"fleet-tui sandbox proxy: cannot reach {host}:{port}: {e}\n")
            return
        if forward:
            up.sendall(forward)
        else:
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        _splice(conn, up)
    except OSError:
        conn.close()


# --------------------------------------------------------------------------------------------
# The launcher (outside the sandbox)


def encode_launch(bwrap: list[str], mcp: list[str], mcp_env: list[str], allow: list[str]) -> bytes:
    """The launcher's job: four lists, each count-prefixed, NUL-separated."""
    fields = [MAGIC]
    for part in (bwrap, mcp, mcp_env, allow):
        fields += [str(len(part)), *part]
    return "\0".join(fields).encode("utf-8", "surrogateescape")


def decode_launch(data: bytes) -> tuple[list[str], list[str], list[str], list[str]]:
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    if not fields or fields[0] != MAGIC:
        raise ValueError("not a fleet-tui sandbox launch file")
    out: list[list[str]] = []
    i = 1
    for _ in range(4):
        n = int(fields[i])
        out.append(fields[i + 1 : i + 1 + n])
        i += 1 + n
    return out[0], out[1], out[2], out[3]


class _Children:
    """ask_human servers started for connections: reaped as they end, never left behind."""

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.lock = thread.allocate_lock()

    def reap(self, pid: int) -> None:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        with self.lock:
            self.live.discard(pid)

    def finish(self, grace: float = 2.0) -> None:
        """Wait up to ``grace`` for the servers to end on their own, then kill what is left."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with self.lock:
                if not self.live:
                    return
            time.sleep(0.02)
        with self.lock:
            for pid in list(self.live):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _ask_conn(conn: sock.socket, mcp: list[str], env: dict[str, str], log: str, kids: _Children) -> None:
    """One ask_human session: the real server runs here, outside, on the connection as its stdio;
    its stderr goes to ``ask_human.log`` next to the run (an agent keeps its MCP servers' stderr to
    itself too, so the run's own stderr stays the agent's)."""
    try:
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fd = conn.fileno()
            pid = os.posix_spawnp(
                mcp[0],
                mcp,
                env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, fd, 0),
                    (os.POSIX_SPAWN_DUP2, fd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                ],
                setsigdef=DEFAULT_SIGNALS,
            )
        finally:
            os.close(log_fd)
        with kids.lock:
            kids.live.add(pid)
        thread.start_new_thread(kids.reap, (pid,))
    except OSError as e:
        os.write(2, f"fleet-tui sandbox: cannot start ask_human: {e}\n".encode())
    finally:
        conn.close()


def launch(args_file: str) -> int:
    with open(args_file, "rb") as fh:
        bwrap, mcp, mcp_env, allow = decode_launch(fh.read())
    _quiet_stop()
    run_dir = os.path.dirname(os.path.abspath(args_file))
    base = os.environ.get("TMPDIR") or "/tmp"
    sockets = os.path.join(base, f"fleet-sb-{os.getpid()}-{os.urandom(4).hex()}")
    os.mkdir(sockets, 0o700)
    made: list[str] = []
    kids = _Children()
    try:
        if mcp:
            env = dict(os.environ)
            env.update(kv.split("=", 1) for kv in mcp_env if "=" in kv)  # type: ignore[misc]
            path = os.path.join(sockets, "ask.sock")
            ask = _listen_unix(path)
            made.append(path)
            log = os.path.join(run_dir, "ask_human.log")
            thread.start_new_thread(_serve, (ask, lambda c: _ask_conn(c, mcp, env, log, kids)))
        if allow:
            path = os.path.join(sockets, "proxy.sock")
            prox = _listen_unix(path)
            made.append(path)
            thread.start_new_thread(_serve, (prox, lambda c: _proxy_conn(c, allow)))
        argv = [sockets if a == SOCKETS_PLACEHOLDER else a for a in bwrap]
        try:
            pid = os.posix_spawnp(argv[0], argv, os.environ, setsigdef=DEFAULT_SIGNALS)
        except OSError as e:
            os.write(2, f"fleet-tui sandbox: cannot start {argv[0]}: {e}\n".encode())
            return 126
        _, status = os.waitpid(pid, 0)
    finally:
        kids.finish()
        for p in made:
            try:
                os.unlink(p)
            except OSError:
                pass
        try:
            os.rmdir(sockets)
        except OSError:
            pass
    return _exit_like(status)


# --------------------------------------------------------------------------------------------
# Inside the sandbox


def mcp_relay(path: str) -> int:
    """stdin -> the broker's socket, the socket -> stdout, until either side closes."""
    s = sock.socket(sock.AF_UNIX, sock.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        os.write(2, f"fleet-tui sandbox: ask_human is not reachable ({path}): {e}\n".encode())
        return 1

    def up() -> None:
        try:
            while True:
                data = os.read(0, 65536)
                if not data:
                    break
                s.sendall(data)
        except OSError:
            pass
        try:
            s.shutdown(sock.SHUT_WR)
        except OSError:
            pass

    thread.start_new_thread(up, ())
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(1, view) :]
    except OSError:
        pass
    return 0


def relay_tcp(port: int, path: str, argv: list[str]) -> int:
    """Forward the sandbox's loopback ``port`` to the proxy socket while ``argv`` runs."""
    _quiet_stop()
    lo = sock.socket(sock.AF_INET, sock.SOCK_STREAM)
    lo.setsockopt(sock.SOL_SOCKET, sock.SO_REUSEADDR, 1)
    lo.bind(("127.0.0.1", port))
    lo.listen(64)

    def handle(conn: sock.socket) -> None:
        up = sock.socket(sock.AF_UNIX, sock.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            up.close()
            return
        _splice(conn, up)

    thread.start_new_thread(_serve, (lo, handle))
    try:
        pid = os.posix_spawnp(argv[0], argv, os.environ, setsigdef=DEFAULT_SIGNALS)
    except OSError as e:
        os.write(2, f"fleet-tui sandbox: cannot start {argv[0]!r}: {e}\n".encode())
        return 127
    _, status = os.waitpid(pid, 0)
    return _exit_like(status)


def main(args: list[str]) -> int:
    if len(args) == 2 and args[0] == "launch":
        return launch(args[1])
    if len(args) == 2 and args[0] == "mcp-relay":
        return mcp_relay(args[1])
    if len(args) >= 4 and args[0] == "relay-tcp" and args[3] == "--":
        return relay_tcp(int(args[1]), args[2], args[4:])
    os.write(2, b"usage: sandbox_run.py launch FILE | mcp-relay SOCKET | relay-tcp PORT SOCKET -- ARGV\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
