"""The notifications table on both stores: one claim per event key, even when engines race."""

from __future__ import annotations

import threading
from typing import Any

from tests.engine.test_store_contract import NOW, make_store

__all__ = ["make_store"]  # the two-store fixture (SQLite, PostgreSQL)


def test_one_claim_per_key_even_racing_and_stats_for_doctor(make_store: Any) -> None:
    stores = [make_store() for _ in range(4)]
    wins: list[bool] = []
    start = threading.Barrier(len(stores) * 2)

    def claim(store: Any) -> None:
        start.wait()
        wins.append(store.claim_notification("question:q-1", "question", "t-1", "a asks", "Why?", "e", NOW))

    threads = [threading.Thread(target=claim, args=(s,)) for s in stores for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(wins) == [False] * 7 + [True]
    s = stores[0]
    s.finish_notification("question:q-1", "sent", "json://h", NOW + 1)
    assert s.claim_notification("needs_human:t-1:1:x", "needs_human", "t-1", "a needs you", "x", "e", NOW)
    s.finish_notification("needs_human:t-1:1:x", "failed", "json://h: timed out", NOW + 2)
    assert s.claim_notification("drained:abc", "drained", None, "drained", "1 done", "e", NOW)
    s.finish_notification("drained:abc", "failed", "json://h: refused", NOW + 3)
    stats = stores[1].notification_stats()
    assert (stats.sent, stats.failed, stats.sending) == (1, 2, 0)
    assert stats.last_failure == "json://h: refused" and stats.last_failure_at == NOW + 3
