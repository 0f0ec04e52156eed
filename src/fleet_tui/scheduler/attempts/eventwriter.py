"""One writer for every attempt's events: one thread hop and one commit per cycle.

Why: with many agents talking, a commit per event batch per agent would queue on the store's
lock. Each attempt's runner hands its events to ``write`` and waits; ``run`` gathers what every
runner handed in during a short window and commits it in one fenced transaction
(``Store.append_events_batch``). A store that refuses (a full disk, a lock) keeps the events for
the next second; the agents go on meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from fleet_tui.scheduler.model import Event
from fleet_tui.scheduler.store.protocol import Store


class EventWriter:
    def __init__(self, store: Store, owner: str, notice: Callable[[str], None]) -> None:
        self.store = store
        self.owner = owner
        self._notice = notice
        self._writes: dict[tuple[str, int], tuple[list[Event], int]] = {}
        self._wanted = anyio.Event()
        self._done = anyio.Event()
        self._results: dict[tuple[str, int], bool] = {}

    async def write(self, tid: str, n: int, events: list[Event], offset: int) -> bool:
        """Queue an attempt's events (and its stdout offset); returns once they are on disk,
        False when the claim was lost (nothing was written)."""
        key = (tid, n)
        pending = self._writes.get(key)
        self._writes[key] = ((pending[0] if pending else []) + events, offset)
        done = self._done
        self._wanted.set()
        await done.wait()
        return self._results.get(key, True)

    async def run(self) -> None:
        """The writer's loop (one per engine, for as long as it runs)."""
        last = 0.0
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            # at most one commit per 20 ms: the other runners of this tick join the transaction;
            # a write after a quiet spell goes at once (an attempt's end waits for it)
            await anyio.sleep(max(0.0, last + 0.02 - time.monotonic()))
            last = time.monotonic()
            batch, self._writes = self._writes, {}
            done, self._done = self._done, anyio.Event()
            keys = list(batch)
            work = [(batch[k][0], (k[0], k[1], batch[k][1])) for k in keys]
            try:
                with anyio.CancelScope(shield=True):
                    results = await anyio.to_thread.run_sync(self.store.append_events_batch, work, self.owner)
                self._results = dict(zip(keys, results, strict=True))
            except Exception as e:
                # a full disk or a locked store: keep the events and try again in a second (the raw
                # output stays on disk too); the agents go on meanwhile
                for k in keys:
                    later = self._writes.get(k)
                    self._writes[k] = (
                        batch[k][0] + (later[0] if later else []),
                        later[1] if later else batch[k][1],
                    )
                self._results = {}
                self._notice(f"writing events failed, retrying: {e}")
                done.set()
                await anyio.sleep(1.0)
                self._wanted.set()
                continue
            done.set()
