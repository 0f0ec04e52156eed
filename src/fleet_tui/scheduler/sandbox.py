"""The bubblewrap sandbox an attempt (or a verifier, or a reviewer) runs in, and its helpers.

Why it exists: every coder runs with its CLI's own permission checks off, so without a fence an
agent can read ``~/.ssh``, write the user's other checkouts or delete the fleet's home. With
``sandbox = "bwrap"`` the agent runs inside bubblewrap (the tool Claude Code and Codex use on
Linux), built from a frozen ``Policy``: the whole filesystem read-only, a private ``/tmp``, the
fleet home, other users' homes and the user's secrets invisible, and only the working directory,
the run's own config folders and the coder's declared state folders writable; its own PID and
IPC namespaces; the host network, none, or an allowlist.

Three small programs live here, all standard library only and run as scripts (``python -I -S
sandbox.py ...``), so they start in milliseconds and need nothing of the fleet inside the
sandbox:

- ``launch POLICY.json -- ARGV``: runs *outside* the sandbox, as the shim's agent process. It
  starts the ask_human broker (a unix socket; each connection runs the real ask_human command
  outside, with the store's address, so the store is never reachable from inside), the network
  proxy when the policy has an allowlist, then bwrap; it exits as bwrap exits. It is in the
  agent's process group, so the shim's stop, pause and kill reach it and everything it started.
- ``mcp-relay SOCKET``: the ask_human "server" the agent starts inside: it copies stdio to the
  broker's socket and back.
- ``relay-tcp PORT SOCKET -- ARGV``: with an allowlist the sandbox has no network at all; this
  listens on the sandbox's own loopback (the ``HTTPS_PROXY`` the agent is given) and forwards
  each connection to the proxy's unix socket outside, then runs ARGV and exits with its status.

``mounts``/``bwrap_argv`` are pure functions of the policy (tested without bwrap). The rule for
overlapping paths is "the most specific path wins": mounts apply from the shortest path to the
longest, so a writable worktree inside the hidden fleet home is visible, and ``~/.ssh`` inside
a readable home is hidden.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

#: the sockets' folder inside the sandbox (in its private /tmp)
INNER_SOCKETS = "/tmp/.fleet-sandbox"
#: the loopback port of the in-sandbox proxy relay (the sandbox has its own network namespace)
PROXY_PORT = 3128
MODES = ("none", "bwrap")
INSTALL_HINT = (
    "install bubblewrap: apt-get install bubblewrap (Debian/Ubuntu), dnf install bubblewrap "
    "(Fedora), pacman -S bubblewrap (Arch)"
)

#: secrets under HOME that a sandboxed agent never sees (folders become empty, files /dev/null)
HOME_SECRETS = (
    ".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".kube", ".docker", ".netrc",
    ".git-credentials", ".config/gh", ".config/hub", ".npmrc", ".pypirc", ".pgpass",
    ".password-store", ".local/share/keyrings", ".vault-token", ".terraform.d", ".cargo/credentials",
    ".cargo/credentials.toml", ".config/rclone", ".s3cfg", ".boto", ".oci", ".mozilla",
    ".config/google-chrome", ".config/chromium", ".gem/credentials", ".config/op", ".authinfo",
    ".authinfo.gpg",
)  # fmt: skip
#: host paths that are hidden too: other sessions' runtime dirs (ssh/gpg agents, D-Bus) and
#: container daemons' sockets (root on the host)
SYSTEM_SECRETS = (
    "/run/user", "/run/docker.sock", "/var/run/docker.sock", "/run/containerd", "/run/podman",
    "/run/dbus", "/var/run/dbus",
)  # fmt: skip
#: environment variables pointing at hidden agents' sockets
DROP_ENV = ("SSH_AUTH_SOCK", "GPG_AGENT_INFO", "DBUS_SESSION_BUS_ADDRESS")


@dataclass(frozen=True)
class Policy:
    """What one sandboxed run may see and do. Paths are absolute and resolved."""

    workdir: str
    #: bound read-write (the working directory, the run's config folders, state folders...)
    writable: tuple[str, ...] = ()
    #: bound read-only on top of what is hidden (the run's folder, HOME, the interpreter...)
    readable: tuple[str, ...] = ()
    #: not visible: a folder becomes an empty tmpfs, a file /dev/null (/tmp is always private)
    hidden: tuple[str, ...] = ()
    #: None: the host's network; (): none at all; hosts: only those, through a proxy
    network: tuple[str, ...] | None = None
    #: the ask_human command run outside for each connection to the broker (empty: no broker)
    mcp_command: tuple[str, ...] = ()
    mcp_env: tuple[tuple[str, str], ...] = ()
    #: the interpreter the in-sandbox relays run with, and this file (both readable inside)
    python: str = field(default_factory=lambda: os.path.realpath(sys.executable))
    script: str = field(default_factory=lambda: os.path.realpath(__file__))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> Policy:
        d = json.loads(text)
        for k in ("writable", "readable", "hidden", "mcp_command"):
            d[k] = tuple(d.get(k) or ())
        d["mcp_env"] = tuple(tuple(p) for p in d.get("mcp_env") or ())
        if d.get("network") is not None:
            d["network"] = tuple(d["network"])
        return Policy(**d)


def mcp_relay_command(policy_python: str | None = None) -> tuple[str, ...]:
    """What a coder registers as the ask_human server inside a sandbox."""
    py = policy_python or os.path.realpath(sys.executable)
    return (py, "-I", "-S", os.path.realpath(__file__), "mcp-relay", f"{INNER_SOCKETS}/ask.sock")


# --------------------------------------------------------------------------------------------
# The bwrap command line (pure)


def _depth(path: str) -> int:
    return len([p for p in path.split("/") if p])


def mounts(policy: Policy, sockets_dir: str | None) -> list[tuple[str, str, str]]:
    """(kind, source, destination) in the order bwrap applies them; kind: tmpfs, hide, ro, rw.

    Shorter paths first; on the same path hide < ro < rw, so the most specific, most permissive
    rule for a path wins. ``/tmp`` is a fresh tmpfs; ``sockets_dir`` (the broker's and proxy's
    sockets outside) appears at ``INNER_SOCKETS``.
    """
    rank = {"tmpfs": 0, "hide": 0, "ro": 1, "rw": 2}
    ops: list[tuple[str, str, str]] = [("tmpfs", "", "/tmp")]
    ops += [("hide", "", p) for p in policy.hidden]
    ops += [("ro", p, p) for p in policy.readable]
    ops += [("ro", p, p) for p in (policy.python, policy.script)]
    ops += [("rw", p, p) for p in policy.writable]
    if sockets_dir:
        ops.append(("ro", sockets_dir, INNER_SOCKETS))  # connecting needs no write access
    seen: set[tuple[str, str]] = set()
    unique = []
    for op in ops:
        if (op[0], op[2]) not in seen:
            seen.add((op[0], op[2]))
            unique.append(op)
    return sorted(unique, key=lambda op: (_depth(op[2]), rank[op[0]]))


def bwrap_argv(
    policy: Policy, argv: list[str], sockets_dir: str | None = None, bwrap: str = "bwrap"
) -> list[str]:
    """The bwrap command that runs ``argv`` under ``policy`` (the proxy relay added when needed)."""
    out = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if policy.network is not None:
        out.append("--unshare-net")
    if os.geteuid() == 0:  # a privileged bwrap keeps capabilities unless told otherwise
        out += ["--cap-drop", "ALL"]
    out += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/dev/shm"]
    frozen: list[str] = []  # hidden folders: empty and read-only once what they hold came back
    for kind, src, dest in mounts(policy, sockets_dir):
        if kind == "tmpfs":
            out += ["--tmpfs", dest]
        elif kind == "hide":
            if os.path.isdir(dest):
                out += ["--tmpfs", dest]
                frozen.append(dest)
            elif os.path.lexists(dest):
                out += ["--ro-bind", "/dev/null", dest]
        elif kind == "ro":
            out += ["--ro-bind-try", src, dest]
        else:
            out += ["--bind-try", src, dest]
    for dest in frozen:
        out += ["--remount-ro", dest]
    out += ["--setenv", "TMPDIR", "/tmp"]
    for name in DROP_ENV:
        out += ["--unsetenv", name]
    inner = list(argv)
    if policy.network:  # an allowlist: the agent reaches the proxy through the relay
        proxy = f"http://127.0.0.1:{PROXY_PORT}"
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy"):
            out += ["--setenv", name, proxy]
        for name in ("NO_PROXY", "no_proxy"):
            out += ["--unsetenv", name]
        inner = [policy.python, "-I", "-S", policy.script, "relay-tcp", str(PROXY_PORT),
                 f"{INNER_SOCKETS}/proxy.sock", "--", *argv]  # fmt: skip
    out += ["--chdir", policy.workdir, "--", *inner]
    return out


def launcher_argv(policy_file: str, argv: list[str], python: str | None = None) -> list[str]:
    """The command the shim (or a verifier) runs instead of ``argv``: the launcher, then bwrap."""
    py = python or os.path.realpath(sys.executable)
    return [py, "-I", "-S", os.path.realpath(__file__), "launch", policy_file, "--", *argv]


# --------------------------------------------------------------------------------------------
# Is bwrap usable here?

_PROBE_OK: str | None = None


def probe(bwrap: str | None = None) -> tuple[bool, str]:
    """(usable, detail): bwrap installed and able to create the namespaces a sandbox needs."""
    global _PROBE_OK
    path = bwrap or shutil.which("bwrap")
    if path is None:
        return False, f"bwrap not found on PATH; {INSTALL_HINT}"
    if path == _PROBE_OK:
        return True, path
    argv = [path, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-net"]
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--"]
    argv += [os.path.realpath(sys.executable), "-I", "-S", "-c", ""]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap cannot run: {e}"
    if p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        why = err[-1] if err else f"exit {p.returncode}"
        hint = ""
        if "uid map" in why or "Operation not permitted" in why or "namespace" in why:
            hint = (
                " (unprivileged user namespaces look disabled: `sysctl -w kernel.unprivileged_userns_clone=1`"
                " on Debian, `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` on Ubuntu 24.04+,"
                " or allow them in the container's seccomp/AppArmor profile)"
            )
        return False, f"bwrap cannot create a sandbox here: {why}{hint}"
    _PROBE_OK = path
    return True, path


# --------------------------------------------------------------------------------------------
# Byte pumps


def _pump(src: socket.socket, dst: socket.socket) -> None:
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
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until both sides closed, then close both."""
    t = threading.Thread(target=_pump, args=(b, a), daemon=True)
    t.start()
    _pump(a, b)
    t.join()
    a.close()
    b.close()


