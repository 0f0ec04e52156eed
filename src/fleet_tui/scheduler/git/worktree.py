"""Per-task git worktrees: create, check, WIP-commit, diff, merge, remove and sweep.

Why this exists: each task with a ``git_ref`` runs in its own worktree on branch ``fleet/<name>``
so parallel agents never share files and the user's checkout (HEAD, branch, index, files) is
never touched by an agent. Merging (a user action) happens in a throw-away worktree; the user's
checkout changes only by a fast-forward of a *clean* checkout of the base branch, so its files
follow its moved branch. Uncommitted work is never deleted: it becomes a WIP commit on the task
branch and only clean worktrees are removed. Synchronous (it runs git): the engine calls it
through ``anyio.to_thread``. Results are frozen dataclasses. No textual/rich imports.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

BRANCH_PREFIX = "fleet/"
MERGE_PREFIX = ".merge-"
REPOS_SUFFIX = ".repos"  # <root>.repos beside the managed root: every repo with a fleet worktree
DEFAULT_NAME = "fleet-tui"
DEFAULT_EMAIL = "fleet@localhost"
_OUTPUT_CAP = 64 * 1024
_TRANSIENT = re.compile(
    r"\.lock\b|could not lock|cannot lock|unable to create .*: file exists|already exists"
    r"|is already checked out|already registered|resource temporarily unavailable|failed to read",
    re.IGNORECASE,
)
_T = TypeVar("_T")
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class WorktreeError(RuntimeError):
    """A git operation failed in a way the caller must hear about (not a dirty/clean answer)."""


@dataclass(frozen=True)
class WorktreeInfo:
    """A task's git worktree: where it is, its branch, and what it was cut from."""

    repo_root: Path  # the user's main checkout
    path: Path  # root/<name>
    branch: str  # fleet/<name>
    base_ref: str  # what the task asked for; a local branch is recorded by its short name
    base_commit: str  # the commit the branch was created from


@dataclass(frozen=True)
class SetupResult:
    """How a worktree's setup command ended."""

    ok: bool
    output: str  # stdout+stderr, the last 64 KiB
    exit_code: int | None  # None when it timed out


@dataclass(frozen=True)
class PreflightResult:
    """Whether a worktree is fit for an agent to start in, and why not."""

    ok: bool
    reason: str  # "" when ok
    head: str | None = None


@dataclass(frozen=True)
class MergeResult:
    """How merging a task's branch into its base went."""

    ok: bool
    commit: str | None  # the new tip of base_ref on success
    conflicts: tuple[str, ...]
    message: str


@dataclass(frozen=True)
class SweepReport:
    """What a sweep of the fleet's worktrees removed, kept and could not touch."""

    removed: tuple[str, ...]
    kept_dirty: tuple[str, ...]
    skipped: tuple[str, ...]
    errors: tuple[str, ...] = ()


# --------------------------------------------------------------------------- git plumbing


def _git(cwd: Path, *args: str, check: bool = True) -> tuple[int, str, str]:
    """Run ``git -C cwd args``; (status, stdout, stderr). Raises WorktreeError when check fails."""
    cmd = ["git", "-C", str(cwd), *args]
    env = {"GIT_TERMINAL_PROMPT": "0", "GIT_EDITOR": "true", "GIT_MERGE_AUTOEDIT": "no"}
    from git import Git  # GitPython costs ~50 ms to import: only once git is needed

    status, out, err = Git().execute(cmd, with_extended_output=True, with_exceptions=False, env=env)
    out_s, err_s = str(out or ""), str(err or "")
    if check and status != 0:
        raise WorktreeError(f"git {' '.join(args)} failed ({status}): {err_s.strip() or out_s.strip()}")
    return int(status or 0), out_s, err_s


def _out(cwd: Path, *args: str) -> str:
    return _git(cwd, *args)[1].strip()


def _retrying(fn: Callable[[], _T], attempts: int = 12) -> _T:
    """Run fn, retrying with jittered backoff while git reports lock/race errors."""
    delay = 0.02
    for i in range(attempts):
        try:
            return fn()
        except WorktreeError as e:
            if i == attempts - 1 or not _TRANSIENT.search(str(e)):
                raise
            time.sleep(delay + random.uniform(0, delay))
            delay = min(delay * 2, 0.5)
    raise AssertionError("unreachable")


