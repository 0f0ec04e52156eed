"""The life of a task in one place: why it moved, and the named moves that change its state.

Every change of a task's state goes through ``Lifecycle.apply``: one fenced ``store.transition``
(by owner and attempt when the caller holds the claim, by the state it saw otherwise), its
publication to the engine's subscribers, and what follows for the task's dependents (a parked
task parks them, a task back in the queue or approved brings them back). What each move is —
its destination, its reason and the fields it resets — is spelled once, by the functions below
(``kill``, ``retry``, ``approve``, ``mark_merged``...), each returning a ``Move``; what entering a
state writes besides (``finished_at``, the claim let go) is ``states.entry_fields``, which both
stores use. As Supervisor's ``change_state`` does for its process states, but typed.

Reasons are stored as the strings they always were (the DB, ``status --json`` and the CLI read
them): ``Reason`` is a code and a detail that renders to exactly that string, and ``Reason.parse``
reads any stored string back (``parse(s).text == s`` for every ``s``; unknown ones are ``OTHER``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.states import PARKED, TaskStatus
from fleet_tui.scheduler.store.protocol import Store


class ReasonCode(StrEnum):
    """What a stored reason says, whatever its wording. The value is the reason's stem."""

    NEVER_STARTED = "never_started"
    PREPARE_FAILED = "could not prepare the attempt"
    DEPENDENCY_FAILED = "dependency_failed"
    DEPENDENCY_RETRIED = "dependency retried"
    KILLED_BY_USER = "killed_by_user"
    CANCELLED_BY_USER = "cancelled by user"
    RETRY_BY_USER = "retry by user"
    PAUSED_BY_USER = "paused by user"
    RESUMED_BY_USER = "resumed by user"
    RESUMED_ENGINE_GONE = "resumed; its engine had stopped"
    RESUMED = "resumed"  # the attempt crashed, its supervisor lost it
    FOLLOW_UP = "follow-up by"
    APPROVED_BY = "approved_by"
    TAKEN_OVER = "taken over by"
    PARKED_AFTER_TAKEOVER = "parked after takeover by"
    REQUEUED_AFTER_TAKEOVER = "requeued after takeover by"
    VERIFIED_AFTER_TAKEOVER = "verified after takeover by"
    CRASHED = "crashed"
    OVER_BUDGET = "over_budget"
    VERIFY_FAILED = "verify_failed"
    MERGE_CONFLICT = "merge_conflict"
    PUSH_REJECTED = "push_rejected"
    PULL_REQUEST_FAILED = "pull_request_failed"
    CHANGES_REQUESTED = "changes_requested"
    AUTO_MERGE_REFUSED = "auto_merge_refused"
    MERGED = "merged"
    PULL_REQUEST = "pull request"
    OTHER = ""  # any other wording: the detail is the whole text


