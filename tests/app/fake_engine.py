"""A FakeEngine implementing EngineAPI for cockpit tests: no processes, no store, no clock.

It records every command call in ``calls`` (name, args), serves a snapshot the test sets, and lets
a test push EngineEvent batches into ``subscribe()``. Ids and times are whatever the test gives,
so screenshots are stable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.model import (
    Attempt,
    EngineEvent,
    Event,
    Gauges,
    Snapshot,
    Task,
    TaskSpec,
    Transition,
)


class FakeEngine:
    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self._snapshot = snapshot or Snapshot(taken_at=0.0)
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.events_by_task: dict[str, list[Event]] = {}
        self.attempts_by_task: dict[str, list[Attempt]] = {}
        self.transitions_by_task: dict[str, list[Transition]] = {}
        self.diffs: dict[str, str] = {}
        self.results: dict[str, CommandResult] = {}  # verb -> canned result
        self.subscribers: list[asyncio.Queue[list[EngineEvent] | None]] = []
        self.shutdown_calls: list[bool] = []

    # ------------------------------------------------------------------ test controls

    def set_snapshot(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def set_paused(self, paused: bool) -> None:
        self._snapshot = replace(self._snapshot, gauges=replace(self._snapshot.gauges, paused=paused))

    def push(self, *events: EngineEvent) -> None:
        """Deliver one batch to every current subscriber."""
        for q in self.subscribers:
            q.put_nowait(list(events))

    def close_streams(self) -> None:
        for q in self.subscribers:
            q.put_nowait(None)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    # ------------------------------------------------------------------ EngineAPI

    def snapshot(self) -> Snapshot:
        return self._snapshot

    async def subscribe(self) -> AsyncIterator[list[EngineEvent]]:
        queue: asyncio.Queue[list[EngineEvent] | None] = asyncio.Queue()
        self.subscribers.append(queue)
        try:
            while True:
                batch = await queue.get()
                if batch is None:
                    return
                yield batch
        finally:
            self.subscribers.remove(queue)

    def _record(self, verb: str, *args: Any) -> CommandResult:
        self.calls.append((verb, args))
        if verb in self.results:
            return self.results[verb]
        target = args[0] if args else None
        return CommandResult(True, f"{verb} {target if target is not None else 'fleet'}: ok")

    async def add(self, specs: Sequence[TaskSpec]) -> CommandResult:
        return self._record("add", list(specs))

    async def kill(self, ref: str) -> CommandResult:
        return self._record("kill", ref)

    async def pause(self, ref: str | None) -> CommandResult:
        return self._record("pause", ref)

    async def resume(self, ref: str | None) -> CommandResult:
        return self._record("resume", ref)

    async def retry(self, ref: str) -> CommandResult:
        return self._record("retry", ref)

    async def cancel(self, ref: str) -> CommandResult:
        return self._record("cancel", ref)

    async def merge(self, ref: str) -> CommandResult:
        return self._record("merge", ref)

    async def answer(self, question_id: str, text: str) -> CommandResult:
        return self._record("answer", question_id, text)

    async def set_config(self, key: str, value: str) -> CommandResult:
        return self._record("set_config", key, value)

    async def events(self, ref: str, attempt: int | None = None, limit: int = 2000) -> list[Event]:
        evs = self.events_by_task.get(ref, [])
        if attempt is not None:
            evs = [e for e in evs if e.attempt == attempt]
        return evs[-limit:]

    async def attempts(self, ref: str) -> list[Attempt]:
        return self.attempts_by_task.get(ref, [])

    async def transitions(self, ref: str) -> list[Transition]:
        return self.transitions_by_task.get(ref, [])

    async def diff(self, ref: str) -> str:
        return self.diffs.get(ref, "(no branch: the task runs in its cwd)")

    async def shutdown(self, leave_running: bool) -> None:
        self.shutdown_calls.append(leave_running)
        self.calls.append(("shutdown", (leave_running,)))
        self.close_streams()


def gauges(**kw: Any) -> Gauges:
    return Gauges(**kw)


def task(**kw: Any) -> Task:
    """A Task with a spec built from ``name``/``prompt`` and the other fields given."""
    spec_keys = {"prompt", "cwd", "coder", "model", "git_ref", "priority", "depends_on", "verify"}
    spec_kw = {k: kw.pop(k) for k in list(kw) if k in spec_keys}
    name = kw.pop("name")
    spec_kw.setdefault("prompt", f"Do the {name} work.")
    return Task(spec=TaskSpec(name=name, **spec_kw), **kw)
