"""What a notification says: one frozen Notice per event, built from the values the engine publishes.

Kept pure (no I/O, no store) so the wording — task name, a one-line summary and the command that
acts on it — is decided in one place and every channel (apprise, the desktop, the terminal,
Telegram) says the same thing. The ``key`` names the event itself, identically in every engine
that sees it, which is what lets the store hand each event to exactly one sender.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from fleet_tui.scheduler.humans.inbox import sanitize_for_display
from fleet_tui.scheduler.model import Question, RateLimit, Task
from fleet_tui.scheduler.states import TaskStatus

#: statuses in which nothing more happens to a task without a person
SETTLED = (TaskStatus.DONE, TaskStatus.CANCELLED, TaskStatus.NEEDS_HUMAN)


@dataclass(frozen=True)
class Notice:
    """One thing worth telling a person (a question, a parked task, a drained queue), once."""

    key: str  # the event's identity across engines (the notifications table's primary key)
    kind: str  # question | needs_human | done | drained | rate_limit | error | test
    title: str
    body: str  # one line
    action: str  # what to type to act on it
    task_id: str | None = None
    task_name: str | None = None
    question_id: str | None = None
    options: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """Title, summary and action as plain text (chat services, logs)."""
        return f"{self.title}\n{self.body}\n→ {self.action}"


def one_line(text: str, limit: int = 200) -> str:
    flat = sanitize_for_display(" ".join((text or "").split()), one_line=True)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def question_notice(q: Question, task_name: str) -> Notice:
    opts = f" [{' | '.join(one_line(o, 40) for o in q.options)}]" if q.options else ""
    example = q.options[0] if q.options else "your answer"
    return Notice(
        key=f"question:{q.id}",
        kind="question",
        title=f"{task_name} asks",
        body=one_line(q.text) + opts,
        action=f"fleet-tui answer {q.id} {shlex.quote(example)}",
        task_id=q.task_id,
        task_name=task_name,
        question_id=q.id,
        options=q.options,
    )


def needs_human_notice(t: Task) -> Notice:
    reason = t.reason or "needs_human"
    return Notice(
        key=f"needs_human:{t.id}:{t.attempt}:{reason}",
        kind="needs_human",
        title=f"{t.name} needs you",
        body=one_line(reason),
        action=f"fleet-tui logs {t.name}   then: fleet-tui retry {t.name}",
        task_id=t.id,
        task_name=t.name,
    )


def done_notice(t: Task) -> Notice:
    summary = one_line(t.result_text or "", 160) or "finished"
    action = f"fleet-tui merge {t.name}" if t.branch and not t.merged_commit else f"fleet-tui logs {t.name}"
    return Notice(
        key=f"done:{t.id}:{t.attempt}",
        kind="done",
        title=f"{t.name} done",
        body=summary + (f" (${t.cost_usd:.2f})" if t.cost_usd else ""),
        action=action,
        task_id=t.id,
        task_name=t.name,
    )


def drained_notice(tasks: tuple[Task, ...]) -> Notice:
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.status.value] = counts.get(t.status.value, 0) + 1
    state = ",".join(sorted(f"{t.id}={t.status.value}:{t.attempt}" for t in tasks))
    import hashlib  # here: it loads OpenSSL's library, a cost every command paid at start

    digest = hashlib.sha256(state.encode()).hexdigest()[:16]
    parts = [f"{counts.get('done', 0)} done"]
    if counts.get("needs_human"):
        parts.append(f"{counts['needs_human']} need you")
    if counts.get("cancelled"):
        parts.append(f"{counts['cancelled']} cancelled")
    return Notice(
        key=f"drained:{digest}",
        kind="drained",
        title="fleet drained: nothing left to run",
        body=", ".join(parts),
        action="fleet-tui status" + ("   then: fleet-tui retry TASK" if counts.get("needs_human") else ""),
    )


def rate_limited_notice(rl: RateLimit, waiting: int) -> Notice:
    until = time.strftime("%H:%M", time.localtime(rl.resets_at)) if rl.resets_at else "unknown"
    return Notice(
        key=f"rate_limit:{rl.account}:{int(rl.resets_at or 0)}",
        kind="rate_limit",
        title=f"{rl.account} rate-limited",
        body=f"new starts on {rl.account} wait until {until}; {waiting} task(s) queued",
        action="fleet-tui plan",
    )


def rate_resumed_notice(account: str, resets_at: float | None) -> Notice:
    return Notice(
        key=f"rate_resumed:{account}:{int(resets_at or 0)}",
        kind="rate_limit",
        title=f"{account} rate limit lifted",
        body=f"tasks on {account} start again",
        action="fleet-tui status",
    )


def error_notice(owner: str, error: BaseException) -> Notice:
    text = one_line(f"{type(error).__name__}: {error}")
    return Notice(
        key=f"error:{owner}",
        kind="error",
        title="fleet-tui engine stopped on an error",
        body=text,
        action="fleet-tui doctor   then: fleet-tui run",
    )


def test_notice() -> Notice:
    return Notice(
        key=f"test:{time.time_ns()}",
        kind="test",
        title="fleet-tui test notification",
        body="notifications from this fleet reach you here",
        action="nothing to do",
    )
