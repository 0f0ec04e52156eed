"""The bubblewrap sandbox an attempt (or a verifier, or a reviewer) runs in: its policy and command.

Why it exists: every coder runs with its CLI's own permission checks off, so without a fence an
agent can read ``~/.ssh``, write the user's other checkouts or delete the fleet's home. With
``sandbox = "bwrap"`` the agent runs inside bubblewrap (the tool Claude Code and Codex use on
Linux), built from a frozen ``Policy``: the whole filesystem read-only, a private ``/tmp``, the
fleet home, other users' homes and the user's secrets invisible, and only the working directory,
the run's own config folders and the coder's declared state folders writable; its own PID, IPC
and UTS namespaces; the host network, none, or an allowlist through a proxy.

This module decides *what* the sandbox is (``mounts``/``bwrap_argv`` are pure functions of the
policy, tested without bwrap) and whether bwrap works here (``probe``); ``sandbox_run.py`` is the
tiny runtime that runs it (the launcher outside, the relays inside); ``sandbox_policy.py`` turns a
task into a policy. The rule for overlapping paths is "the most specific path wins": mounts apply
from the shortest path to the longest, so a writable worktree inside the hidden fleet home is
visible, and ``~/.ssh`` inside a readable home is hidden.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace

from fleet_tui.scheduler.sandbox import run as sandbox_run
from fleet_tui.scheduler.sandbox.run import SOCKETS_PLACEHOLDER, host_allowed

__all__ = ["Policy", "bwrap_argv", "host_allowed", "launcher_argv", "mounts", "probe", "write_launch"]

#: the runtime script (launcher and relays), run by path with ``python -I -S``
RUN_SCRIPT = os.path.realpath(sandbox_run.__file__)

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
    script: str = RUN_SCRIPT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def run_command(python: str, script: str, *args: str) -> list[str]:
    """``sandbox_run.py ARGS`` the fast way: imported (its cached bytecode is used), not run as a
    script (which is compiled on every start), in an isolated interpreter without ``site``."""
    module = os.path.splitext(os.path.basename(script))[0]  # run.py since the package split
    boot = (
        f"import sys; sys.path.insert(0, {os.path.dirname(script)!r}); import {module} as sandbox_run; "
        "sys.exit(sandbox_run.main(sys.argv[1:]))"
    )
    return [python, "-I", "-S", "-c", boot, *args]


def mcp_relay_command(python: str | None = None) -> tuple[str, ...]:
    """What a coder registers as the ask_human server inside a sandbox."""
    py = python or os.path.realpath(sys.executable)
    return tuple(run_command(py, RUN_SCRIPT, "mcp-relay", f"{INNER_SOCKETS}/ask.sock"))


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
    ops += [("ro", p, p) for p in (policy.python, os.path.dirname(policy.script))]
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
        sock = f"{INNER_SOCKETS}/proxy.sock"
        inner = run_command(policy.python, policy.script, "relay-tcp", str(PROXY_PORT), sock, "--", *argv)
    out += ["--chdir", policy.workdir, "--", *inner]
    return out


def write_launch(policy: Policy, argv: list[str], run_dir: str) -> list[str]:
    """Write ``run_dir/sandbox.json`` (the policy, for people) and ``run_dir/sandbox.args`` (the
    launcher's job), both private and hidden inside; return the command the shim runs instead of
    ``argv``. The ask_human environment may carry the store's URL: nothing of it reaches argv."""
    files = {name: os.path.join(run_dir, name) for name in ("sandbox.json", "sandbox.args")}
    for path in files.values():  # they exist before the mounts are decided, so they get hidden
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    hidden = (*policy.hidden, *files.values())
    bwrap = shutil.which("bwrap") or "bwrap"
    command = bwrap_argv(replace(policy, hidden=hidden), argv, SOCKETS_PLACEHOLDER, bwrap)
    job = sandbox_run.encode_launch(
        command, list(policy.mcp_command), [f"{k}={v}" for k, v in policy.mcp_env], list(policy.network or ())
    )
    with open(files["sandbox.json"], "w", encoding="utf-8") as fh:
        fh.write(policy.to_json())
    with open(files["sandbox.args"], "wb") as fh:
        fh.write(job)
    return launcher_argv(files["sandbox.args"], policy.python)


def launcher_argv(args_file: str, python: str | None = None) -> list[str]:
    """The launcher's command line (``sandbox_run.py launch ARGS_FILE``)."""
    return run_command(python or os.path.realpath(sys.executable), RUN_SCRIPT, "launch", args_file)


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