#: code -> (the text without a detail or None, the text before the detail, the text after it)
_FORMS: dict[ReasonCode, tuple[str | None, str, str]] = {
    ReasonCode.NEVER_STARTED: ("never_started", "never_started: ", ""),
    ReasonCode.PREPARE_FAILED: (None, "could not prepare the attempt (", "); trying again in a minute"),
    ReasonCode.DEPENDENCY_FAILED: ("dependency_failed", "dependency_failed: ", ""),
    ReasonCode.DEPENDENCY_RETRIED: (None, "dependency ", " retried"),
    ReasonCode.KILLED_BY_USER: ("killed_by_user", "killed_by_user: ", ""),
    ReasonCode.CANCELLED_BY_USER: ("cancelled by user", "cancelled by user: ", ""),
    ReasonCode.RETRY_BY_USER: ("retry by user", "retry by user: ", ""),
    ReasonCode.PAUSED_BY_USER: ("paused by user", "paused by user: ", ""),
    ReasonCode.RESUMED_BY_USER: ("resumed by user", "resumed by user: ", ""),
    ReasonCode.RESUMED_ENGINE_GONE: (
        "resumed; its engine had stopped",
        "resumed; its engine had stopped: ",
        "",
    ),
    ReasonCode.RESUMED: ("resumed", "resumed: ", ""),
    ReasonCode.FOLLOW_UP: (None, "follow-up by ", ""),
    ReasonCode.APPROVED_BY: (None, "approved_by:", ""),
    ReasonCode.TAKEN_OVER: (None, "taken over by ", ""),
    ReasonCode.PARKED_AFTER_TAKEOVER: (None, "parked after takeover by ", ""),
    ReasonCode.REQUEUED_AFTER_TAKEOVER: (None, "requeued after takeover by ", ""),
    ReasonCode.VERIFIED_AFTER_TAKEOVER: (None, "verified after takeover by ", ""),
    ReasonCode.CRASHED: ("crashed", "crashed: ", ""),
    ReasonCode.OVER_BUDGET: ("over_budget", "over_budget: ", ""),
    ReasonCode.VERIFY_FAILED: ("verify_failed", "verify_failed: ", ""),
    ReasonCode.MERGE_CONFLICT: ("merge_conflict", "merge_conflict: ", ""),
    ReasonCode.PUSH_REJECTED: ("push_rejected", "push_rejected: ", ""),
    ReasonCode.PULL_REQUEST_FAILED: ("pull_request_failed", "pull_request_failed: ", ""),
    ReasonCode.CHANGES_REQUESTED: ("changes_requested", "changes_requested: ", ""),
    ReasonCode.AUTO_MERGE_REFUSED: ("auto_merge_refused", "auto_merge_refused: ", ""),
    ReasonCode.MERGED: ("merged", "merged ", ""),
    ReasonCode.PULL_REQUEST: (None, "pull request ", ""),
    ReasonCode.OTHER: (None, "", ""),
}

#: a merge that a person must look at: ``fleet-tui merge`` may try such a parked task again
MERGE_TROUBLE = frozenset(
    {ReasonCode.MERGE_CONFLICT, ReasonCode.PUSH_REJECTED, ReasonCode.PULL_REQUEST_FAILED}
)


@dataclass(frozen=True)
class Reason:
    """Why a task moved: a code and an optional detail, stored as ``text``."""

    code: ReasonCode
    detail: str | None = None

    @property
    def text(self) -> str:
        bare, before, after = _FORMS[self.code]
        if self.detail is None:
            return bare if bare is not None else self.code.value
        return before + self.detail + after

    def __str__(self) -> str:
        return self.text

    @staticmethod
    def parse(text: str) -> Reason:
        """The reason a stored string says (``OTHER`` with the whole text when none fits)."""
        best: Reason | None = None
        width = -1
        for code, (bare, before, after) in _FORMS.items():
            if code == ReasonCode.OTHER:
                continue
            if bare is not None and text == bare:
                return Reason(code)
            if (
                before
                and len(before) > width
                and text.startswith(before)
                and text.endswith(after)
                and len(text) >= len(before) + len(after)
            ):
                best, width = Reason(code, text[len(before) : len(text) - len(after)]), len(before)
        return best if best is not None else Reason(ReasonCode.OTHER, text)

    @staticmethod
    def of(task: Task) -> Reason | None:
        """The task's stored reason, read back (None when it has none)."""
        return Reason.parse(task.reason) if task.reason else None

    @property
    def parent(self) -> str | None:
        """The direct parent named by a ``dependency_failed`` reason, or None."""
        if self.code != ReasonCode.DEPENDENCY_FAILED or not self.detail:
            return None
        words = self.detail.split()
        return words[0] if words else None


def text_of(reason: Reason | None) -> str | None:
    return None if reason is None else reason.text


class AttemptOutcome(StrEnum):
    """How an attempt ended, as recorded on it (``Attempt.outcome``): the coder's classification
    (``model.OutcomeKind``) refined by the engine's verdict."""

    SUCCESS = "success"
    FAILURE = "failure"
    VERIFY_FAILED = "verify_failed"
    STALLED = "stalled"
    TIMEOUT = "timeout"
    OVER_BUDGET = "over_budget"
    LOOPING = "looping"
    CRASHED = "crashed"
    CONTEXT_PRESSURE = "context_pressure"
    RATE_LIMITED = "rate_limited"
    AUTH_FAILED = "auth_failed"
    KILLED = "killed"
    LEASE_LOST = "lease_lost"


