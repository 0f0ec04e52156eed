"""The bwrap sandbox itself: what a sandboxed command can and cannot do (issue 18).

Each test builds a policy the way the engine does (``sandbox_policy.build_policy``), runs a real
command through the launcher under the real ``bwrap``, and checks the effect from outside: a file
written or not, a process still alive, a loopback server reached or not. The pure parts (mount
order, the allowlist match, the task-file keys) are checked without bwrap.
"""

from __future__ import annotations

import http.server
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fleet_tui.scheduler.model import TaskSpec
from fleet_tui.scheduler.sandbox import bwrap as sb
from fleet_tui.scheduler.sandbox import policy as sbp
from fleet_tui.scheduler.store.protocol import spec_from_json, spec_to_json
from fleet_tui.taskfile import load_taskfile

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def bwrap() -> str:
    ok, detail = sb.probe()
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(detail)
        pytest.skip(detail)
    return detail


class Box:
    """A fleet home, a task's worktree and run folder, a user HOME with secrets, another checkout."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fleet = root / "fleet"
        self.work = self.fleet / "worktrees" / "job"
        self.run_dir = self.fleet / "tasks" / "t-1" / "attempts" / "1"
        self.home = root / "home"
        self.other = root / "other-checkout"
        for d in (self.work, self.run_dir / "coder_state", self.home / ".ssh", self.other):
            d.mkdir(parents=True)
        (self.home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
        (self.home / ".netrc").write_text("machine example.com password hunter2\n")
        (self.home / "notes.txt").write_text("readable notes\n")
        (self.other / "main.py").write_text("print('theirs')\n")
        (self.fleet / "fleet.db").write_text("not really a database\n")
        (self.run_dir / "lease").write_text("123\n")

    def policy(self, **kw: object) -> sb.Policy:
        args: dict[str, object] = dict(
            workdir=self.work, run_dir=self.run_dir, fleet_home=self.fleet, user_home=str(self.home)
        )
        args.update(kw)
        return sbp.build_policy(**args)  # type: ignore[arg-type]

    def run(self, policy: sb.Policy, script: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        argv = sbp.wrap(policy, self.run_dir, ["/bin/sh", "-c", script])
        return subprocess.run(
            argv, cwd=self.work, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )


@pytest.fixture
def box(tmp_path: Path, bwrap: str) -> Box:
    return Box(tmp_path)


def test_writes_only_where_the_policy_allows(box: Box) -> None:
    p = box.run(
        box.policy(extra_ro=[str(box.other)]),
        f"""
        echo ours > in-worktree.txt && echo W-ok
        echo x > {box.home}/planted 2>/dev/null || echo HOME-denied
        echo x > {box.other}/main.py 2>/dev/null || echo OTHER-denied
        cat {box.other}/main.py >/dev/null && echo OTHER-readable
        echo x > {box.fleet}/fleet.db 2>/dev/null || echo FLEET-denied
        ls {box.fleet}/fleet.db >/dev/null 2>&1 || echo STORE-invisible
        echo x > {box.run_dir}/lease 2>/dev/null || echo LEASE-denied
        echo x > {box.run_dir}/coder_state/s && echo STATE-ok
        echo x > /usr/planted 2>/dev/null || echo USR-denied
        echo x > /tmp/scratch && echo TMP-ok
        cat {box.home}/notes.txt >/dev/null && echo HOME-readable
        """,
    )
    out = p.stdout.split()
    for want in ("W-ok", "HOME-denied", "OTHER-denied", "OTHER-readable", "FLEET-denied", "STORE-invisible",
                 "LEASE-denied", "STATE-ok", "USR-denied", "TMP-ok", "HOME-readable"):  # fmt: skip
        assert want in out, (want, p.stdout, p.stderr)
    assert (box.work / "in-worktree.txt").read_text() == "ours\n"
    assert (box.run_dir / "coder_state" / "s").exists()
    assert not (box.home / "planted").exists()
    assert (box.other / "main.py").read_text() == "print('theirs')\n"
    assert (box.fleet / "fleet.db").read_text() == "not really a database\n"
    assert (box.run_dir / "lease").read_text() == "123\n"
    assert not Path("/usr/planted").exists()
    assert not Path("/tmp/scratch").exists()  # /tmp is the sandbox's own


def test_the_coders_state_folders_in_home_stay_writable(box: Box) -> None:
    (box.home / ".claude").mkdir()
    (box.home / ".claude" / "settings.json").write_text("{}")
    (box.home / ".claude.json").write_text("{}")
    policy = box.policy(state_dirs=["~/.claude", "~/.claude.json", "~/.local/share/opencode"])
    p = box.run(
        policy,
        f"echo s > {box.home}/.claude/session && echo '{{\"a\": 1}}' > {box.home}/.claude.json && echo OK; "
        f"echo x > {box.home}/other 2>/dev/null || echo HOME-denied; "
        f"echo hooks > {box.home}/.claude/settings.json 2>/dev/null || echo SETTINGS-denied",
    )
    assert p.stdout.split() == ["OK", "HOME-denied", "SETTINGS-denied"], (p.stdout, p.stderr)
    assert (box.home / ".claude" / "settings.json").read_text() == "{}"
    assert (box.home / ".claude" / "session").read_text() == "s\n"
    assert (box.home / ".claude.json").read_text() == '{"a": 1}\n'
    assert not (box.home / ".local").exists()  # a state folder the user lacks is not created


def test_an_unlisted_checkout_is_not_even_visible(box: Box) -> None:
    p = box.run(box.policy(), f"ls {box.other} 2>&1 || echo OTHER-invisible")
    assert "OTHER-invisible" in p.stdout, p.stdout


def test_secrets_are_not_visible(box: Box) -> None:
    p = box.run(
        box.policy(),
        f"cat {box.home}/.ssh/id_* 2>&1; echo rc=$?; cat {box.home}/.netrc; echo netrc-bytes; "
        "echo SSH_AUTH_SOCK=${SSH_AUTH_SOCK:-unset}",
    )
    assert "PRIVATE KEY" not in p.stdout and "hunter2" not in p.stdout, p.stdout
    assert "rc=1" in p.stdout and "SSH_AUTH_SOCK=unset" in p.stdout, p.stdout
    # a task that names a secret folder itself gets it (read-only)
    q = box.run(box.policy(extra_ro=[str(box.home / ".ssh")]), f"cat {box.home}/.ssh/id_*")
    assert "PRIVATE KEY" in q.stdout, q.stderr
    # ...but not through a broader grant
    r = box.run(box.policy(extra_ro=[str(box.home)]), f"cat {box.home}/.ssh/id_* 2>/dev/null || echo HIDDEN")
    assert r.stdout.split() == ["HIDDEN"], r.stdout


def test_readonly_reviewer_cannot_write_the_worktree(box: Box) -> None:
    p = box.run(
        box.policy(readonly=True), "echo x > review.txt 2>/dev/null || echo RO; ls >/dev/null && echo LS"
    )
    assert p.stdout.split() == ["RO", "LS"], (p.stdout, p.stderr)
    assert not (box.work / "review.txt").exists()


def test_processes_outside_cannot_be_seen_or_signalled(box: Box) -> None:
    outside = subprocess.Popen(["sleep", "60"])
    try:
        p = box.run(
            box.policy(),
            f"kill -TERM {outside.pid} 2>/dev/null && echo KILLED || echo KILL-failed; "
            f"ls /proc/{outside.pid} >/dev/null 2>&1 && echo SEEN || echo UNSEEN; "
            "ls /proc | grep -c '^[0-9]'",
        )
        lines = p.stdout.split()
        assert lines[:2] == ["KILL-failed", "UNSEEN"] or (
            # the same number may exist inside the sandbox's own pid namespace; it is not ours
            lines[0] == "KILLED" and outside.pid < 10
        ), p.stdout
        assert int(lines[2]) < 10, p.stdout  # only the sandbox's own few processes
        assert outside.poll() is None  # still running
    finally:
        outside.kill()
        outside.wait()


@pytest.fixture
def loopback_http() -> Iterator[int]:
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"hello from {self.headers.get('Host')}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


FETCH = (
    "import sys, urllib.request\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode().strip())\n"
    "except Exception as e:\n"
    "    print('FAILED', type(e).__name__, getattr(e, 'code', ''))\n"
)


def _fetch(box: Box, policy: sb.Policy, url: str, wrapper: list[str] | None = None) -> str:
    script = box.work / "fetch.py"
    script.write_text(FETCH)
    argv = sbp.wrap(policy, box.run_dir, [sb.Policy(workdir="").python, "-I", str(script), url])
    p = subprocess.run([*(wrapper or []), *argv], cwd=box.work, capture_output=True, text=True, timeout=40)
    return p.stdout.strip() + p.stderr[-500:]


def test_network_none_cannot_reach_a_loopback_server_outside(box: Box, loopback_http: int) -> None:
    url = f"http://127.0.0.1:{loopback_http}/"
    assert _fetch(box, box.policy(), url).startswith("hello from")  # the host network: reachable
    out = _fetch(box, box.policy(network=()), url)
    assert out.startswith("FAILED"), out


def test_allowlist_reaches_only_the_listed_host(box: Box, loopback_http: int) -> None:
    """Two names for the loopback server in this test's own hosts file (a mount namespace of the
    test's, made with bwrap): only the listed one gets through the proxy."""
    hosts = box.root / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.0.1 allowed.test\n127.0.0.1 denied.test\n")
    own_hosts = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(hosts), "/etc/hosts", "--"]
    policy = box.policy(network=("allowed.test",))
    port = loopback_http
    ok = _fetch(box, policy, f"http://allowed.test:{port}/", own_hosts)
    assert ok.startswith(f"hello from allowed.test:{port}"), ok
    denied = _fetch(box, policy, f"http://denied.test:{port}/", own_hosts)
    assert denied.startswith("FAILED HTTPError 403"), denied
    by_address = _fetch(box, policy, f"http://127.0.0.1:{port}/", own_hosts)
    assert by_address.startswith("FAILED HTTPError 403"), by_address


