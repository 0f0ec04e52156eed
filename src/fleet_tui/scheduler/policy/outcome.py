"""Attempt result -> the task's next state: retry, park for a person, verify, done.

One pure function with one table-like body, so every path (stall, timeout, rate limit, context
handoff, false completion, budget...) can be read and tested without processes. Rate limits,
context handoffs, crashes and stops asked for by the user never use up a retry.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.procs.attemptdir import ExitReason
from fleet_tui.scheduler.procs.runner import AttemptResult
from fleet_tui.scheduler.states import TaskStatus

FALSE_COMPLETION_LIMIT = 3
RATE_LIMIT_GRACE_S = 30.0
RATE_LIMIT_BACKOFF_S = (60.0, 120.0, 300.0, 600.0, 1200.0)


@dataclass(frozen=True)
class Policy:
    """The retry and handoff rules an attempt's verdict follows."""

    max_retries: int = 2
    retry_backoff_s: tuple[float, ...] = (30.0, 120.0, 480.0)
    max_handoffs: int = 3
    jitter: float = 0.1


@dataclass(frozen=True)
class Verdict:
    """What happens to a task after an attempt: its next state, why, and when it may run."""

    status: TaskStatus | None  # None: leave the task alone (the claim was lost)
    reason: str | None
    use_retry: bool = False
    not_before: float | None = None
    handoff: bool = False
    crashed: bool = False
    verify: bool = False  # success so far: run the verifiers
    false_completion: bool = False
    block_account_until: float | None = None
    outcome: str = "failure"  # recorded on the attempt


def backoff(policy: Policy, n: int, now: float) -> float:
    if not policy.retry_backoff_s:
        return now
    base = policy.retry_backoff_s[min(n, len(policy.retry_backoff_s) - 1)]
    if base <= 0:
        return now
    return now + base * (1 + random.uniform(-policy.jitter, policy.jitter))


def _retry(
    task: Task,
    policy: Policy,
    now: float,
    reason: str,
    outcome: str,
    park_reason: str | None = None,
    false_completion: bool = False,
) -> Verdict:
    limit = task.spec.max_retries if task.spec.max_retries is not None else policy.max_retries
    if task.retries_used >= limit:
        return Verdict(
            TaskStatus.NEEDS_HUMAN,
            park_reason or "retries_exhausted",
            outcome=outcome,
            false_completion=false_completion,
        )
    return Verdict(
        TaskStatus.QUEUED,
        reason,
        use_retry=True,
        not_before=backoff(policy, task.retries_used, now),
        outcome=outcome,
        false_completion=false_completion,
    )


