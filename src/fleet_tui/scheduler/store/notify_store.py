"""The notifications table: one row per notified event, so several engines on one store send each once.

Every engine sees every question and every parked task (they all read the same store), so each
would notify the person about it. Instead an engine first *claims* the event's key: an insert
that only one engine's transaction can win (the key is the primary key). The winner sends and
records how it went; ``doctor`` reads the counts and the last failure from here, whichever
process sent.

The table is created with ``CREATE TABLE IF NOT EXISTS`` at open time rather than as a numbered
migration: it is independent of every other table, and an older fleet-tui ignores it.
"""

from __future__ import annotations

from typing import Any

from fleet_tui.scheduler.model import NotifyStats

SQL_TABLE = """CREATE TABLE IF NOT EXISTS notifications (
  key TEXT PRIMARY KEY, kind TEXT NOT NULL, task_id TEXT, title TEXT, body TEXT,
  created_at {real} NOT NULL, owner TEXT, status TEXT NOT NULL DEFAULT 'sending',
  detail TEXT, sent_at {real}
)"""


def _stats(rows: list[Any], last: Any) -> NotifyStats:
    counts = {str(r[0]): int(r[1]) for r in rows}
    return NotifyStats(
        sent=counts.get("sent", 0),
        failed=counts.get("failed", 0),
        sending=counts.get("sending", 0),
        last_failure=str(last[0]) if last else None,
        last_failure_at=float(last[1]) if last and last[1] is not None else None,
    )


class SqliteNotifications:
    """Mixin for the SQLite store (uses its ``_tx`` and ``_q``)."""

    _tx: Any
    _q: Any

    def claim_notification(
        self, key: str, kind: str, task_id: str | None, title: str, body: str, owner: str, now: float
    ) -> bool:
        """True for exactly one caller per key: that caller sends it."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO notifications(key, kind, task_id, title, body, created_at, owner)"
                " VALUES (?,?,?,?,?,?,?)",
                (key, kind, task_id, title, body, now, owner),
            )
            return bool(cur.rowcount == 1)

    def finish_notification(self, key: str, status: str, detail: str | None, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE notifications SET status = ?, detail = ?, sent_at = ? WHERE key = ?",
                (status, detail, now, key),
            )

    def notification_stats(self) -> NotifyStats:
        rows = self._q("SELECT status, COUNT(*) FROM notifications GROUP BY status")
        last = self._q(
            "SELECT detail, sent_at FROM notifications WHERE status = 'failed' ORDER BY sent_at DESC LIMIT 1"
        )
        return _stats(rows, last[0] if last else None)


class PgNotifications:
    """Mixin for the PostgreSQL store (uses its ``_tx`` and ``_all``)."""

    _tx: Any
    _all: Any

    def claim_notification(
        self, key: str, kind: str, task_id: str | None, title: str, body: str, owner: str, now: float
    ) -> bool:
        with self._tx() as tx:
            row = tx.one(
                "INSERT INTO notifications(key, kind, task_id, title, body, created_at, owner)"
                " VALUES (%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, kind, task_id, title, body, now, owner),
            )
            return row is not None

    def finish_notification(self, key: str, status: str, detail: str | None, now: float) -> None:
        with self._tx() as tx:
            tx.execute(
                "UPDATE notifications SET status = %s, detail = %s, sent_at = %s WHERE key = %s",
                (status, detail, now, key),
            )

    def notification_stats(self) -> NotifyStats:
        rows = self._all("SELECT status, COUNT(*) AS n FROM notifications GROUP BY status")
        last = self._all(
            "SELECT detail, sent_at FROM notifications WHERE status = 'failed' ORDER BY sent_at DESC LIMIT 1"
        )
        return _stats(
            [(r["status"], r["n"]) for r in rows],
            (last[0]["detail"], last[0]["sent_at"]) if last else None,
        )