#: attempts whose failure the next attempt's prompt explains (with the output)
RETRIED_FAILURES = frozenset(
    {
        AttemptOutcome.FAILURE,
        AttemptOutcome.VERIFY_FAILED,
        AttemptOutcome.STALLED,
        AttemptOutcome.TIMEOUT,
        AttemptOutcome.OVER_BUDGET,
    }
)


class StopReason(StrEnum):
    """Why the engine stopped an agent (``AttemptRunner.stop``'s reason; policy/outcome.py
    decides what each means for the task)."""

    KILLED_BY_USER = "killed_by_user"
    CANCELLED = "cancelled"
    RETRY_BY_USER = "retry_by_user"
    SHUTDOWN = "shutdown"
    LEASE_LOST = "lease_lost"
    STALLED = "stalled"
    TIMEOUT = "timeout"
    OVER_BUDGET = "over_budget"
    LOOPING = "looping"
    CONTEXT_PRESSURE = "context_pressure"


# -- moves ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """One change of state: where to, why, the fields it writes, and whether the task's
    dependents follow (parked with it, or brought back with it)."""

    dst: TaskStatus
    reason: Reason | None
    fields: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    dependents: bool = True


def _move(dst: TaskStatus, reason: Reason | None, *, dependents: bool = True, **fields: Any) -> Move:
    return Move(dst, reason, MappingProxyType(fields), dependents)


#: the counters a fresh start resets (a retry by the user, a follow-up, a requeue after takeover)
_FRESH: dict[str, Any] = {"retries_used": 0, "false_completions": 0, "handoffs": 0, "not_before": None}


def kill() -> Move:
    return _move(TaskStatus.NEEDS_HUMAN, Reason(ReasonCode.KILLED_BY_USER), paused_running=0)


def cancel() -> Move:
    return _move(TaskStatus.CANCELLED, Reason(ReasonCode.CANCELLED_BY_USER), paused_running=0)


def retry(queued: bool = False) -> Move:
    """Back to the queue by the user's hand (a queued task only loses its backoff)."""
    if queued:
        return _move(TaskStatus.QUEUED, Reason(ReasonCode.RETRY_BY_USER), not_before=None)
    return _move(TaskStatus.QUEUED, Reason(ReasonCode.RETRY_BY_USER), **_FRESH, paused_running=0)


def pause() -> Move:
    return _move(TaskStatus.PAUSED, Reason(ReasonCode.PAUSED_BY_USER), paused_running=0)


def resume(engine_gone: bool = False) -> Move:
    if engine_gone:
        return _move(TaskStatus.QUEUED, Reason(ReasonCode.RESUMED_ENGINE_GONE), paused_running=0)
    return _move(TaskStatus.QUEUED, Reason(ReasonCode.RESUMED_BY_USER))


def pause_live() -> Move:
    """The agent this engine holds was stopped with SIGSTOP."""
    return _move(TaskStatus.PAUSED, Reason(ReasonCode.PAUSED_BY_USER), dependents=False, paused_running=1)


def resume_live() -> Move:
    return _move(TaskStatus.RUNNING, Reason(ReasonCode.RESUMED_BY_USER), dependents=False, paused_running=0)


def follow_up(by: str) -> Move:
    return _move(TaskStatus.QUEUED, Reason(ReasonCode.FOLLOW_UP, by), **_FRESH, paused_running=0)


def approve(by: str) -> Move:
    return _move(TaskStatus.DONE, Reason(ReasonCode.APPROVED_BY, by), paused_running=0)


def take_over(by: str) -> Move:
    return _move(TaskStatus.NEEDS_HUMAN, Reason(ReasonCode.TAKEN_OVER, by), paused_running=0)


def leave_after_takeover(by: str) -> Move:
    return _move(TaskStatus.NEEDS_HUMAN, Reason(ReasonCode.PARKED_AFTER_TAKEOVER, by))


def requeue_after_takeover(by: str) -> Move:
    return _move(TaskStatus.QUEUED, Reason(ReasonCode.REQUEUED_AFTER_TAKEOVER, by), **_FRESH)


def verified_after_takeover(by: str) -> Move:
    return _move(TaskStatus.DONE, Reason(ReasonCode.VERIFIED_AFTER_TAKEOVER, by), paused_running=0)


