"""SQLite plumbing and the side tables: the connection, the schema and its migrations, errors a
user can act on, and the simple tables (questions, hosts, settings, rate limits, commands).

The queue itself (tasks, claims, transitions, leases, attempts, events) is in sqlite_store.py;
splitting keeps each file readable. Every writing transaction is ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from fleet_tui.scheduler.model import Command, Host, Question, RateLimit, TaskSpec
from fleet_tui.scheduler.store.changes import ChangeWatcher, FolderWatch
from fleet_tui.scheduler.store.notify_store import SQL_TABLE as NOTIFY_TABLE
from fleet_tui.scheduler.store.notify_store import SqliteNotifications
from fleet_tui.scheduler.store.protocol import (
    ATTEMPT_COLUMNS,
    TASK_COLUMNS,
    StoreError,
    after,
    is_nfs,
    new_id,
)

SCHEMA_VERSION = 3

#: the page size of a new file: 8 KB pages hold seven 1000-byte output lines where 4 KB pages
#: held three (rows do not span pages), for little extra cost per small transaction. A file
#: keeps the page size it was created with (changing it needs a VACUUM outside WAL mode).
PAGE_SIZE = 8192

_TASK_COLS_SQL = ",\n".join(
    f"  {c} {'REAL' if c in ('lease_until', 'not_before', 'created_at', 'updated_at', 'started_at', 'attempt_started_at', 'finished_at', 'cost_usd') else ''}"  # noqa: E501
    for c in TASK_COLUMNS
)

#: a trigger's body: the next change number, given to the task(s) ``where`` selects
_BUMP = (
    "UPDATE revs SET n = n + 1 WHERE name = 'tasks'; "
    "UPDATE tasks SET rev = (SELECT n FROM revs WHERE name = 'tasks') WHERE {where};"
)

MIGRATIONS: list[str] = [
    # version 1: the first release
    f"""
