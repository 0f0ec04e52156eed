"""Sandboxed tasks through the real `fleet-tui` command (issue 18), with the real bwrap.

The shell and sim coders run in their worktree under ``sandbox = "bwrap"``: they commit to their
branch but cannot touch the user's checkout, HOME, secrets or the fleet home; ask_human still
reaches the store; kill, pause, adoption by a restarted engine and the fence of an unsupervised
shim all hold for the sandboxed process tree; a task asking for a sandbox that cannot be had never
starts. Tests of the sandbox's own walls are in tests/engine/test_sandbox_walls.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from fleet_tui.scheduler.sandbox import bwrap as sb
from helpers import by_name, fleet, fleet_bg, fleet_env, pid_alive, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", autouse=True)
def bwrap() -> None:
    ok, detail = sb.probe()
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(detail)
        pytest.skip(detail)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def user_home(tmp_path: Path) -> Path:
    home = tmp_path / "userhome"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    return home


def sandboxed_home(tmp_path: Path, **cfg: str) -> Path:
    home = tmp_path / "fleet"
    fleet(home, "config", "set", "sandbox", "bwrap")
    for k, v in cfg.items():
        fleet(home, "config", "set", k, v)
    return home


def test_a_worktree_task_commits_to_its_branch_and_cannot_escape(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "app.py").write_text("print('v1')\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    uhome = user_home(tmp_path)
    home = tmp_path / "fleet"
    probe = (
        "echo v2 > app.py && git add app.py && git commit -qm agent-v2 && echo COMMITTED; "
        f"echo x > {repo}/app.py 2>/dev/null || echo CHECKOUT-denied; "
        f"echo x > {uhome}/planted 2>/dev/null || echo HOME-denied; "
        f"cat {uhome}/.ssh/id_* 2>/dev/null || echo SSH-denied; "
        f"echo x > {home}/config.toml 2>/dev/null || echo FLEET-denied; "
        f"git -C {repo} branch -f main HEAD 2>/dev/null || echo MAIN-denied"
    )
    (tmp_path / "tasks.toml").write_text(
        f"""
[[task]]
name = "boxed"
coder = "shell"
cwd = "repo"
git_ref = "main"
sandbox = "bwrap"
command = "{probe}"
  [task.env]
  GIT_AUTHOR_NAME = "a"
  GIT_AUTHOR_EMAIL = "a@a"
  GIT_COMMITTER_NAME = "a"
  GIT_COMMITTER_EMAIL = "a@a"