def verify_failed_after_takeover(label: str | None, by: str) -> Move:
    return _move(
        TaskStatus.NEEDS_HUMAN, Reason(ReasonCode.VERIFY_FAILED, f"{label} (after takeover by {by})")
    )


def never_started(why: str) -> Move:
    return _move(TaskStatus.NEEDS_HUMAN, Reason(ReasonCode.NEVER_STARTED, why))


def requeue_later(error: str, not_before: float) -> Move:
    """Preparing the attempt failed for a reason not the task's (a full disk): later again."""
    return _move(
        TaskStatus.QUEUED, Reason(ReasonCode.PREPARE_FAILED, error), dependents=False, not_before=not_before
    )


def requeue_crashed() -> Move:
    """An adopted attempt whose shim died without an exit record."""
    return _move(
        TaskStatus.QUEUED,
        Reason(ReasonCode.RESUMED, "the attempt crashed"),
        dependents=False,
        paused_running=0,
    )


def start_verifying() -> Move:
    return _move(TaskStatus.VERIFYING, None, dependents=False)


def verdict(dst: TaskStatus, reason: str | None, **fields: Any) -> Move:
    """The engine's decision on an ended attempt (policy/outcome.py); a parked task parks its
    dependents."""
    return _move(dst, None if reason is None else Reason.parse(reason), dependents=dst in PARKED, **fields)


def mark_merged(commit: str | None) -> Move:
    return _move(
        TaskStatus.DONE, Reason(ReasonCode.MERGED, f"{commit}"), dependents=False, merged_commit=commit
    )


def merge_conflict(files: Iterable[str]) -> Move:
    return _move(
        TaskStatus.NEEDS_HUMAN, Reason(ReasonCode.MERGE_CONFLICT, ", ".join(files)), dependents=False
    )


def auto_merge_refused(why: str) -> Move:
    return _move(TaskStatus.DONE, Reason(ReasonCode.AUTO_MERGE_REFUSED, why), dependents=False)


def park_done(reason: str) -> Move:
    """A done task a person must look at again (its push or pull request failed, a reviewer
    asked for changes); its dependents are left as they are."""
    return _move(TaskStatus.NEEDS_HUMAN, Reason.parse(reason), dependents=False)


def mark_done(reason: str, **fields: Any) -> Move:
    """A done (or parked) task settled again as done: a pull request opened, merged."""
    return _move(TaskStatus.DONE, Reason.parse(reason), dependents=False, **fields)


def dependency_failed(parent: str, root: str, why: str) -> Move:
    detail = parent + (f" ← {root}" if parent != root else "") + f" ({why})"
    return _move(TaskStatus.NEEDS_HUMAN, Reason(ReasonCode.DEPENDENCY_FAILED, detail), dependents=False)


def dependency_retried(parent: str) -> Move:
    return _move(TaskStatus.QUEUED, Reason(ReasonCode.DEPENDENCY_RETRIED, parent), dependents=False)


# -- applying moves -------------------------------------------------------------------------------


