"""Connections, transactions and wake-ups for the PostgreSQL store.

Split from ``postgres_store`` so that module holds only the Store contract's queries. Here:

* a small thread-safe connection pool (the engine calls the store from worker threads at once);
  a connection that broke or was left inside a transaction is dropped, never reused;
* ``_tx()``: one transaction that ``pg_notify``s channel ``fleet_tui`` (payload: the schema) when
  a statement changed rows, so peers wake up; errors become StoreErrors naming the URL;
* opening: connect (clear errors for refused / auth / missing database), pick the schema, and
  migrate under an advisory lock so two processes starting at once don't race;
* ``change_token()`` / ``wait_for_change()`` (changes.py): one thread blocks on a dedicated
  LISTEN connection and moves the token for each notification from another session: a real
  event, no polling. NOTIFY is a wake-up only: the token also moves every ``fallback_s``
  seconds and whenever the listener had to reconnect, so a lost notification delays a peer's
  reaction but never hides a change. (A NOTIFY is lost only when a writer dies between its
  commit and the NOTIFY, or the listener's connection drops, which moves the token by itself:
  so the fallback is rare insurance, 30 s by default, not a poll.) ``change_marker()`` is the
  same without the thread (drains the listener without blocking), for callers that poll.
* every session sets ``idle_in_transaction_session_timeout``: a host that dies, freezes or loses
  its network inside a transaction would otherwise keep its row locks until the server's TCP
  keepalive notices (two hours by default), and every peer's take-over of its tasks (and every
  ``set_waiting`` touching them) would wait that long. The server ends such a session instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row

from fleet_tui.scheduler.store import postgres_schema as ps
from fleet_tui.scheduler.store.changes import ChangeWatcher
from fleet_tui.scheduler.store.notify_store import SQL_TABLE as NOTIFY_TABLE
from fleet_tui.scheduler.store.notify_store import PgNotifications
from fleet_tui.scheduler.store.protocol import StoreError

Conn = psycopg.Connection[DictRow]
Args = Sequence[Any] | dict[str, Any] | None
T = TypeVar("T")
#: a session idle this long inside a transaction is ended by the server, releasing its row locks
#: (ours last milliseconds; keep it below the default lease so a dead host's tasks come back on time)
IDLE_TX_TIMEOUT_S = 20.0


def q(text: str) -> sql.SQL:
    """SQL text built from this package's constants (never from user input)."""
    return sql.SQL(text)  # type: ignore[arg-type,unused-ignore]  # LiteralString for pyright


