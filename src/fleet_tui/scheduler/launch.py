"""Starting, adopting and finishing attempts: the blocking side of the engine (runs in threads).

Here a claimed task becomes a running agent: its coder is resolved (a missing program parks the
task as ``never_started`` instead of looping), its working directory is prepared (a git worktree
on ``fleet/<name>`` when the task has a ``git_ref``), its prompt is built, the coder writes its
per-run config, and the shim is started. Adoption (a restarted engine taking over the live shims
of a dead one) and the after-work (WIP commit, worktree removal, merge) live here too.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from fleet_tui.coders.base import AttemptContext, Coder, CoderNotFound, get_coder
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.git import worktree as wt
from fleet_tui.scheduler.git.merge import merge_branch
from fleet_tui.scheduler.humans import followup
from fleet_tui.scheduler.humans.mcp_ask_human import server_launch
from fleet_tui.scheduler.model import Attempt, Event, Task
from fleet_tui.scheduler.policy.prompt import DependencyResult, PromptContext, build_prompt
from fleet_tui.scheduler.procs import attemptdir
from fleet_tui.scheduler.procs import shim as shimmod
from fleet_tui.scheduler.procs.runner import ShimProcess, read_json, spawn_shim
from fleet_tui.scheduler.sandbox import bwrap as sandbox
from fleet_tui.scheduler.sandbox import policy as sbp
from fleet_tui.scheduler.states import TaskStatus

if TYPE_CHECKING:
    from fleet_tui.scheduler.engine import Engine

EXCLUDE_PATTERNS = (".fleet-tui/",)


class LaunchError(RuntimeError):
    """The attempt cannot start; the message is the ``never_started`` reason."""


@dataclass
class Launch:
    dir: Path
    coder: Coder
    coder_name: str
    popen: ShimProcess | None
    shim_pid: int | None
    shim_ticks: int | None
    offset: int = 0
    next_seq: int = 0
    started_at: float | None = None


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


def _workdir(engine: Engine, task: Task) -> tuple[Path, str | None]:
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
        repo = _repo_holding_home(cwd, engine.home)
        if repo is not None:
            raise LaunchError(
                f"the fleet home {engine.home} is inside the git repository {repo} that this task "
                "works in in place: its git commands (git clean -fdx, git stash -u, ...) could delete "
                "the queue. Move the home out of the repository (--home or FLEET_HOME), or give the "
                "task a git_ref so it runs in a worktree of its own"
            )
        return cwd, None
    info = load_worktree(engine.home, task.id)
    marker = task_dir(engine.home, task.id) / "setup.ok"
    if info is None or not info.path.exists():
        fresh = info is None  # no record yet: a fleet/<name> branch found now is not ours
        repo = wt.find_repo(cwd)
        if repo is None:
            raise LaunchError(f"git_ref {task.spec.git_ref!r} given but {cwd} is not in a git repository")
        try:
            wt.ensure_exclude(repo, _exclude_patterns(repo, engine.home))
            info = wt.create_worktree(
                repo, engine.home / "worktrees", task.name, task.spec.git_ref, fresh=fresh
            )
        except wt.WorktreeError as e:
            raise LaunchError(f"worktree: {e}") from e
        save_worktree(engine.home, task.id, info)
        marker.unlink(missing_ok=True)  # a new checkout: its setup has not run yet
    setup = task.spec.setup or engine.cfg.worktree_setup
    if setup and not marker.exists():
        res = wt.run_setup(info, setup, timeout_s=600, home=engine.home)
        if not res.ok:
            raise LaunchError(f"setup_failed: `{setup}` exit {res.exit_code}: {res.output[-2000:]}")
        marker.write_text(str(info.path))
    pf = wt.preflight(info)
    if not pf.ok:
        raise LaunchError(f"preflight: {pf.reason}")
    engine.store.update_task(
        task.id, owner=engine.owner, attempt=task.attempt, worktree=str(info.path), branch=info.branch
    )
    return info.path, info.branch


def _handoff_summary(engine: Engine, task: Task, workdir: Path) -> str:
    events = engine.store.last_events(task.id, 400)
    lines: list[str] = []
    for e in events:
        if e.attempt != task.attempt - 1:
            continue
        if e.kind == "tool_call":
            lines.append(f"- called {e.tool}: {json.dumps(e.tool_input)[:200]}")
        elif e.kind in ("text", "result") and e.text:
            lines.append(f"- said: {e.text[:300]}")
    info = load_worktree(engine.home, task.id)
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


def prepare_attempt(engine: Engine, task: Task) -> Launch:
    """Everything needed to start the attempt, then the shim (blocking; runs in a thread)."""
    name = task.coder or engine.cfg.default_coder
    try:
        coder = get_coder(name)
    except CoderNotFound as e:
        raise LaunchError(str(e)) from e
    ok, detail = coder.available()
    if not ok:
        raise LaunchError(detail)
    sandbox_mode = sbp.mode_of(task.spec.sandbox, engine.cfg.sandbox)
    try:  # a sandbox that cannot be had: never started, never run without it
        sbp.ensure_available(sandbox_mode)
    except sbp.SandboxUnavailable as e:
        raise LaunchError(str(e)) from e
    workdir, branch = _workdir(engine, task)
    store = engine.store
    prev = store.get_attempt(task.id, task.attempt - 1) if task.attempt > 1 else None
    deps = [DependencyResult(d.name, d.result_text, d.branch) for d in store.dependencies(task.id)]
    retry_reason = retry_output = None
    crashed = False
    handoff = None
    if prev is not None:
        if prev.outcome in ("failure", "verify_failed", "stalled", "timeout", "over_budget"):
            retry_reason = f"{prev.outcome}: {prev.detail}" if prev.detail else prev.outcome
            retry_output = prev.verify_output or _tail_text(store, task.id, prev.n)
        elif prev.outcome in ("crashed", None):
            crashed = True
        elif prev.outcome == "context_pressure":
            handoff = _handoff_summary(engine, task, workdir)
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
        store, task, prev, engine.cfg.continue_session, coder, retry_reason=retry_reason,
        retry_output=retry_output, crashed=crashed, handoff=handoff is not None, message=message,
    )  # fmt: skip
    adir = attempt_dir(engine.home, task.id, task.attempt)
    adir.mkdir(parents=True, exist_ok=True)
    if branch is not None:  # other engines on this home (other stores) must leave it alone
        from fleet_tui.scheduler.git import wtmark

        wtmark.mark(engine.home, workdir.name, getattr(store, "url", ""), task.id, adir)
    mcp_command, mcp_env = server_launch(
        store, engine.home, task.id, task.attempt, engine.cfg.question_timeout_min * 60, adir
    )
    sandboxed = sandbox_mode != "none"
    ctx = AttemptContext(
        task=task,
        attempt=task.attempt,
        prompt=prompt,
        workdir=workdir,
        attempt_dir=adir,
        home=engine.home,
        model=task.model,
        # sandboxed, the agent starts a relay to the sandbox's broker, which runs the real server
        mcp_command=sandbox.mcp_relay_command() if sandboxed else mcp_command,
        mcp_env={} if sandboxed else mcp_env,
        user_mcp=(task.spec.mcp or engine.cfg.mcp) == "inherit",
    )
    try:
        cmd = followup.command(coder, ctx, plan, Path(prev.dir) if prev is not None and prev.dir else None)
        ctx, argv = cmd.ctx, cmd.argv
        extra = coder.env(ctx)
        stdin = coder.stdin(ctx)
    except (ValueError, OSError) as e:
        raise LaunchError(f"{name}: {e}") from e
    prompt = ctx.prompt
    (adir / attemptdir.PROMPT).write_text(prompt)
    followup.record(adir, plan, cmd)
    env = dict(os.environ)
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
            task.spec, workdir=workdir, run_dir=adir, fleet_home=engine.home, env=env, coder=coder,
            branch=branch, mcp_command=mcp_command, mcp_env=mcp_env,
        )  # fmt: skip
        argv = sbp.wrap(policy, adir, argv)
    now = engine.clock()
    store.put_attempt(
        Attempt(
            task_id=task.id, n=task.attempt, owner=engine.owner, dir=str(adir), started_at=now, prompt=prompt
        )
    )
    store.update_task(task.id, owner=engine.owner, attempt=task.attempt, workdir=str(workdir))
    next_seq = 0
    if cmd.note:  # how this attempt started (continued session or fresh, and why): its first event
        note = Event(task.id, task.attempt, 0, now, "lifecycle", text=cmd.note, session_id=plan.session_id)
        store.append_events([note], offset=(task.id, task.attempt, 0))
        next_seq = 1
    if message is not None:
        followup.clear_pending(store, task.id)
    try:
        popen = spawn_shim(
            adir,
            workdir,
            argv,
            env,
            stdin,
            engine.cfg.kill_grace_s,
            time.time() + engine.cfg.lease_s / 2,  # the shim reads it against real time
            pool=engine.shim_pool,
            nice=engine.cfg.agent_nice,
        )
    except OSError as e:
        raise LaunchError(f"could not start the shim: {e}") from e
    ticks = getattr(popen, "start_ticks", None) or shimmod.proc_start_ticks(popen.pid)
    store.update_attempt(task.id, task.attempt, shim_pid=popen.pid, shim_create_time=float(ticks or 0))
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


def _tail_text(store: Any, task_id: str, n: int) -> str:
    evs = store.events(task_id, n)
    texts = [e.text for e in evs if e.text and e.kind in ("error", "result", "stderr", "text")]
    return "\n".join(texts[-20:])


async def adopt(engine: Engine, t: Task) -> None:
    """Take over a task whose engine is gone: adopt its live shim, reap a finished one, or requeue
    a crashed one with a prompt that says to assess the worktree first."""
    from fleet_tui.scheduler.control import owner_alive

    now = engine.clock()
    store = engine.store
    stale_s = max(3 * engine.cfg.heartbeat_s, 5.0)
    same_host = t.host == engine.host
    alive = await anyio.to_thread.run_sync(owner_alive, store, t.owner, now, stale_s)
    if alive:
        return
    att = await anyio.to_thread.run_sync(store.get_attempt, t.id, t.attempt)
    info = attemptdir.read_shim(Path(att.dir)) if att and att.dir else None
    if same_host and att is not None and info is not None:
        new = await anyio.to_thread.run_sync(
            lambda: store.take_over(
                t.id, t.owner, t.attempt, engine.owner, engine.host, now, engine.cfg.lease_s, False
            )
        )
        if new is None:
            return
        pid, ticks = info.pid, info.start_ticks
        adir = Path(att.dir)
        shim_alive = shimmod.alive(pid, ticks)
        if shim_alive or attemptdir.has_exit(adir):
            from fleet_tui.scheduler.procs.runner import write_lease

            if shim_alive:
                write_lease(adir, time.time() + engine.cfg.lease_s / 2)
            try:
                coder = get_coder(new.coder or engine.cfg.default_coder)
            except CoderNotFound:
                coder = get_coder("shell")
            launch = Launch(
                dir=adir,
                coder=coder,
                coder_name=new.coder or "",
                popen=None,
                shim_pid=pid,
                shim_ticks=ticks,
                offset=att.stdout_offset,
                next_seq=att.next_seq,
                started_at=att.started_at,
            )
            engine.publish_task(new)
            engine._launch_runner(new, launch, adopted=True)
            return
        # a dead shim without an exit record: its agent may still run (ppid 1); it dies first
        from fleet_tui.scheduler.procs.owned import reap_attempt

        await anyio.to_thread.run_sync(reap_attempt, adir)
        t = new
    elif not same_host or att is None or info is None:
        # a remote (or never-started) attempt: reclaim only once its lease expired
        new = await anyio.to_thread.run_sync(
            lambda: store.take_over(
                t.id, t.owner, t.attempt, engine.owner, engine.host, now, engine.cfg.lease_s, not same_host
            )
        )
        if new is None:
            return
        t = new
    await anyio.to_thread.run_sync(
        lambda: store.update_attempt(
            t.id, t.attempt, outcome="crashed", ended_at=now, detail="supervisor lost it"
        )
    )
    dst = TaskStatus.QUEUED
    new2 = await anyio.to_thread.run_sync(
        lambda: store.transition(
            t.id,
            dst,
            reason="resumed: the attempt crashed",
            now=now,
            owner=engine.owner,
            attempt=t.attempt,
            paused_running=0,
        )
    )
    engine.publish_task(new2)
    engine.wake()


def _publish(engine: Any, task: Task | None) -> None:
    """Tell the engine's subscribers about a task changed from a worker thread (best effort).

    The bus wakes its subscribers with anyio events, which must be set on the event loop's
    thread: hop there when called from an ``anyio.to_thread`` worker; do nothing elsewhere.
    """
    if task is None or not hasattr(engine, "publish_task"):
        return
    try:
        anyio.from_thread.run_sync(engine.publish_task, task)
    except RuntimeError:  # not in an anyio worker thread (a plain call): nobody to tell
        pass


def _notice(engine: Any, text: str) -> None:
    """An engine notice from a worker thread (best effort, like ``_publish``)."""
    from fleet_tui.scheduler.model import Notice

    bus = getattr(engine, "bus", None)
    if bus is None:
        return
    try:
        anyio.from_thread.run_sync(bus.publish, [Notice(text)])
    except RuntimeError:
        pass


def after_done(engine: Engine, task: Task) -> None:
    """After a task reached ``done``: commit what is left in its worktree; auto-merge if asked.

    The worktree itself stays (the user inspects or merges it); a merge removes it when clean,
    and the start-up sweep removes clean worktrees of finished tasks. Never raises: the engine
    calls this from its supervision path, so a git failure becomes a notice (and, for an
    auto-merge that was refused, the task's reason) instead of an exception.
    """
    info = load_worktree(engine.home, task.id)
    if info is None:
        return
    try:
        if info.path.exists():
            wt.wip_commit(info.path, f"fleet-tui: work of {task.name} (attempt {task.attempt})")
        if task.spec.merge == "pr":  # push + pull request (pullrequest.py); failures park the task
            from fleet_tui.scheduler.github.pullrequest import publish

            _publish(engine, publish(engine, task, info).task)
            return
        if task.spec.merge != "auto":
            return
        res = _merge_sync(engine, task, info)
    except Exception as e:  # a broken repository must not take the engine down
        _notice(engine, f"{task.name}: after-work failed: {e}")
        return
    if res.ok or res.task is None or res.task.status != TaskStatus.DONE:
        _publish(engine, res.task)
        return
    # refused (dirty base, base not a branch, ...): stay done, say why it was not merged
    new = engine.store.transition(
        task.id,
        TaskStatus.DONE,
        reason=f"auto_merge_refused: {res.message.removeprefix(task.name + ': ')}",
        now=engine.clock(),
        expect=[TaskStatus.DONE],
        actor=engine.actor,
    )
    _publish(engine, new)
    _notice(engine, f"auto-merge of {res.message}")


def commit_leftovers(engine: Engine, task: Task) -> str | None:
    """WIP-commit whatever the attempt left uncommitted in the task's worktree (sha or None)."""
    info = load_worktree(engine.home, task.id)
    if info is None or not info.path.exists():
        return None
    return wt.wip_commit(
        info.path, f"fleet-tui: WIP of {task.name} (attempt {task.attempt}, uncommitted work)"
    )


def _merge_sync(engine: Engine, task: Task, info: wt.WorktreeInfo) -> CommandResult:
    """Merge the task's branch into its base (blocking); park on a conflict; record the commit.

    Leftovers are committed first so the merge brings everything. On success the clean worktree
    is removed (unless ``keep_worktrees``); the branch stays.
    """
    try:
        if info.path.exists():
            wt.wip_commit(info.path, f"fleet-tui: work of {task.name}")
    except wt.WorktreeError as e:
        return CommandResult(False, f"{task.name}: cannot commit the worktree's leftovers: {e}", task)
    res = merge_branch(info, message=f"Merge {info.branch} (fleet-tui task {task.name})")
    now = engine.clock()
    if not res.ok:
        if res.conflicts:
            why = f"{task.name}: merge conflict in {', '.join(res.conflicts)}"
            if task.status != TaskStatus.DONE:  # still parked on an earlier conflict
                return CommandResult(False, why, task)
            new = engine.store.transition(
                task.id,
                TaskStatus.NEEDS_HUMAN,
                reason="merge_conflict: " + ", ".join(res.conflicts),
                now=now,
                expect=[TaskStatus.DONE],
                actor=engine.actor,
            )
            return CommandResult(False, why, new)
        return CommandResult(False, f"{task.name}: {res.message}", task)
    new = engine.store.transition(
        task.id,
        TaskStatus.DONE,
        reason=f"merged {res.commit}",
        now=now,
        expect=[TaskStatus.DONE, TaskStatus.NEEDS_HUMAN],
        actor=engine.actor,
        merged_commit=res.commit,
    )
    msg = f"{task.name}: merged into {info.base_ref} ({(res.commit or '')[:10]})"
    if not engine.cfg.keep_worktrees and info.path.exists():
        try:
            if not wt.remove_worktree(info):
                msg += f"; worktree {info.path} kept (it has uncommitted work)"
        except wt.WorktreeError as e:
            msg += f"; worktree {info.path} not removed: {e}"
    return CommandResult(True, msg, new)


async def merge_task(engine: Any, ref: str) -> CommandResult:
    task = await anyio.to_thread.run_sync(engine.store.get_task, ref)
    if task is None:
        return CommandResult(False, f"no task {ref!r}")
    if task.status != TaskStatus.DONE and not (
        task.status == TaskStatus.NEEDS_HUMAN
        and (task.reason or "").startswith(("merge_conflict", "push_rejected", "pull_request_failed"))
    ):
        return CommandResult(False, f"{task.name} is {task.status.value}: only done tasks merge")
    info = load_worktree(engine.home, task.id)
    if info is None:
        return CommandResult(
            False, f"{task.name} ran without git_ref (in place): there is no branch to merge"
        )
    if task.spec.merge == "pr":  # merge = "pr": (re)push and open/update the pull request
        from fleet_tui.scheduler.github.pullrequest import publish

        return await anyio.to_thread.run_sync(lambda: publish(engine, task, info))
    return await anyio.to_thread.run_sync(lambda: _merge_sync(engine, task, info))


def task_diff(home: Path, task: Task) -> str:
    info = load_worktree(home, task.id)
    if info is None:
        return f"{task.name} runs in place (no git_ref): no branch to diff"
    try:
        return wt.diff(info, include_worktree=info.path.exists())
    except Exception as e:
        return f"no diff: {e}"
