"""Starting attempts: where an agent is spawned (``Launcher.prepare``, run in a worker thread).

Here a claimed task becomes a running agent: its coder is resolved (a missing program parks the
task as ``never_started`` instead of looping), its working directory is prepared (a git worktree
on ``fleet/<name>`` when the task has a ``git_ref``), its prompt is built, the coder writes its
per-run config, and the shim is started. The task's files under the fleet home (its directory,
its attempts', its worktree record) are found here too. Adoption is adopt.py; the after-work
(WIP commit, merge) merger.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fleet_tui.coders.base import AttemptContext, Coder, CoderNotFound, get_coder
from fleet_tui.config import Config
from fleet_tui.scheduler.git import worktree as wt
from fleet_tui.scheduler.humans import followup
from fleet_tui.scheduler.humans.mcp_ask_human import server_launch
from fleet_tui.scheduler.lifecycle import RETRIED_FAILURES, AttemptOutcome
from fleet_tui.scheduler.model import Attempt, Event, Task
from fleet_tui.scheduler.policy.prompt import DependencyResult, PromptContext, build_prompt
from fleet_tui.scheduler.procs import attemptdir, attemptfiles
from fleet_tui.scheduler.procs import shim as shimmod
from fleet_tui.scheduler.procs.runner import ShimPool, ShimProcess, read_json, spawn_shim
from fleet_tui.scheduler.procs.spares import SPARE_DIR, Spares
from fleet_tui.scheduler.sandbox import bwrap as sandbox
from fleet_tui.scheduler.sandbox import policy as sbp
from fleet_tui.scheduler.store.protocol import Store

EXCLUDE_PATTERNS = (".fleet-tui/",)

#: ``os.environ`` decoded, and the raw table it was decoded from (``inherited_env``)
_inherited: tuple[dict[Any, Any], dict[str, str]] | None = None


def inherited_env() -> dict[str, str]:
    """A copy of the engine's environment, for an agent's: ``dict(os.environ)``, decoded again
    only when the environment changed. ``dict(os.environ)`` decodes every variable in Python (18 µs
    an attempt with 35 of them, on the worker thread that prepares it); ``os.environ`` keeps its
    raw table in ``_data`` (CPython), which is compared and copied in C (0.5 µs)."""
    global _inherited
    raw = getattr(os.environ, "_data", None)
    if not isinstance(raw, dict):
        return dict(os.environ)
    kept = _inherited
    if kept is None or kept[0] != raw:
        kept = _inherited = (dict(raw), dict(os.environ))
    return dict(kept[1])


class LaunchError(RuntimeError):
    """The attempt cannot start; the message is the ``never_started`` reason."""


@dataclass
class Launch:
    """A started (or adopted) attempt, as its supervisor needs it."""

    dir: Path
    coder: Coder
    coder_name: str
    popen: ShimProcess | None
    shim_pid: int | None
    shim_ticks: int | None
    offset: int = 0
    next_seq: int = 0
    started_at: float | None = None
    #: taken over from a shim another engine started (a follow-up may wait at a turn boundary)
    adopted: bool = False


def task_dir(home: Path, task_id: str) -> Path:
    return home / "tasks" / task_id


def attempt_dir(home: Path, task_id: str, n: int) -> Path:
    return task_dir(home, task_id) / "attempts" / str(n)


def load_worktree(home: Path, task_id: str) -> wt.WorktreeInfo | None:
    """The task's worktree as saved in ``tasks/<id>/worktree.json`` (None: it runs in place)."""
    data = read_json(task_dir(home, task_id) / "worktree.json")
    if not data:
        return None
    return wt.WorktreeInfo(
        repo_root=Path(data["repo_root"]),
        path=Path(data["path"]),
        branch=data["branch"],
        base_ref=data["base_ref"],
        base_commit=data["base_commit"],
    )


def save_worktree(home: Path, task_id: str, info: wt.WorktreeInfo) -> None:
    """Record the task's worktree in ``tasks/<id>/worktree.json`` (atomically replaced)."""
    d = task_dir(home, task_id)
    d.mkdir(parents=True, exist_ok=True)
    data = {k: str(v) for k, v in asdict(info).items()}
    tmp = d / "worktree.json.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, d / "worktree.json")


def _exclude_patterns(repo: Path, home: Path) -> list[str]:
    """What fleet keeps out of ``git status``: its own patterns, plus the home when inside repo."""
    patterns = list(EXCLUDE_PATTERNS)
    try:
        rel = home.resolve().relative_to(repo)
    except ValueError:
        return patterns
    if rel.parts:  # a home that *is* the repo root cannot be excluded
        patterns.append(f"/{rel.as_posix()}/")
    return patterns


