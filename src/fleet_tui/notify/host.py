"""What the notifier needs from the engine that hosts it, and nothing more.

``watch`` and ``engine_failed`` run inside every engine, but they only read its config, store,
clock, owner and running tasks, publish on its bus and follow its events. Naming that as a
protocol keeps ``notify`` from importing the engine (no import cycle), and any host (a test's
fake, a future engine process) that has these members can carry a notifier.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fleet_tui.config import Config
    from fleet_tui.scheduler.bus import Bus
    from fleet_tui.scheduler.model import EngineEvent, Snapshot
    from fleet_tui.scheduler.store.protocol import Store


class NotifierHost(Protocol):
    """The members of an engine the notifier and loop guard use."""

    @property
    def cfg(self) -> Config: ...

    @property
    def store(self) -> Store: ...

    @property
    def owner(self) -> str: ...

    @property
    def bus(self) -> Bus: ...

    @property
    def runners(self) -> Mapping[str, Any]: ...

    def clock(self) -> float: ...

    def snapshot(self) -> Snapshot: ...

    def subscribe(self) -> AsyncIterator[list[EngineEvent]]: ...

    def wake(self) -> None: ...
