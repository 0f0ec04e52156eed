"""How close does a claim come to the cheapest possible write transaction? (prints, never asserts)

A claim is one conditional UPDATE (ready conditions, priority order, dependency check, the
transition row, SKIP LOCKED on PostgreSQL), so its floor is a bare single-row
``UPDATE ... RETURNING`` transaction on the same server. This bench races 4 processes on each
and prints claims/s, raw updates/s and their ratio, for PostgreSQL and for SQLite, in one run so
both numbers see the same machine and load. A ratio near 1 means the claim costs little beyond
the commit; a low ratio points at the claim query.

    .venv/bin/python bench/bench_claims.py [--tasks 2000] [--procs 4] [--pg URL] [--no-pg]

PostgreSQL comes from --pg, else $FLEET_TEST_PG_URL, else postgresql://postgres@127.0.0.1:5432/test;
the bench works in a throw-away schema (dropped afterwards).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from fleet_tui.scheduler.model import TaskSpec

NOW = 1_800_000_000.0
DEFAULT_PG = os.environ.get("FLEET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


# -- workers (run in child processes) ------------------------------------------------------------
def _open(kind: str, target: str) -> Any:
    if kind == "pg":
        from fleet_tui.scheduler.store.postgres_store import PostgresStore

        url, schema = target.split("|")
        return PostgresStore(url, schema=schema)
    from fleet_tui.scheduler.store.sqlite_store import SqliteStore

    return SqliteStore(target)


def _claims(kind: str, target: str, i: int, n: int, barrier: Any, out: Any) -> None:
    store = _open(kind, target)
    barrier.wait()
    t0 = time.monotonic()
    done = 0
    while store.claim(f"e{i}", "h", (), NOW, 60.0, "sim", None) is not None:
        done += 1
    out.put((done, t0, time.monotonic()))
    store.close()


def _raw(kind: str, target: str, i: int, n: int, barrier: Any, out: Any) -> None:
    rows = range(i * 100 + 1, i * 100 + 101)  # each process its own 100 rows: no lock waits
    if kind == "pg":
        import psycopg

        url, schema = target.split("|")
        conn: Any = psycopg.connect(url, autocommit=True)
        conn.execute(f'SET search_path TO "{schema}"')
        sql = "UPDATE raw SET n = n + 1 WHERE id = %s RETURNING n"

        def one(k: int) -> None:
            with conn.transaction():
                conn.execute(sql, (k,)).fetchone()
    else:
        conn = sqlite3.connect(target, isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")

        def one(k: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE raw SET n = n + 1 WHERE id = ? RETURNING n", (k,)).fetchone()
            conn.execute("COMMIT")

    barrier.wait()
    t0 = time.monotonic()
    for j in range(n):
        one(rows[j % 100])
    out.put((n, t0, time.monotonic()))
    conn.close()


def _race(worker: Callable[..., None], kind: str, target: str, procs: int, per_proc: int) -> float:
    """Operations per second of ``procs`` processes racing (first start to last finish)."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=worker, args=(kind, target, i, per_proc, barrier, out)) for i in range(procs)]
    for p in ps:
        p.start()
    results = [out.get(timeout=120) for _ in ps]
    for p in ps:
        p.join()
    total = sum(r[0] for r in results)
    wall = max(r[2] for r in results) - min(r[1] for r in results)
    return total / wall if wall > 0 else float("inf")


def _specs(n: int) -> list[TaskSpec]:
    return [TaskSpec(name=f"t{k:05d}", prompt="bench", priority=k % 3) for k in range(n)]


# -- per backend ---------------------------------------------------------------------------------
def bench_pg(url: str, tasks: int, procs: int) -> tuple[float, float] | None:
    try:
        import psycopg

        psycopg.connect(url, connect_timeout=3).close()
    except Exception as e:
        print(f"postgres: skipped ({str(e).strip().splitlines()[0]})")
        return None
    from fleet_tui.scheduler.store.postgres_store import PostgresStore

    schema = f"fleet_bench_{uuid.uuid4().hex[:8]}"
    try:
        store = PostgresStore(url, schema=schema)
        store.add_tasks(_specs(tasks), NOW)
        store.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'CREATE TABLE "{schema}".raw (id INTEGER PRIMARY KEY, n BIGINT NOT NULL)')
            conn.execute(
                f'INSERT INTO "{schema}".raw SELECT g, 0 FROM generate_series(1, %s) g', (procs * 100,)
            )
        target = f"{url}|{schema}"
        claims = _race(_claims, "pg", target, procs, 0)
        raw = _race(_raw, "pg", target, procs, tasks // procs)
        return claims, raw
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def bench_sqlite(tasks: int, procs: int) -> tuple[float, float]:
    from fleet_tui.scheduler.store.sqlite_store import SqliteStore

    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as d:
        path = os.path.join(d, "fleet.db")
        store = SqliteStore(path)
        store.add_tasks(_specs(tasks), NOW)
        store.close()
        raw_path = os.path.join(d, "raw.db")
        with sqlite3.connect(raw_path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
            conn.executemany("INSERT INTO raw VALUES (?, 0)", [(k,) for k in range(1, procs * 100 + 1)])
        claims = _race(_claims, "sqlite", path, procs, 0)
        raw = _race(_raw, "sqlite", raw_path, procs, tasks // procs)
        return claims, raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--pg", default=DEFAULT_PG)
    ap.add_argument("--no-pg", action="store_true")
    a = ap.parse_args(argv)
    print(f"{a.procs} racing processes, {a.tasks} tasks / raw updates per backend")
    rows: list[tuple[str, float, float]] = []
    if not a.no_pg:
        got = bench_pg(a.pg, a.tasks, a.procs)
        if got:
            rows.append(("postgres", *got))
    rows.append(("sqlite", *bench_sqlite(a.tasks, a.procs)))
    print(f"{'store':<10}{'claims/s':>12}{'raw updates/s':>16}{'ratio':>8}")
    for name, claims, raw in rows:
        print(f"{name:<10}{claims:>12.0f}{raw:>16.0f}{claims / raw:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