def _serve(listener: socket.socket, handle: Any) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


# --------------------------------------------------------------------------------------------
# The allowlist proxy (outside the sandbox)


def host_allowed(host: str, allow: tuple[str, ...]) -> bool:
    """``host`` is listed, or matches a ``*.domain`` entry (case-insensitive)."""
    h = host.strip().rstrip(".").lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    for entry in allow:
        e = entry.strip().rstrip(".").lower()
        if e.startswith("*.") and (h.endswith(e[1:]) or h == e[2:]):
            return True
        if h == e:
            return True
    return False


def _split_host_port(hostport: str, default: int) -> tuple[str, int]:
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = hostport.rpartition(":") if hostport.count(":") == 1 else (hostport, "", "")
    return host, int(port) if port.isdigit() else default


def _proxy_conn(conn: socket.socket, allow: tuple[str, ...]) -> None:
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
            forward = f"{method} /{path if slash else ''} {version}".encode("latin-1") + b"\r\n" + rest
        if not host or not host_allowed(host, allow):
            msg = f"fleet-tui sandbox: {host or target!r} is not in this task's network allowlist\n"
            conn.sendall(
                f"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {len(msg)}\r\n"
                f"Connection: close\r\n\r\n{msg}".encode()
            )
            conn.close()
            return
        try:
            up = socket.create_connection((host, port), timeout=30)
            up.settimeout(None)
        except OSError as e:
            msg = f"fleet-tui sandbox proxy: cannot reach {host}:{port}: {e}\n"
            head_502 = f"HTTP/1.1 502 Bad Gateway\r\nContent-Length: {len(msg)}\r\nConnection: close\r\n\r\n"
            conn.sendall((head_502 + msg).encode())
            conn.close()
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


