"""Pull requests and issues end to end: the real CLI, a local bare repository as the remote and a
fake GitHub REST API on loopback (tests/fakeapi/github.py). No network.

- a ``merge = "pr"`` task pushes its branch and opens a pull request (head, base, title, a body
  naming the verifier results); changes requested on GitHub park it; a retry pushes again and
  updates the same pull request; a merge on GitHub marks it merged — all seen in ``status``;
- ``import github`` queues one task per labelled issue, once, and comments when a task starts;
- a rejected push, no remote, a bad token and an exhausted rate limit each park with a clear reason.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.fakeapi.github import TOKEN, FakeGitHub

from helpers import fleet, fleet_bg, fleet_env, wait_for

pytestmark = pytest.mark.timeout(120)

REPO = "acme/widgets"
_ID = {
    "GIT_AUTHOR_NAME": "Test User",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test User",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


@dataclass
class World:
    tmp: Path
    home: Path
    env: dict[str, str]
    gh: FakeGitHub

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return fleet(self.home, *args, check=check, env=self.env, timeout=60)

    def git(self, cwd: Path, *args: str) -> str:
        p = subprocess.run(
            ["git", "-C", str(cwd), *args], capture_output=True, text=True, env={**self.env, **_ID}
        )
        assert p.returncode == 0, f"git {args}: {p.stderr}"
        return p.stdout.strip()

    def repo(self, name: str = "repo", remote: bool = True) -> Path:
        """A checkout on main; with remote: origin is a bare repository at remotes/acme/widgets.git."""
        path = self.tmp / name
        path.mkdir()
        self.git(path, "init", "-q", "-b", "main")
        (path / "README").write_text("widgets\n")
        self.git(path, "add", "-A")
        self.git(path, "commit", "-q", "-m", "initial")
        if remote:
            bare = self.tmp / name / ".." / f"remotes-{name}" / "acme" / "widgets.git"
            bare.mkdir(parents=True)
            self.git(bare, "init", "-q", "--bare")
            self.git(path, "remote", "add", "origin", str(bare.resolve()))
            self.git(path, "push", "-q", "origin", "main")
        return path.resolve()

    def load(self, repo: Path, name: str, verify: str = "test -f fix.txt") -> None:
        f = self.tmp / f"{name}.toml"
        f.write_text(
            f'[[task]]\nname = "{name}"\ncwd = "{repo}"\ngit_ref = "main"\nmerge = "pr"\ncoder = "sim"\n'
            f'prompt = """Fix the widget {name}\n@sim write=fix.txt text="fixed\\n"\n"""\n'
            f'  [[task.verify]]\n  run = "{verify}"\n'
        )
        self("load", str(f))

    def run_idle(self) -> None:
        p = fleet_bg(self.home, "run", "--until-idle", env=self.env, log=self.tmp / "run.log")
        # 0: all finished; 3: a task parked (a person is needed)
        assert p.wait(timeout=90) in (0, 3), (self.tmp / "run.log").read_text()

    def tasks(self) -> dict[str, dict[str, Any]]:
        return {t["name"]: t for t in json.loads(self("status", "--json").stdout)}


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    gh = FakeGitHub()
    base = gh.start()
    user = tmp_path / "user"
    user.mkdir()
    (user / ".gitconfig").write_text("")
    home = tmp_path / "fleet"
    home.mkdir()
    (home / "config.toml").write_text(
        "max_load_per_core = 1000.0\nmem_floor_gib = 0.1\ndisk_floor_gib = 0.1\n"
        "retry_backoff_s = [0.0]\ngithub_poll_s = 1.0\n"
    )
    env = fleet_env(
        home,
        HOME=str(user),
        GIT_CONFIG_GLOBAL=str(user / ".gitconfig"),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CEILING_DIRECTORIES=str(tmp_path),
        GIT_TERMINAL_PROMPT="0",
        GITHUB_API_URL=base,
        GH_TOKEN=TOKEN,
        PATH="/usr/bin:/bin",  # no gh CLI: the token comes from GH_TOKEN only
    )
    env.pop("GITHUB_TOKEN", None)
    yield World(tmp_path, home, env, gh)
    gh.stop()


def test_pr_opened_changes_requested_updated_merged(w: World) -> None:
    repo = w.repo()
    w.load(repo, "fix-a")
    w.run_idle()

    t = w.tasks()["fix-a"]
    bare = repo.parent / "remotes-repo" / "acme" / "widgets.git"
    assert w.git(bare, "rev-parse", "refs/heads/fleet/fix-a") == w.git(repo, "rev-parse", "fleet/fix-a")
    (create,) = w.gh.calls_to("POST", f"/repos/{REPO}/pulls")
    assert create.body["head"] == "fleet/fix-a" and create.body["base"] == "main"
    assert create.body["title"] == "Fix the widget fix-a"
    assert "`run: test -f fix.txt`: passed" in create.body["body"]
    assert t["id"] in create.body["body"] and "fix.txt" in create.body["body"]  # task id, diffstat
    pr = t["pull_request"]
    assert t["status"] == "done" and pr["state"] == "open" and pr["number"] == 1
    assert pr["url"] == f"https://github.example/{REPO}/pull/1"
    assert "PR #1 open" in w("status").stdout

    # a reviewer asks for changes: the engine's poll parks the task with the review's words
    w.gh.request_changes(REPO, 1, "Please also handle the empty widget.")
    w.gh.set_check("sha-1", "failure")
    engine = fleet_bg(w.home, "run", env=w.env, log=w.tmp / "engine.log")
    try:
        wait_for(lambda: w.tasks()["fix-a"]["status"] == "needs_human", 30, 0.3, "changes requested parks")
    finally:
        engine.terminate()
        engine.wait(timeout=30)
    t = w.tasks()["fix-a"]
    assert t["reason"].startswith("changes_requested: pull request #1: Please also handle the empty widget.")
    assert t["pull_request"]["review"] == "changes_requested" and t["pull_request"]["checks"] == "failing"

    # a retry runs again, pushes to the same branch and updates the same pull request
    w("retry", "fix-a")
    w.run_idle()
    t = w.tasks()["fix-a"]
    assert t["status"] == "done" and t["attempt"] == 2, t
    assert len(w.gh.calls_to("POST", f"/repos/{REPO}/pulls")) == 1
    (update,) = w.gh.calls_to("PATCH", f"/repos/{REPO}/pulls/1")
    assert "attempt 2" in update.body["body"] and "passed" in update.body["body"]
    assert t["reason"].startswith("pull request #1 updated")

    # merged on GitHub: the task is marked merged
    w.gh.merge(REPO, 1, "feedfacecafe0123")
    engine = fleet_bg(w.home, "run", env=w.env, log=w.tmp / "engine2.log")
    try:
        wait_for(lambda: w.tasks()["fix-a"]["merged_commit"], 30, 0.3, "the merge seen")
    finally:
        engine.terminate()
        engine.wait(timeout=30)
    t = w.tasks()["fix-a"]
    assert t["status"] == "done" and t["merged_commit"] == "feedfacecafe0123"
    assert t["reason"] == "merged feedfaceca via pull request #1" and t["pull_request"]["state"] == "merged"


def test_import_issues_once_and_comment_on_start(w: World) -> None:
    repo = w.repo()
    one = w.gh.add_issue(
        REPO, "Login button is blue", 'Make it green.\n@sim write=fix.txt text="g\\n"', ("fleet",)
    )
    two = w.gh.add_issue(REPO, "Typo in README", "widgts", ("fleet", "docs"))
    w.gh.add_issue(REPO, "Not for the fleet", "", ("question",))
    w.gh.add_issue(REPO, "A pull request", "", ("fleet",), pull=True)

    args = ("import", "github", REPO, "--label", "fleet", "--cwd", str(repo), "--coder", "sim", "--comment")
    out = w(*args).stdout
    assert "queued 2 task(s) from 2 matching issue(s); 0 already imported" in out
    tasks = w.tasks()
    assert set(tasks) == {f"gh-{one}-login-button-is-blue", f"gh-{two}-typo-in-readme"}
    t1 = tasks[f"gh-{one}-login-button-is-blue"]
    assert t1["issue_url"] == f"https://github.example/{REPO}/issues/{one}"
    assert "queued 0 task(s) from 2 matching issue(s); 2 already imported" in w(*args).stdout
    assert len(w.tasks()) == 2

    engine = fleet_bg(w.home, "run", env=w.env, log=w.tmp / "engine.log")
    try:
        wait_for(
            lambda: {n for _, n, b in w.gh.comments if "started working" in b} == {one, two},
            40,
            0.3,
            "a start comment on each issue",
        )
        wait_for(lambda: all(t["status"] == "done" for t in w.tasks().values()), 40, 0.3, "both done")
    finally:
        engine.terminate()
        engine.wait(timeout=30)
    creates = w.gh.calls_to("POST", f"/repos/{REPO}/pulls")
    assert len(creates) == 2 and any(f"Closes #{one}." in c.body["body"] for c in creates)
    assert {n for _, n, b in w.gh.comments if "opened pull request" in b} == {one, two}
    starts = [c for c in w.gh.comments if "started working" in c[2]]
    assert len(starts) == 2  # once each, not every poll


def test_failures_park_with_a_clear_reason(w: World) -> None:
    # a push the remote rejects: its branch has a commit the task's branch lacks
    repo = w.repo()
    bare = repo.parent / "remotes-repo" / "acme" / "widgets.git"
    other = w.tmp / "other"
    w.git(w.tmp, "clone", "-q", str(bare), str(other))
    w.git(other, "checkout", "-q", "-b", "fleet/diverged")
    (other / "x.txt").write_text("someone else\n")
    w.git(other, "add", "-A")
    w.git(other, "commit", "-q", "-m", "theirs")
    w.git(other, "push", "-q", "origin", "fleet/diverged")
    w.load(repo, "diverged")
    lonely = w.repo("lonely", remote=False)
    w.load(lonely, "no-remote")
    w.run_idle()
    ts = w.tasks()
    assert ts["diverged"]["status"] == "needs_human"
    assert ts["diverged"]["reason"].startswith("push_rejected: non-fast-forward: origin/fleet/diverged")
    assert ts["no-remote"]["status"] == "needs_human"
    assert ts["no-remote"]["reason"].startswith("push_rejected: no git remote")
    assert w.gh.calls_to("POST", f"/repos/{REPO}/pulls") == []

    # a bad token: a one-line reason; `import` says the same and exits 1
    w.gh.bad_token = True
    w.load(repo, "bad-token")
    w.run_idle()
    t = w.tasks()["bad-token"]
    assert t["status"] == "needs_human"
    assert t["reason"].startswith("pull_request_failed: GitHub API: bad credentials (401)")
    assert t["pull_request"]["error"] == t["reason"]
    bad = w("import", "github", REPO, "--cwd", str(repo), check=False)
    assert bad.returncode == 1 and "bad credentials (401)" in bad.stderr
    assert "Traceback" not in bad.stderr and TOKEN not in bad.stderr + bad.stdout

    # an exhausted rate limit (403, x-ratelimit-remaining: 0)
    w.gh.bad_token, w.gh.rate_limited = False, True
    w.load(repo, "rate-limited")
    w.run_idle()
    t = w.tasks()["rate-limited"]
    assert t["status"] == "needs_human"
    assert t["reason"].startswith("pull_request_failed: GitHub API rate limit exhausted until ")

    # once GitHub answers again, `merge` (m) on the parked task pushes and opens the pull request
    w.gh.rate_limited = False
    assert "pull request #" in w("merge", "rate-limited").stdout
    assert w.tasks()["rate-limited"]["status"] == "done"
    assert TOKEN not in "".join(p.read_text(errors="replace") for p in w.home.rglob("*") if p.is_file())


def test_a_branch_with_conflict_markers_is_never_pushed(w: World) -> None:
    """An agent that leaves a conflict block fails its attempts; approved by a person anyway, its
    branch is still not pushed: merged on GitHub, the markers would reach the base."""
    repo = w.repo()
    f = w.tmp / "marked.toml"
    block = r"<<<<<<< HEAD\nmine\n=======\ntheirs\n>>>>>>> main\n"  # the sim turns \n into newlines
    f.write_text(
        f'[[task]]\nname = "marked"\ncwd = "{repo}"\ngit_ref = "main"\nmerge = "pr"\ncoder = "sim"\n'
        f"max_retries = 0\nprompt = '''Fix it\n@sim write=fix.txt text=\"{block}\"\n'''\n"
    )
    w("load", str(f))
    w.run_idle()
    t = w.tasks()["marked"]
    assert t["status"] == "needs_human" and t["reason"] == "retries_exhausted"
    w("approve", "marked")
    refused = w("merge", "marked", check=False)
    assert refused.returncode == 1
    assert (
        "push_rejected: its branch adds conflict markers (<<<<<<< ======= >>>>>>>) in fix.txt"
        in refused.stderr
    )
    t = w.tasks()["marked"]
    assert t["status"] == "needs_human" and t["reason"].startswith("push_rejected: its branch adds conflict")
    assert w.gh.calls_to("POST", f"/repos/{REPO}/pulls") == []
    bare = repo.parent / "remotes-repo" / "acme" / "widgets.git"
    assert w.git(bare, "branch", "--list", "fleet/marked") == ""
