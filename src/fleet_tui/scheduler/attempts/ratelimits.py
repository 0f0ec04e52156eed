"""Rate-limit bookkeeping of one engine: what its agents saw, and how often an account was hit.

Why: a rejected account is held back for every engine on the store (the store's ``rate_limits``,
read by the gate), and the backoff after a hit grows with the strikes in a row that this engine
counted (policy/outcome.py); a success clears them. Both were loose dictionaries and calls in
the engine's event path and its reaper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import anyio

from fleet_tui.scheduler.model import RateLimit
from fleet_tui.scheduler.store.protocol import Store


class RateLimitBook:
    def __init__(
        self, store: Store, clock: Callable[[], float], changed: Callable[[], None] = lambda: None
    ) -> None:
        self.store = store
        self.clock = clock
        #: called (from the writing thread) once ``block`` wrote: the planner reads it again
        self._changed = changed
        self._strikes: dict[str, int] = {}

    def strikes(self, account: str) -> int:
        """Rate-limit hits of ``account`` in a row (since its last success)."""
        return self._strikes.get(account, 0)

    def strike(self, account: str) -> None:
        self._strikes[account] = self.strikes(account) + 1

    def clear(self, account: str) -> None:
        self._strikes.pop(account, None)

    async def observed(self, rl: RateLimit, account: str) -> None:
        """A reading an agent of ``account`` reported (its vendor's headers or message)."""
        rl = replace(rl, account=account, observed_at=rl.observed_at or self.clock())
        blocked = rl.resets_at if rl.status == "rejected" and rl.resets_at else None
        await anyio.to_thread.run_sync(self.store.put_rate_limit, rl, blocked)

    def block(self, account: str, resets_at: float | None, until: float) -> None:
        """Hold ``account`` back until ``until`` (an attempt ended rate-limited; blocking)."""
        self.store.put_rate_limit(
            RateLimit(
                account=account,
                status="rejected",
                # the account's own reset when known: the grace after it is the engine's, not its
                resets_at=resets_at if resets_at and resets_at < until else until,
                observed_at=self.clock(),
            ),
            until,
        )
        self._changed()
