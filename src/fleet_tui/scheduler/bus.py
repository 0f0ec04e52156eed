"""In-process fan-out of engine events to subscribers (the cockpit, tests), bounded and batched.

Publishing never blocks the engine: each subscriber has its own bounded buffer; a subscriber that
falls behind loses its oldest items and receives a ``Notice`` saying how many, instead of slowing
agents down. A subscriber receives everything that accumulated since its last read as one batch,
which is what lets the cockpit repaint at 10-20 Hz however fast agents talk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Sequence

import anyio

from fleet_tui.scheduler.model import EngineEvent, Notice


class _Sub:
    def __init__(self, limit: int) -> None:
        self.items: deque[EngineEvent] = deque()
        self.limit = limit
        self.dropped = 0
        self.ready = anyio.Event()
        self.closed = False


class Bus:
    def __init__(self, limit: int = 20_000) -> None:
        self._subs: list[_Sub] = []
        self._limit = limit

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def publish(self, items: Sequence[EngineEvent]) -> None:
        if not items:
            return
        for sub in self._subs:
            sub.items.extend(items)
            over = len(sub.items) - sub.limit
            if over > 0:
                for _ in range(over):
                    sub.items.popleft()
                sub.dropped += over
            sub.ready.set()

    def close(self) -> None:
        for sub in self._subs:
            sub.closed = True
            sub.ready.set()

    async def subscribe(self) -> AsyncIterator[list[EngineEvent]]:
        sub = _Sub(self._limit)
        self._subs.append(sub)
        try:
            while True:
                await sub.ready.wait()
                sub.ready = anyio.Event()
                batch = list(sub.items)
                sub.items.clear()
                if sub.dropped:
                    batch.insert(
                        0,
                        Notice(
                            f"display fell behind: {sub.dropped} events skipped "
                            "(all are on disk: fleet-tui logs)",
                        ),
                    )
                    sub.dropped = 0
                if batch:
                    yield batch
                if sub.closed:
                    return
        finally:
            self._subs.remove(sub)