CREATE TABLE tasks (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  seqno INTEGER NOT NULL,
  spec TEXT NOT NULL,
  status TEXT NOT NULL,
  priority INTEGER NOT NULL DEFAULT 0,
  requires TEXT NOT NULL DEFAULT '[]',
  spec_coder TEXT,
  spec_model TEXT,
  waiting TEXT,
{_TASK_COLS_SQL}
);
CREATE INDEX tasks_ready ON tasks(status, priority DESC, seqno);
CREATE TABLE deps (task_id TEXT NOT NULL, dep_id TEXT NOT NULL, PRIMARY KEY (task_id, dep_id));
CREATE INDEX deps_dep ON deps(dep_id);
CREATE TABLE transitions (
  id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL, ts REAL NOT NULL, src TEXT,
  dst TEXT NOT NULL, reason TEXT, attempt INTEGER NOT NULL, actor TEXT
);
CREATE INDEX transitions_task ON transitions(task_id, id);
CREATE TABLE attempts (
  task_id TEXT NOT NULL, n INTEGER NOT NULL, {", ".join(ATTEMPT_COLUMNS)},
  PRIMARY KEY (task_id, n)
);
CREATE TABLE events (
  task_id TEXT NOT NULL, attempt INTEGER NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL,
  kind TEXT NOT NULL, text TEXT, payload TEXT, PRIMARY KEY (task_id, attempt, seq)
) WITHOUT ROWID;
CREATE TABLE questions (
  id TEXT PRIMARY KEY, task_id TEXT NOT NULL, attempt INTEGER NOT NULL, asked_at REAL NOT NULL,
  text TEXT NOT NULL, options TEXT NOT NULL DEFAULT '[]', status TEXT NOT NULL DEFAULT 'pending',
  answer TEXT, answered_at REAL, answered_by TEXT
);
CREATE INDEX questions_status ON questions(status);
CREATE TABLE engines (
  owner TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, pid_create_time REAL NOT NULL,
  heartbeat REAL NOT NULL, started_at REAL NOT NULL, stopped INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE hosts (
  name TEXT PRIMARY KEY, heartbeat REAL NOT NULL, cores INTEGER, load REAL, mem_available INTEGER,
  disk_free INTEGER, running INTEGER, tags TEXT, version TEXT
);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE rate_limits (
  account TEXT PRIMARY KEY, status TEXT, utilization REAL, resets_at REAL, window TEXT,
  observed_at REAL, blocked_until REAL
);
CREATE TABLE commands (
  id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT, verb TEXT NOT NULL, arg TEXT,
  created_at REAL NOT NULL, target_owner TEXT, status TEXT NOT NULL DEFAULT 'pending', result TEXT
);
CREATE INDEX commands_pending ON commands(status, target_owner);
""",
    # version 2: a change counter on tasks (``tasks_changed_since``): every insert or update of a
    # task, and every question asked or settled (a task's ``asking``), gives the task the next
    # number of ``revs.tasks``; trigger bodies stay on one line (statements split on ";\n")
    """
ALTER TABLE tasks ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
CREATE TABLE revs (name TEXT PRIMARY KEY, n INTEGER NOT NULL);
INSERT INTO revs(name, n) VALUES ('tasks', 0);
CREATE INDEX tasks_rev ON tasks(rev);
CREATE TRIGGER tasks_rev_insert AFTER INSERT ON tasks BEGIN """
    + _BUMP.format(where="rowid = NEW.rowid")
    + """ END;
CREATE TRIGGER tasks_rev_update AFTER UPDATE ON tasks WHEN NEW.rev IS OLD.rev BEGIN """
    + _BUMP.format(where="rowid = NEW.rowid")
    + """ END;
CREATE TRIGGER questions_rev_insert AFTER INSERT ON questions BEGIN """
    + _BUMP.format(where="id = NEW.task_id")
    + """ END;
CREATE TRIGGER questions_rev_update AFTER UPDATE OF status ON questions BEGIN """
    + _BUMP.format(where="id = NEW.task_id")
    + """ END;
""",
    # version 3: events in a rowid table with a unique index on (task_id, attempt, seq). The
    # WITHOUT ROWID layout keeps rows in an index b-tree, whose cells hold at most ~1 KB on a
    # 4 KB page: a 1000-byte line spilled into an overflow page of its own (~4.7 KB per row).
    # A rowid table keeps rows up to a page inline; the unique index keeps the order, the
    # INSERT OR IGNORE de-duplication and the range scans. Rows are copied in key order.
    """
CREATE TABLE events_v2 (
  task_id TEXT NOT NULL, attempt INTEGER NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL,
  kind TEXT NOT NULL, text TEXT, payload TEXT
);
INSERT INTO events_v2(task_id, attempt, seq, ts, kind, text, payload)
  SELECT task_id, attempt, seq, ts, kind, text, payload FROM events ORDER BY task_id, attempt, seq;
DROP TABLE events;
ALTER TABLE events_v2 RENAME TO events;
CREATE UNIQUE INDEX events_key ON events(task_id, attempt, seq);
""",
]

_DISK_FULL = "database or disk is full"


def _explain(e: sqlite3.Error, path: str) -> StoreError:
    msg = str(e)
    if _DISK_FULL in msg:
        return StoreError(
            f"disk full while writing {path}: free some space on that disk (the write rolled back; "
            "nothing already recorded was lost)"
        )
    if "locked" in msg or "busy" in msg:
        return StoreError(
            f"the store {path} stayed locked by another process for too long ({msg}); "
            "check for a stuck fleet-tui process (`fleet-tui status` shows owners) and retry"
        )
    if "readonly" in msg or "unable to open" in msg:
        return StoreError(f"cannot write the store {path} ({msg}): check the folder's permissions")
    return StoreError(f"store error on {path}: {msg}")


class SqliteBase(SqliteNotifications):
    """Connection, schema and the side tables of the SQLite store."""

    def __init__(self, path: str, *, busy_timeout_ms: int = 30_000, readonly: bool = False) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self.readonly = readonly
        folder = os.path.dirname(os.path.abspath(path))
        if not (readonly and os.path.isfile(path)):
            os.makedirs(folder, exist_ok=True)
        if is_nfs(folder):
            raise StoreError(
                f"{folder} is on a network filesystem (NFS/SMB): SQLite's locking is unsafe there. "
                "Use a local --home, or a PostgreSQL store (--store postgresql://...)"
            )
        self._lock = threading.RLock()
        self._changes: ChangeWatcher | None = None
        self._specs: dict[str, TaskSpec] = {}
        self._spec_texts: dict[str, str] = {}
        try:
            if readonly and os.path.isfile(path):
                self._db = self._open_readonly(path, busy_timeout_ms)
                if self._schema_version() == SCHEMA_VERSION:
                    return
                self._db.close()  # an older (or empty) file: open it for writing to migrate it
            self._db = self._connect(path, busy_timeout_ms)
            if not self._db.execute("SELECT 1 FROM sqlite_master").fetchone():
                self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file: no effect otherwise
            # journal mode is stored in the file: set it only when it is not WAL yet (a write)
            if str(self._db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=OFF")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise _explain(e, path) from e
        try:
            st = os.stat(path)
            #: to notice the file vanishing (check_file)
            self._file_id: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            self._file_id = None

    def check_file(self) -> None:
        """Raise StoreError when the database file this store opened was deleted or replaced
        (``git clean -fdx`` in a repository holding the home, an ``rm``): writes would go to a
        file nobody else sees, while other commands silently start a new, empty queue."""
        if self._file_id is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self._file_id:
            what = "deleted" if st is None else "replaced by another file"
            raise StoreError(
                f"the store's database {self.path} was {what} while this engine ran; stopping so "
                "nothing is recorded where nobody sees it. Restore the file (or accept the loss), "
                "keep the fleet home out of reach of git clean and the like, then start the engine again"
            )

    def set_busy_timeout(self, ms: int) -> None:
        """How long a write waits for another process's lock before it fails (the engine waits
        out longer locks itself, saying so: outage.py)."""
        with self._lock:
            self._db.execute(f"PRAGMA busy_timeout={int(ms)}")

    @staticmethod
    def _connect(target: str, busy_timeout_ms: int, *, uri: bool = False) -> sqlite3.Connection:
        db = sqlite3.connect(
            target, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False, uri=uri
        )
        db.row_factory = sqlite3.Row
        db.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        return db

    def _open_readonly(self, path: str, busy_timeout_ms: int) -> sqlite3.Connection:
        """A read-only connection that takes no lock and writes nothing.

        WAL readers need the ``-shm`` index: when it cannot be created (a read-only folder or a
        full disk) and no ``-wal`` file holds unmerged changes (no writer has the file open),
        the file is read as immutable, which needs neither."""
        base = "file:" + quote(os.path.abspath(path)) + "?mode=ro"
        db = self._connect(base, busy_timeout_ms, uri=True)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.OperationalError:
            db.close()
            wal = path + "-wal"
            if os.path.exists(wal) and os.path.getsize(wal) > 0:
                raise
        db = self._connect(base + "&immutable=1", busy_timeout_ms, uri=True)
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db

    def _schema_version(self) -> int:
        """The file's schema version, read without a write lock (0: a new or empty file)."""
        if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
            return 0
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    # -- plumbing ------------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise _explain(e, self.path) from e
            try:
                yield self._db
            except BaseException as e:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # a damaged file may refuse even that; the transaction is gone either way
                if isinstance(e, sqlite3.Error):  # e.g. a file damaged after it was opened
                    raise _explain(e, self.path) from e
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as e:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise _explain(e, self.path) from e

    def _q(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                raise _explain(e, self.path) from e

    def _migrate(self) -> None:
        current = self._schema_version()
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {current}, newer than this fleet-tui knows "
                f"({SCHEMA_VERSION}): upgrade fleet-tui"
            )
        if current == SCHEMA_VERSION:
            return  # nothing to migrate: opening writes nothing and takes no write lock
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            current = int(row[0]) if row else 0
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {current}, newer than this fleet-tui knows "
                    f"({SCHEMA_VERSION}): upgrade fleet-tui"
                )
            for v in range(current, SCHEMA_VERSION):
                for stmt in MIGRATIONS[v].split(";\n"):
                    if stmt.strip():
                        db.execute(stmt)
            db.execute(NOTIFY_TABLE.format(real="REAL"))
            db.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )

    _TASK_SELECT = (
        "SELECT t.*, EXISTS(SELECT 1 FROM questions q WHERE q.task_id = t.id AND q.status = 'pending')"
        " AS asking FROM tasks t"
    )

    # -- questions -----------------------------------------------------------------------------
    @staticmethod
    def _question(r: sqlite3.Row) -> Question:
        d = dict(r)
        d["options"] = tuple(json.loads(d["options"] or "[]"))
        return Question(**d)

    def add_question(
        self, task_id: str, attempt: int, text: str, options: Sequence[str], now: float
    ) -> Question:
        qid = new_id("q")
        with self._tx() as db:
            db.execute(
                "INSERT INTO questions(id, task_id, attempt, asked_at, text, options, status)"
                " VALUES (?,?,?,?,?,?,'pending')",
                (qid, task_id, attempt, now, text, json.dumps(list(options))),
            )
            return self._question(db.execute("SELECT * FROM questions WHERE id = ?", (qid,)).fetchone())

    def get_question(self, qid: str) -> Question | None:
        rows = self._q("SELECT * FROM questions WHERE id = ?", (qid,))
        return self._question(rows[0]) if rows else None

    def answer_question(self, qid: str, answer: str, by: str, now: float) -> bool:
        with self._tx() as db:
            return (
                db.execute(
                    "UPDATE questions SET status = 'answered', answer = ?, answered_at = ?,"
                    " answered_by = ? WHERE id = ? AND status = 'pending'",
                    (answer, now, by, qid),
                ).rowcount
                == 1
            )

    def close_questions(self, task_id: str, status: str, now: float) -> int:
        with self._tx() as db:
            return db.execute(
                "UPDATE questions SET status = ?, answered_at = ? WHERE task_id = ? AND status = 'pending'",
                (status, now, task_id),
            ).rowcount

    def expire_question(self, qid: str, now: float) -> bool:
        with self._tx() as db:
            return (
                db.execute(
                    "UPDATE questions SET status = 'expired', answered_at = ? WHERE id = ?"
                    " AND status = 'pending'",
                    (now, qid),
                ).rowcount
                == 1
            )

    def pending_questions(self) -> list[Question]:
        return [
            self._question(r)
            for r in self._q("SELECT * FROM questions WHERE status = 'pending' ORDER BY asked_at")
        ]

    def questions(self, task_id: str) -> list[Question]:
        return [
            self._question(r)
            for r in self._q("SELECT * FROM questions WHERE task_id = ? ORDER BY asked_at", (task_id,))
        ]

    # -- hosts, settings, rate limits, commands --------------------------------------------------
    def upsert_host(self, h: Host) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO hosts(name, heartbeat, cores, load, mem_available,"
                " disk_free, running, tags, version) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    h.name,
                    h.heartbeat,
                    h.cores,
                    h.load,
                    h.mem_available,
                    h.disk_free,
                    h.running,
                    json.dumps(list(h.tags)),
                    h.version,
                ),
            )

    def hosts(self) -> list[Host]:
        out = []
        for r in self._q("SELECT * FROM hosts ORDER BY name"):
            d = dict(r)
            d["tags"] = tuple(json.loads(d["tags"] or "[]"))
            out.append(Host(**d))
        return out

    def get_setting(self, key: str) -> str | None:
        rows = self._q("SELECT value FROM settings WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def set_setting(self, key: str, value: str | None) -> None:
        with self._tx() as db:
            if value is None:
                db.execute("DELETE FROM settings WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO settings(key, value) VALUES (?,?)", (key, value))

    def settings_with_prefix(self, prefix: str) -> dict[str, str]:
        rows = self._q("SELECT key, value FROM settings WHERE key >= ? AND key < ?", (prefix, after(prefix)))
        return {str(k): str(v) for k, v in rows if v is not None}

    def put_rate_limit(self, rl: RateLimit, blocked_until: float | None) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO rate_limits(account, status, utilization, resets_at,"
                " window, observed_at, blocked_until) VALUES (?,?,?,?,?,?,?)",
                (
                    rl.account,
                    rl.status,
                    rl.utilization,
                    rl.resets_at,
                    rl.window,
                    rl.observed_at,
                    blocked_until,
                ),
            )

    def rate_limits(self) -> list[tuple[RateLimit, float | None]]:
        out = []
        for r in self._q("SELECT * FROM rate_limits ORDER BY account"):
            d = dict(r)
            blocked = d.pop("blocked_until")
            out.append((RateLimit(**d), blocked))
        return out

    def add_command(
        self, task_id: str | None, verb: str, arg: str | None, target_owner: str | None, now: float
    ) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO commands(task_id, verb, arg, created_at, target_owner) VALUES (?,?,?,?,?)",
                (task_id, verb, arg, now, target_owner),
            )
            return int(cur.lastrowid or 0)

    def pending_commands(self, owner: str) -> list[Command]:
        rows = self._q(
            "SELECT * FROM commands WHERE status = 'pending' AND target_owner = ? ORDER BY id", (owner,)
        )
        return [Command(**dict(r)) for r in rows]

    def finish_command(self, cid: int, status: str, result: str | None) -> None:
        with self._tx() as db:
            db.execute("UPDATE commands SET status = ?, result = ? WHERE id = ?", (status, result, cid))

    def get_command(self, cid: int) -> Command | None:
        rows = self._q("SELECT * FROM commands WHERE id = ?", (cid,))
        return Command(**dict(rows[0])) if rows else None

    def spent_since(self, since: float) -> float:
        rows = self._q("SELECT COALESCE(SUM(cost_usd), 0) FROM attempts WHERE started_at >= ?", (since,))
        return float(rows[0][0] or 0.0)

    def change_marker(self) -> int:
        """Changes whenever another connection commits (PRAGMA data_version): a cheap poll."""
        with self._lock:
            return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    # -- change notification (changes.py) --------------------------------------------------------
    def change_token(self) -> int:
        """Moves when another connection (process) committed here since; see ``wait_for_change``."""
        return self._watcher().token()

    def wait_for_change(self, token: int, timeout: float) -> int:
        """Block until the change token differs from ``token``, at most ``timeout`` seconds."""
        return self._watcher().wait(token, timeout)

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call back (on the watcher's thread) on each move of the change token; what stops it."""
        return self._watcher().listen(callback)

    def _watcher(self) -> ChangeWatcher:
        """The store's one watcher thread: inotify on the folder wakes it when a commit writes
        the ``-wal`` (or the file), then ``data_version`` says whether another connection
        committed; without inotify, ``data_version`` four times a second."""
        if self._changes is not None:  # without the store's lock: a transaction may hold it
            return self._changes
        with self._lock:
            if self._changes is not None:
                return self._changes
            base = os.path.basename(self.path)
            fw = FolderWatch.open(os.path.dirname(os.path.abspath(self.path)), (base, base + "-wal"))
            last = [self.change_marker()]

            def step(timeout: float) -> bool:
                if fw is not None:
                    fw.wait(timeout)
                else:
                    time.sleep(timeout)
                now = self.change_marker()
                moved, last[0] = now != last[0], now
                return moved

            self._changes = ChangeWatcher(
                step,
                period_s=5.0 if fw else 0.25,
                name=f"changes {base}",
                cleanup=fw.close if fw is not None else None,
            )
            return self._changes

    def maintenance(self) -> None:
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass  # a busy checkpoint is retried on the next tick

    def close(self) -> None:
        if self._changes is not None:
            self._changes.close()
        with self._lock:
            self._db.close()