#: how long the answer to "does the repository around this cwd hold the fleet home" is reused (it
#: walks the cwd's parents: a third of a millisecond before every in-place attempt otherwise)
HOME_CHECK_S = 10.0


def _repo_holding_home(cwd: Path, home: Path) -> Path | None:
    """The git checkout around ``cwd`` when the fleet home lies inside it (else None); found by
    looking for ``.git`` upwards, without starting git (this runs for every in-place attempt)."""
    try:
        here, home_r = cwd.resolve(), Path(home).resolve()
    except OSError:
        return None
    for d in (here, *here.parents):
        if (d / ".git").exists():
            return d if home_r == d or d in home_r.parents else None
    return None


class Launcher:
    """Starts attempts of claimed tasks for one engine (``owner``) on one fleet home. Blocking:
    the engine runs ``prepare`` in a worker thread."""

    def __init__(
        self,
        store: Store,
        home: Path,
        config: Callable[[], Config],
        clock: Callable[[], float],
        owner: str,
        shim_pool: Callable[[], ShimPool | None] = lambda: None,
    ) -> None:
        self.store = store
        self.home = Path(home)
        self._config = config
        self.clock = clock
        self.owner = owner
        self._shim_pool = shim_pool
        #: attempt folders the shims' server made ahead (spares.py): one rename instead of a
        #: few folders and files between an agent's end and the next one's start
        self._spares = Spares(str(self.home / SPARE_DIR))
        self._home_checks: dict[Path, tuple[float, Path | None]] = {}  # cwd -> (until, answer)

    @property
    def cfg(self) -> Config:
        """The engine's settings as they are now (a hot reload replaces them)."""
        return self._config()

    def _workdir(self, task: Task) -> tuple[Path, str | None]:
        """Where the attempt runs: the task's cwd (no ``git_ref``), else its worktree, made ready.

        A worktree is created on the first attempt (or again when its directory is gone, e.g. swept)
        and reused as it is by retries and handoffs. The setup command runs in a worktree until it
        has succeeded once there: a retry after a failed setup runs it again instead of starting the
        agent in a half-prepared tree. Then the preflight must pass; any doubt is a LaunchError.
        """
        cwd = Path(task.spec.cwd).expanduser()
        if not cwd.is_dir():
            raise LaunchError(f"cwd {cwd} does not exist (fix the task's cwd, then retry)")
        if not task.spec.git_ref:
            now = time.monotonic()
            until, repo = self._home_checks.get(cwd, (0.0, None))
            if now >= until:
                repo = _repo_holding_home(cwd, self.home)
                self._home_checks[cwd] = (now + HOME_CHECK_S, repo)
            if repo is not None:
                raise LaunchError(
                    f"the fleet home {self.home} is inside the git repository {repo} that this task "
                    "works in in place: its git commands (git clean -fdx, git stash -u, ...) could delete "
                    "the queue. Move the home out of the repository (--home or FLEET_HOME), or give the "
                    "task a git_ref so it runs in a worktree of its own"
                )
            return cwd, None
        info = load_worktree(self.home, task.id)
        # other engines on this home (other stores) must leave it alone from now on: while it is
        # made and set up, and while its agent runs (wtmark.py)
        from fleet_tui.scheduler.git import wtmark

        name = info.path.name if info is not None else task.name
        url = getattr(self.store, "url", "")
        wtmark.mark(self.home, name, url, task.id, attempt_dir(self.home, task.id, task.attempt))
        marker = task_dir(self.home, task.id) / "setup.ok"
        if info is None or not info.path.exists():
            fresh = info is None  # no record yet: a fleet/<name> branch found now is not ours
            repo = wt.find_repo(cwd)
            if repo is None:
                raise LaunchError(f"git_ref {task.spec.git_ref!r} given but {cwd} is not in a git repository")
            try:
                wt.ensure_exclude(repo, _exclude_patterns(repo, self.home))
                info = wt.create_worktree(
                    repo, self.home / "worktrees", task.name, task.spec.git_ref, fresh=fresh
                )
            except wt.WorktreeError as e:
                raise LaunchError(f"worktree: {e}") from e
            save_worktree(self.home, task.id, info)
            marker.unlink(missing_ok=True)  # a new checkout: its setup has not run yet
        setup = task.spec.setup or self.cfg.worktree_setup
        if setup and not marker.exists():
            res = wt.run_setup(info, setup, timeout_s=600, home=self.home, nice=self.cfg.agent_nice)
            if not res.ok:
                raise LaunchError(f"setup_failed: `{setup}` exit {res.exit_code}: {res.output[-2000:]}")
            marker.write_text(str(info.path))
        pf = wt.preflight(info)
        if not pf.ok:
            raise LaunchError(f"preflight: {pf.reason}")
        self.store.update_task(
            task.id, owner=self.owner, attempt=task.attempt, worktree=str(info.path), branch=info.branch
        )
        return info.path, info.branch

    def _handoff_summary(self, task: Task, workdir: Path) -> str:
        events = self.store.last_events(task.id, 400)
        lines: list[str] = []
        for e in events:
            if e.attempt != task.attempt - 1:
                continue
            if e.kind == "tool_call":
                lines.append(f"- called {e.tool}: {json.dumps(e.tool_input)[:200]}")
            elif e.kind in ("text", "result") and e.text:
                lines.append(f"- said: {e.text[:300]}")
        info = load_worktree(self.home, task.id)
        stat = ""
        if info is not None:
            try:
                stat = wt.diffstat(info)
            except Exception:
                stat = ""
        summary = "The previous session ran out of context. What it did, most recent last:\n" + "\n".join(
            lines[-40:]
        )
        if stat:
            summary += f"\n\nChanges so far (diffstat against the base):\n{stat}"
        return summary + "\n\nContinue the task from where it stopped; do not redo finished work."

    def prepare(self, task: Task) -> Launch:
        """Everything needed to start the attempt, then the shim (blocking; runs in a thread)."""
        name = task.coder or self.cfg.default_coder
        try:
            coder = get_coder(name)
        except CoderNotFound as e:
            raise LaunchError(str(e)) from e
        ok, detail = coder.available()
        if not ok:
            raise LaunchError(detail)
        sandbox_mode = sbp.mode_of(task.spec.sandbox, self.cfg.sandbox)
        try:  # a sandbox that cannot be had: never started, never run without it
            sbp.ensure_available(sandbox_mode)
        except sbp.SandboxUnavailable as e:
            raise LaunchError(str(e)) from e
        workdir, branch = self._workdir(task)
        store = self.store
        prev = store.get_attempt(task.id, task.attempt - 1) if task.attempt > 1 else None
        deps = (  # no dependency to tell about: no store read for them
            [DependencyResult(d.name, d.result_text, d.branch) for d in store.dependencies(task.id)]
            if task.spec.depends_on
            else []
        )
        retry_reason = retry_output = None
        crashed = False
        handoff = None
        if prev is not None:
            if prev.outcome in RETRIED_FAILURES:
                retry_reason = f"{prev.outcome}: {prev.detail}" if prev.detail else prev.outcome
                retry_output = prev.verify_output or _tail_text(store, task.id, prev.n)
            elif prev.outcome in (AttemptOutcome.CRASHED, None):
                crashed = True
            elif prev.outcome == AttemptOutcome.CONTEXT_PRESSURE:
                handoff = self._handoff_summary(task, workdir)
        message = followup.message_text(followup.pending(store, task.id))
        prompt = build_prompt(
            PromptContext(
                task=task,
                attempt=task.attempt,
                workdir=str(workdir),
                branch=branch,
                dependencies=deps,
                retry_reason=retry_reason,
                retry_output=retry_output,
                crashed=crashed,
                handoff=handoff,
                followup=message,
            )
        )
        plan = followup.plan(
            store, task, prev, self.cfg.continue_session, coder, retry_reason=retry_reason,
            retry_output=retry_output, crashed=crashed, handoff=handoff is not None, message=message,
        )  # fmt: skip
        adir = attempt_dir(self.home, task.id, task.attempt)
        if not self._spares.take(str(adir)):
            _make_attempt_dir(adir)
        mcp_command, mcp_env = server_launch(
            store, self.home, task.id, task.attempt, self.cfg.question_timeout_min * 60, adir
        )
        sandboxed = sandbox_mode != "none"
        ctx = AttemptContext(
            task=task,
            attempt=task.attempt,
            prompt=prompt,
            workdir=workdir,
            attempt_dir=adir,
            home=self.home,
            model=task.model,
            # sandboxed, the agent starts a relay to the sandbox's broker, which runs the real server
            mcp_command=sandbox.mcp_relay_command() if sandboxed else mcp_command,
            mcp_env={} if sandboxed else mcp_env,
            user_mcp=(task.spec.mcp or self.cfg.mcp) == "inherit",
        )
        try:
            cmd = followup.command(
                coder, ctx, plan, Path(prev.dir) if prev is not None and prev.dir else None
            )
            ctx, argv = cmd.ctx, cmd.argv
            extra = coder.env(ctx)
            stdin = coder.stdin(ctx)
        except (ValueError, OSError) as e:
            raise LaunchError(f"{name}: {e}") from e
        prompt = ctx.prompt
        prompt_file = adir / attemptdir.PROMPT
        own = getattr(coder, "prompt_file", None)
        if own is None or own(ctx) != prompt_file:  # else the coder's prepare just wrote it there
            attemptfiles.write_into(str(prompt_file), prompt.encode("utf-8"))
        env = inherited_env()
        for k in ("FLEET_PROMPT", "FLEET_STORE"):  # the store URL may carry a password: agents get none
            env.pop(k, None)
        env.update(
            {
                "PWD": str(workdir),
                "FLEET_TASK_ID": task.id,
                "FLEET_TASK_NAME": task.name,
                "FLEET_ATTEMPT": str(task.attempt),
                "FLEET_WORKDIR": str(workdir),
            }
        )
        env.update(dict(task.spec.env))
        env.update(extra)
        if sandboxed:
            policy = sbp.for_task(
                task.spec, workdir=workdir, run_dir=adir, fleet_home=self.home, env=env, coder=coder,
                branch=branch, mcp_command=mcp_command, mcp_env=mcp_env,
            )  # fmt: skip
            argv = sbp.wrap(policy, adir, argv)
        now = self.clock()
        next_seq = 0
        if cmd.note:  # how this attempt started (continued session or fresh, and why): its first event
            note = Event(
                task.id, task.attempt, 0, now, "lifecycle", text=cmd.note, session_id=plan.session_id
            )
            store.append_events([note], offset=(task.id, task.attempt, 0))
            next_seq = 1
        if message is not None:
            followup.clear_pending(store, task.id)
        attempt = Attempt(
            task_id=task.id, n=task.attempt, owner=self.owner, dir=str(adir), started_at=now, prompt=prompt,
            next_seq=next_seq,
        )  # fmt: skip
        try:
            popen = spawn_shim(
                adir,
                workdir,
                argv,
                env,
                stdin,
                self.cfg.kill_grace_s,
                time.time() + self.cfg.lease_s / 2,  # the shim reads it against real time
                pool=self._shim_pool(),
                nice=self.cfg.agent_nice,
                # a prompt read on stdin is read from the prompt file: one file less per attempt
                stdin_file=prompt_file if stdin is not None and stdin == prompt.encode() else None,
            )
        except OSError as e:
            store.start_attempt(attempt, str(workdir))  # what was tried, for the person who looks
            raise LaunchError(f"could not start the shim: {e}") from e
        # the attempt's record, its shim and the task's workdir: one write, after the agent
        # started (an engine that dies before it is adopted from the attempt's folder: adopt.py)
        ticks = getattr(popen, "start_ticks", None) or shimmod.proc_start_ticks(popen.pid)
        store.start_attempt(
            replace(attempt, shim_pid=popen.pid, shim_create_time=float(ticks or 0)), str(workdir)
        )
        followup.record(adir, plan, cmd)  # how it started: after the agent, not before it
        return Launch(
            dir=adir,
            coder=coder,
            coder_name=name,
            popen=popen,
            shim_pid=popen.pid,
            shim_ticks=ticks,
            started_at=now,
            next_seq=next_seq,
        )


def _make_attempt_dir(adir: Path) -> None:
    """``tasks/<id>/attempts/<n>``, made with as few directory calls as it takes (a first
    attempt makes all three levels; a later one only its own)."""
    try:
        adir.mkdir()
        return
    except FileExistsError:
        return
    except FileNotFoundError:
        pass
    top = adir.parent.parent
    top.mkdir(parents=True, exist_ok=True)  # tasks/ too, in a new home
    adir.parent.mkdir(exist_ok=True)
    adir.mkdir(exist_ok=True)


def _tail_text(store: Any, task_id: str, n: int) -> str:
    evs = store.events(task_id, n)
    texts = [e.text for e in evs if e.text and e.kind in ("error", "result", "stderr", "text")]
    return "\n".join(texts[-20:])


def task_diff(home: Path, task: Task) -> str:
    info = load_worktree(home, task.id)
    if info is None:
        return f"{task.name} runs in place (no git_ref): no branch to diff"
    try:
        return wt.diff(info, include_worktree=info.path.exists())
    except Exception as e:
        return f"no diff: {e}"
