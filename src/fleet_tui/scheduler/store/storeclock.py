"""The store's clock, as seen from this host: leases and heartbeats are judged by one clock.

Engines on several machines share a PostgreSQL store; each writes heartbeats and leases and
judges the others' by comparing times. With each host's own clock, hosts whose clocks are a
minute apart take each other's live tasks (the other's heartbeat looks a minute old). So the
engine and the CLI use the store's clock instead: this host's ``time.time()`` plus the offset of
the store server's clock, measured with one query (half the round trip counted) and measured
again from time to time. A store without a clock of its own (SQLite: one host) gives offset 0.
"""

from __future__ import annotations

import time
from typing import Any


class StoreClock:
    """A clock callable: ``time.time()`` corrected to the store server's clock."""

    def __init__(self, store: Any) -> None:
        self._measure = getattr(store, "clock_offset", None)
        self.offset = 0.0
        self.refresh()

    def refresh(self) -> None:
        """Measure the offset again (blocking: a store query); keeps the last one on failure."""
        if self._measure is None:
            return
        try:
            self.offset = float(self._measure())
        except Exception:
            pass

    def __call__(self) -> float:
        return time.time() + self.offset
