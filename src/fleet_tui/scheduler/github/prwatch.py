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
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.github.api import GitHub, GitHubError, RateLimited
from fleet_tui.scheduler.github.pullrequest import get_link, is_linked, put_link, say
from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.states import TaskStatus

#: seconds between looks at the store for comments owed (no network unless one is owed)
COMMENT_TICK_S = 5.0
#: how long calls wait after a rate-limit error whose reset time is unknown
RATE_LIMIT_PAUSE_S = 900.0


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
    life = lc.Lifecycle(store, lambda: now, actor)
    if pr.state == "merged":
        why = f"merged {(pr.merge_commit or '')[:10]} via pull request #{pr.number}"
        new = life.apply(
            task,
            lc.mark_done(why, merged_commit=pr.merge_commit),
            expect=[TaskStatus.DONE, TaskStatus.NEEDS_HUMAN],
        )
    elif pr.review == "changes_requested" and pr.review_id and pr.review_id != link.get("review_acted"):
        changes["review_acted"] = pr.review_id
        text = re.sub(r"\s+", " ", pr.review_text or "").strip()[:300] or "see the review"
        if task.status == TaskStatus.DONE:
            new = life.apply(task, lc.park_done(f"changes_requested: pull request #{pr.number}: {text}"))
    put_link(store, task.id, changes)
    return new


async def watch(
    store: Any,
    clock: Callable[[], float],
    actor: str,
    poll_s: Callable[[], float],
    notice: Callable[[str], None],
    publish: Callable[[Task], None],
    generation: Callable[[], int | None] = lambda: None,
    tasks: Callable[[], Sequence[Task]] = tuple,
) -> None:
    """An engine's GitHub loop (runs until cancelled; never raises): owed comments every few
    seconds, open pull requests every ``poll_s()``; tasks it moved go to ``publish``.
    ``generation`` is the engine's change generation (None: unknown, every round reads the
    store) and ``tasks`` its snapshot's tasks (is any linked to GitHub?)."""
    last_poll = float("-inf")
    hold_until = 0.0
    # the engine's change generation at the last round: without a change since, only linked
    # tasks' pull requests (polled every github_poll_s) need a round; owed comments follow changes
    seen = generation()
    while True:
        await anyio.sleep(min(COMMENT_TICK_S, poll_s()))
        now = clock()
        if now < hold_until:
            continue
        poll = now - last_poll >= poll_s()
        gen = generation()
        if gen is not None and gen == seen and not poll:
            continue  # nothing changed, no poll due: no store read
        if gen is not None and not any(is_linked(t.spec) for t in tasks()):
            # no task here has a GitHub record: no comment owed, no pull request to poll (a
            # busy engine changes all the time; this keeps it from listing the store each round)
            seen = gen
            if poll:
                last_poll = now
            continue
        try:
            changed = await anyio.to_thread.run_sync(tick, store, now, actor, poll)
        except RateLimited as e:
            hold_until = e.reset_at or now + RATE_LIMIT_PAUSE_S
            continue
        except Exception as e:  # a store hiccup must not stop the engine
            notice(f"GitHub poll failed: {e}")
            continue
        seen = gen
        if poll:
            last_poll = now
        for t in changed:
            publish(t)