def _listen_unix(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(16)
    return s


def _ask_conn(
    conn: socket.socket, policy: Policy, log_path: str, children: list[subprocess.Popen[bytes]]
) -> None:
    """One ask_human session: the real server runs here, outside, on the connection as its stdio;
    its stderr goes to ``ask_human.log`` next to the run (an agent keeps its MCP servers' stderr
    to itself too, so the run's own stderr stays the agent's)."""
    env = dict(os.environ)
    env.update(dict(policy.mcp_env))
    try:
        with open(log_path, "ab") as log:
            p = subprocess.Popen(
                list(policy.mcp_command),
                stdin=conn.fileno(),
                stdout=conn.fileno(),
                stderr=log,
                env=env,
                cwd=policy.workdir,
            )
        children.append(p)
    except OSError as e:
        sys.stderr.write(f"fleet-tui sandbox: cannot start ask_human: {e}\n")
    finally:
        conn.close()


def _exit_like(status: int) -> int:
    """Exit the way a child ended: its code, or its signal re-raised on ourselves."""
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


def launch(policy_file: str, argv: list[str]) -> int:
    with open(policy_file, encoding="utf-8") as fh:
        policy = Policy.from_json(fh.read())
    # a stop (TERM to the process group) reaches bwrap and the agent directly; the launcher stays
    # to serve ask_human and the proxy until they are gone (a handler, not SIG_IGN, which bwrap
    # and the agent would inherit)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        sys.stderr.write(f"fleet-tui sandbox: bwrap not found; {INSTALL_HINT}\n")
        return 126
    sockets_dir = tempfile.mkdtemp(prefix="fleet-sb-")
    ask_log = os.path.join(os.path.dirname(os.path.abspath(policy_file)), "ask_human.log")
    children: list[subprocess.Popen[bytes]] = []
    listeners: list[socket.socket] = []
    try:
        if policy.mcp_command:
            ask = _listen_unix(os.path.join(sockets_dir, "ask.sock"))
            listeners.append(ask)
            threading.Thread(
                target=_serve, args=(ask, lambda c: _ask_conn(c, policy, ask_log, children)), daemon=True
            ).start()
        if policy.network:
            prox = _listen_unix(os.path.join(sockets_dir, "proxy.sock"))
            listeners.append(prox)
            allow = policy.network
            threading.Thread(target=_serve, args=(prox, lambda c: _proxy_conn(c, allow)), daemon=True).start()
        try:
            p = subprocess.Popen(bwrap_argv(policy, argv, sockets_dir, bwrap))
        except OSError as e:
            sys.stderr.write(f"fleet-tui sandbox: cannot start bwrap: {e}\n")
            return 126
        while True:
            try:
                status = p.wait()
                break
            except InterruptedError:
                continue
    finally:
        for s in listeners:
            s.close()
        for c in children:  # ask_human servers end when their connection closes; never orphan one
            try:
                c.wait(timeout=2)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        shutil.rmtree(sockets_dir, ignore_errors=True)
    return _exit_like(status)


# --------------------------------------------------------------------------------------------
# Inside the sandbox


def mcp_relay(path: str) -> int:
    """stdin -> the broker's socket, the socket -> stdout, until either side closes."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        sys.stderr.write(f"fleet-tui sandbox: ask_human is not reachable ({path}): {e}\n")
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
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=up, daemon=True).start()
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
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    lo = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lo.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lo.bind(("127.0.0.1", port))
    lo.listen(64)

    def handle(conn: socket.socket) -> None:
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            up.close()
            return
        _splice(conn, up)

    threading.Thread(target=_serve, args=(lo, handle), daemon=True).start()
    try:
        p = subprocess.Popen(argv)
    except OSError as e:
        sys.stderr.write(f"fleet-tui sandbox: cannot start {argv[0]!r}: {e}\n")
        return 127
    return _exit_like(p.wait())


def main(args: list[str]) -> int:
    if len(args) >= 3 and args[0] == "launch" and args[2] == "--":
        return launch(args[1], args[3:])
    if len(args) == 2 and args[0] == "mcp-relay":
        return mcp_relay(args[1])
    if len(args) >= 4 and args[0] == "relay-tcp" and args[3] == "--":
        return relay_tcp(int(args[1]), args[2], args[4:])
    sys.stderr.write(
        "usage: sandbox.py launch POLICY -- ARGV | mcp-relay SOCKET | relay-tcp PORT SOCKET -- ARGV\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