def test_the_allowlist_matches_names_and_subdomains() -> None:
    allow = ("api.anthropic.com", "*.openai.com")
    assert sb.host_allowed("api.anthropic.com", allow)
    assert sb.host_allowed("API.Anthropic.com.", allow)
    assert sb.host_allowed("chatgpt.openai.com", allow) and sb.host_allowed("openai.com", allow)
    assert not sb.host_allowed("anthropic.com", allow)
    assert not sb.host_allowed("evil-openai.com", allow)
    assert not sb.host_allowed("api.anthropic.com.evil.test", allow)


def test_the_most_specific_path_wins(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    policy = sb.Policy(
        workdir=str(fleet / "worktrees" / "a"),
        writable=(str(fleet / "worktrees" / "a"),),
        readable=(str(tmp_path / "home"),),
        hidden=(str(fleet), str(tmp_path / "home" / ".ssh")),
    )
    order = [(kind, dest) for kind, _, dest in sb.mounts(policy, None)]
    at = {item: i for i, item in enumerate(order)}
    assert order[0] == ("tmpfs", "/tmp")
    assert at[("hide", str(fleet))] < at[("rw", str(fleet / "worktrees" / "a"))]
    assert at[("ro", str(tmp_path / "home"))] < at[("hide", str(tmp_path / "home" / ".ssh"))]
    argv = sb.bwrap_argv(policy, ["true"])
    assert argv[-2:] == ["--", "true"] and "--die-with-parent" in argv and "--unshare-pid" in argv
    assert "--unshare-net" not in argv
    assert "--unshare-net" in sb.bwrap_argv(replace(policy, network=()), ["true"])
    with_proxy = sb.bwrap_argv(replace(policy, network=("a.test",)), ["true"])
    assert "relay-tcp" in with_proxy and with_proxy[with_proxy.index("HTTPS_PROXY") + 1].startswith("http://")


def test_a_missing_bwrap_is_reported_with_how_to_install(tmp_path: Path) -> None:
    ok, detail = sb.probe(str(tmp_path / "no-bwrap"))
    assert not ok and "bwrap cannot run" in detail
    saved = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path)
    try:
        ok, detail = sb.probe()
    finally:
        os.environ["PATH"] = saved
    assert not ok and "apt-get install bubblewrap" in detail, detail
    # a bwrap that the kernel or the container refuses (as with user namespaces turned off)
    refused = tmp_path / "bwrap"
    refused.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    refused.chmod(0o755)
    ok, detail = sb.probe(str(refused))
    assert not ok and "setting up uid map" in detail and "unprivileged_userns_clone" in detail, detail
    with pytest.raises(sbp.SandboxUnavailable, match="not supported"):
        sbp.ensure_available("docker")


