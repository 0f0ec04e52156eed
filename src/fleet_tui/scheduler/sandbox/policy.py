"""From a task to its sandbox ``Policy``: which paths a sandboxed attempt, verifier or reviewer gets.

Why it exists apart from ``sandbox.py``: that module knows bwrap, not the fleet (it imports
nothing of it), while deciding the policy needs the fleet's own values — the config's default
mode, the task's ``sandbox``/``network``/``sandbox_rw``/``sandbox_ro`` keys, its git worktree and
the coder's declared state folders. The result is a frozen ``Policy``, written next to the run
(``sandbox.json``, for post-mortems) with the launcher's job (``sandbox.args``).

What a sandboxed run may write: its working directory (not for a reviewer), the git folders a
commit in its worktree touches, the subfolders of its own run folder (the coder's per-run
config), the coder's state folders in HOME, and the task's ``sandbox_rw``. What it may read: the
whole filesystem except the fleet home (only its own run folder and worktree come back), other
users' homes, the secrets in ``sandbox.HOME_SECRETS``/``SYSTEM_SECRETS`` and the host's /tmp.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fleet_tui.scheduler.model import Task, TaskSpec
from fleet_tui.scheduler.sandbox import bwrap as sb

#: entries of a coder's state folder that decide what its later runs do: read-only in a sandbox
STATE_CONFIG = (
    "settings.json", "settings.local.json", "CLAUDE.md", "AGENTS.md", "GEMINI.md", "commands",
    "agents", "hooks", "plugins", "skills", "output-styles", "config.toml", "config.json",
    "opencode.json", "opencode.jsonc", "mcp.json", "extensions",
)  # fmt: skip


class SandboxUnavailable(RuntimeError):
    """The task asks for a sandbox this machine cannot give; the message says why and how to fix."""


def mode_of(task_mode: str | None, config_mode: str) -> str:
    return task_mode or config_mode


def ensure_available(mode: str) -> None:
    """Raise SandboxUnavailable unless ``mode`` can run here (never fall back to no sandbox)."""
    if mode == "none":
        return
    if mode != "bwrap":
        raise SandboxUnavailable(f"sandbox {mode!r} is not supported (use 'bwrap' or 'none')")
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable("sandbox 'bwrap' needs Linux (bubblewrap)")
    ok, why = sb.probe()
    if not ok:
        raise SandboxUnavailable(f"sandbox bwrap: {why}")


def _real(p: str | Path) -> str:
    return os.path.realpath(os.path.expanduser(str(p)))


def _git_paths(workdir: Path, branch: str | None) -> tuple[list[str], str | None]:
    """What a commit on ``branch`` in the worktree ``workdir`` writes (its own git dir, the shared
    object store, the folders of its branch's ref and reflog), and the repository's own checkout
    (shown read-only)."""
    try:
        p = subprocess.run(
            ["git", "-C", str(workdir), "rev-parse", "--absolute-git-dir", "--git-common-dir"],
            capture_output=True,
            text=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return [], None
    lines = p.stdout.split("\n")
    if p.returncode != 0 or len(lines) < 2:
        return [], None
    gitdir = Path(lines[0])
    common = Path(lines[1]) if os.path.isabs(lines[1]) else (Path(workdir) / lines[1])
    out = [str(gitdir), str(common / "objects")]
    if branch:
        parent = str(Path(branch).parent)
        sub = "" if parent == "." else parent
        out += [str(common / "refs" / "heads" / sub), str(common / "logs" / "refs" / "heads" / sub)]
    checkout = _real(common.parent) if common.name == ".git" else None
    return [_real(x) for x in out], checkout


def build_policy(
    *,
    workdir: Path,
    run_dir: Path,
    fleet_home: Path,
    user_home: str | None,
    state_dirs: Sequence[str] = (),
    git_branch: str | None = None,
    in_worktree: bool = False,
    network: tuple[str, ...] | None = None,
    extra_rw: Sequence[str] = (),
    extra_ro: Sequence[str] = (),
    readonly: bool = False,
    mcp_command: Sequence[str] = (),
    mcp_env: Mapping[str, str] | None = None,
) -> sb.Policy:
    """The policy of one run. ``readonly`` (reviewers): nothing but the run's own config folders
    and the coder's state folders is writable."""
    wd, rd, fh = _real(workdir), _real(run_dir), _real(fleet_home)
    home = _real(user_home) if user_home else None
    writable: list[str] = []
    readable: list[str] = [rd]
    hidden: list[str] = [fh]
    if not readonly:
        writable.append(wd)
        if in_worktree:
            git_rw, checkout = _git_paths(Path(wd), git_branch)
            writable += git_rw
            readable += [checkout] if checkout else []
    else:
        readable.append(wd)
    # the coder's per-run config folders (made by its prepare step) stay writable; the run
    # folder's own files (the shim's lease, pid and exit files) do not
    if os.path.isdir(rd):
        writable += [_real(e.path) for e in os.scandir(rd) if e.is_dir(follow_symlinks=False)]
    if home:
        readable.append(home)
        # the CLI's own state (a login, sessions) where the user has it; nothing is created in HOME.
        # What in it configures later runs (settings, hooks, commands) stays read-only: an agent
        # must not plant a hook that the user's next, unsandboxed session would run.
        for d in state_dirs:
            p = _real(home + d[1:] if d.startswith("~") else d)
            writable.append(p)
            readable += [os.path.join(p, name) for name in STATE_CONFIG if os.path.isdir(p)]
        for other in ("/home", "/root"):  # other users' homes (ours comes back read-only above)
            if os.path.isdir(other) and _real(other) != home:
                hidden.append(_real(other))
    extra = [_real(p) for p in extra_ro] + [_real(p) for p in extra_rw]
    if readonly:
        readable += extra
    else:
        readable += [_real(p) for p in extra_ro]
        writable += [_real(p) for p in extra_rw]
    secrets = [os.path.join(home, s) for s in sb.HOME_SECRETS] if home else []
    secrets += list(sb.SYSTEM_SECRETS)
    # a secret the task names itself (sandbox_ro/rw) is shown; none is shown through a broader
    # grant (sandbox_ro = ["~"] still hides ~/.ssh; a path inside a secret comes back on its own)
    hidden += [s for s in (_real(x) for x in secrets) if os.path.lexists(s) and s not in extra]
    runtime = {_real(sys.prefix), _real(sys.base_prefix), _real(Path(__file__).parents[3])}
    readable += sorted(runtime)
    return sb.Policy(
        workdir=wd,
        writable=tuple(dict.fromkeys(writable)),
        readable=tuple(dict.fromkeys(readable)),
        hidden=tuple(dict.fromkeys(hidden)),
        network=network,
        mcp_command=tuple(mcp_command),
        mcp_env=tuple(sorted((mcp_env or {}).items())),
    )


def wrap(policy: sb.Policy, run_dir: Path, argv: Sequence[str]) -> list[str]:
    """Write the policy next to the run and return the launcher command that runs ``argv`` in it."""
    return sb.write_launch(policy, list(argv), str(run_dir))


def for_task(
    spec: TaskSpec,
    *,
    workdir: Path,
    run_dir: Path,
    fleet_home: Path,
    env: Mapping[str, str],
    coder: object = None,
    branch: str | None = None,
    readonly: bool = False,
    mcp_command: Sequence[str] = (),
    mcp_env: Mapping[str, str] | None = None,
) -> sb.Policy:
    """The policy of a run of ``spec``: an attempt, a verifier, or (``readonly``) a reviewer."""
    return build_policy(
        workdir=workdir,
        run_dir=run_dir,
        fleet_home=fleet_home,
        user_home=env.get("HOME") or os.environ.get("HOME"),
        state_dirs=tuple(getattr(coder, "sandbox_state", ())),
        git_branch=branch,
        in_worktree=branch is not None,
        network=spec.network,
        extra_rw=spec.sandbox_rw,
        extra_ro=spec.sandbox_ro,
        readonly=readonly,
        mcp_command=mcp_command,
        mcp_env=mcp_env,
    )


def verifier_wrap(
    fleet_home: Path, config_mode: str, task: Task, workdir: Path
) -> Callable[[list[str]], list[str]] | None:
    """How ``run`` verifiers of ``task`` are started: in the task's sandbox, or as they are (None).

    The returned function raises SandboxUnavailable when the sandbox cannot be had; the verifier
    then fails with that reason instead of running unsandboxed.
    """
    mode = mode_of(task.spec.sandbox, config_mode)
    if mode == "none":
        return None
    run_dir = Path(fleet_home) / "tasks" / task.id / "verify" / str(task.attempt)

    def wrap_argv(argv: list[str]) -> list[str]:
        ensure_available(mode)
        run_dir.mkdir(parents=True, exist_ok=True)
        branch = task.branch if task.worktree else None
        policy = for_task(
            task.spec, workdir=workdir, run_dir=run_dir, fleet_home=fleet_home, env=os.environ, branch=branch
        )
        return wrap(policy, run_dir, argv)

    return wrap_argv
