"""The boundary the cockpit talks to: the one protocol both a live engine and an attached view
implement.

The cockpit holds an ``EngineAPI`` and nothing else: it pulls ``snapshot()`` on a timer, consumes
``subscribe()`` for live events, and calls the command coroutines. Only frozen dataclasses from
``model`` cross this line. Commands never raise for ordinary refusals; they return a
``CommandResult`` whose ``message`` the cockpit shows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from fleet_tui.scheduler.model import Attempt, EngineEvent, Event, Snapshot, Task, TaskSpec, Transition


@dataclass(frozen=True)
class CommandResult:
    """What a command (add, kill, retry, ...) did, in words a person reads."""

    ok: bool
    message: str
    task: Task | None = None


class EngineAPI(Protocol):
    def snapshot(self) -> Snapshot: ...

    def subscribe(self) -> AsyncIterator[list[EngineEvent]]:
        """Batches of EngineEvents as they happen (bounded; a slow reader loses old batches
        and gets a ``notice`` saying so, never blocks the engine)."""
        ...

    async def add(self, specs: Sequence[TaskSpec]) -> CommandResult: ...

    async def kill(self, ref: str) -> CommandResult: ...

    async def pause(self, ref: str | None) -> CommandResult:
        """Pause one task, or the whole fleet when ``ref`` is None."""
        ...

    async def resume(self, ref: str | None) -> CommandResult: ...

    async def retry(self, ref: str) -> CommandResult: ...

    async def cancel(self, ref: str) -> CommandResult: ...

    async def merge(self, ref: str) -> CommandResult: ...

    async def answer(self, question_id: str, text: str) -> CommandResult: ...

    async def set_config(self, key: str, value: str) -> CommandResult: ...

    async def events(self, ref: str, attempt: int | None = None, limit: int = 2000) -> list[Event]:
        """Stored events of a task (for the stream pane's first fill and the detail screen)."""
        ...

    async def attempts(self, ref: str) -> list[Attempt]: ...

    async def transitions(self, ref: str) -> list[Transition]: ...

    async def diff(self, ref: str) -> str:
        """The diff (with diffstat) of the task's branch against its base, or a reason why none."""
        ...

    async def shutdown(self, leave_running: bool) -> None:
        """Stop the engine: leave agents running for a later adopter, or stop them all."""
        ...