def test_the_ask_human_relay_reaches_the_broker_outside(box: Box) -> None:
    """The relay inside the sandbox is the agent's "server"; the broker runs the real command
    outside with its own environment (here: a cat that echoes what the relay sent)."""
    echo = "import os, sys; sys.stdout.write(os.environ['SECRET_ENV'] + sys.stdin.read())"
    env = {"SECRET_ENV": "from-outside:"}
    policy = box.policy(
        mcp_command=[sys.executable, "-c", echo], mcp_env=env, network=()
    )  # no network at all
    relay = shlex.join(sb.mcp_relay_command())
    p = box.run(policy, f"echo hello | {relay}; cat {box.run_dir}/sandbox.json | wc -c")
    lines = p.stdout.split()
    assert lines[0] == "from-outside:hello", (p.stdout, p.stderr)
    assert lines[1] == "0"  # the policy (with the ask_human environment) is hidden inside


def test_task_file_keys(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    f = tmp_path / "tasks.toml"
    f.write_text(
        '[defaults]\nsandbox = "bwrap"\n'
        '[[task]]\nname = "a"\nprompt = "p"\nnetwork = ["api.anthropic.com"]\nsandbox_rw = ["cache"]\n'
        'sandbox_ro = ["~/.config/x"]\n'
        '[[task]]\nname = "b"\nprompt = "p"\nnetwork = "none"\nsandbox = "none"\n'
        '[[task]]\nname = "c"\nprompt = "p"\nnetwork = "on"\n'
    )
    res = load_taskfile(f, known_coders=())
    assert res.ok, res.errors
    a, b, c = res.specs
    assert a.sandbox == "bwrap" and a.network == ("api.anthropic.com",)
    assert a.sandbox_rw == (str(tmp_path / "cache"),)
    assert a.sandbox_ro == (str(Path("~/.config/x").expanduser()),)
    assert b.sandbox == "none" and b.network == () and c.network is None
    for spec in (a, b, c):
        assert spec_from_json(spec_to_json(spec)) == spec
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[task]]\nname = "a"\nprompt = "p"\nsandbox = "docker"\nnetwork = "off"\nsandbox_rw = "x"\n'
    )
    errors = [str(e) for e in load_taskfile(bad, known_coders=()).errors]
    assert any(":4: sandbox must be" in e and "docker is not supported yet" in e for e in errors), errors
    assert any(":5: network must be" in e for e in errors), errors
    assert any(":6: sandbox_rw must be an array" in e for e in errors), errors
    assert TaskSpec(name="x", prompt="p").sandbox is None


def test_the_launcher_exits_like_the_command(box: Box) -> None:
    assert box.run(box.policy(), "exit 7").returncode == 7
    # bwrap reports a command killed by a signal as 128 + the signal: the exit code the shim
    # records for an unsandboxed agent killed the same way
    p = box.run(box.policy(), "kill -TERM $$")
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, p.stderr)
