"""PostgreSQL-only behaviour of the store: URL forms, error messages, racing first opens,
NOTIFY wake-ups and reconnection after killed sessions.

The shared contract lives in ``test_store_contract`` (run against both stores); what only exists
on PostgreSQL is tested here, against throw-away schemas. Unreachable PostgreSQL skips (fails
under ``CI=true``), like the contract suite.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from test_store_contract import NOW, PG_URL, drop_schema, need_pg, spec

from fleet_tui.scheduler.store.opener import open_store
from fleet_tui.scheduler.store.protocol import StoreError

pytestmark = [pytest.mark.timeout(90), pytest.mark.postgres]


@pytest.fixture
def pg_schema() -> Iterator[str]:
    need_pg()
    schema = f"fleet_test_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        drop_schema(schema)


def _with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


def test_pg_open_store_with_schema_in_url(pg_schema: str, tmp_path: Any) -> None:
    s = open_store(_with_query(PG_URL, f"schema={pg_schema}"), str(tmp_path))
    try:
        assert type(s).__name__ == "PostgresStore"
        assert f"schema={pg_schema}" in s.url
        s.add_tasks([spec("a")], NOW)
        s2 = open_store(s.url, str(tmp_path))  # the shown URL reopens the same queue
        assert s2.task_names() == {"a"}
        s2.close()
    finally:
        s.close()


def test_pg_schema_via_libpq_options(pg_schema: str) -> None:
    from fleet_tui.scheduler.store.postgres_store import PostgresStore

    s = PostgresStore(_with_query(PG_URL, f"options=-csearch_path%3D{pg_schema}"))
    try:
        assert s.schema == pg_schema
        s.add_tasks([spec("a")], NOW)
    finally:
        s.close()
    s = PostgresStore(PG_URL, schema=pg_schema)
    assert s.task_names() == {"a"}
    s.close()


def test_pg_url_hides_password_and_errors_name_the_fix() -> None:
    need_pg()
    from fleet_tui.scheduler.store.postgres_schema import parse_url
    from fleet_tui.scheduler.store.postgres_store import PostgresStore

    t = parse_url("postgresql://fleet:s3cret@db.example:6543/q?sslmode=require&schema=f1")
    assert t.url == "postgresql://fleet@db.example:6543/q?sslmode=require&schema=f1"
    assert "s3cret" in t.conninfo and "schema" not in t.conninfo and t.schema == "f1"
    with pytest.raises(StoreError, match="not a plain identifier"):
        parse_url("postgresql://x@y/z?schema=a;drop")
    with pytest.raises(StoreError, match=r"cannot reach .*postgresql://postgres@127\.0\.0\.1:1/test.*Start"):
        PostgresStore("postgresql://postgres:pw@127.0.0.1:1/test")
    with pytest.raises(StoreError) as info:
        PostgresStore(PG_URL.rsplit("/", 1)[0] + "/fleet_no_such_db_x")
    assert "database does not exist" in str(info.value) and "createdb" in str(info.value)
    with pytest.raises(StoreError, match="cannot log in"):
        PostgresStore(PG_URL.replace("//postgres@", "//fleet_no_such_role@"))


def test_pg_concurrent_first_open_migrates_once(pg_schema: str) -> None:
    from fleet_tui.scheduler.store.postgres_store import PostgresStore

    opened: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_one() -> None:
        try:
            barrier.wait()
            opened.append(PostgresStore(PG_URL, schema=pg_schema))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == [] and len(opened) == 4
        opened[0].add_tasks([spec("a")], NOW)
        assert opened[3].task_names() == {"a"}
    finally:
        for s in opened:
            s.close()


def test_pg_notify_wakes_without_the_fallback(pg_schema: str) -> None:
    from fleet_tui.scheduler.store.postgres_store import PostgresStore

    watcher = PostgresStore(PG_URL, schema=pg_schema, fallback_s=None)
    writer = PostgresStore(PG_URL, schema=pg_schema)
    other = PostgresStore(PG_URL, schema=pg_schema + "_x")
    try:
        m0 = watcher.change_marker()
        watcher.set_setting("own", "write")  # our own writes do not wake us
        other.set_setting("other", "schema")  # nor do writes in another schema
        writer.get_setting("k")  # nor reads
        # a write we can observe arriving proves the earlier notifications were delivered too
        writer.set_setting("k", "v")
        deadline = time.monotonic() + 20
        while watcher.change_marker() == m0:
            assert time.monotonic() < deadline, "no NOTIFY arrived"
            time.sleep(0.01)
        assert watcher.change_marker() == m0 + 1
    finally:
        for s in (watcher, writer, other):
            s.close()
        drop_schema(pg_schema + "_x")


def test_pg_survives_killed_connections(pg_schema: str) -> None:
    """A server restart or a dropped network kills idle connections: the next call reconnects."""
    import psycopg

    from fleet_tui.scheduler.store.postgres_store import PostgresStore

    s = PostgresStore(PG_URL, schema=pg_schema, fallback_s=None)
    try:
        s.add_tasks([spec("a")], NOW)
        s.get_setting("warm")  # a second pooled connection is fine too
        m0 = s.change_marker()
        ours = sorted(s.session_pids)  # this store's sessions only
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS n FROM unnest(%s::int[]) AS pid",
                (ours,),
            ).fetchone()
            deadline = time.monotonic() + 20
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (ours,)).fetchone():
                assert time.monotonic() < deadline, "the killed sessions did not go away"
                time.sleep(0.01)
        assert len(ours) >= 2 and killed == (len(ours),)
        assert s.get_task("a") is not None  # a read after the kill: retried on a fresh connection
        claimed = s.claim("e1", "h", (), NOW, 60.0, "sim", None)
        assert claimed is not None and claimed.name == "a"  # a write: BEGIN retried
        deadline = time.monotonic() + 20
        while s.change_marker() == m0:  # the listener died: the marker moves (we may have missed news)
            assert time.monotonic() < deadline, "change_marker did not move after the listener died"
            time.sleep(0.01)
    finally:
        s.close()
