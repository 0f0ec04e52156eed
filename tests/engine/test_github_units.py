"""The GitHub pieces in isolation: the client against the fake API, the poll's decisions, naming of
imported tasks, remote URL parsing. The whole flows through the CLI are in
tests/e2e/test_pullrequest_flow.py."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.fakeapi.github import TOKEN, FakeGitHub

from fleet_tui.scheduler.github import ghimport
from fleet_tui.scheduler.github.api import GitHub, GitHubError, Issue, RateLimited, find_token
from fleet_tui.scheduler.github.prwatch import tick
from fleet_tui.scheduler.github.pullrequest import get_link, link_line, put_link, repo_slug
from fleet_tui.scheduler.model import TaskSpec
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store.sqlite_store import SqliteStore

pytestmark = pytest.mark.timeout(30)
REPO = "acme/widgets"


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    f = FakeGitHub()
    f.start()
    yield f
    f.stop()


PG_URL = os.environ.get("FLEET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Both stores: the GitHub records live in their settings table."""
    if request.param == "sqlite":
        s: Any = SqliteStore(str(tmp_path / "fleet.db"))
        yield s
        s.close()
        return
    import psycopg
    from psycopg import sql

    from fleet_tui.scheduler.store.postgres_store import PostgresStore

    schema = f"fleet_test_{uuid.uuid4().hex[:12]}"
    try:
        s = PostgresStore(PG_URL, schema=schema)
    except Exception as e:
        pytest.skip(f"PostgreSQL unreachable at {PG_URL}: {e}")
    try:
        yield s
    finally:
        s.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _done_pr_task(store: Any, fake: FakeGitHub) -> str:
    """A done merge=pr task whose pull request #N is open on the fake."""
    (t,) = store.add_tasks([TaskSpec(name="t1", prompt="p", merge="pr")], 1.0)
    store.claim("o", "h", (), 2.0, 30.0, "sim", None)
    store.transition(t.id, TaskStatus.DONE, reason=None, now=3.0)
    pr = GitHub(TOKEN, fake.base).create_pull(REPO, head="fleet/t1", base="main", title="t", body="b")
    put_link(store, t.id, {"repo": REPO, "pr": pr.number, "state": "open", "url": pr.url})
    return t.id


def test_repo_slug_from_remote_urls() -> None:
    assert repo_slug("git@github.com:acme/widgets.git") == REPO
    assert repo_slug("https://github.com/acme/widgets") == REPO
    assert repo_slug("https://ghe.example.com/acme/widgets.git/") == REPO
    assert repo_slug("/srv/git/acme/widgets.git") == REPO
    assert repo_slug("widgets") is None


def test_token_from_env_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GH_TOKEN", "")
    monkeypatch.setenv("GITHUB_TOKEN", "from-github-token")
    assert find_token() == "from-github-token"
    monkeypatch.setenv("GH_TOKEN", "from-gh-token")
    assert find_token() == "from-gh-token"


def test_errors_are_one_line_reasons(fake: FakeGitHub) -> None:
    with pytest.raises(GitHubError, match=r"^GitHub API: bad credentials \(401\)"):
        GitHub("wrong", fake.base).issues(REPO)
    fake.rate_limited = True
    with pytest.raises(RateLimited, match="rate limit exhausted until") as e:
        GitHub(TOKEN, fake.base).issues(REPO)
    assert e.value.reset_at is not None
    fake.rate_limited = False
    with pytest.raises(GitHubError, match="cannot reach the GitHub API"):
        GitHub(TOKEN, "http://127.0.0.1:9").issues(REPO)


def test_poll_parks_once_per_review_and_notes_checks(store: Any, fake: FakeGitHub) -> None:
    tid = _done_pr_task(store, fake)
    gh = GitHub(TOKEN, fake.base)
    assert tick(store, 10.0, "t", poll=True, gh=gh) == []
    assert get_link(store, tid)["state"] == "open"
    fake.set_check("sha-1", None)
    fake.request_changes(REPO, 1, "no")
    (t,) = tick(store, 11.0, "t", poll=True, gh=gh)
    assert t.status == TaskStatus.NEEDS_HUMAN and t.reason == "changes_requested: pull request #1: no"
    assert link_line(get_link(store, tid)) == "PR #1 open, checks pending, changes requested"
    store.transition(tid, TaskStatus.DONE, reason="fixed by hand", now=12.0)
    assert tick(store, 13.0, "t", poll=True, gh=gh) == []  # the same review does not park it again
    fake.request_changes(REPO, 1, "still no")
    (t,) = tick(store, 14.0, "t", poll=True, gh=gh)
    assert t.reason == "changes_requested: pull request #1: still no"


