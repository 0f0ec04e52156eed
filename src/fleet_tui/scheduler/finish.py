"""What happens when an attempt ends, and commands on the agents an engine holds.

Kept out of engine.py so the engine reads as its loops: here an ended attempt is verified, its
verdict decided (outcome.py), the attempt record and the task's transition written (both fenced
by owner and attempt: a claim lost meanwhile changes nothing), dependents cascaded and finished
work handed to the worktree after-work; and kill/cancel/retry/pause/resume act on a live agent.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.control import cascade_failure
from fleet_tui.scheduler.model import Event, Notice, Task
from fleet_tui.scheduler.policy.evidence import nothing_done
from fleet_tui.scheduler.policy.outcome import Verdict, after_verify, decide
from fleet_tui.scheduler.policy.verify import run_verifiers
from fleet_tui.scheduler.procs.attemptdir import ExitReason
from fleet_tui.scheduler.procs.runner import AttemptResult
from fleet_tui.scheduler.sandbox.policy import verifier_wrap
from fleet_tui.scheduler.states import PARKED, TaskStatus

#: consecutive crashed attempts before a task is parked for a person
CRASH_LIMIT = 3

if TYPE_CHECKING:
    from fleet_tui.scheduler.engine import Engine, Running


async def after_done_hook(engine: Engine, task: Task) -> None:
    """Worktree after-work of a finished task (WIP commit, auto-merge)."""
    from fleet_tui.scheduler.launch import after_done

    await anyio.to_thread.run_sync(lambda: after_done(engine, task))


async def cascade(engine: Engine, task: Task) -> None:
    """A parked or cancelled task parks its dependents, down the chain."""
    if task.status in PARKED:
        for t in await anyio.to_thread.run_sync(
            cascade_failure, engine.store, task, engine.clock(), engine.owner
        ):
            engine.publish_task(t)


async def finish_attempt(engine: Engine, r: Running, res: AttemptResult) -> None:
    """An attempt ended: verify, decide, write the fenced transition, cascade, after-work."""
    task = r.task
    now = engine.clock()
    fresh = await anyio.to_thread.run_sync(engine.store.get_task, task.id)
    if fresh is None or fresh.owner != engine.owner or fresh.attempt != task.attempt:
        return  # the claim was lost: someone else owns it now
    task = fresh
    if r.peak_mem:
        engine.mem.record(r.coder, r.peak_mem)
    if task.worktree:  # uncommitted work goes to the branch as a WIP commit, never discarded
        from fleet_tui.scheduler.launch import commit_leftovers

        try:
            await anyio.to_thread.run_sync(commit_leftovers, engine, task)
        except Exception as e:
            engine.bus.publish([Notice(f"{task.name}: WIP commit failed: {e}")])
    if res.exit_reason == ExitReason.CRASHED:  # the shim died: what it hosted must die before a retry
        from fleet_tui.scheduler.procs.owned import reap_attempt

        await anyio.to_thread.run_sync(reap_attempt, r.dir)
    v = decide(task, res, engine.policy(), now, engine._rl_strikes.get(r.account, 0), r.base_cost)
    if task.status == TaskStatus.VERIFYING and res.stop_reason is None:
        # adopted mid-verification: its engine had judged the agent's run a success (the output
        # it read is not read again), so only the verification is left to do
        v = Verdict(TaskStatus.VERIFYING, None, verify=True, outcome="success")
    if v.crashed:  # crashes use no retry, so a task that always crashes must not loop forever
        earlier = await anyio.to_thread.run_sync(engine.store.attempts, task.id)
        streak = 1
        for a in reversed([a for a in earlier if a.n < task.attempt]):
            if a.outcome != "crashed":
                break
            streak += 1
        if streak >= CRASH_LIMIT:
            v = replace(
                v,
                status=TaskStatus.NEEDS_HUMAN,
                crashed=False,
                reason=f"crashed: {streak} attempts in a row ended without an exit status "
                "(supervisor lost, or the agent host died)",
            )
    att_fields: dict[str, Any] = {
        "ended_at": now,
        "exit_code": res.exit_code,
        "outcome": v.outcome,
        "detail": res.stop_detail or res.outcome.detail,
        "cost_usd": res.cost_usd or 0.0,
        "tokens": res.tokens,
    }
    if v.block_account_until:
        engine._rl_strikes[r.account] = engine._rl_strikes.get(r.account, 0) + 1
    elif v.outcome == "success":
        engine._rl_strikes.pop(r.account, None)
    verify_out = None
    if v.verify:
        if task.status == TaskStatus.VERIFYING:
            moved: Task | None = task  # adopted mid-verification (its engine died): verify again
        else:
            moved = await anyio.to_thread.run_sync(
                lambda: engine.store.transition(
                    task.id,
                    TaskStatus.VERIFYING,
                    reason=None,
                    now=engine.clock(),
                    owner=engine.owner,
                    attempt=task.attempt,
                )
            )
        if moved is None:
            return
        engine.publish_task(moved)
        workdir = Path(task.workdir or task.spec.cwd)
        reviewer = engine.reviewer(task)

        def judge() -> bool:
            # from when the agent started (after any worktree setup), not from the claim
            att = engine.store.get_attempt(task.id, task.attempt)
            since = att.started_at if att is not None else (task.attempt_started_at or now)
            return nothing_done(task.spec.verify, workdir, since, skip=(engine.home,))

        # the evidence only matters when a verifier fails: none to run, no directory walk
        did_nothing = await anyio.to_thread.run_sync(judge) if task.spec.verify else False
        stop = r.runner.stop_event  # kill, cancel, retry and shutdown stop the verifiers too
        if reviewer is not None:
            reviewer.cancel = stop  # type: ignore[attr-defined]
        wrap = verifier_wrap(engine.home, engine.cfg.sandbox, task, workdir)
        r.verifying = True
        vr = await anyio.to_thread.run_sync(
            lambda: run_verifiers(
                task.spec.verify, workdir, reviewer=reviewer, wrap=wrap, cancel=stop, home=engine.home
            )
        )
        r.verifying = False
        # a review is part of the task's cost (and of today's spend, through the attempt record)
        att_fields["cost_usd"] += float(getattr(reviewer, "cost_usd", 0.0) or 0.0)
        att_fields["tokens"] += int(getattr(reviewer, "tokens", 0) or 0)
        if r.runner.stop_reason is not None:
            # stopped during verification: the stop decides, not the (interrupted) verifiers
            v = decide(moved, replace(res, stop_reason=r.runner.stop_reason), engine.policy(), now)
            if r.runner.stop_reason == "shutdown" or v.status is None:
                return  # left verifying: the engine that adopts it verifies again
            att_fields["outcome"] = v.outcome
            att_fields["detail"] = r.runner.stop_reason
            task = moved
        else:
            verify_out = vr.output or None
            if vr.output:
                await engine._sink(
                    task.id,
                    task.attempt,
                    [
                        Event(
                            task_id=task.id,
                            attempt=task.attempt,
                            seq=r.runner.normalizer_seq(),
                            ts=engine.clock(),
                            kind="verify",
                            text=vr.output,
                            is_error=not vr.passed,
                        )
                    ],
                    r.runner.offset,
                )
            v = after_verify(
                moved,
                vr.passed,
                getattr(vr, "reason", None) or vr.label,
                res.outcome.claimed_success or res.exit_code == 0,
                engine.policy(),
                engine.clock(),
                nothing_done=did_nothing,
            )
            task = moved
            att_fields["outcome"] = v.outcome
            att_fields["verify_output"] = verify_out
    kept = await anyio.to_thread.run_sync(
        lambda: engine.store.update_attempt(task.id, task.attempt, owner=engine.owner, **att_fields)
    )
    if not kept:
        return  # the claim was lost while we finished: the new owner's record stands
    if v.status is None:
        return
    # the task's usage covers every attempt and review: what came before plus this attempt
    total_cost = r.base_cost + att_fields["cost_usd"]
    budget = task.spec.budget_usd
    over = budget is not None and total_cost >= budget
    if v.status == TaskStatus.QUEUED and over and v.outcome != "killed" and not v.crashed:
        # another attempt could only overspend: the budget is for the whole task
        v = replace(
            v,
            status=TaskStatus.NEEDS_HUMAN,
            reason=f"over_budget: spent ${total_cost:.2f} of the ${budget:.2f} budget",
            use_retry=False,
            handoff=False,
            not_before=None,
            outcome=v.outcome,
        )
    fields: dict[str, Any] = {"paused_running": 0}
    fields["cost_usd"] = total_cost
    fields["tokens"] = r.base_tokens + att_fields["tokens"]
    if v.use_retry:
        fields["retries_used"] = task.retries_used + 1
    if v.handoff:
        fields["handoffs"] = task.handoffs + 1
    if v.false_completion:
        fields["false_completions"] = task.false_completions + 1
    if v.not_before is not None:
        fields["not_before"] = v.not_before
    if res.outcome.result_text or res.last_text:
        fields["result_text"] = res.outcome.result_text or res.last_text
    status = v.status
    assert status is not None  # checked above; the budget only moves a retry to needs_human
    new = await anyio.to_thread.run_sync(
        lambda: engine.store.transition(
            task.id,
            status,
            reason=v.reason,
            now=engine.clock(),
            owner=engine.owner,
            attempt=task.attempt,
            **fields,
        )
    )
    if v.block_account_until:
        from fleet_tui.scheduler.model import RateLimit

        await anyio.to_thread.run_sync(
            engine.store.put_rate_limit,
            RateLimit(
                account=r.account,
                status="rejected",
                # the account's own reset when known: the grace after it is the engine's, not its
                resets_at=res.outcome.resets_at
                if res.outcome.resets_at and res.outcome.resets_at < v.block_account_until
                else v.block_account_until,
                observed_at=engine.clock(),
            ),
            v.block_account_until,
        )
    if r.runner.asked or task.asking:  # a question left pending dies with its attempt
        await anyio.to_thread.run_sync(engine.store.close_questions, task.id, "cancelled", engine.clock())
    engine.publish_task(new)
    if new is not None:
        await cascade(engine, new)
        if new.status == TaskStatus.DONE and (new.worktree or new.spec.git_ref):  # in place: no after-work
            await after_done_hook(engine, new)


async def local_command(engine: Engine, verb: str, tid: str) -> CommandResult:
    """Act on an agent this engine holds: stop it (kill, cancel, retry) or signal its group."""
    r = engine.runners.get(tid)
    if r is None:
        task = await anyio.to_thread.run_sync(engine.store.get_task, tid)
        return CommandResult(False, f"{task.name if task else tid} is not running here")
    name = r.task.name
    if verb in ("kill", "cancel", "retry"):
        reason = {"kill": "killed_by_user", "cancel": "cancelled", "retry": "retry_by_user"}[verb]
        r.runner.stop(reason)
        with anyio.move_on_after(engine.cfg.kill_grace_s + 10):
            await r.done.wait()
        new = await anyio.to_thread.run_sync(engine.store.get_task, tid)
        state = new.status.value if new else "gone"
        return CommandResult(r.done.is_set(), f"{name}: {verb} -> {state}", new)
    if verb == "followup":  # stop at the agent's next turn boundary
        from fleet_tui.scheduler.humans.followup import stop_at_turn

        return await stop_at_turn(engine, r)
    if verb == "pause":
        if not r.runner.signal_agent(signal.SIGSTOP):
            return CommandResult(False, f"{name}: its agent is not running")
        return await _move_live(
            engine, r, TaskStatus.PAUSED, "paused by user", 1, f"{name}: paused (agent stopped with SIGSTOP)"
        )
    if verb == "resume":
        r.runner.signal_agent(signal.SIGCONT)
        return await _move_live(engine, r, TaskStatus.RUNNING, "resumed by user", 0, f"{name}: resumed")
    return CommandResult(False, f"unknown command {verb!r}")


async def _move_live(
    engine: Engine, r: Running, dst: TaskStatus, reason: str, paused_running: int, message: str
) -> CommandResult:
    """The fenced transition of a task whose agent this engine holds (pause/resume)."""
    new = await anyio.to_thread.run_sync(
        lambda: engine.store.transition(
            r.task.id,
            dst,
            reason=reason,
            now=engine.clock(),
            owner=engine.owner,
            attempt=r.task.attempt,
            paused_running=paused_running,
        )
    )
    if new:
        r.task = new
    engine.publish_task(new)
    return CommandResult(new is not None, message, new)
