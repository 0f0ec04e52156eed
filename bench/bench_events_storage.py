"""How many bytes does the store spend per byte of agent output? (prints, never asserts)

Appends N events of one L-byte line each (the shape of a chatty shell agent: ``kind='text'``, the
line in ``text``, an empty payload) through the Store contract, in batches the size the engine
writes, then compares the store's size with the raw bytes of the rows: every TEXT column's UTF-8
bytes plus 8 bytes per number (attempt, seq, ts). The goal is <= 1.3x.

SQLite: the size of ``fleet.db`` plus its ``-wal`` after a checkpoint. PostgreSQL:
``pg_total_relation_size('events')`` (heap, TOAST and indexes) in a throw-away schema.

    .venv/bin/python bench/bench_events_storage.py [--events 20000] [--bytes 1000] [--pg URL] [--no-pg]

PostgreSQL comes from --pg, else $FLEET_TEST_PG_URL, else postgresql://postgres@127.0.0.1:5432/test.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from typing import Any

from fleet_tui.scheduler.model import Event
from fleet_tui.scheduler.store.protocol import event_payload

DEFAULT_PG = os.environ.get("FLEET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
BATCH = 200  # events per append_events call (the engine writes what one tick of output brought)


def _events(n: int, size: int, tasks: int = 20) -> list[list[Event]]:
    """n events over ``tasks`` tasks, grouped in append batches, interleaved like parallel agents."""
    line = ("0123456789abcdef" * (size // 16 + 1))[:size]
    per = n // tasks
    batches: list[list[Event]] = []
    for start in range(0, per, BATCH):
        for t in range(tasks):
            tid = f"t_{t:04d}_{'x' * 12}"
            batches.append(
                [
                    Event(task_id=tid, attempt=1, seq=s, ts=1_800_000_000.0 + s, kind="text", text=line)
                    for s in range(start, min(per, start + BATCH))
                ]
            )
    return batches


def _raw_bytes(batches: list[list[Event]]) -> int:
    total = 0
    for b in batches:
        for e in b:
            total += len(e.task_id.encode()) + len(e.kind.encode()) + len((e.text or "").encode())
            total += len(event_payload(e).encode()) + 3 * 8
    return total


def _fill(store: Any, batches: list[list[Event]]) -> float:
    t0 = time.perf_counter()
    for b in batches:
        store.append_events(b)
    return time.perf_counter() - t0


def bench_sqlite(batches: list[list[Event]]) -> tuple[int, float]:
    from fleet_tui.scheduler.store.sqlite_store import SqliteStore

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "fleet.db")
        store = SqliteStore(path)
        secs = _fill(store, batches)
        store.maintenance()  # checkpoint: the WAL's pages land in the file
        size = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
        store.close()
    return size, secs


def bench_pg(url: str, batches: list[list[Event]]) -> tuple[int, float]:
    import psycopg

    from fleet_tui.scheduler.store.postgres_store import PostgresStore

    schema = "bench_ev_" + uuid.uuid4().hex[:8]
    store = PostgresStore(url, schema=schema)
    try:
        secs = _fill(store, batches)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute("VACUUM events")  # the visibility map and free-space map exist, as in steady state
            size = int(conn.execute("SELECT pg_total_relation_size('events')").fetchone()[0])  # type: ignore[index]
    finally:
        store.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return size, secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--bytes", type=int, default=1000, help="bytes per line")
    ap.add_argument("--pg", default=DEFAULT_PG)
    ap.add_argument("--no-pg", action="store_true")
    args = ap.parse_args()
    batches = _events(args.events, args.bytes)
    n = sum(len(b) for b in batches)
    raw = _raw_bytes(batches)
    print(f"events={n} line={args.bytes} B raw row bytes={raw / 1e6:.1f} MB ({raw / n:.0f} B/row)")
    rows: list[tuple[str, int, float]] = [("sqlite", *bench_sqlite(batches))]
    if not args.no_pg:
        try:
            rows.append(("postgresql", *bench_pg(args.pg, batches)))
        except Exception as e:  # no server: say so, keep the SQLite figure
            print(f"postgresql: skipped ({str(e).strip().splitlines()[0]})")
    for name, size, secs in rows:
        print(
            f"{name:10s}: {size / 1e6:8.1f} MB, {size / n:6.0f} B/row, {n / secs:8.0f} events/s"
            f"  ratio store/raw (goal <= 1.3): {size / raw:.2f}"
        )


if __name__ == "__main__":
    main()