def test_poll_rate_limit_recorded_and_raised(store: Any, fake: FakeGitHub) -> None:
    tid = _done_pr_task(store, fake)
    fake.rate_limited = True
    with pytest.raises(RateLimited):
        tick(store, 10.0, "t", poll=True, gh=GitHub(TOKEN, fake.base))
    assert "rate limit" in get_link(store, tid)["error"]
    assert store.get_task(tid).status == TaskStatus.DONE
    calls = len(fake.calls)
    assert tick(store, 11.0, "t", poll=False, gh=GitHub(TOKEN, fake.base)) == []
    assert len(fake.calls) == calls  # no poll due, no comment owed: no call at all


def test_import_names_and_idempotence() -> None:
    issues = [Issue(7, "Fix: the Login page!", "b", "u7"), Issue(8, "", "", "u8")]
    template = TaskSpec(name="-", prompt="-", merge="pr")
    existing = [TaskSpec(name="gh-7-fix-the-login-page", prompt="x")]
    planned = ghimport.plan(REPO, issues, template, existing)
    assert [p.spec.name for p in planned if p.spec] == ["widgets-7-fix-the-login-page", "gh-8"]
    assert planned[0].spec and planned[0].spec.source == "github:acme/widgets#7"
    assert planned[0].spec.prompt == "Fix: the Login page!\n\nb\n\nGitHub issue: u7"
    again = ghimport.plan(REPO, issues, template, [p.spec for p in planned if p.spec])
    assert all(p.spec is None for p in again)


def test_controller_pull_request_line(store: Any, fake: FakeGitHub) -> None:
    import anyio

    from fleet_tui.scheduler.control import Controller

    tid = _done_pr_task(store, fake)
    put_link(store, tid, {"checks": "passing"})
    line = anyio.run(Controller(store, actor="t").pull_request, "t1")
    assert line == f"PR #1 open, checks passing · https://github.example/{REPO}/pull/1"
    (other,) = store.add_tasks([TaskSpec(name="t2", prompt="p")], 5.0)
    assert anyio.run(Controller(store, actor="t").pull_request, other.id) is None


def test_imported_task_comments_on_start_and_park_once(store: Any, fake: FakeGitHub) -> None:
    n = fake.add_issue(REPO, "Broken", "b", ("fleet",))
    (t,) = store.add_tasks([TaskSpec(name="gh-1", prompt="p", source=f"github:{REPO}#{n}")], 1.0)
    put_link(store, t.id, {"repo": REPO, "issue": n, "comment": True})
    gh = GitHub(TOKEN, fake.base)
    assert tick(store, 2.0, "t", poll=False, gh=gh) == [] and fake.comments == []  # not started yet
    store.claim("o", "h", (), 2.0, 30.0, "sim", None)
    store.transition(t.id, TaskStatus.NEEDS_HUMAN, reason="retries_exhausted", now=3.0)
    tick(store, 4.0, "t", poll=False, gh=gh)
    tick(store, 5.0, "t", poll=False, gh=gh)
    said = [b for _, i, b in fake.comments if i == n]
    assert len(said) == 2 and "started working" in said[0] and "needs a person: retries_exhausted" in said[1]
    assert get_link(store, t.id)["said"] == ["park:1", "start"]


def test_publish_on_a_parked_task_without_remote_does_not_raise(store: Any, tmp_path: Path) -> None:
    import subprocess

    from fleet_tui.scheduler.git.worktree import WorktreeInfo
    from fleet_tui.scheduler.github.pullrequest import publish
    from fleet_tui.scheduler.lifecycle import Lifecycle

    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "-C", str(repo), "init", "-q", "-b", "main"], check=True)
    (t,) = store.add_tasks([TaskSpec(name="t1", prompt="p", merge="pr", git_ref="main")], 1.0)
    store.claim("o", "h", (), 2.0, 30.0, "sim", None)
    store.transition(t.id, TaskStatus.NEEDS_HUMAN, reason="push_rejected: no git remote", now=3.0)
    life = Lifecycle(store, lambda: 4.0, "t")
    info = WorktreeInfo(repo, tmp_path / "gone", "fleet/t1", "main", "0" * 40)
    res = publish(life, store.get_task(t.id), info)
    assert not res.ok and "push_rejected: no git remote" in res.message
    assert store.get_task(t.id).status == TaskStatus.NEEDS_HUMAN


def test_push_refused_by_the_remote_names_why(tmp_path: Path) -> None:
    import subprocess

    from fleet_tui.scheduler.github.pullrequest import push

    bare = tmp_path / "acme" / "widgets.git"
    bare.mkdir(parents=True)
    subprocess.run(["git", "-C", str(bare), "init", "-q", "--bare"], check=True)
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(
        "#!/bin/sh\necho 'GH006: Protected branch update failed for refs/heads/fleet/x.' >&2\nexit 1\n"
    )
    hook.chmod(0o755)
    repo = tmp_path / "r"
    ident = ["-c", "user.name=T", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "fleet/x", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), *ident, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    subprocess.run(["git", "-C", str(repo), "remote", "add", "origin", str(bare)], check=True)
    with pytest.raises(GitHubError, match=r"^push_rejected: .*Protected branch update failed"):
        push(repo, "origin", "fleet/x")
