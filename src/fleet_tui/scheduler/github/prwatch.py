"""Keeping tasks in step with GitHub: pull request state polled, issue comments posted.

The engine starts ``watch`` next to its other loops (one line in engine.py). Every few seconds it
looks at the store only (no network) for imported tasks that owe their issue a comment (the task
started, or parked); every ``github_poll_s`` seconds it asks GitHub about each *open* pull request
(3-4 calls each, so 20 open pull requests at 60 s stay far below the 5000/hour limit). What it
learns lands in the task's record (``pullrequest.get_link``) and, when it matters, in the task:

- merged on GitHub: the task stays/becomes ``done`` with ``merged_commit`` and reason
  ``merged <sha> via pull request #N``;
- a new "changes requested" review: a done task goes to ``needs_human`` with reason
  ``changes_requested: pull request #N: <the review's text>`` (``retry`` runs the agent again,
  and its next success pushes to the same branch and updates the pull request);
- closed without merging: recorded, the task keeps its state.

A rate limit holds every call until the reset GitHub announced; errors are kept in the record
(shown by ``status``), never raised into the engine.
"""

from __future__ import annotations

import re
from typing import Any

import anyio

from fleet_tui.scheduler.github.api import GitHub, GitHubError, RateLimited
from fleet_tui.scheduler.github.pullrequest import get_link, is_linked, put_link
from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.states import TaskStatus

#: seconds between looks at the store for comments owed (no network unless one is owed)
COMMENT_TICK_S = 5.0
#: how long calls wait after a rate-limit error whose reset time is unknown
RATE_LIMIT_PAUSE_S = 900.0


def say(gh: GitHub, store: Any, task_id: str, link: dict[str, Any], key: str, text: str) -> None:
    """Comment on the task's issue once per ``key`` (start, park:<attempt>, pr)."""
    said = list(link.get("said") or [])
    if key in said or not link.get("issue") or not link.get("repo"):
        return
    gh.comment(str(link["repo"]), int(link["issue"]), text)
    link.update(put_link(store, task_id, {"said": [key]}))


def _comments_due(task: Task, link: dict[str, Any]) -> list[tuple[str, str]]:
    if not link.get("comment") or not link.get("issue"):
        return []
    said = set(link.get("said") or [])
    due: list[tuple[str, str]] = []
    if task.started_at is not None and "start" not in said:
        due.append(("start", f"fleet-tui started working on this issue as task `{task.name}` ({task.id})."))
    if task.status == TaskStatus.NEEDS_HUMAN and f"park:{task.attempt}" not in said:
        due.append(
            (
                f"park:{task.attempt}",
                f"fleet-tui task `{task.name}` needs a person: {task.reason or 'parked'}",
            )
        )
    return due


def tick(store: Any, now: float, actor: str | None, poll: bool, gh: GitHub | None = None) -> list[Task]:
    """One round: owed comments, and (when ``poll``) the open pull requests. Returns tasks that
    changed. Raises RateLimited (only) (the caller holds off until the reset)."""
    changed: list[Task] = []
    work = [(t, get_link(store, t.id)) for t in store.list_tasks() if is_linked(t.spec)]
    work = [(t, link) for t, link in work if link]
    due = [(t, link, c) for t, link in work for c in _comments_due(t, link)]
    polled = [(t, link) for t, link in work if poll and link.get("pr") and link.get("state") == "open"]
    if not due and not polled:
        return changed
    try:
        gh = gh or GitHub()
    except GitHubError as e:
        for t, _link in polled:
            put_link(store, t.id, {"error": str(e)})
        return changed
    for t, link, (key, text) in due:
        try:
            say(gh, store, t.id, link, key, text)
        except GitHubError as e:
            if isinstance(e, RateLimited):
                raise
            put_link(store, t.id, {"error": f"comment on issue #{link.get('issue')} failed: {e}"})
    for t, link in polled:
        try:
            new = _refresh(store, gh, t, link, now, actor)
        except GitHubError as e:
            put_link(store, t.id, {"error": str(e)})
            if isinstance(e, RateLimited):
                raise
            continue
        if new is not None:
            changed.append(new)
    return changed


def _refresh(
    store: Any, gh: GitHub, task: Task, link: dict[str, Any], now: float, actor: str | None
) -> Task | None:
    pr = gh.pull_status(str(link["repo"]), int(link["pr"]))
    changes: dict[str, Any] = {
        "state": pr.state,
        "checks": pr.checks,
        "review": pr.review,
        "url": pr.url,
        "checked_at": now,
        "error": None,
    }
    new: Task | None = None
    if pr.state == "merged":
        new = store.transition(
            task.id,
            TaskStatus.DONE,
            reason=f"merged {(pr.merge_commit or '')[:10]} via pull request #{pr.number}",
            now=now,
            expect=[TaskStatus.DONE, TaskStatus.NEEDS_HUMAN],
            actor=actor,
            merged_commit=pr.merge_commit,
        )
    elif pr.review == "changes_requested" and pr.review_id and pr.review_id != link.get("review_acted"):
        changes["review_acted"] = pr.review_id
        text = re.sub(r"\s+", " ", pr.review_text or "").strip()[:300] or "see the review"
        if task.status == TaskStatus.DONE:
            new = store.transition(
                task.id,
                TaskStatus.NEEDS_HUMAN,
                reason=f"changes_requested: pull request #{pr.number}: {text}",
                now=now,
                expect=[TaskStatus.DONE],
                actor=actor,
            )
    put_link(store, task.id, changes)
    return new


async def watch(engine: Any) -> None:
    """The engine's GitHub loop (runs until cancelled; never raises)."""
    last_poll = float("-inf")
    hold_until = 0.0
    # the engine's change generation at the last round: without a change since, only linked
    # tasks' pull requests (polled every github_poll_s) need a round; owed comments follow changes
    seen = getattr(engine, "generation", None)
    while True:
        await anyio.sleep(min(COMMENT_TICK_S, engine.cfg.github_poll_s))
        now = engine.clock()
        if now < hold_until:
            continue
        poll = now - last_poll >= engine.cfg.github_poll_s
        gen = getattr(engine, "generation", None)
        if gen is not None and gen == seen:
            if not poll:
                continue  # nothing changed, no poll due: no store read
            if not any(is_linked(t.spec) for t in engine.snapshot().tasks):
                last_poll = now  # no pull request to poll
                continue
        try:
            changed = await anyio.to_thread.run_sync(tick, engine.store, now, engine.actor, poll)
        except RateLimited as e:
            hold_until = e.reset_at or now + RATE_LIMIT_PAUSE_S
            continue
        except Exception as e:  # a store hiccup must not stop the engine
            from fleet_tui.scheduler.model import EngineEvent

            engine.bus.publish([EngineEvent(kind="notice", text=f"GitHub poll failed: {e}")])
            continue
        seen = gen
        if poll:
            last_poll = now
        for t in changed:
            engine.publish_task(t)
