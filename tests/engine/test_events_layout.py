"""The SQLite events table's on-disk layout: compact rows, and a migration that keeps every event.

Schema version 1 kept events in a ``WITHOUT ROWID`` table, where a 1000-byte line spilled into an
overflow page of its own (~4.7 KB per row); version 3 keeps them in a rowid table with a unique
index on (task_id, attempt, seq). These tests build a version-1 file by hand, open it with the
current store and check that every event survives, in order, with the same contract (duplicate
sequence numbers ignored, fenced appends refused after a lost claim).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
from pathlib import Path

import pytest

from fleet_tui.scheduler.model import Event, TaskSpec
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store import sqlite_base
from fleet_tui.scheduler.store.notify_store import SQL_TABLE as NOTIFY_TABLE
from fleet_tui.scheduler.store.protocol import event_payload
from fleet_tui.scheduler.store.sqlite_store import SqliteStore

pytestmark = pytest.mark.timeout(60)

NOW = 1_800_000_000.0


def _v1_file(path: Path, events: list[Event]) -> None:
    """A store file as fleet-tui with schema version 1 wrote it (4 KB pages, WITHOUT ROWID events)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA page_size=4096")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("BEGIN")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    for stmt in sqlite_base.MIGRATIONS[0].split(";\n"):
        if stmt.strip():
            db.execute(stmt)
    db.execute(NOTIFY_TABLE.format(real="REAL"))
    db.execute("INSERT INTO meta(key, value) VALUES ('schema_version', '1')")
    db.executemany(
        "INSERT INTO events(task_id, attempt, seq, ts, kind, text, payload) VALUES (?,?,?,?,?,?,?)",
        [(e.task_id, e.attempt, e.seq, e.ts, e.kind, e.text, event_payload(e)) for e in events],
    )
    db.execute("COMMIT")
    db.close()


def _events_sql(path: Path) -> str:
    db = sqlite3.connect(path)
    try:
        return str(db.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0])
    finally:
        db.close()


def test_migrating_a_version_1_file_keeps_every_event_in_order(tmp_path: Path) -> None:
    events = [
        Event(
            task_id=f"t_{t}",
            attempt=a,
            seq=s,
            ts=NOW + s,
            kind="tool_call" if s % 7 == 0 else "text",
            text=f"line {s} " * (1 + s % 200),
            tool="Bash" if s % 7 == 0 else None,
            tool_input={"command": f"echo {s}"} if s % 7 == 0 else None,
        )
        for t in range(3)
        for a in (1, 2)
        for s in range(150)
    ]
    shuffled = list(events)
    random.Random(7).shuffle(shuffled)  # written out of order: the key, not the insert order, rules
    path = tmp_path / "fleet.db"
    _v1_file(path, shuffled)
    assert "WITHOUT ROWID" in _events_sql(path)

    st = SqliteStore(str(path))
    try:
        assert "WITHOUT ROWID" not in _events_sql(path)
        assert st._schema_version() == sqlite_base.SCHEMA_VERSION
        for t in range(3):
            want = [e for e in events if e.task_id == f"t_{t}"]
            assert st.events(f"t_{t}") == want
            assert st.events(f"t_{t}", attempt=2) == [e for e in want if e.attempt == 2]
            assert (
                st.events(f"t_{t}", after=(1, 100), limit=10)
                == [e for e in want if (e.attempt, e.seq) > (1, 100)][:10]
            )
            assert st.last_events(f"t_{t}", 5) == want[-5:]
        # the unique key still de-duplicates a re-sent event
        dup = Event(task_id="t_0", attempt=1, seq=3, ts=NOW, kind="text", text="other")
        assert st.append_events([dup])
        assert st.events("t_0", attempt=1)[3] == events[3]
        # and new events land after the migrated ones
        new = Event(task_id="t_0", attempt=2, seq=150, ts=NOW + 999, kind="text", text="new")
        assert st.append_events([new])
        assert st.last_events("t_0", 1) == [new]
    finally:
        st.close()

    again = SqliteStore(str(path), readonly=True)  # already migrated: a read-only open suffices
    try:
        assert len(again.events("t_1", limit=1000)) == 300
    finally:
        again.close()


def test_fenced_appends_still_refuse_a_lost_claim_after_migration(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    _v1_file(path, [])
    st = SqliteStore(str(path))
    try:
        (task,) = st.add_tasks([TaskSpec(name="a", prompt="x")], NOW)
        claimed = st.claim("e1", "h", (), NOW, 60.0, "shell", None)
        assert claimed is not None and claimed.status == TaskStatus.RUNNING
        ev = Event(task_id=task.id, attempt=claimed.attempt, seq=0, ts=NOW, kind="text", text="mine")
        assert st.append_events([ev], offset=(task.id, claimed.attempt, 10), owner="e1")
        late = Event(task_id=task.id, attempt=claimed.attempt, seq=1, ts=NOW, kind="text", text="late")
        assert not st.append_events([late], offset=(task.id, claimed.attempt, 20), owner="e2")
        assert st.events(task.id) == [ev]
    finally:
        st.close()


def test_a_new_file_stores_1000_byte_lines_within_1_3x_their_bytes(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    st = SqliteStore(str(path))
    line = ("0123456789abcdef" * 63)[:1000]
    raw = 0
    try:
        for b in range(20):
            batch = [
                Event(task_id=f"t_{b % 4}", attempt=1, seq=b * 100 + s, ts=NOW, kind="text", text=line)
                for s in range(100)
            ]
            raw += sum(len(e.task_id) + len(e.kind) + len(line) + len(event_payload(e)) + 24 for e in batch)
            st.append_events(batch)
        st.maintenance()
        size = sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if os.path.exists(p))
    finally:
        st.close()
    empty = tmp_path / "empty.db"
    SqliteStore(str(empty)).close()
    # the bytes the events take, beyond an empty store's fixed tables
    assert size - os.path.getsize(empty) <= 1.3 * raw, (size, raw)


def test_an_events_payload_holds_the_fields_beyond_its_columns_and_reads_back_whole() -> None:
    """The payload a stored event carries: every set field beyond the columns, usage and rate
    limit as flat objects in field order (what every stored event has held), nothing unset; and
    the row reads back as the same event."""
    from dataclasses import asdict

    from fleet_tui.scheduler.model import RateLimit, Usage
    from fleet_tui.scheduler.store.protocol import event_from_row

    ev = Event(
        "t-1",
        2,
        7,
        NOW,
        "tool_result",
        text="3 passed",
        tool="Bash",
        tool_input={"command": "pytest -q"},
        is_error=True,
        usage=Usage(10, 20, 3, 4),
        rate_limit=RateLimit("claude", "allowed", 0.4, NOW + 60),
        session_id="s-1",
        raw={"type": "user"},
    )
    payload = event_payload(ev)
    assert json.loads(payload) == {
        "tool": "Bash",
        "tool_input": {"command": "pytest -q"},
        "is_error": True,
        "usage": asdict(Usage(10, 20, 3, 4)),
        "rate_limit": asdict(RateLimit("claude", "allowed", 0.4, NOW + 60)),
        "session_id": "s-1",
        "raw": {"type": "user"},
    }
    assert list(json.loads(payload)["usage"]) == [
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_creation_tokens",
    ]
    assert event_from_row(ev.task_id, ev.attempt, ev.seq, ev.ts, ev.kind, ev.text, payload) == ev
    bare = Event("t-1", 1, 0, NOW, "text", text="hi")
    assert event_payload(bare) == "{}"
    assert event_from_row("t-1", 1, 0, NOW, "text", "hi", event_payload(bare)) == bare