class Tx:
    """One transaction's cursor; remembers whether a statement changed rows (to NOTIFY)."""

    def __init__(self, cur: psycopg.Cursor[DictRow]) -> None:
        self.cur = cur
        self.changed = False

    def execute(self, text: str, args: Args = None) -> psycopg.Cursor[DictRow]:
        self.cur.execute(q(text), args)
        if self.cur.rowcount > 0 and text.lstrip()[:6].upper() != "SELECT":
            self.changed = True
        return self.cur

    def executemany(self, text: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.cur.executemany(q(text), rows)
            if self.cur.rowcount > 0:
                self.changed = True

    def one(self, text: str, args: Args = None) -> DictRow | None:
        return self.execute(text, args).fetchone()


class Pool:
    """A few reusable connections shared by many threads (at most ``size`` in use at once)."""

    def __init__(self, connect: Callable[[], Conn], size: int) -> None:
        self._connect = connect
        self._idle: list[Conn] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self._pid: dict[int, int] = {}  # id(conn) -> backend pid
        self.pids: set[int] = set()  # backend pids of our connections (to ignore our own NOTIFYs)

    def adopt(self, conn: Conn) -> None:
        self._slots.acquire()
        self._track(conn)
        self.release(conn)

    def _track(self, conn: Conn) -> None:
        with self._lock:
            self._pid[id(conn)] = conn.info.backend_pid
            self.pids.add(conn.info.backend_pid)

    def acquire(self) -> Conn:
        self._slots.acquire()
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
                self._track(conn)
            return conn
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn: Conn) -> None:
        """Back to the idle list, or closed when broken or left inside a transaction."""
        try:
            if conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
                self._discard(conn)
            else:
                with self._lock:
                    self._idle.append(conn)
        finally:
            self._slots.release()

    def reset(self) -> None:
        """Close every idle connection (after one turned out dead, e.g. a server restart)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            self._discard(c)

    def _discard(self, conn: Conn) -> None:
        with self._lock:
            self.pids.discard(self._pid.pop(id(conn), 0))
        try:
            conn.close()
        except psycopg.Error:
            pass

    close = reset


class PgBase(PgNotifications):
    """Opening, pooling, transactions and the change marker of a PostgresStore."""

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        pool_size: int = 8,
        fallback_s: float | None = 30.0,
        connect_timeout_s: int = 10,
        idle_tx_timeout_s: float | None = IDLE_TX_TIMEOUT_S,
    ) -> None:
        target = ps.parse_url(url, schema)
        self._conninfo = target.conninfo
        self._timeout = connect_timeout_s
        self._idle_tx_ms = int(idle_tx_timeout_s * 1000) if idle_tx_timeout_s else 0
        #: the URL without password (with ``?schema=`` when one was chosen)
        self.url = target.url
        self.schema: str = target.schema or ""
        self._fallback_s = fallback_s
        self._notes = 0
        self._listener: Conn | None = None
        self._listen_lock = threading.Lock()
        self._listen_retry_at = 0.0
        self._changes: ChangeWatcher | None = None
        first = self._raw_connect()
        try:
            if not self.schema:
                self.schema = self._default_schema(first)
            self._migrate(first)
        except BaseException:
            first.close()
            raise
        self._pool = Pool(self._connect, pool_size)
        self._pool.adopt(first)
        self._start_listener()

    # -- connections ---------------------------------------------------------------------------
    def _raw_connect(self) -> Conn:
        kw: dict[str, Any] = {"autocommit": True, "row_factory": dict_row}
        if "connect_timeout" not in self._conninfo:
            kw["connect_timeout"] = self._timeout
        try:
            conn = psycopg.connect(self._conninfo, **kw)
        except psycopg.Error as e:
            raise ps.explain_connect(e, self.url) from e
        if self._idle_tx_ms:
            try:
                conn.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                    (str(self._idle_tx_ms),),
                )
            except psycopg.Error as e:
                conn.close()
                raise ps.explain(e, self.url) from e
        return conn

    def _connect(self) -> Conn:
        conn = self._raw_connect()
        try:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        except psycopg.Error as e:
            conn.close()
            raise ps.explain(e, self.url) from e
        return conn

    def _default_schema(self, conn: Conn) -> str:
        """No ``schema=``: the connection's current schema, else the first of its search_path."""
        row = conn.execute("SELECT current_schema() AS s").fetchone()
        if row and row["s"]:
            return ps.check_schema_name(str(row["s"]))
        path = conn.execute("SHOW search_path").fetchone()
        items = [p.strip().strip('"') for p in str(path["search_path"] if path else "").split(",")]
        items = [p for p in items if p and p != "$user"]
        if not items:
            raise StoreError(f"the store {self.url} has an empty search_path: add ?schema=NAME to the URL")
        return ps.check_schema_name(items[0])

    def _current_version(self, conn: Conn) -> int | None:
        """The schema's version read without a lock or a write; None when there is none yet."""
        try:
            row = conn.execute(
                sql.SQL("SELECT value FROM {}.meta WHERE key = 'schema_version'").format(
                    sql.Identifier(self.schema)
                )
            ).fetchone()
        except psycopg.Error:  # no schema or no meta table yet (autocommit: nothing to roll back)
            return None
        return int(row["value"]) if row else None

    def _migrate(self, conn: Conn) -> None:
        ident = sql.Identifier(self.schema)
        if self._current_version(conn) == ps.SCHEMA_VERSION:
            # nothing to migrate: opening takes no lock and writes nothing (a read-only role, or
            # `status` while another host migrates, still works)
            try:
                conn.execute(sql.SQL("SET search_path TO {}").format(ident))
            except psycopg.Error as e:
                raise ps.explain(e, self.url) from e
            return
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (ps.lock_key(self.schema),))
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
                conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(ident))
                conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                current = int(row["value"]) if row else 0
                if current > ps.SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.url} has schema version {current}, newer than this fleet-tui knows "
                        f"({ps.SCHEMA_VERSION}): upgrade fleet-tui"
                    )
                for v in range(current, ps.SCHEMA_VERSION):
                    conn.execute(q(ps.MIGRATIONS[v]))
                conn.execute(q(NOTIFY_TABLE.format(real="DOUBLE PRECISION")))
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', %s)"
                    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    (str(ps.SCHEMA_VERSION),),
                )
            conn.execute(sql.SQL("SET search_path TO {}").format(ident))
        except psycopg.Error as e:
            raise ps.explain(e, self.url) from e

    # -- transactions --------------------------------------------------------------------------
    def _checkout(self, first: Callable[[Conn], T]) -> tuple[Conn, T]:
        """A pooled connection and ``first(conn)``; when the connection turns out dead (server
        restarted, network dropped while it idled), the idle ones are dropped and ``first`` runs
        once more on a fresh connection. ``first`` must be safe to repeat (a read, or BEGIN)."""
        conn = self._pool.acquire()
        try:
            return conn, first(conn)
        except psycopg.Error as e:
            broken = conn.broken
            self._pool.release(conn)
            if not broken:
                raise ps.explain(e, self.url) from e
        self._pool.reset()
        conn = self._pool.acquire()
        try:
            return conn, first(conn)
        except psycopg.Error as e:
            self._pool.release(conn)
            raise ps.explain(e, self.url) from e

    @contextmanager
    def _tx(self) -> Iterator[Tx]:
        """A writing transaction; NOTIFYs the channel after it committed a change.

        The NOTIFY is its own statement after the commit, not part of the transaction: a commit
        that carries a NOTIFY holds PostgreSQL's global notify lock across its WAL flush, which
        serializes every committing engine (claims/s dropped by almost half with 4 engines). A
        NOTIFY lost to a crash in between only delays peers until ``change_marker``'s fallback.
        """
        conn, _ = self._checkout(lambda c: c.execute("BEGIN"))
        committed = False
        try:
            with conn.cursor() as cur:
                tx = Tx(cur)
                try:
                    yield tx
                    conn.execute("COMMIT")
                    committed = True
                finally:
                    if not committed and not conn.broken and not conn.closed:
                        try:
                            conn.execute("ROLLBACK")
                        except psycopg.Error:
                            pass
            if tx.changed:
                try:
                    conn.execute("SELECT pg_notify(%s, %s)", (ps.CHANNEL, self.schema))
                except psycopg.Error:
                    pass  # the write is committed; the wake-up is best effort
        except psycopg.Error as e:
            raise ps.explain(e, self.url) from e
        finally:
            self._pool.release(conn)

    def _all(self, text: str, args: Args = None) -> list[DictRow]:
        conn, rows = self._checkout(lambda c: c.execute(q(text), args).fetchall())
        self._pool.release(conn)
        return rows

    def _run(self, text: str) -> None:
        """A statement outside any transaction (ANALYZE), no result."""
        conn, _ = self._checkout(lambda c: c.execute(q(text)))
        self._pool.release(conn)

    # -- wake-ups ------------------------------------------------------------------------------
    def _start_listener(self) -> None:
        try:
            conn = self._raw_connect()
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(ps.CHANNEL)))
            self._listener = conn
        except (StoreError, psycopg.Error):
            self._listener = None
            self._listen_retry_at = time.monotonic() + 5.0

    @property
    def session_pids(self) -> frozenset[int]:
        """The server's backend pids of this store's open sessions (its pool and its listener), as
        ``pg_stat_activity`` names them: what an operator looks for to find or end this store's own."""
        pids = set(self._pool.pids)
        lst = self._listener
        if lst is not None and not lst.closed:
            pids.add(lst.info.backend_pid)
        return frozenset(pids)

    def change_marker(self) -> int:
        """Moves when another session committed a change here (NOTIFY), and every ``fallback_s``."""
        if self._changes is not None:  # the watcher thread owns the listener now
            bucket = int(time.monotonic() // self._fallback_s) if self._fallback_s else 0
            return self._changes.token() + bucket
        with self._listen_lock:
            lst = self._listener
            if lst is None or lst.closed or lst.broken:
                if lst is not None:
                    lst.close()
                    self._listener = None
                if time.monotonic() >= self._listen_retry_at:
                    self._start_listener()
                    self._notes += 1  # we may have missed something while deaf
            else:
                try:
                    for n in lst.notifies(timeout=0):
                        if n.payload == self.schema and n.pid not in self._pool.pids:
                            self._notes += 1
                except psycopg.Error:
                    lst.close()
                    self._listener = None
                    self._notes += 1
            bucket = int(time.monotonic() // self._fallback_s) if self._fallback_s else 0
            return self._notes + bucket

    def change_token(self) -> int:
        """Moves when another session committed here since (NOTIFY); see ``wait_for_change``."""
        return self._watcher().token()

    def wait_for_change(self, token: int, timeout: float) -> int:
        """Block until the change token differs from ``token``, at most ``timeout`` seconds."""
        return self._watcher().wait(token, timeout)

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call back (on the watcher's thread) on each move of the change token; what stops it."""
        return self._watcher().listen(callback)

    def _watcher(self) -> ChangeWatcher:
        with self._listen_lock:
            if self._changes is None:
                due = [time.monotonic() + (self._fallback_s or 0.0)]

                def step(timeout: float) -> bool:
                    now = time.monotonic()
                    if self._fallback_s and now >= due[0]:
                        due[0] = now + self._fallback_s
                        return True
                    if self._fallback_s:
                        timeout = min(timeout, due[0] - now)
                    return self._listen(timeout)

                self._changes = ChangeWatcher(step, period_s=1.0, name=f"changes {self.schema}")
            return self._changes

    def _listen(self, timeout: float) -> bool:
        """Block on the LISTEN connection up to ``timeout``: True for another session's NOTIFY on
        this schema, or when the listener had to be replaced (we may have missed one)."""
        lst = self._listener
        if lst is None or lst.closed or lst.broken:
            if lst is not None:
                lst.close()
                self._listener = None
            wait = self._listen_retry_at - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, timeout))
                return False
            self._start_listener()
            return self._listener is not None
        got = False
        try:
            for n in lst.notifies(timeout=max(0.0, timeout), stop_after=1):
                got = got or (n.payload == self.schema and n.pid not in self._pool.pids)
            for n in lst.notifies(timeout=0):  # the rest of a burst, at once
                got = got or (n.payload == self.schema and n.pid not in self._pool.pids)
        except psycopg.Error:
            lst.close()
            self._listener = None
            return True
        return got

    def clock_offset(self) -> float:
        """The server's clock minus this host's, in seconds (storeclock.py): leases and heartbeats
        are judged by the server's clock, so hosts whose clocks differ agree on them."""
        t0 = time.time()
        rows = self._all("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8 AS now")
        t1 = time.time()
        return float(rows[0]["now"]) - (t0 + t1) / 2

    def maintenance(self) -> None:
        """Nothing periodic: autovacuum keeps PostgreSQL's tables in shape."""

    def close(self) -> None:
        if self._changes is not None:
            self._changes.close()
        with self._listen_lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        self._pool.close()
