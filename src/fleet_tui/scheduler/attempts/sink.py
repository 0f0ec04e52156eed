"""Where a running attempt's output goes: its events, its rate-limit readings, its usage.

Each runner hands its parsed events here (``AttemptSink.take``): they are written through the
engine's one event writer (fenced: an engine that lost the claim stops its agent) and published
to the cockpit; rate-limit readings go to the rate-limit book under the task's account (a coder
names its vendor, the limit belongs to coder + model); and once a second the task's usage
(tokens, cost, context) reaches the store and the cockpit, covering all its attempts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import anyio

from fleet_tui.scheduler.attempts.eventwriter import EventWriter
from fleet_tui.scheduler.attempts.ratelimits import RateLimitBook
from fleet_tui.scheduler.attempts.running import Running
from fleet_tui.scheduler.lifecycle import StopReason
from fleet_tui.scheduler.model import AgentEvent, EngineEvent, Event, Task
from fleet_tui.scheduler.store.protocol import Store

LOST = "another engine owns this task now"

#: how often a live attempt's usage figures (tokens, cost, context) reach the store
USAGE_EVERY_S = 1.0


class AttemptSink:
    def __init__(
        self,
        store: Store,
        owner: str,
        runners: Mapping[str, Running],
        writer: EventWriter,
        rate_limits: RateLimitBook,
        publish: Callable[[list[EngineEvent]], None],
        publish_task: Callable[[Task], None],
        wake: Callable[[], None] = lambda: None,
        spent: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.owner = owner
        self.runners = runners
        self.writer = writer
        self.rate_limits = rate_limits
        self._publish = publish
        self._publish_task = publish_task
        self._wake = wake  # the planner reads rate limits: a new reading means plan again
        self._spent = spent  # and today's spend: a cost recorded means read it again

    async def take(self, tid: str, n: int, events: list[Event], offset: int) -> None:
        """Events of attempt ``n`` of task ``tid`` (and how far its stdout was read)."""
        r = self.runners.get(tid)
        if r is not None:
            events = _on_account(events, r.account)
        if events or offset:
            kept = await self.writer.write(tid, n, events, offset)
            if not kept:  # fenced out: another engine owns this task now; stop our agent
                if r is not None:
                    r.runner.stop(StopReason.LEASE_LOST, LOST)
                return
        if events:
            self._publish([AgentEvent(e) for e in events])
        if r is None:
            return
        for e in events:
            if e.rate_limit is not None:
                await self.rate_limits.observed(e.rate_limit, r.account)
                self._wake()
        await self._usage(r, tid, n)

    async def _usage(self, r: Running, tid: str, n: int) -> None:
        ru = r.runner
        # usage figures reach the store (and the cockpit) once a second, and the attempt's last
        # ones at once: its slot is freed next, and its verdict, which records them too, waits
        # for the next start; with a daily budget that start is planned from today's spend.
        # (The shim's being alive stood for "not the last": a shim still alive when its agent's
        # last line was read left the cost out, and the next task started over the budget.)
        if time.monotonic() - r.metrics_at < USAGE_EVERY_S and not ru.ended:
            return
        r.metrics_at = time.monotonic()
        # a task's tokens and cost cover all its attempts (and reviews): earlier ones + this one
        changes: dict[str, Any] = {}
        if r.base_tokens + ru.tokens != r.task.tokens:
            changes["tokens"] = r.base_tokens + ru.tokens
        if ru.cost_usd is not None and r.base_cost + ru.cost_usd != r.task.cost_usd:
            changes["cost_usd"] = r.base_cost + ru.cost_usd
        if ru.context_tokens != r.task.context_tokens and ru.context_tokens is not None:
            changes["context_tokens"] = ru.context_tokens
        if ru.context_window != r.task.context_window and ru.context_window is not None:
            changes["context_window"] = ru.context_window
        if not changes:
            return

        def write() -> Task | None:
            # the attempt's own figures too, so today's spend (the gauge) counts a live attempt
            self.store.update_attempt(tid, n, owner=self.owner, cost_usd=ru.cost_usd or 0.0, tokens=ru.tokens)
            return self.store.update_task(tid, owner=self.owner, attempt=n, **changes)

        new = await anyio.to_thread.run_sync(write)
        if "cost_usd" in changes:
            self._spent()
        if new is None:
            ru.stop(StopReason.LEASE_LOST, LOST)
        else:
            r.task = new
            self._publish_task(new)


def _on_account(events: list[Event], account: str) -> list[Event]:
    """The events, their rate-limit readings put on ``account``."""
    if not any(e.rate_limit is not None for e in events):
        return events
    return [
        replace(e, rate_limit=replace(e.rate_limit, account=account))
        if e.rate_limit is not None and e.rate_limit.account != account
        else e
        for e in events
    ]
