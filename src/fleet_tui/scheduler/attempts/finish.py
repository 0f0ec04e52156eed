"""What happens when an attempt ends: the reaper verifies, decides and records.

Kept out of engine.py so the engine reads as its loops. An ended attempt is first checked to
still be this engine's (a claim lost meanwhile changes nothing); its leftovers are WIP-committed.
Then ``decide`` turns the runner's result into a verdict (policy/outcome.py, plus the crash
streak), ``verify`` runs the task's verifiers when the agent claims success, and ``record``
writes the attempt's record and the task's move (both fenced by owner and attempt, through the
lifecycle, which parks dependents of a parked task), holds a rate-limited account back, and
hands finished work to the merger's after-work.

All of it is blocking work (store writes, git, verifiers), so it runs in one worker thread from
start to end (``finish``): one hand-over per ended attempt instead of one per step. What it
publishes is queued on the loop (onloop.py); a verifier's output goes to the event writer on the
loop (``anyio.from_thread``), the one step that waits for it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from fleet_tui.config import Config
from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.attempts.launch import load_worktree
from fleet_tui.scheduler.attempts.ratelimits import RateLimitBook
from fleet_tui.scheduler.attempts.running import Running
from fleet_tui.scheduler.git import worktree as wt
from fleet_tui.scheduler.lifecycle import AttemptOutcome, Lifecycle, StopReason
from fleet_tui.scheduler.merger import Merger, commit_leftovers
from fleet_tui.scheduler.model import Event, Task
from fleet_tui.scheduler.policy.evidence import nothing_done
from fleet_tui.scheduler.policy.headroom import MemoryModel
from fleet_tui.scheduler.policy.outcome import Policy, Verdict, after_verify, decide
from fleet_tui.scheduler.policy.verify import AgentReviewer, run_verifiers
from fleet_tui.scheduler.procs.owned import DYING_S, reap_attempt
from fleet_tui.scheduler.procs.runner import AttemptResult
from fleet_tui.scheduler.sandbox.policy import verifier_wrap
from fleet_tui.scheduler.states import TaskStatus

#: consecutive crashed attempts before a task is parked for a person
CRASH_LIMIT = 3

#: an attempt's events on their way to the store: (task id, attempt, events, stdout offset)
Sink = Callable[[str, int, list[Event], int], Coroutine[Any, Any, None]]


def _judged(r: Running, res: AttemptResult) -> None:
    """An agent that finished as it was stopped (context pressure at its last turn): the verdict
    sent its work on to verification, so that stop must neither cancel the verifiers nor be
    decided again as a kill."""
    if res.stop_reason is not None and r.runner.stop_reason == res.stop_reason:
        r.runner.judged()


class Reaper:
    """Finishes the attempts of one engine (the lifecycle's actor)."""

    def __init__(
        self,
        life: Lifecycle,
        home: Path,
        config: Callable[[], Config],
        policy: Callable[[], Policy],
        reviewer: Callable[[Task], AgentReviewer | None],
        mem: MemoryModel,
        rate_limits: RateLimitBook,
        merger: Merger,
        sink: Sink,
        notice: Callable[[str], None],
    ) -> None:
        self.life = life
        self.store = life.store
        self.home = Path(home)
        self._config = config
        self._policy = policy
        self._reviewer = reviewer
        self.mem = mem
        self.rate_limits = rate_limits
        self.merger = merger
        self._sink = sink
        self._notice = notice

    @property
    def owner(self) -> str:
        assert self.life.actor is not None
        return self.life.actor

    async def finish(self, r: Running, res: AttemptResult, lane: anyio.CapacityLimiter | None = None) -> None:
        """An attempt ended: verify, decide, write the fenced move, after-work (in a thread; in
        ``lane`` when given, the engine's one thread for short work: see ``Engine.lane``)."""
        await anyio.to_thread.run_sync(self.settle, r, res, limiter=lane)

    def settle(self, r: Running, res: AttemptResult) -> None:
        """``finish``'s work, blocking (a worker thread runs it)."""
        now = self.life.clock()
        fresh = self.store.get_task(r.task.id)
        if fresh is None or fresh.owner != self.owner or fresh.attempt != r.task.attempt:
            return  # the claim was lost: someone else owns it now
        task = fresh
        self._leftovers(r, task, res)
        res = self._conflicts_left(task, res)
        v = self.decide(r, task, res, now)
        att: dict[str, Any] = {
            "ended_at": now,
            "exit_code": res.exit_code,
            "outcome": v.outcome,
            "detail": res.stop_detail or res.outcome.detail,
            "cost_usd": res.cost_usd or 0.0,
            "tokens": res.tokens,
        }
        if v.block_account_until:
            self.rate_limits.strike(r.account)
        elif v.outcome == AttemptOutcome.SUCCESS:
            self.rate_limits.clear(r.account)
        via: TaskStatus | None = None
        if v.verify and not task.spec.verify and task.status == TaskStatus.RUNNING:
            # nothing to verify: the claimed success is the verdict, and the task passes through
            # verifying in the same transaction as its record and its move (one write, not three)
            _judged(r, res)
            v = after_verify(task, True, None, True, self._policy(), now)
            att["outcome"] = v.outcome
            via = TaskStatus.VERIFYING
        elif v.verify:
            judged = self.verify(r, task, res, att, now)
            if judged is None:
                return  # the claim was lost, or left verifying for the engine that adopts it
            task, v = judged
        self.record(r, task, res, v, att, via)

    def _leftovers(self, r: Running, task: Task, res: AttemptResult) -> None:
        if r.peak_mem:
            self.mem.record(r.coder, r.peak_mem)
        if task.worktree:  # uncommitted work goes to the branch as a WIP commit, never discarded
            try:
                commit_leftovers(self.home, task)
            except Exception as e:
                self._notice(f"{task.name}: WIP commit failed: {e}")
        if res.exit_reason == "crashed":  # the shim died: what it hosted must die before a retry
            reap_attempt(r.dir, DYING_S)

    def _conflicts_left(self, task: Task, res: AttemptResult) -> AttemptResult:
        """An agent that says it finished, on a branch that adds whole git conflict blocks (a merge
        of its base it was asked to make, a stash or rebase stopped on a conflict; the WIP commit
        keeps the files as they are, markers and all), did not finish: its run counts as failed,
        and the next attempt is told which files to resolve. Never merged into the base as it is."""
        if not task.worktree or res.stop_reason is not None or res.exit_code != 0:
            return res
        if res.outcome.kind != "success":
            return res
        info = load_worktree(self.home, task.id)
        if info is None:
            return res
        try:
            files = wt.conflict_blocks(info)
        except wt.WorktreeError as e:
            self._notice(f"{task.name}: could not look for conflict markers: {e}")
            return res
        if not files:
            return res
        detail = (
            f"unresolved merge conflicts: {wt.CONFLICT_MARKERS} left in "
            f"{', '.join(files)}; resolve them, keep what both sides meant, and commit"
        )
        failed = replace(res.outcome, kind="failure", detail=detail, claimed_success=False)
        return replace(res, outcome=failed)

    def decide(self, r: Running, task: Task, res: AttemptResult, now: float) -> Verdict:
        """The verdict on the agent's run (before any verification)."""
        v = decide(task, res, self._policy(), now, self.rate_limits.strikes(r.account), r.base_cost)
        if task.status == TaskStatus.VERIFYING and res.stop_reason is None:
            # adopted mid-verification: its engine had judged the agent's run a success (the output
            # it read is not read again), so only the verification is left to do
            v = Verdict(TaskStatus.VERIFYING, None, verify=True, outcome=AttemptOutcome.SUCCESS)
        if v.crashed:  # crashes use no retry, so a task that always crashes must not loop forever
            earlier = self.store.attempts(task.id)
            streak = 1
            for a in reversed([a for a in earlier if a.n < task.attempt]):
                if a.outcome != AttemptOutcome.CRASHED:
                    break
                streak += 1
            if streak >= CRASH_LIMIT:
                v = replace(
                    v,
                    status=TaskStatus.NEEDS_HUMAN,
                    crashed=False,
                    reason=lc.Reason(
                        lc.ReasonCode.CRASHED,
                        f"{streak} attempts in a row ended without an exit status "
                        "(supervisor lost, or the agent host died)",
                    ).text,
                )
        return v

    def verify(
        self, r: Running, task: Task, res: AttemptResult, att: dict[str, Any], now: float
    ) -> tuple[Task, Verdict] | None:
        """Run the task's verifiers on the agent's claimed success; the verdict after them
        (None: leave the task as it is — the claim was lost, or the engine shuts down)."""
        if task.status == TaskStatus.VERIFYING:
            moved: Task | None = task  # adopted mid-verification (its engine died): verify again
            self.life.tell(task)
        else:
            moved = self.life.apply(task, lc.start_verifying(), held=True)
        if moved is None:
            return None
        workdir = Path(task.workdir or task.spec.cwd)
        reviewer = self._reviewer(task)

        def judge() -> bool:
            # from when the agent started (after any worktree setup), not from the claim
            a = self.store.get_attempt(task.id, task.attempt)
            since = a.started_at if a is not None else (task.attempt_started_at or now)
            return nothing_done(task.spec.verify, workdir, since, skip=(self.home,))

        # the evidence only matters when a verifier fails: none to run, no directory walk
        did_nothing = judge() if task.spec.verify else False
        _judged(r, res)
        stop = r.runner.stop_event  # kill, cancel, retry and shutdown stop the verifiers too
        if reviewer is not None:
            reviewer.cancel = stop  # type: ignore[attr-defined]
        cfg = self._config()
        wrap = verifier_wrap(self.home, cfg.sandbox, task, workdir)
        r.verifying = True
        vr = run_verifiers(
            task.spec.verify,
            workdir,
            reviewer=reviewer,
            wrap=wrap,
            cancel=stop,
            home=self.home,
            nice=cfg.agent_nice,
        )
        r.verifying = False
        # a review is part of the task's cost (and of today's spend, through the attempt record)
        att["cost_usd"] += float(getattr(reviewer, "cost_usd", 0.0) or 0.0)
        att["tokens"] += int(getattr(reviewer, "tokens", 0) or 0)
        if r.runner.stop_reason is not None:
            # stopped during verification: the stop decides, not the (interrupted) verifiers
            v = decide(moved, replace(res, stop_reason=r.runner.stop_reason), self._policy(), now)
            if r.runner.stop_reason == StopReason.SHUTDOWN or v.status is None:
                return None  # left verifying: the engine that adopts it verifies again
            att["outcome"] = v.outcome
            att["detail"] = r.runner.stop_reason
            return moved, v
        if vr.output:
            event = Event(
                task_id=task.id,
                attempt=task.attempt,
                seq=r.runner.normalizer_seq(),
                ts=self.life.clock(),
                kind="verify",
                text=vr.output,
                is_error=not vr.passed,
            )
            anyio.from_thread.run(self._sink, task.id, task.attempt, [event], r.runner.offset)
        v = after_verify(
            moved,
            vr.passed,
            getattr(vr, "reason", None) or vr.label,
            res.outcome.claimed_success or res.exit_code == 0,
            self._policy(),
            self.life.clock(),
            nothing_done=did_nothing,
        )
        att["outcome"] = v.outcome
        att["verify_output"] = vr.output or None
        return moved, v

    def record(
        self,
        r: Running,
        task: Task,
        res: AttemptResult,
        v: Verdict,
        att: dict[str, Any],
        via: TaskStatus | None = None,
    ) -> None:
        """Write the attempt's record and the task's move (fenced, in one transaction; through
        ``via`` first when given), then what follows from it."""
        if v.status is None:
            self.store.update_attempt(task.id, task.attempt, owner=self.owner, **att)
            return
        # the task's usage covers every attempt and review: what came before plus this attempt
        total_cost = r.base_cost + att["cost_usd"]
        budget = task.spec.budget_usd
        over = budget is not None and total_cost >= budget
        if v.status == TaskStatus.QUEUED and over and v.outcome != AttemptOutcome.KILLED and not v.crashed:
            # another attempt could only overspend: the budget is for the whole task
            v = replace(
                v,
                status=TaskStatus.NEEDS_HUMAN,
                reason=lc.Reason(
                    lc.ReasonCode.OVER_BUDGET, f"spent ${total_cost:.2f} of the ${budget:.2f} budget"
                ).text,
                use_retry=False,
                handoff=False,
                not_before=None,
                outcome=v.outcome,
            )
        fields: dict[str, Any] = {"paused_running": 0}
        fields["cost_usd"] = total_cost
        fields["tokens"] = r.base_tokens + att["tokens"]
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
        move = lc.verdict(status, v.reason, **fields)

        # the attempt's record and the task's move, together
        new = self.life.apply(task, move, held=True, via=via, record=att)
        if new is None:
            return  # the claim was lost while we finished: the new owner's record stands
        if v.block_account_until:
            self.rate_limits.block(r.account, res.outcome.resets_at, v.block_account_until)
        if r.runner.asked or task.asking:  # a question left pending dies with its attempt
            self.store.close_questions(task.id, "cancelled", self.life.clock())
        if new is not None and new.status == TaskStatus.DONE and (new.worktree or new.spec.git_ref):
            self.merger.after_done(new)  # in place: no after-work