"""
    )
    env = fleet_env(home, HOME=str(uhome))
    fleet(home, "load", str(tmp_path / "tasks.toml"), env=env)
    fleet(home, "run", "--until-idle", env=env)
    t = by_name(home)["boxed"]
    out = fleet(home, "logs", "boxed", env=env).stdout
    assert t["status"] == "done", (t, out)
    for word in ("COMMITTED", "CHECKOUT-denied", "HOME-denied", "SSH-denied", "FLEET-denied", "MAIN-denied"):
        assert word in out, (word, out)
    assert "PRIVATE KEY" not in out
    assert git(repo, "log", "-1", "--format=%s", "fleet/boxed").strip() == "agent-v2"
    assert git(repo, "log", "-1", "--format=%s", "main").strip() == "v1"
    assert (repo / "app.py").read_text() == "print('v1')\n"
    assert not (uhome / "planted").exists()
    assert (home / "config.toml").read_text().startswith("max_load_per_core")  # untouched


def test_ask_human_reaches_the_store_from_inside(tmp_path: Path) -> None:
    home = sandboxed_home(tmp_path)
    (tmp_path / "work").mkdir()
    fleet(home, "add", '@sim ask="Which database?"', "--coder", "sim", "--name", "asker", "--cwd",
          str(tmp_path / "work"))  # fmt: skip
    run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    try:

        def pending() -> list[dict[str, Any]]:
            assert run.poll() is None, (tmp_path / "run.log").read_text()
            data: list[dict[str, Any]] = json.loads(fleet(home, "questions", "--json").stdout)
            return data

        (q,) = wait_for(pending, 60, interval=0.3, what="the sandboxed agent's question")
        assert q["text"] == "Which database?"
        fleet(home, "answer", q["id"], "Use PostgreSQL 16.")
        assert run.wait(timeout=60) == 0, (tmp_path / "run.log").read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    t = by_name(home)["asker"]
    assert t["status"] == "done" and "PostgreSQL 16" in t["result_text"], t
    policy = json.loads((home / "tasks" / t["id"] / "attempts" / "1" / "sandbox.json").read_text())
    # the real server (its lean stdio entry point) ran outside, via the broker
    assert policy["mcp_command"][-1].endswith("mcp_stdio.py"), policy["mcp_command"]


def test_a_sandbox_that_cannot_be_had_never_starts(tmp_path: Path) -> None:
    home = tmp_path / "fleet"
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "git").symlink_to(shutil.which("git") or "/usr/bin/git")
    env = fleet_env(home, PATH=str(bare))  # git, but no bwrap on PATH
    (tmp_path / "work").mkdir()
    fleet(home, "config", "set", "sandbox", "bwrap", env=env)
    fleet(home, "add", "@sim steps=1", "--coder", "sim", "--name", "nobox", "--cwd", str(tmp_path / "work"),
          env=env)  # fmt: skip
    assert fleet(home, "run", "--until-idle", env=env, check=False).returncode == 3  # needs a person
    t = by_name(home)["nobox"]
    assert t["status"] == "needs_human", t
    assert t["reason"].startswith("never_started: sandbox bwrap: bwrap not found"), t["reason"]
    assert "apt-get install bubblewrap" in t["reason"]
    doc = fleet(home, "doctor", env=env, check=False)
    assert doc.returncode == 1 and "--  sandbox bwrap not usable" in doc.stdout, doc.stdout
    (bare / "bwrap").symlink_to(shutil.which("bwrap") or "/usr/bin/bwrap")
    doc = fleet(home, "doctor", env=env, check=False)
    assert "ok  sandbox bwrap usable" in doc.stdout and "default sandbox = bwrap" in doc.stdout, doc.stdout


def _tree(home: Path, name: str) -> tuple[dict[str, Any], list[int]]:
    t = by_name(home)[name]
    shim_file = home / "tasks" / t["id"] / "attempts" / str(t["attempt"]) / "shim.json"
    wait_for(lambda: shim_file.exists() and "agent_pid" in shim_file.read_text(), 20, what="shim.json")
    info = json.loads(shim_file.read_text())
    kids = psutil.Process(info["pid"]).children(recursive=True)
    return info, [info["pid"], *(k.pid for k in kids)]


def _sandboxed_tree(home: Path, name: str) -> tuple[dict[str, Any], list[int]]:
    """The shim's tree once the agent runs inside bwrap (the sim agent's python is in it)."""

    def ready() -> tuple[dict[str, Any], list[int]] | None:
        info, tree = _tree(home, name)
        names = []
        for pid in tree:
            try:
                names.append(" ".join(psutil.Process(pid).cmdline()))
            except psutil.Error:
                pass
        ok = any(os.path.basename(n.split(" ")[0]) == "bwrap" for n in names) and any(
            "sim_agent" in n for n in names
        )
        return (info, tree) if ok else None

    return wait_for(ready, 30, interval=0.2, what="the sandboxed agent's process tree")


def _state(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return "gone"


def test_pause_resume_adoption_and_kill_hold_for_a_sandboxed_agent(tmp_path: Path) -> None:
    home = sandboxed_home(tmp_path, kill_grace_s="2")
    (tmp_path / "work").mkdir()
    fleet(home, "add", "@sim ignore-sigterm\n@sim sleep=300", "--coder", "sim", "--name", "napper",
          "--cwd", str(tmp_path / "work"))  # fmt: skip
    run1 = fleet_bg(home, "run", log=tmp_path / "run1.log")
    run2: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: by_name(home)["napper"]["status"] == "running", 30, what="napper running")
        info, tree = _sandboxed_tree(home, "napper")
        fleet(home, "pause", "napper")
        wait_for(lambda: all(_state(p) in ("stopped", "gone") for p in tree[1:]), 10, what="all stopped")
        fleet(home, "resume", "napper")
        wait_for(lambda: all(_state(p) != "stopped" for p in tree[1:]), 10, what="all continued")
        # the supervisor dies; the sandboxed agent lives on under its shim and is adopted
        first_owner = by_name(home)["napper"]["owner"]
        os.kill(run1.pid, signal.SIGKILL)
        run1.wait(timeout=10)
        assert all(pid_alive(p) for p in tree)
        run2 = fleet_bg(home, "run", log=tmp_path / "run2.log")
        wait_for(
            lambda: by_name(home)["napper"]["owner"] not in (None, first_owner),
            30,
            what="the second engine to take the task over",
        )
        t = by_name(home)["napper"]
        assert t["status"] == "running" and t["attempt"] == 1, t
        info2, _ = _tree(home, "napper")
        assert info2["pid"] == info["pid"]  # the same shim: adopted, not restarted
        fleet(home, "kill", "napper")
        wait_for(lambda: not any(pid_alive(p) for p in tree), 15, interval=0.05, what="the tree to be gone")
        t = by_name(home)["napper"]
        assert t["status"] == "needs_human" and t["reason"] == "killed_by_user", t
    finally:
        for r in (run1, run2):
            if r is not None and r.poll() is None:
                r.send_signal(signal.SIGTERM)
                r.wait(timeout=30)


def test_an_unsupervised_sandboxed_agent_is_stopped_by_its_shim(tmp_path: Path) -> None:
    """No orphan: with its engine gone and nobody adopting, the shim's fence stops the whole
    sandboxed tree before the lease could be taken by another engine."""
    home = sandboxed_home(tmp_path, heartbeat_s="1", lease_s="4", kill_grace_s="1")
    (tmp_path / "work").mkdir()
    fleet(home, "add", "@sim sleep=300", "--coder", "sim", "--name", "alone", "--cwd", str(tmp_path / "work"))
    run = fleet_bg(home, "run", log=tmp_path / "run.log")
    try:
        wait_for(lambda: by_name(home)["alone"]["status"] == "running", 30, what="alone running")
        _, tree = _sandboxed_tree(home, "alone")
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=10)
    wait_for(lambda: not any(pid_alive(p) for p in tree), 30, interval=0.1, what="the fenced tree to be gone")
    t = by_name(home)["alone"]
    exit_info = json.loads((home / "tasks" / t["id"] / "attempts" / "1" / "exit.json").read_text())
    assert exit_info["reason"] == "lease_expired", exit_info


def test_doctor_and_validate_know_the_keys(tmp_path: Path) -> None:
    f = tmp_path / "tasks.toml"
    f.write_text('[[task]]\nname = "a"\nprompt = "p"\nsandbox = "docker"\n')
    p = subprocess.run(
        [sys.executable, "-m", "fleet_tui", "--home", str(tmp_path / "h"), "validate", str(f)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 1 and "tasks.toml:4: sandbox must be" in p.stderr + p.stdout, p


def test_verifiers_and_reviewers_run_in_the_sandbox(tmp_path: Path) -> None:
    """A ``run`` verifier gets the task's sandbox (the worktree writable, HOME not); an ``agent``
    reviewer gets a read-only one (its attempt to write is refused, and it still answers)."""
    uhome = user_home(tmp_path)
    home = sandboxed_home(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "tasks.toml").write_text(
        f"""
[[task]]
name = "checked"
coder = "shell"
cwd = "work"
command = "echo built > out.txt"
  [[task.verify]]
  run = "echo verified >> out.txt && ! touch {uhome}/from-verifier 2>/dev/null"
  [[task.verify]]
  agent = "@sim write=review.txt text=x\\n@sim say=PASS"
  coder = "sim"
"""
    )
    env = fleet_env(home, HOME=str(uhome))
    fleet(home, "load", str(tmp_path / "tasks.toml"), env=env)
    fleet(home, "run", "--until-idle", env=env)
    t = by_name(home)["checked"]
    assert t["status"] == "done", t
    assert (work / "out.txt").read_text() == "built\nverified\n"
    assert not (uhome / "from-verifier").exists()
    assert not (work / "review.txt").exists()  # the reviewer could not write
    reviews = home / "tasks" / t["id"] / "reviews" / "1"
    assert (reviews / "sandbox.json").exists()
    out = (reviews / "stdout.jsonl").read_text()
    assert "Read-only file system" in out, out[-2000:]
