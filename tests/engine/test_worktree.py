"""Worktree engine module against real git repositories in tmp_path."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleet_tui.scheduler.git import worktree as wt
from fleet_tui.scheduler.git.merge import merge_branch
from fleet_tui.scheduler.git.worktree import WorktreeInfo

pytestmark = pytest.mark.timeout(120)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(autouse=True)
def git_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "_home"
    home.mkdir()
    (home / "gitconfig").write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(var, raising=False)
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Test User")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.com")


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in (files or {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n"}).items():
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path.resolve()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "fleet" / "worktrees"


def snapshot(repo: Path) -> dict[str, object]:
    """What the user sees of their checkout: branch, HEAD, index, status and file contents."""
    files = {
        str(p.relative_to(repo)): p.read_bytes()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(repo).parts
    }
    return {
        "branch": git(repo, "symbolic-ref", "HEAD"),
        "head": git(repo, "rev-parse", "HEAD"),
        "index": git(repo, "ls-files", "-s"),
        "status": git(repo, "status", "--porcelain"),
        "files": files,
    }


def edit_and_commit(info: WorktreeInfo, name: str, text: str) -> str:
    (info.path / name).write_text(text)
    sha = wt.wip_commit(info.path, f"edit {name}")
    assert sha is not None
    return sha


def worktree_paths(repo: Path) -> list[str]:
    return [
        line.split(" ", 1)[1]
        for line in git(repo, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


# --------------------------------------------------------------------------- find / exclude


def test_find_repo_innermost_and_none(tmp_path: Path) -> None:
    outer = make_repo(tmp_path / "outer")
    inner = make_repo(outer / "sub" / "inner")
    (inner / "deep").mkdir()
    assert wt.find_repo(inner / "deep") == inner
    assert wt.find_repo(outer / "sub") == outer
    plain = tmp_path / "plain"
    plain.mkdir()
    assert wt.find_repo(plain) is None
    assert wt.find_repo(tmp_path / "does-not-exist") is None
    assert wt.find_repo(outer / ".git") is None


def test_ensure_exclude_idempotent_and_common_dir(repo: Path, root: Path) -> None:
    wt.ensure_exclude(repo, ["/.fleet/", "*.fleet-tmp"])
    info = wt.create_worktree(repo, root, "t1", "main")
    wt.ensure_exclude(info.path, ["/.fleet/", "*.fleet-tmp", "/other/"])  # from a linked worktree
    lines = (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert lines.count("/.fleet/") == 1 and lines.count("*.fleet-tmp") == 1 and "/other/" in lines
    assert not (repo / ".gitignore").exists()


def test_fleet_home_inside_repo_leaves_status_empty(repo: Path) -> None:
    root = repo / ".fleet" / "worktrees"
    a = wt.create_worktree(repo, root, "ta", "main")
    edit_and_commit(a, "a.txt", "from ta\n")
    (a.path / "new.txt").write_text("untracked in worktree\n")
    assert wt.wip_commit(a.path, "wip") is not None
    assert merge_branch(a, message="merge ta").ok
    assert wt.remove_worktree(a)
    assert git(repo, "status", "--porcelain") == ""
    assert "/.fleet/worktrees/" in (repo / ".git" / "info" / "exclude").read_text()
    assert not (repo / ".gitignore").exists()


# --------------------------------------------------------------------------- create


def test_create_records_base_and_never_touches_user_checkout(repo: Path, root: Path) -> None:
    git(repo, "checkout", "-q", "-b", "dev")
    (repo / "a.txt").write_text("user edit\n")
    (repo / "scratch.txt").write_text("user untracked\n")
    before = snapshot(repo)
    main_sha = git(repo, "rev-parse", "main")
    info = wt.create_worktree(repo, root, "t1", "main")
    assert info == WorktreeInfo(repo, root.resolve() / "t1", "fleet/t1", "main", main_sha)
    assert git(info.path, "symbolic-ref", "HEAD") == "refs/heads/fleet/t1"
    assert snapshot(repo) == before


def test_create_from_head_records_current_branch(repo: Path, root: Path) -> None:
    info = wt.create_worktree(repo, root, "t1", "HEAD")
    assert info.base_ref == "main"
    tag_info = wt.create_worktree(repo, root, "t2", git(repo, "rev-parse", "HEAD"))
    assert tag_info.base_commit == git(repo, "rev-parse", "HEAD")


def test_create_rejects_bad_name_and_unknown_ref(repo: Path, root: Path) -> None:
    with pytest.raises(wt.WorktreeError):
        wt.create_worktree(repo, root, "../escape", "main")
    with pytest.raises(wt.WorktreeError, match="does not name a commit"):
        wt.create_worktree(repo, root, "t1", "no-such-ref")
    (root / "occupied").mkdir(parents=True)
    with pytest.raises(wt.WorktreeError, match="not a worktree"):
        wt.create_worktree(repo, root, "occupied", "main")


def test_retry_reuses_same_worktree_without_reset(repo: Path, root: Path) -> None:
    first = wt.create_worktree(repo, root, "t1", "main")
    agent_sha = edit_and_commit(first, "a.txt", "agent work\n")
    (first.path / "wip.txt").write_text("uncommitted\n")
    (repo / "b.txt").write_text("main moves on\n")
    git(repo, "commit", "-q", "-am", "main advances")
    again = wt.create_worktree(repo, root, "t1", "main")
    assert again == first
    assert git(again.path, "rev-parse", "HEAD") == agent_sha
    assert (again.path / "wip.txt").read_text() == "uncommitted\n"
    # handoff after the worktree was removed: the branch is reused at its tip, same base
    assert wt.wip_commit(first.path, "wip") is not None
    assert wt.remove_worktree(first)
    third = wt.create_worktree(repo, root, "t1", "main")
    assert third == first
    assert (third.path / "wip.txt").read_text() == "uncommitted\n"
    assert worktree_paths(repo).count(str(third.path)) == 1


def test_concurrent_create_from_threads(repo: Path, root: Path) -> None:
    names = ["w1", "w2", "w3", "w4"]
    barrier = threading.Barrier(len(names) + 1)

    def make(name: str) -> WorktreeInfo:
        barrier.wait()
        return wt.create_worktree(repo, root, name, "main")

    with ThreadPoolExecutor(len(names) + 1) as pool:
        futures = [pool.submit(make, n) for n in [*names, "w1"]]  # w1 twice: a racing retry
        infos = [f.result() for f in futures]
    assert infos[0] == infos[-1]
    assert {i.path.name for i in infos} == set(names)
    assert len(worktree_paths(repo)) == 1 + len(names), git(repo, "worktree", "list", "--porcelain")
    assert all(wt.preflight(i).ok for i in infos)
    assert git(repo, "status", "--porcelain") == ""


def test_concurrent_create_from_processes(repo: Path, root: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from fleet_tui.scheduler.git.worktree import create_worktree;"
        "create_worktree(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], 'main')"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(repo), str(root), f"p{i}"], stderr=subprocess.PIPE)
        for i in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert sorted(Path(p).name for p in worktree_paths(repo)[1:]) == ["p0", "p1", "p2", "p3"]


# --------------------------------------------------------------------------- preflight / setup


def test_preflight(repo: Path, root: Path) -> None:
    (repo / "a.txt").write_text("second\n")
    git(repo, "commit", "-q", "-am", "second")
    info = wt.create_worktree(repo, root, "t1", "main")
    assert wt.preflight(info).ok
    sha = edit_and_commit(info, "b.txt", "agent\n")
    assert wt.preflight(info, expected_head=sha).ok
    git(info.path, "checkout", "-q", "-b", "other")
    res = wt.preflight(info)
    assert not res.ok and "on branch other, expected fleet/t1" in res.reason
    git(info.path, "checkout", "-q", "--detach", "fleet/t1")
    res = wt.preflight(info)
    assert not res.ok and "detached HEAD" in res.reason
    git(info.path, "checkout", "-q", "fleet/t1")
    git(info.path, "reset", "-q", "--hard", "main~1")  # behind its base
    res = wt.preflight(info)
    assert not res.ok and "does not descend" in res.reason
    moved = WorktreeInfo(repo, root / "gone", "fleet/gone", "main", info.base_commit)
    res = wt.preflight(moved)
    assert not res.ok and "worktree missing" in res.reason


def test_run_setup(repo: Path, root: Path) -> None:
    (repo / ".env").write_text("SECRET=1\n")
    info = wt.create_worktree(repo, root, "t1", "main")
    res = wt.run_setup(info, 'cp "$FLEET_REPO_ROOT/.env" .env && echo copied', timeout_s=30)
    assert res == wt.SetupResult(True, "copied\n", 0)
    assert (info.path / ".env").read_text() == "SECRET=1\n"
    res = wt.run_setup(info, "echo oops >&2; exit 3", timeout_s=30)
    assert not res.ok and res.exit_code == 3 and "oops" in res.output
    start = time.monotonic()
    res = wt.run_setup(info, "sleep 30 & sleep 30", timeout_s=0.5)
    assert not res.ok and res.exit_code is None and "timed out" in res.output
    assert time.monotonic() - start < 10


# --------------------------------------------------------------------------- wip / diff / remove


def test_wip_commit_preserves_work(repo: Path, root: Path) -> None:
    info = wt.create_worktree(repo, root, "t1", "main")
    assert wt.wip_commit(info.path, "nothing") is None
    (info.path / "a.txt").write_text("changed\n")
    (info.path / "new.txt").write_text("brand new\n")
    sha = wt.wip_commit(info.path, "WIP: t1")
    assert sha is not None
    assert git(repo, "rev-parse", "fleet/t1") == sha
    assert git(repo, "show", f"{sha}:new.txt") == "brand new"
    assert git(repo, "show", f"{sha}:a.txt") == "changed"
    assert git(repo, "log", "-1", "--format=%an <%ae>", sha) == "Test User <test@example.com>"
    assert wt.wip_commit(info.path, "again") is None


def test_wip_commit_without_identity(repo: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = wt.create_worktree(repo, root, "t1", "main")
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.delenv(f"GIT_{who}_NAME")
        monkeypatch.delenv(f"GIT_{who}_EMAIL")
    (info.path / "x.txt").write_text("x\n")
    sha = wt.wip_commit(info.path, "wip")
    assert sha is not None
    assert git(repo, "log", "-1", "--format=%an <%ae>", sha) == "fleet-tui <fleet@localhost>"
    git(repo, "config", "user.name", "Repo Person")  # the repo's own identity wins
    (info.path / "y.txt").write_text("y\n")
    sha = wt.wip_commit(info.path, "wip2")
    assert git(repo, "log", "-1", "--format=%an <%ae>", sha or "") == "Repo Person <fleet@localhost>"


def test_diff_and_diffstat(repo: Path, root: Path) -> None:
    info = wt.create_worktree(repo, root, "t1", "main")
    assert wt.diff(info) == ""
    edit_and_commit(info, "a.txt", "a\nadded line\n")
    stat = wt.diffstat(info)
    assert "a.txt" in stat and "1 insertion" in stat
    text = wt.diff(info)
    assert text.startswith(stat) and "+added line" in text
    (info.path / "b.txt").write_text("live edit\n")
    assert "+live edit" in wt.diff(info, include_worktree=True)
    assert "live edit" not in wt.diff(info)


def test_conflict_blocks_are_the_whole_blocks_the_branch_adds(repo: Path, root: Path) -> None:
    """A branch that commits a stopped merge (markers and all) adds conflict blocks; a block
    the base already held, a lone marker-like line, and a clean resolution add none."""
    block = "<<<<<<< HEAD\nB2\n=======\nB1\n>>>>>>> main\n"
    (repo / "doc.md").write_text("how a conflict looks:\n" + block)
    git(repo, "add", "doc.md")
    git(repo, "commit", "-q", "-m", "a document that shows a conflict block")
    info = wt.create_worktree(repo, root, "t1", "main")
    assert wt.conflict_blocks(info) == []
    edit_and_commit(info, "doc.md", "how a conflict looks:\n" + block + "and more prose\n")
    edit_and_commit(info, "a.txt", "a\n=======\n<<<<<<< only one marker\n")
    assert wt.conflict_blocks(info) == []
    # main moves on; the task's branch merges it, stops on the conflict, and the stop is committed
    (repo / "b.txt").write_text("B1\n")
    git(repo, "commit", "-q", "-am", "b on main")
    (info.path / "b.txt").write_text("B2\n")
    wt.wip_commit(info.path, "b on the branch")
    subprocess.run(["git", "-C", str(info.path), "merge", "-q", "main"], capture_output=True, check=False)
    assert "<<<<<<<" in (info.path / "b.txt").read_text()
    wt.wip_commit(info.path, "WIP: the merge as it stood")
    assert wt.conflict_blocks(info) == ["b.txt"]
    (info.path / "b.txt").write_text("B1 and B2\n")
    wt.wip_commit(info.path, "resolved")
    assert wt.conflict_blocks(info) == []


def test_remove_worktree_only_when_clean(repo: Path, root: Path) -> None:
    info = wt.create_worktree(repo, root, "t1", "main")
    (info.path / "untracked.txt").write_text("keep me\n")
    assert wt.remove_worktree(info) is False
    assert (info.path / "untracked.txt").exists()
    sha = wt.wip_commit(info.path, "wip")
    assert wt.remove_worktree(info) is True
    assert not info.path.exists()
    assert git(repo, "rev-parse", "fleet/t1") == sha
    assert str(info.path) not in worktree_paths(repo)
    assert wt.remove_worktree(info) is True  # already gone


# --------------------------------------------------------------------------- merge


def test_merge_two_then_conflict_user_checkout_untouched(repo: Path, root: Path) -> None:
    base = git(repo, "rev-parse", "main")
    t1 = wt.create_worktree(repo, root, "t1", "main")
    t2 = wt.create_worktree(repo, root, "t2", "main")
    t3 = wt.create_worktree(repo, root, "t3", "main")
    edit_and_commit(t1, "a.txt", "a from t1\n")
    edit_and_commit(t2, "b.txt", "b from t2\n")
    edit_and_commit(t3, "a.txt", "a from t3\n")
    git(repo, "checkout", "-q", "-b", "dev")  # the user works elsewhere, with local edits
    (repo / "c.txt").write_text("user edit\n")
    (repo / "notes.txt").write_text("user untracked\n")
    before = snapshot(repo)

    r1 = merge_branch(t1, message="merge t1")
    r2 = merge_branch(t2, message="merge t2")
    assert r1.ok and r2.ok, (r1, r2)
    assert git(repo, "rev-parse", "main") == r2.commit
    assert git(repo, "show", "main:a.txt") == "a from t1"
    assert git(repo, "show", "main:b.txt") == "b from t2"
    assert git(repo, "log", "-1", "--format=%s", "main") == "merge t2"
    assert git(repo, "merge-base", "--is-ancestor", base, "main") == ""

    r3 = merge_branch(t3, message="merge t3")
    assert not r3.ok and r3.conflicts == ("a.txt",) and "a.txt" in r3.message
    assert git(repo, "rev-parse", "main") == r2.commit
    assert snapshot(repo) == before
    assert [p for p in worktree_paths(repo) if ".merge-" in p] == []
    assert sorted(p.name for p in root.iterdir()) == ["t1", "t2", "t3"]
    assert wt.preflight(t3).ok  # the task's own worktree is untouched by the failed merge
    again = merge_branch(t1, message="merge t1 again")
    assert again.ok and again.commit == r2.commit and "already merged" in again.message


def test_merge_into_clean_checked_out_base_updates_its_files(repo: Path, root: Path) -> None:
    t1 = wt.create_worktree(repo, root, "t1", "main")
    edit_and_commit(t1, "a.txt", "a from t1\n")
    (repo / "scratch.txt").write_text("user untracked survives\n")
    res = merge_branch(t1, message="merge t1")
    assert res.ok, res
    assert git(repo, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert git(repo, "rev-parse", "HEAD") == res.commit
    assert (repo / "a.txt").read_text() == "a from t1\n"
    assert git(repo, "status", "--porcelain") == "?? scratch.txt"


def test_dirty_base_checkout_refused(repo: Path, root: Path) -> None:
    t1 = wt.create_worktree(repo, root, "t1", "main")
    edit_and_commit(t1, "b.txt", "b from t1\n")
    (repo / "a.txt").write_text("user's uncommitted edit\n")
    before = snapshot(repo)
    res = merge_branch(t1, message="merge t1")
    assert not res.ok and "base checkout is dirty: commit or stash first" in res.message
    assert snapshot(repo) == before
    assert [p for p in worktree_paths(repo) if ".merge-" in p] == []


def test_merge_refuses_tag_or_sha_base(repo: Path, root: Path) -> None:
    git(repo, "tag", "v1")
    for ref in ("v1", git(repo, "rev-parse", "HEAD")):
        info = wt.create_worktree(repo, root, f"t-{ref[:6]}", ref)
        edit_and_commit(info, "a.txt", "x\n")
        res = merge_branch(info, message="m")
        assert not res.ok and "is not a local branch" in res.message


def test_untracked_file_in_base_checkout_blocks_update_cleanly(repo: Path, root: Path) -> None:
    t1 = wt.create_worktree(repo, root, "t1", "main")
    edit_and_commit(t1, "new.txt", "from branch\n")
    (repo / "new.txt").write_text("user's own untracked file\n")
    before = snapshot(repo)
    res = merge_branch(t1, message="merge t1")
    assert not res.ok and "could not update the base checkout" in res.message
    assert snapshot(repo) == before


# --------------------------------------------------------------------------- sweep


def test_sweep(repo: Path, root: Path, tmp_path: Path) -> None:
    clean = wt.create_worktree(repo, root, "clean", "main")
    dirty = wt.create_worktree(repo, root, "dirty", "main")
    alive = wt.create_worktree(repo, root, "alive", "main")
    vanished = wt.create_worktree(repo, root, "vanished", "main")
    (dirty.path / "work.txt").write_text("uncommitted\n")
    outside = wt.create_worktree(repo, tmp_path / "elsewhere", "outside", "main")
    (root / "linked").symlink_to(outside.path)
    (root / "junk").mkdir()
    (root / "junk" / "f.txt").write_text("not a worktree\n")
    stale = root / ".merge-old-0000"
    git(repo, "worktree", "add", "-q", "--detach", str(stale), "main")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = root / ".merge-new-1111"
    git(repo, "worktree", "add", "-q", "--detach", str(fresh), "main")
    subprocess.run(["rm", "-rf", str(vanished.path)], check=True)
    before = snapshot(repo)

    report = wt.sweep(root, keep=lambda name: name == "alive")

    assert report.removed == (".merge-old-0000", "clean")
    assert report.kept_dirty == ("dirty",)
    assert set(report.skipped) == {".merge-new-1111", "alive", "junk", "linked"}
    assert report.errors == ()
    assert not clean.path.exists() and not stale.exists()
    assert (dirty.path / "work.txt").read_text() == "uncommitted\n"
    assert alive.path.exists() and fresh.exists() and (root / "junk" / "f.txt").exists()
    assert outside.path.exists() and (root / "linked").is_symlink()
    listed = worktree_paths(repo)
    assert str(clean.path) not in listed and str(vanished.path) not in listed
    assert str(outside.path) in listed and str(dirty.path) in listed
    assert git(repo, "rev-parse", "--verify", "fleet/clean")  # the branch stays
    assert snapshot(repo) == before and git(repo, "status", "--porcelain") == ""
    assert wt.sweep(tmp_path / "no-such-root", keep=lambda _: False) == wt.SweepReport((), (), ())


def test_merge_refuses_base_being_rebased(repo: Path, root: Path) -> None:
    t1 = wt.create_worktree(repo, root, "t1", "main")
    edit_and_commit(t1, "b.txt", "b from t1\n")
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "a.txt").write_text("side\n")
    git(repo, "commit", "-q", "-am", "side")
    git(repo, "checkout", "-q", "main")
    (repo / "a.txt").write_text("main\n")
    git(repo, "commit", "-q", "-am", "main")
    main_sha = git(repo, "rev-parse", "main")
    rebase = subprocess.run(["git", "-C", str(repo), "rebase", "side"], capture_output=True, text=True)
    assert rebase.returncode != 0  # stopped on the conflict, main is mid-rebase
    res = merge_branch(t1, message="merge t1")
    assert not res.ok and "being rebased" in res.message
    assert git(repo, "rev-parse", "main") == main_sha


def test_create_retries_while_git_config_is_locked(repo: Path, root: Path) -> None:
    lock = repo / ".git" / "config.lock"
    lock.write_text("")  # another git process is writing the repo config
    timer = threading.Timer(0.3, lock.unlink)
    timer.start()
    try:
        info = wt.create_worktree(repo, root, "t1", "main")
    finally:
        timer.join()
    assert info.base_commit == git(repo, "rev-parse", "main")
    assert git(repo, "config", "branch.fleet/t1.fleetbase") == info.base_commit


def test_create_from_subdirectory_records_repo_top(repo: Path, root: Path) -> None:
    (repo / "pkg").mkdir()
    info = wt.create_worktree(repo / "pkg", root, "t1", "main")
    assert info.repo_root == repo
    with pytest.raises(wt.WorktreeError, match="not inside a git work tree"):
        wt.create_worktree(root.parent, root, "t2", "main")