def decide(
    task: Task,
    r: AttemptResult,
    policy: Policy,
    now: float,
    rate_limit_strikes: int = 0,
    spent_before: float = 0.0,
) -> Verdict:
    """The next state after an attempt ended (before verification).

    ``spent_before`` is what the task's earlier attempts (and their reviews) cost: a task's
    ``budget_usd`` covers the whole task, not each attempt."""
    stop = r.stop_reason
    finished = r.exit_code == 0 and r.outcome.kind == "success"
    if stop == "lease_lost":
        return Verdict(None, None, outcome="lease_lost")
    if stop == "killed_by_user":
        return Verdict(TaskStatus.NEEDS_HUMAN, "killed_by_user", outcome="killed")
    if stop == "cancelled":
        return Verdict(TaskStatus.CANCELLED, "cancelled by user", outcome="killed")
    if stop in ("shutdown", "retry_by_user"):
        return Verdict(
            TaskStatus.QUEUED,
            "stopped with the fleet" if stop == "shutdown" else "retry by user",
            outcome="killed",
        )
    if stop == "over_budget":
        return Verdict(TaskStatus.NEEDS_HUMAN, f"over_budget: {r.stop_detail}", outcome="over_budget")
    if stop == "looping":  # scheduler/policy/loops.py: retrying would loop again
        return Verdict(TaskStatus.NEEDS_HUMAN, f"looping: {r.stop_detail}", outcome="looping")
    budget = task.spec.budget_usd
    total = spent_before + (r.cost_usd or 0.0)
    if stop is None and budget is not None and r.cost_usd is not None and total > budget:
        # most agents report their cost only in the final result line, often after the runner's
        # last look at a live process: the budget is checked again here, whatever the ending
        return Verdict(
            TaskStatus.NEEDS_HUMAN,
            f"over_budget: cost ${total:.2f} > budget ${budget:.2f}",
            outcome="over_budget",
        )
    if stop == "context_pressure" and finished:
        # the agent had already finished (exit 0, a success result) when its context crossed the
        # line: its work goes to verification; a handoff is only for an agent stopped mid-work
        return Verdict(TaskStatus.VERIFYING, None, verify=True, outcome="success")
    if stop == "context_pressure":
        if task.handoffs >= policy.max_handoffs:
            return Verdict(
                TaskStatus.NEEDS_HUMAN,
                f"context_pressure: {policy.max_handoffs} handoffs used",
                outcome="context_pressure",
            )
        return Verdict(
            TaskStatus.QUEUED, f"context handoff: {r.stop_detail}", handoff=True, outcome="context_pressure"
        )
    if stop == "stalled":
        return _retry(task, policy, now, f"stalled: {r.stop_detail}", "stalled", park_reason="stalled")
    if stop == "timeout":
        return _retry(
            task, policy, now, f"timeout: {r.stop_detail}", "timeout", park_reason=f"timeout: {r.stop_detail}"
        )
    if r.exit_reason in (ExitReason.CRASHED, ExitReason.LEASE_EXPIRED):
        why = "its supervisor lost it" if r.exit_reason == ExitReason.LEASE_EXPIRED else "the attempt crashed"
        return Verdict(TaskStatus.QUEUED, f"resumed: {why}", crashed=True, outcome="crashed")
    if r.exit_reason == ExitReason.SPAWN_FAILED:
        return Verdict(
            TaskStatus.NEEDS_HUMAN, "never_started: the agent could not be started", outcome="failure"
        )
    o = r.outcome
    if o.kind == "rate_limited":
        if o.resets_at and o.resets_at > now:
            until = o.resets_at + RATE_LIMIT_GRACE_S
        else:
            until = now + RATE_LIMIT_BACKOFF_S[min(rate_limit_strikes, len(RATE_LIMIT_BACKOFF_S) - 1)]
        return Verdict(
            TaskStatus.QUEUED,
            f"rate limited: {o.detail}".rstrip(": "),
            not_before=until,
            block_account_until=until,
            outcome="rate_limited",
        )
    if o.kind == "auth_failed":
        return Verdict(TaskStatus.NEEDS_HUMAN, f"auth_failed: {o.detail}", outcome="auth_failed")
    if o.kind == "context_pressure":
        if task.handoffs >= policy.max_handoffs:
            return Verdict(TaskStatus.NEEDS_HUMAN, "context_pressure", outcome="context_pressure")
        return Verdict(
            TaskStatus.QUEUED, f"context handoff: {o.detail}", handoff=True, outcome="context_pressure"
        )
    if o.kind == "success" and r.exit_code == 0:
        return Verdict(TaskStatus.VERIFYING, None, verify=True, outcome="success")
    detail = o.detail or (f"exit {r.exit_code}" if r.exit_code is not None else "no exit status")
    return _retry(task, policy, now, f"failed: {detail}", "failure")


def after_verify(
    task: Task,
    passed: bool,
    failed_label: str | None,
    claimed_success: bool,
    policy: Policy,
    now: float,
    nothing_done: bool = False,
) -> Verdict:
    """The next state once verifiers ran (or there were none).

    A failed verification is a *false completion* only when the agent claimed success and the
    evidence shows it did nothing (``nothing_done``: no file of its working directory changed
    during the attempt, or an artifact it was asked for does not exist). An honest draft that a
    verifier rejects is an ordinary ``verify_failed``: it retries, then parks as
    ``verify_failed: ...``. ``false_completion`` parks only the third proven false claim."""
    if passed:
        return Verdict(TaskStatus.DONE, None, outcome="success")
    fc = claimed_success and nothing_done
    if fc and task.false_completions + 1 >= FALSE_COMPLETION_LIMIT:
        return Verdict(
            TaskStatus.NEEDS_HUMAN, "false_completion", outcome="verify_failed", false_completion=True
        )
    return _retry(
        task,
        policy,
        now,
        f"verify_failed: {failed_label}",
        "verify_failed",
        park_reason=f"verify_failed: {failed_label}",
        false_completion=fc,
    )