def _identity(cwd: Path) -> list[str]:
    """``-c`` options giving a fallback identity for whatever the repo config lacks."""
    opts = ["-c", "commit.gpgsign=false"]
    if _git(cwd, "config", "user.name", check=False)[0] != 0:
        opts += ["-c", f"user.name={DEFAULT_NAME}"]
    if _git(cwd, "config", "user.email", check=False)[0] != 0:
        opts += ["-c", f"user.email={DEFAULT_EMAIL}"]
    return opts


def _common_dir(cwd: Path) -> Path:
    return Path(_out(cwd, "rev-parse", "--path-format=absolute", "--git-common-dir")).resolve()


def _rev(cwd: Path, ref: str) -> str | None:
    status, out, _ = _git(cwd, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    return out.strip() if status == 0 else None


def _is_clean(path: Path) -> bool:
    return _out(path, "status", "--porcelain", "--untracked-files=all") == ""


def _head_is_safe(path: Path) -> bool:
    """HEAD is on a branch, or its commit is reachable from some branch (nothing would be lost)."""
    if _git(path, "symbolic-ref", "-q", "HEAD", check=False)[0] == 0:
        return True
    return _out(path, "for-each-ref", "--contains", "HEAD", "--count=1", "refs/heads") != ""


def _worktrees(repo_root: Path) -> list[dict[str, str]]:
    """``git worktree list --porcelain`` as a list of {"worktree": path, "branch": ref, ...}."""
    entries: list[dict[str, str]] = []
    for block in _git(repo_root, "worktree", "list", "--porcelain")[1].split("\n\n"):
        entry: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            entry[key] = value
        if "worktree" in entry:
            entries.append(entry)
    return entries


@contextlib.contextmanager
def _worktree_lock(repo_root: Path) -> Iterator[None]:
    """Serialize fleet's own worktree add/remove/prune on one repo, across threads and processes.

    Two concurrent ``git worktree add`` calls can trip over each other's half-written admin
    dirs (and two adds of one path can leave a stray entry); git's own locks do not cover that.
    flock is per open file, so it also serializes threads of one process. Not reentrant.
    """
    with open(_common_dir(repo_root) / "fleet-tui-worktree.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _wt(repo_root: Path, *args: str, check: bool = True) -> tuple[int, str, str]:
    """``git worktree <args>`` under the fleet worktree lock."""
    with _worktree_lock(repo_root):
        return _git(repo_root, "worktree", *args, check=check)


def _same(a: Path | str, b: Path | str) -> bool:
    return Path(a).resolve() == Path(b).resolve()


# --------------------------------------------------------------------------- finding, excluding


def find_repo(cwd: Path) -> Path | None:
    """The root of the (innermost) git checkout containing cwd; None outside any work tree."""
    cwd = Path(cwd)
    if not cwd.is_dir():
        return None
    status, out, _ = _git(cwd, "rev-parse", "--show-toplevel", check=False)
    if status != 0 or not out.strip():
        return None
    return Path(out.strip()).resolve()


def ensure_exclude(repo_root: Path, patterns: Sequence[str]) -> None:
    """Append missing patterns to the common ``info/exclude`` (never a committed .gitignore)."""
    exclude = _common_dir(repo_root) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with open(exclude, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # concurrent callers must not both append
        f.seek(0)
        text = f.read()
        have = {line.strip() for line in text.splitlines()}
        missing = [p for p in dict.fromkeys(patterns) if p.strip() and p.strip() not in have]
        if missing:
            prefix = "" if not text or text.endswith("\n") else "\n"
            f.write(prefix + "".join(f"{p.strip()}\n" for p in missing))
            f.flush()


def _main_checkout(repo_root: Path) -> Path:
    """The main checkout of the repository repo_root belongs to (itself, for a main checkout)."""
    common = _common_dir(repo_root)
    return common.parent if common.name == ".git" else common


def _registry(root: Path) -> Path:
    """``<root>.repos``: kept beside the root so the root holds nothing but worktrees."""
    return root.with_name(root.name + REPOS_SUFFIX)


def _remember_repo(root: Path, repo_root: Path) -> None:
    """Note the repo in ``<root>.repos`` so a sweep can prune it even after every one of its
    worktree directories is gone (then nothing under root leads back to it)."""
    line = str(_main_checkout(repo_root))
    with open(_registry(root), "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        if line not in f.read().splitlines():
            f.write(line + "\n")
            f.flush()


# --------------------------------------------------------------------------- create / check


def _branch_config(repo_root: Path, branch: str, key: str) -> str | None:
    status, out, _ = _git(repo_root, "config", "--get", f"branch.{branch}.{key}", check=False)
    return out.strip() if status == 0 and out.strip() else None


def _base_ref_name(repo_root: Path, git_ref: str) -> str:
    """A ref naming a local branch (``main``, ``refs/heads/main``, ``HEAD`` on main) -> ``main``."""
    status, out, _ = _git(repo_root, "rev-parse", "--symbolic-full-name", git_ref, check=False)
    full = out.strip()
    if status == 0 and full.startswith("refs/heads/"):
        return full.removeprefix("refs/heads/")
    return git_ref


def create_worktree(
    repo_root: Path, root: Path, name: str, git_ref: str, *, fresh: bool = False
) -> WorktreeInfo:
    """Worktree ``root/<name>`` on branch ``fleet/<name>`` from ``git_ref``; reused if it exists.

    Safe to call again for a retry or a handoff: an existing worktree and branch are reused as
    they are (no reset). Safe to call concurrently for several tasks of one repo (git lock
    errors are retried with backoff). The user's checkout is never touched.

    ``fresh`` says the caller has no record of this task's worktree (its first attempt): a
    ``fleet/<name>`` branch left by an earlier task of the same name must not be mistaken for
    this task's. When that branch holds nothing outside ``git_ref`` (typically: merged) it is
    moved to ``git_ref``; when it holds other commits this raises instead of guessing.
    """
    if not _NAME_OK.match(name) or name.endswith(".lock") or ".." in name:
        raise WorktreeError(f"invalid task name for a worktree/branch: {name!r}")
    top = find_repo(repo_root)
    if top is None:
        raise WorktreeError(f"{repo_root} is not inside a git work tree")
    repo_root = top
    Path(root).mkdir(parents=True, exist_ok=True)
    root = Path(root).resolve()
    path = root / name
    branch = BRANCH_PREFIX + name
    with contextlib.suppress(ValueError):
        rel = root.relative_to(repo_root)  # a fleet home inside the repo must not show up
        ensure_exclude(repo_root, [f"/{rel.as_posix()}/", f"/{rel.as_posix()}{REPOS_SUFFIX}"])
    _remember_repo(root, repo_root)

    def attempt() -> WorktreeInfo:
        with _worktree_lock(repo_root):
            return locked_attempt()

    def locked_attempt() -> WorktreeInfo:
        listed = {str(Path(e["worktree"]).resolve()): e for e in _worktrees(repo_root)}
        entry = listed.get(str(path))
        if entry is not None and not path.exists():
            _git(repo_root, "worktree", "prune")
            entry = None
        if path.exists() and entry is None:
            raise WorktreeError(f"{path} exists but is not a worktree of {repo_root}")
        if entry is None and fresh:
            _retire_stale_branch(repo_root, branch, git_ref)
        if entry is None:
            if _rev(repo_root, f"refs/heads/{branch}") is not None:
                _git(repo_root, "worktree", "add", str(path), branch)
            else:
                commit = _rev(repo_root, git_ref)
                if commit is None:
                    raise WorktreeError(f"git_ref {git_ref!r} does not name a commit in {repo_root}")
                _git(repo_root, "worktree", "add", "--no-track", "-b", branch, str(path), commit)
                ref_name = _base_ref_name(repo_root, git_ref)
                _retrying(lambda: _git(repo_root, "config", f"branch.{branch}.fleetbase", commit))
                _retrying(lambda: _git(repo_root, "config", f"branch.{branch}.fleetbaseref", ref_name))
        base_commit = _branch_config(repo_root, branch, "fleetbase")
        base_ref = _branch_config(repo_root, branch, "fleetbaseref") or _base_ref_name(repo_root, git_ref)
        if base_commit is None:  # a branch made by someone else: its fork point from git_ref
            base_commit = _out(repo_root, "merge-base", branch, git_ref)
        return WorktreeInfo(repo_root, path, branch, base_ref, base_commit)

    return _retrying(attempt)


def _retire_stale_branch(repo_root: Path, branch: str, git_ref: str) -> None:
    """Delete an earlier task's ``branch`` when git_ref already holds it; refuse otherwise.

    Called (under the worktree lock) before a new task creates its worktree. A branch checked
    out somewhere, or with commits git_ref lacks, is somebody's work: raise a WorktreeError
    that says what to do. Deleting is safe only because every commit stays reachable from
    git_ref; the task then gets a new branch from git_ref (and fresh fleetbase config).
    """
    tip = _rev(repo_root, f"refs/heads/{branch}")
    if tip is None:
        return
    target = _rev(repo_root, git_ref)
    if target is None:
        raise WorktreeError(f"git_ref {git_ref!r} does not name a commit in {repo_root}")
    holder = next(
        (e["worktree"] for e in _worktrees(repo_root) if e.get("branch") == f"refs/heads/{branch}"), None
    )
    merged = _git(repo_root, "merge-base", "--is-ancestor", tip, target, check=False)[0] == 0
    if holder is not None or not merged:
        where = f" (checked out in {holder})" if holder else f" with commits not in {git_ref}"
        raise WorktreeError(
            f"branch {branch} already exists{where}, left by an earlier task of the same name; "
            f"rename the task, or merge or delete the branch (git branch -D {branch}) first"
        )
    _git(repo_root, "branch", "-D", branch)
    _git(repo_root, "config", "--remove-section", f"branch.{branch}", check=False)


def run_setup(
    info: WorktreeInfo, command: str, timeout_s: float, *, home: Path | None = None, nice: int = 0
) -> SetupResult:
    """Run a setup command (copy .env, install deps) with /bin/sh -c inside the worktree.

    The command sees FLEET_REPO_ROOT, FLEET_WORKTREE and FLEET_BRANCH. It runs under a keeper
    (owned.py): on timeout, or when the engine that started it dies, its whole process tree is
    killed. Output goes through a file so a lingering grandchild holding a pipe cannot hang us.
    """
    from fleet_tui.scheduler.procs.owned import run_owned

    env = dict(os.environ)
    env.update(FLEET_REPO_ROOT=str(info.repo_root), FLEET_WORKTREE=str(info.path), FLEET_BRANCH=info.branch)
    r = run_owned(
        ["/bin/sh", "-c", command],
        cwd=info.path,
        env=env,
        timeout_s=timeout_s,
        home=home,
        grace_s=2.0,
        merge_stderr=True,
        cap=_OUTPUT_CAP,
        nice=nice,  # installing dependencies is the agents' work too (agent_nice)
    )
    text = r.stdout.decode("utf-8", errors="replace")
    if r.timed_out:
        text += f"\n[setup timed out after {timeout_s:g}s and was killed]"
    return SetupResult(ok=r.exit_code == 0, output=text, exit_code=r.exit_code)


def preflight(info: WorktreeInfo, expected_head: str | None = None) -> PreflightResult:
    """Is the worktree fit to (re)start an agent in? Any doubt is a failure with a reason.

    Checks: the directory is a worktree of ``info.repo_root``, HEAD is on ``info.branch``, no
    merge/rebase is in progress, and HEAD descends from ``base_commit`` (or, when given, is
    ``expected_head`` or a descendant of it).
    """
    path = info.path
    try:
        if not path.is_dir():
            return PreflightResult(False, f"worktree missing: {path}")
        top = _git(path, "rev-parse", "--show-toplevel", check=False)
        if top[0] != 0 or not _same(top[1].strip(), path):
            return PreflightResult(False, f"{path} is not the top of a git worktree")
        if _common_dir(path) != _common_dir(info.repo_root):
            return PreflightResult(False, f"{path} belongs to another repository than {info.repo_root}")
        head = _rev(path, "HEAD")
        status, ref, _ = _git(path, "symbolic-ref", "-q", "HEAD", check=False)
        if status != 0:
            return PreflightResult(False, f"detached HEAD at {head}; expected branch {info.branch}", head)
        if ref.strip() != f"refs/heads/{info.branch}":
            current = ref.strip().removeprefix("refs/heads/")
            return PreflightResult(False, f"on branch {current}, expected {info.branch}", head)
        if head is None:
            return PreflightResult(False, f"branch {info.branch} has no commit")
        for marker in ("MERGE_HEAD", "rebase-merge", "rebase-apply", "CHERRY_PICK_HEAD"):
            if Path(_out(path, "rev-parse", "--path-format=absolute", "--git-path", marker)).exists():
                return PreflightResult(False, f"a git operation is in progress ({marker})", head)
        anchor = expected_head or info.base_commit
        if head != anchor:
            status = _git(path, "merge-base", "--is-ancestor", anchor, head, check=False)[0]
            if status != 0:
                return PreflightResult(False, f"HEAD {head[:12]} does not descend from {anchor[:12]}", head)
        return PreflightResult(True, "", head)
    except WorktreeError as e:
        return PreflightResult(False, f"cannot tell: {e}")


def wip_commit(path: Path, message: str) -> str | None:
    """Commit every uncommitted change (untracked non-ignored files too) to the current branch.

    Returns the new sha, or None when the worktree was clean. Hooks are skipped (saving work
    must not depend on a linter) and a fallback identity is used when git has none. Refuses a
    detached HEAD: a commit there could be lost when the worktree goes.
    """
    path = Path(path)
    if _is_clean(path):
        return None
    if _git(path, "symbolic-ref", "-q", "HEAD", check=False)[0] != 0:
        raise WorktreeError(f"{path}: detached HEAD, refusing a WIP commit that no branch would hold")

    def commit() -> str:
        _git(path, "add", "-A")
        _git(path, *_identity(path), "commit", "--no-verify", "-q", "-m", message)
        return _out(path, "rev-parse", "HEAD")

    return _retrying(commit)


# --------------------------------------------------------------------------- diff


def _diff_base(info: WorktreeInfo) -> str:
    """Where the branch's own changes start: merge-base with the base branch tip (if a branch)."""
    tip = _rev(info.repo_root, f"refs/heads/{info.base_ref}") or info.base_commit
    status, out, _ = _git(info.repo_root, "merge-base", tip, info.branch, check=False)
    return out.strip() if status == 0 and out.strip() else info.base_commit


def _diff(info: WorktreeInfo, stat: bool, include_worktree: bool) -> str:
    opts = ["diff", "--no-color", "--no-ext-diff", *(["--stat"] if stat else [])]
    if include_worktree and info.path.is_dir():  # working tree (tracked files) vs the base
        return _git(info.path, *opts, _diff_base(info))[1]
    return _git(info.repo_root, *opts, _diff_base(info), info.branch)[1]


#: how messages name a git conflict block's markers (``conflict_blocks``)
CONFLICT_MARKERS = "conflict markers (<<<<<<< ======= >>>>>>>)"


def conflict_blocks(info: WorktreeInfo) -> list[str]:
    """The files where the task's branch adds a whole git conflict block (a ``<<<<<<<`` line, then
    ``=======``, then ``>>>>>>>``) against its base: a merge, rebase or stash that stopped on a
    conflict and was committed as it stood (by the agent, or by the WIP commit that keeps its
    work). Merged as it is, the block would land in the base. Only lines the branch adds count:
    a file that already held such a block in the base is not the branch's doing. Empty when git
    cannot compare them (no such branch, an empty repository): what the caller does next (a
    merge, a push) meets that and says it in its own words."""
    diff = ("diff", "--no-color", "--no-ext-diff", "-U0", _diff_base(info), info.branch)
    status, out, _ = _git(info.repo_root, *diff, check=False)
    if status != 0:
        return []
    found: list[str] = []
    path, stage = None, 0  # stage: 0 before a block, 1 after its <<<<<<<, 2 after its =======
    for line in out.splitlines():
        if line.startswith("+++ "):
            path, stage = (line[6:] if line.startswith("+++ b/") else None), 0
        elif path is None or path in found or not line.startswith("+"):
            continue
        elif line.startswith("+<<<<<<<"):
            stage = 1
        elif line.startswith("+=======") and stage == 1:
            stage = 2
        elif line.startswith("+>>>>>>>") and stage == 2:
            found.append(path)
    return found


def diffstat(info: WorktreeInfo, *, include_worktree: bool = False) -> str:
    """``git diff --stat`` of the branch against its base (see ``diff``)."""
    return _diff(info, True, include_worktree).strip()


def diff(info: WorktreeInfo, *, include_worktree: bool = False) -> str:
    """Diffstat then full diff of the branch against its base (merge-base with the base branch).

    Without ``include_worktree`` it is exactly what a merge would bring; with it, the worktree's
    uncommitted edits to tracked files are included (a live view for the cockpit).
    """
    stat = diffstat(info, include_worktree=include_worktree)
    return f"{stat}\n\n{_diff(info, False, include_worktree)}" if stat else ""


# --------------------------------------------------------------------------- merge


def _remove_temp(repo_root: Path, tmp: Path) -> None:
    if _wt(repo_root, "remove", "--force", str(tmp), check=False)[0] != 0 and tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    _wt(repo_root, "prune", check=False)


def remove_worktree(info: WorktreeInfo) -> bool:
    """Remove the worktree if it holds nothing uncommitted; the branch stays. False when dirty.

    "Dirty" includes untracked files and a detached HEAD whose commits no branch holds. A
    worktree already gone counts as removed.
    """
    path = info.path
    if not path.exists():
        _wt(info.repo_root, "prune", check=False)
        return True
    if _common_dir(path) != _common_dir(info.repo_root) or _same(path, info.repo_root):
        raise WorktreeError(f"{path} is not a linked worktree of {info.repo_root}")
    if not _is_clean(path) or not _head_is_safe(path):
        return False
    _remove_clean(info.repo_root, path)
    return True


def _remove_clean(repo_root: Path, path: Path) -> None:
    status, _, err = _wt(repo_root, "remove", str(path), check=False)
    if status != 0 and "submodule" in err:  # git refuses these even clean; we checked
        _wt(repo_root, "remove", "--force", str(path))
    elif status != 0:
        raise WorktreeError(f"git worktree remove {path} failed: {err.strip()}")
    _wt(repo_root, "prune", check=False)


def _owner_repo(path: Path) -> Path | None:
    """The main checkout of the repo a linked worktree at path belongs to (None if not one)."""
    if not (path / ".git").is_file():
        return None
    status, out, _ = _git(path, "rev-parse", "--path-format=absolute", "--git-common-dir", check=False)
    if status != 0:
        return None
    common = Path(out.strip())
    repo = common.parent if common.name == ".git" else common
    return repo if repo.is_dir() else None


def sweep(root: Path, keep: Callable[[str], bool], *, stale_merge_s: float = 3600.0) -> SweepReport:
    """At engine start: remove clean worktrees under ``root`` whose task ``keep(name)`` rejects.

    Only real directories directly under ``root`` are considered (symlinks and anything that
    resolves outside ``root`` are skipped); dirty ones (uncommitted, untracked or unreachable
    commits) are kept and reported; temp merge dirs older than ``stale_merge_s`` are removed;
    ``git worktree prune`` runs on every repo involved, and on every repo listed in
    ``<root>.repos`` (so entries of worktree directories deleted by hand go too).
    """
    removed: list[str] = []
    kept_dirty: list[str] = []
    skipped: list[str] = []
    errors: list[str] = []
    if not Path(root).is_dir():
        return SweepReport((), (), ())
    root = Path(root).resolve()
    repos: dict[Path, None] = {}
    for entry in sorted(root.iterdir()):
        name = entry.name
        if entry.is_symlink() or not entry.is_dir() or entry.resolve().parent != root:
            skipped.append(name)
            continue
        repo = _owner_repo(entry)
        if name.startswith(MERGE_PREFIX):
            if time.time() - entry.stat().st_mtime < stale_merge_s:
                skipped.append(name)
                continue
            if repo is not None:
                repos[repo] = None
                _remove_temp(repo, entry)
            else:
                shutil.rmtree(entry, ignore_errors=True)
            removed.append(name)
            continue
        if keep(name):
            skipped.append(name)
            continue
        if repo is None:
            skipped.append(name)  # not a linked worktree we can vouch for: leave it
            continue
        repos[repo] = None
        try:
            if not _is_clean(entry) or not _head_is_safe(entry):
                kept_dirty.append(name)
                continue
            _remove_clean(repo, entry)
            removed.append(name)
        except WorktreeError as e:
            errors.append(f"{name}: {e}")
    for repo in repos:
        status, _, err = _wt(repo, "prune", check=False)
        if status != 0:
            errors.append(f"prune {repo}: {err.strip()}")
    registry = _registry(root)
    known = registry.read_text(encoding="utf-8").splitlines() if registry.is_file() else []
    for line in dict.fromkeys(x.strip() for x in known if x.strip()):
        repo = Path(line)
        if repo in repos or not repo.is_dir() or find_repo(repo) is None:
            continue  # pruned above, or the repository is gone: nothing to keep true
        _wt(repo, "prune", check=False)
    return SweepReport(tuple(removed), tuple(kept_dirty), tuple(skipped), tuple(errors))