class Lifecycle:
    """Applies moves to tasks in a store, as ``actor``, and tells ``publish`` what changed.

    Blocking (the store is): async callers run ``apply`` in a worker thread. ``publish`` is called
    from there, so give one that may be (the engine's queues it on its loop: onloop.LoopPost)."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        actor: str | None,
        publish: Callable[[Task], None] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.actor = actor
        self._publish = publish

    def apply(
        self,
        task: Task,
        move: Move,
        *,
        held: bool = False,
        expect: Iterable[TaskStatus] | None = None,
        via: TaskStatus | None = None,
        record: Mapping[str, Any] | None = None,
    ) -> Task | None:
        """Move ``task``: fenced by this actor's claim on its attempt when ``held`` (the engine
        that runs it), else by the state it is in now (``task.status``, or ``expect``). A held
        move may pass ``via`` a state and write the attempt's ``record`` in the same transaction
        (``Store.transition``).

        Returns the moved task, or None when the fence did not match (the claim was lost, or the
        task moved meanwhile). Raises IllegalTransition for a move the state table forbids."""
        now = self.clock()
        if held:
            assert self.actor is not None, "a held move is fenced by its owner"
            new = self.store.transition(
                task.id, move.dst, reason=text_of(move.reason), now=now, owner=self.actor,
                attempt=task.attempt, via=via, record=record, **move.fields,
            )  # fmt: skip
        else:
            new = self.store.transition(
                task.id, move.dst, reason=text_of(move.reason), now=now,
                expect=list(expect) if expect is not None else [task.status], actor=self.actor, **move.fields,
            )  # fmt: skip
        if new is None:
            return None
        self.tell(new)
        if move.dependents:
            if new.status in PARKED:
                self.cascade_failure(new)
            elif new.status in (TaskStatus.QUEUED, TaskStatus.DONE):
                self.cascade_restore(new)
        return new

    def adopt(self, task: Task, host: str, lease_s: float, *, reclaim: bool) -> Task | None:
        """Take the claim of a task whose engine is gone, as this actor (fenced by its old owner
        and attempt): to adopt its live shim, or (``reclaim``) once its lease has expired."""
        assert self.actor is not None, "an adopter is an engine"
        new = self.store.take_over(
            task.id, task.owner, task.attempt, self.actor, host, self.clock(), lease_s, reclaim
        )
        return new

    def tell(self, task: Task | None) -> None:
        if task is not None and self._publish is not None:
            self._publish(task)

    def cascade_failure(self, task: Task) -> list[Task]:
        """Park every dependent of a parked/cancelled task, down the whole chain. Each says its
        direct parent and the root cause: ``dependency_failed: mid ← base (retries_exhausted)``."""
        root, why = _root_cause(task)
        out: list[Task] = []
        stack = [task]
        while stack:
            cur = stack.pop()
            for dep in self.store.dependents(cur.id):
                if dep.status in (TaskStatus.QUEUED, TaskStatus.PAUSED) and not dep.paused_running:
                    new = self.apply(dep, dependency_failed(cur.name, root, why))
                    if new is not None:
                        out.append(new)
                        stack.append(new)
        return out

    def cascade_restore(self, task: Task) -> list[Task]:
        """Bring back the dependents parked because of this task (retry of a dependency)."""
        out: list[Task] = []
        stack = [task]
        while stack:
            cur = stack.pop()
            for dep in self.store.dependents(cur.id):
                r = Reason.of(dep)
                if dep.status == TaskStatus.NEEDS_HUMAN and r is not None and r.parent == cur.name:
                    new = self.apply(dep, dependency_retried(cur.name))
                    if new is not None:
                        out.append(new)
                        stack.append(new)
        return out


def _root_cause(task: Task) -> tuple[str, str]:
    """The task whose own failure parks a chain, and why (``retries_exhausted``, ``cancelled``...)."""
    why = task.reason or task.status.value
    if task.status == TaskStatus.CANCELLED:
        why = "cancelled"
    r = Reason.of(task)
    parent = r.parent if r is not None else None
    if parent is not None and task.status == TaskStatus.NEEDS_HUMAN:  # parked by an earlier cascade
        head, _, cause = why.partition(" (")
        root = head.split("← ", 1)[1].strip() if "← " in head else parent
        return root, cause[:-1] if cause.endswith(")") else (cause or "dependency_failed")
    return task.name, (why if len(why) <= 80 else why[:79] + "…")


class Commands(Protocol):
    """What the people's commands (humans/: send, approve, takeover) need of a controller: the
    store, its clock and actor, a task by name, a move applied, and a running agent stopped.
    ``control.Controller`` (the CLI's), the engine and the attached view all are one."""

    store: Store
    actor: str

    @property
    def clock(self) -> Callable[[], float]: ...

    async def get(self, ref: str) -> Task | CommandResult:
        """The task, or a failed result saying there is none (with a did-you-mean)."""
        ...

    async def command(self, task: Task, move: Move) -> CommandResult:
        """Apply ``move`` to a task no engine holds, fenced by the state it was seen in."""
        ...

    async def kill(self, ref: str) -> CommandResult: ...

    async def retry(self, ref: str) -> CommandResult: ...

    async def stop_for_followup(self, task: Task) -> CommandResult | None:
        """Have the engine running ``task`` stop its agent at the next turn boundary (None: no
        live engine owns it)."""
        ...

    def wake(self) -> None:
        """Tell the scheduler here (if any) that the queue changed."""
        ...
