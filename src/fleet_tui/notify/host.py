"""What the notifier needs of the engine it runs in (a Protocol, so notify/ imports no engine).

The watcher follows the engine's event stream and snapshot, claims notifications in its store as
its owner, answers questions (then wakes the scheduler), and stops an agent its loop guard
catches; the engine (``scheduler.engine.Engine``) is one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from fleet_tui.config import Config
from fleet_tui.scheduler.attempts.running import Running
from fleet_tui.scheduler.bus import Bus
from fleet_tui.scheduler.model import EngineEvent, Snapshot
from fleet_tui.scheduler.store.protocol import Store


class NotifierHost(Protocol):
    @property
    def cfg(self) -> Config: ...

    @property
    def owner(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def bus(self) -> Bus: ...

    @property
    def runners(self) -> Mapping[str, Running]:
        """The attempts this engine runs, by task id."""
        ...

    @property
    def clock(self) -> Callable[[], float]: ...

    def snapshot(self) -> Snapshot: ...

    def subscribe(self) -> AsyncIterator[list[EngineEvent]]: ...

    def wake(self) -> None: ...
