"""Python's cyclic garbage collector held off while a key is in hand.

Under a loud fleet the cockpit allocates fast (strips, segments, events), and the collector runs
on whichever thread crosses its threshold, with the interpreter lock held throughout. Measured
under 32 agents at 200 events/s (`bench/bench_cockpit.py`, `gc.callbacks` timing each run): 780
collections in 85 s, a young one 5-9 ms, an older one 17-38 ms and a full one 30-44 ms; one
that lands while a key is handled adds all of it to that key (an `esc` close of 41.7 ms held
30.5 ms of it). The start-up heap is already frozen out of the collector's walks
(``FleetApp._settle_heap``); this moves the collections themselves out of a key's way.

For ``HOLD_S`` after each key, at most ``HOLD_MAX_S`` from the first of a run of keys (a key
held down), the collector is disabled; the first allocation after the hold collects what waited.
A hold that lasted ``HOLD_MAX_S`` is followed by ``HOLD_S`` in which keys do not hold the
collector, so keys held down leave it its turn. Nothing is lost or kept: a cycle lives at most
``HOLD_MAX_S`` longer. A collector someone else disabled is left alone.
"""

from __future__ import annotations

import asyncio
import gc
import time

#: how long the collector waits after a key (seconds): an idle cockpit draws a key's change in
#: 2-40 ms here, a loud one in up to twice that
HOLD_S = 0.1
#: the longest one hold lasts, however many keys come (a key held down, auto-repeat)
HOLD_MAX_S = 0.5


class CollectorHold:
    """``key()`` on each key (on the loop's thread); ``release()`` when the app closes."""

    def __init__(self, hold: float = HOLD_S, most: float = HOLD_MAX_S) -> None:
        self.hold = hold
        self.most = most
        self._since: float | None = None  # when this hold began (monotonic), None: not holding
        self._timer: asyncio.TimerHandle | None = None
        self._rest_until = 0.0  # after a hold of ``most``: the collector's turn (monotonic)
        self.holds = 0  # holds begun (for tests and benchmarks)

    @property
    def holding(self) -> bool:
        return self._since is not None

    def key(self) -> None:
        now = time.monotonic()
        if self._since is None:
            if now < self._rest_until or not gc.isenabled():  # its turn; or someone else's to enable
                return
            gc.disable()
            self._since = now
            self.holds += 1
        if self._timer is not None:
            self._timer.cancel()
        left = min(self.hold, self._since + self.most - now)
        self._timer = asyncio.get_running_loop().call_later(max(0.0, left), self._end)

    def _end(self) -> None:
        if self._since is not None and time.monotonic() - self._since >= self.most:
            self._rest_until = time.monotonic() + self.hold
        self.release()

    def release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._since is not None:
            self._since = None
            gc.enable()
