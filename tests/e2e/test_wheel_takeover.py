"""`fleet-tui takeover` for real: a running agent is stopped, its CLI opens in a new tmux window in
the task's worktree, and when the person leaves it, the four choices do what they say.

Why: takeover is a terminal dance (a headless agent stopped, a window opened where the work is,
a question asked in the first pane), so it runs in a real tmux server on a private socket, with
the shell coder standing in for an interactive CLI (its takeover opens the person's ``$SHELL``,
here a script that records where it ran). The choices after the takeover are also driven with
``--then`` in the foreground, one by one. Every wait is on a condition, never a bare sleep.

The real interactive ``claude`` is tested too, against the fake Anthropic API: the tmux server
runs with the person's environment (a temporary HOME whose ``~/.claude.json`` says onboarding is
done, the folder trusted and the API key approved, as after a person's first use), the takeover
window shows Claude Code's UI resumed on the task's session, a typed message reaches the fake
model with the headless run's conversation before it, and ``/exit`` brings the four choices.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_tui.scheduler.store.opener import open_store
from helpers import by_name, fleet, fleet_bg, fleet_env, wait_for

pytestmark = [pytest.mark.tmux, pytest.mark.timeout(120)]


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def git_repo(path: Path) -> Path:
    path.mkdir()
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "t@e.st"],
        ["config", "user.name", "t"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    (path / "README").write_text("repo\n")
    subprocess.run(["git", "add", "."], cwd=path, check=True)
    subprocess.run(["git", "commit", "-qm", "init"], cwd=path, check=True)
    return path


@pytest.fixture
def tmux_socket() -> Iterator[str]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("tmux is not installed (CI=true): apt-get install tmux")
        pytest.skip("tmux is not installed: apt-get install tmux")
    sock = f"fleet-takeover-{uuid.uuid4().hex[:8]}"
    yield sock
    subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)


def tmux(sock: str, *args: str) -> str:
    out = subprocess.run(
        ["tmux", "-L", sock, "-f", "/dev/null", *args], capture_output=True, text=True, timeout=15
    )
    return out.stdout


def test_takeover_in_tmux_stops_the_agent_opens_the_worktree_and_asks(
    tmp_path: Path, tmux_socket: str
) -> None:
    home = tmp_path / "fleet"
    repo = git_repo(tmp_path / "repo")
    fleet(home, "config", "set", "retry_backoff_s", "0")
    # the headless "agent" runs until stopped
    fleet(home, "add", "work", "--name", "job", "--coder", "shell", "--command", "echo started; sleep 300",
          "--cwd", str(repo), "--git-ref", "main")  # fmt: skip
    engine = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    try:
        wait_for(lambda: by_name(home)["job"]["status"] == "running", timeout=60, what="job running")
        where = tmp_path / "where.txt"
        shell = script(
            tmp_path / "person.sh", f'echo "$PWD" > {where}; tmux display -p "#{{window_name}}" >> {where}'
        )
        driver = script(
            tmp_path / "takeover.sh",
            f"export FLEET_HOME={home} SHELL={shell}\n"
            f"exec {sys.executable} -m fleet_tui --home {home} takeover job",
        )
        env_flags = ["-e", f"PATH={os.environ['PATH']}"]
        tmux(tmux_socket, "new-session", "-d", "-s", "main", "-x", "120", "-y", "30", *env_flags, str(driver))

        def asked() -> bool:
            return "[v]erify now, [r]equeue, mark [d]one, or [l]eave parked?" in tmux(
                tmux_socket, "capture-pane", "-p", "-t", "main:0"
            )

        wait_for(asked, timeout=60, what="the question after the takeover window closed")
        t = by_name(home)["job"]
        assert t["status"] == "needs_human" and t["reason"].startswith("taken over by "), t
        pwd, window = where.read_text().split("\n")[:2]
        assert Path(pwd).resolve() == Path(t["worktree"]).resolve() and window == "takeover:job", (
            pwd,
            window,
        )
        store = open_store(None, str(home))
        try:
            attempt = store.get_attempt(t["id"], 1)
            assert attempt is not None and attempt.outcome == "killed"  # the headless agent was stopped
        finally:
            store.close()
        tmux(tmux_socket, "send-keys", "-t", "main:0", "r", "Enter")
        wait_for(lambda: by_name(home)["job"]["status"] != "needs_human", timeout=30, what="requeued")
        assert by_name(home)["job"]["reason"].startswith("requeued after takeover by ")
    finally:
        engine.kill()
        engine.wait(timeout=30)


@pytest.fixture
def parked(tmp_path: Path) -> Path:
    """A home whose task ``job`` failed its verifier and waits for a person."""
    home = tmp_path / "fleet"
    fleet(home, "config", "set", "retry_backoff_s", "0")
    flag = tmp_path / "fixed"
    fleet(home, "add", "work", "--name", "job", "--coder", "shell", "--command", "echo tried",
          "--cwd", str(tmp_path), "--verify", f"test -e {flag}", "--max-retries", "0")  # fmt: skip
    fleet(home, "run", "--until-idle", timeout=90, check=False)
    assert by_name(home)["job"]["status"] == "needs_human"
    return home


def takeover(home: Path, tmp_path: Path, then: str, fix: bool = False) -> subprocess.CompletedProcess[str]:
    body = f"touch {tmp_path / 'fixed'}" if fix else "true"
    env = fleet_env(home, SHELL=str(script(tmp_path / "person.sh", body)))
    env.pop("TMUX", None)
    return fleet(home, "takeover", "job", "--then", then, env=env, check=False)


def test_takeover_then_verify_passes_or_parks(parked: Path, tmp_path: Path) -> None:
    p = takeover(parked, tmp_path, "verify")
    assert p.returncode == 1 and "verify failed" in p.stderr, p.stderr
    t = by_name(parked)["job"]
    assert t["status"] == "needs_human" and "(after takeover by " in t["reason"], t
    p = takeover(parked, tmp_path, "verify", fix=True)
    assert p.returncode == 0, p.stderr
    t = by_name(parked)["job"]
    assert t["status"] == "done" and t["reason"].startswith("verified after takeover by "), t


def test_takeover_then_done_and_leave(parked: Path, tmp_path: Path) -> None:
    assert takeover(parked, tmp_path, "leave").returncode == 0
    t = by_name(parked)["job"]
    assert t["status"] == "needs_human" and t["reason"].startswith("parked after takeover by "), t
    assert takeover(parked, tmp_path, "done").returncode == 0
    t = by_name(parked)["job"]
    assert t["status"] == "done" and t["reason"].startswith("approved_by:"), t


def test_takeover_then_requeue_continues_with_a_note(parked: Path, tmp_path: Path) -> None:
    assert takeover(parked, tmp_path, "requeue", fix=True).returncode == 0
    assert by_name(parked)["job"]["status"] == "queued"
    fleet(parked, "run", "--until-idle", timeout=90, check=False)
    t = by_name(parked)["job"]
    assert t["status"] == "done" and t["attempt"] == 2, t
    prompt = (parked / "tasks" / t["id"] / "attempts" / "2" / "prompt.txt").read_text()
    assert "took this task over and worked on it interactively" in prompt


# -- the real interactive claude -------------------------------------------------------------------


def claude_user_for_takeover(home: Path, work: Path) -> None:
    """``~/.claude.json`` as it is once a person has used Claude Code here: onboarding done, this
    folder trusted, the API key from the environment approved (no dialog stands in the way)."""
    state = {
        "hasCompletedOnboarding": True,
        "projects": {str(work.resolve()): {"hasTrustDialogAccepted": True}},
        "customApiKeyResponses": {"approved": ["sk-ant-fake"[-20:]], "rejected": []},
    }
    (home / ".claude.json").write_text(json.dumps(state))


@pytest.mark.realcli
@pytest.mark.timeout(180)
def test_takeover_opens_the_real_claude_on_the_tasks_session(tmp_path: Path, tmux_socket: str) -> None:
    from tests.e2e.test_real_agents import Fleet, claude_env
    from tests.fakeapi import Text, require_program
    from tests.fakeapi.anthropic import serve_anthropic

    require_program("claude")
    fl = Fleet(tmp_path)
    claude_user_for_takeover(fl.user_home, fl.work)
    script_ = [Text("HEADLESS-FIRST-PASS"), Text("INTERACTIVE-REPLY")]
    with serve_anthropic(script_) as (url, rec):
        claude_env(fl, url)
        fl.add("claude", "doc", "Write a module docstring", "--verify", "false", "--max-retries", "0")
        fl.run_until_idle()
        t = fl.task("doc")
        assert t["status"] == "needs_human", (t, fl.stderr_of("doc"))
        sid = next(e["session_id"] for e in fl.logs_json("doc") if e["kind"] == "session_started")
        # the person's terminal: a tmux server started with their environment (HOME, API key, URL)
        driver = script(
            tmp_path / "takeover.sh", f"exec {sys.executable} -m fleet_tui --home {fl.home} takeover doc"
        )
        subprocess.run(
            ["tmux", "-L", tmux_socket, "-f", "/dev/null", "new-session", "-d", "-s", "main",
             "-x", "150", "-y", "40", "-c", str(fl.work), str(driver)],
            env=fl.env, check=True, timeout=15,
        )  # fmt: skip

        def pane(target: str) -> str:
            return tmux(tmux_socket, "capture-pane", "-p", "-t", target)

        def window() -> str:
            return tmux(tmux_socket, "list-windows", "-t", "main", "-F", "#{window_index} #{window_name}")

        wait_for(lambda: "takeover:doc" in window(), timeout=60, what="the takeover window")
        index = next(w.split()[0] for w in window().splitlines() if w.endswith("takeover:doc"))
        target = f"main:{index}"
        # Claude Code's own UI, resumed on the task's conversation (its first answer is shown)
        wait_for(lambda: "Claude Code" in pane(target), timeout=60, what="the claude UI")
        wait_for(lambda: "HEADLESS-FIRST-PASS" in pane(target), timeout=60, what="the resumed conversation")
        cwd = tmux(tmux_socket, "display", "-p", "-t", target, "#{pane_current_path}").strip()
        assert Path(cwd).resolve() == fl.work.resolve(), cwd
        t = fl.task("doc")
        assert t["status"] == "needs_human" and t["reason"].startswith("taken over by "), t
        tmux(tmux_socket, "send-keys", "-t", target, "-l", "Please finish it by hand")
        tmux(tmux_socket, "send-keys", "-t", target, "Enter")
        wait_for(lambda: "INTERACTIVE-REPLY" in pane(target), timeout=60, what="the model's answer")
        # the request that carried the person's line (Claude Code makes side calls of its own, a
        # one-message one came after the reply once, on a loaded machine)
        last = next(
            r
            for r in reversed(rec.model_requests())
            if "Please finish it by hand" in json.dumps(r.body.get("messages", []))
        )
        texts = [json.dumps(m.get("content")) for m in last.body.get("messages", [])]
        mine = [i for i, x in enumerate(texts) if "Please finish it by hand" in x]
        first = [i for i, x in enumerate(texts) if "HEADLESS-FIRST-PASS" in x]
        assert mine and first and first[0] < mine[0], texts  # the same conversation, continued
        assert last.headers["x-claude-code-session-id"] == sid, (last.headers, sid)
        tmux(tmux_socket, "send-keys", "-t", target, "-l", "/exit")
        tmux(tmux_socket, "send-keys", "-t", target, "Enter")
        wait_for(
            lambda: "[v]erify now, [r]equeue, mark [d]one, or [l]eave parked?" in pane("main:0"),
            timeout=60,
            what="the four choices after claude exited",
        )
        tmux(tmux_socket, "send-keys", "-t", "main:0", "d", "Enter")
        wait_for(lambda: fl.task("doc")["status"] == "done", timeout=30, what="marked done")
    assert fl.task("doc")["reason"].startswith("approved_by:")
