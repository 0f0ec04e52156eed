"""Merging a task's branch into its base ref without touching the user's checkout.

The merge happens in a temporary detached worktree at the base tip; the base branch then moves
with a guarded ``update-ref`` (or, when it is checked out and clean, a fast-forward inside that
checkout, so its branch and files move together). A dirty base, a base that is not a local branch
or is mid-rebase is refused; a conflict aborts cleanly and names the files.
"""

from __future__ import annotations

import os
from pathlib import Path

from fleet_tui.scheduler.git.worktree import (
    MERGE_PREFIX,
    MergeResult,
    WorktreeError,
    WorktreeInfo,
    _git,
    _identity,
    _out,
    _remove_temp,
    _retrying,
    _rev,
    _worktrees,
    _wt,
)
from fleet_tui.scheduler.procs.owned import run_owned

#: a merge (with its hooks) that runs longer is stopped, hooks and all
MERGE_TIMEOUT_S = 600.0


def _git_owned(cwd: Path, *args: str) -> tuple[int, str, str]:
    """A ``git merge`` (which runs the repository's merge hooks) under a keeper (owned.py): the
    hooks' processes die with the engine instead of running on with ppid 1."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_EDITOR="true", GIT_MERGE_AUTOEDIT="no")
    r = run_owned(["git", "-C", str(cwd), *args], cwd=cwd, env=env, timeout_s=MERGE_TIMEOUT_S)
    if r.exit_code is None:
        return 1, "", f"git {args[0]} timed out after {MERGE_TIMEOUT_S:g}s"
    return r.exit_code, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def _checked_out_in(repo_root: Path, branch: str) -> tuple[Path | None, str]:
    """(the worktree that has branch checked out, or None; a reason the branch is busy, or "")."""
    ref = f"refs/heads/{branch}"
    for entry in _worktrees(repo_root):
        where = Path(entry["worktree"])
        if entry.get("branch") == ref:
            if not where.is_dir():
                return None, f"base branch is checked out in missing worktree {where}"
            return where, ""
        if "detached" in entry and where.is_dir():  # a rebase/bisect of the base branch?
            for marker in ("rebase-merge/head-name", "rebase-apply/head-name", "BISECT_START"):
                status, out, _ = _git(
                    where, "rev-parse", "--path-format=absolute", "--git-path", marker, check=False
                )
                flag = Path(out.strip())
                if status == 0 and flag.is_file() and flag.read_text().strip() in (ref, branch):
                    return None, f"base branch {branch} is being rebased/bisected in {where}"
    return None, ""


def merge_branch(info: WorktreeInfo, *, message: str, attempts: int = 3) -> MergeResult:
    """Merge ``info.branch`` into the branch ``info.base_ref`` without using the user's checkout.

    The merge commit is made in a temporary detached worktree ``<root>/.merge-<name>-<rand>`` at
    the base tip. Then the base branch is moved to it: with ``update-ref`` guarded by the old
    value when the branch is checked out nowhere; with ``merge --ff-only`` inside the checkout
    that has it (only when that checkout has no tracked changes: its files must follow its
    branch). A dirty base checkout is refused, a conflict aborts and names the files, and in
    every failure the base branch and every checkout are left as they were.
    """
    repo = info.repo_root
    if _rev(repo, f"refs/heads/{info.base_ref}") is None:
        return MergeResult(False, None, (), f"base {info.base_ref!r} is not a local branch: not merging")
    if _rev(repo, f"refs/heads/{info.branch}") is None:
        return MergeResult(False, None, (), f"branch {info.branch} does not exist")
    for _ in range(attempts):
        try:
            result = _merge_once(info, message)
        except WorktreeError as e:
            return MergeResult(False, None, (), f"merge failed: {e}")
        if result is not None:
            return result
    return MergeResult(False, None, (), "base branch kept moving during the merge; try again")


def _merge_once(info: WorktreeInfo, message: str) -> MergeResult | None:
    """One merge try; None means the base moved under us and the caller should retry."""
    repo = info.repo_root
    base_ref = f"refs/heads/{info.base_ref}"
    holder, busy = _checked_out_in(repo, info.base_ref)
    if busy:
        return MergeResult(False, None, (), busy)
    if holder is not None and _out(holder, "status", "--porcelain", "--untracked-files=no"):
        return MergeResult(False, None, (), f"base checkout is dirty: commit or stash first ({holder})")
    old = _rev(repo, base_ref)
    assert old is not None
    if _git(repo, "merge-base", "--is-ancestor", info.branch, old, check=False)[0] == 0:
        return MergeResult(True, old, (), f"{info.branch} is already merged into {info.base_ref}")
    tmp = info.path.parent / f"{MERGE_PREFIX}{info.path.name}-{os.urandom(4).hex()}"
    try:
        _retrying(lambda: _wt(repo, "add", "--detach", str(tmp), old))
        status, out, err = _git_owned(
            tmp, *_identity(tmp), "merge", "--no-ff", "--no-verify", "-m", message, info.branch
        )
        if status != 0:
            conflicts = tuple(_out(tmp, "diff", "--name-only", "--diff-filter=U").splitlines())
            _git(tmp, "merge", "--abort", check=False)
            if conflicts:
                why = f"merge conflict in {len(conflicts)} file(s): {', '.join(conflicts)}"
                return MergeResult(False, None, conflicts, why)
            return MergeResult(False, None, (), f"merge failed: {(err or out).strip()}")
        new = _out(tmp, "rev-parse", "HEAD")
    finally:
        _remove_temp(repo, tmp)
    if holder is None:
        if _git(repo, "update-ref", "-m", f"fleet-tui: {message}", base_ref, new, old, check=False)[0]:
            return None
        return MergeResult(True, new, (), f"merged {info.branch} into {info.base_ref}")
    # The base branch is checked out (clean): move branch and files together, or not at all.
    if _rev(holder, "HEAD") != old:
        return None
    status, out, err = _git_owned(holder, "merge", "--ff-only", "--no-verify", "-q", new)
    if status != 0:
        text = (err or out).strip()
        if _rev(repo, base_ref) != old:
            return None
        return MergeResult(False, None, (), f"could not update the base checkout {holder}: {text}")
    return MergeResult(True, new, (), f"merged {info.branch} into {info.base_ref}; {holder} updated")


# --------------------------------------------------------------------------- remove / sweep
