"""The embedded default store: one SQLite file in the fleet home, shared by every process on it.

SQLite in WAL mode with ``synchronous=NORMAL`` and a ``busy_timeout`` lets several ``fleet-tui``
processes (engines, CLI commands, cockpits) share one queue. Every writing transaction is
``BEGIN IMMEDIATE`` so a writer takes the lock up front instead of failing on upgrade. A claim is
one conditional ``UPDATE ... WHERE id = (SELECT ...) AND status = 'queued' RETURNING``; writes on
behalf of an attempt are fenced by owner and attempt number.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from fleet_tui.scheduler.model import (
    Attempt,
    Command,
    Event,
    Host,
    Question,
    RateLimit,
    Task,
    TaskSpec,
    Transition,
)
from fleet_tui.scheduler.states import IllegalTransition, TaskStatus, allowed
from fleet_tui.scheduler.store import (
    ATTEMPT_COLUMNS,
    TASK_COLUMNS,
    DuplicateName,
    StoreError,
    event_from_row,
    event_payload,
    is_nfs,
    new_id,
    spec_from_json,
    spec_to_json,
)

SCHEMA_VERSION = 1

_TASK_COLS_SQL = ",\n".join(
    f"  {c} {'REAL' if c in ('lease_until', 'not_before', 'created_at', 'updated_at', 'started_at', 'attempt_started_at', 'finished_at', 'cost_usd') else ''}"  # noqa: E501
    for c in TASK_COLUMNS
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
]

_DISK_FULL = "database or disk is full"


def _explain(e: sqlite3.Error, path: str) -> StoreError:
    msg = str(e)
    if _DISK_FULL in msg:
        return StoreError(
            f"disk full while writing {path}: free some space on that disk and run the command again "
            "(the store rolled back; nothing already recorded was lost)"
        )
    if "locked" in msg or "busy" in msg:
        return StoreError(
            f"the store {path} stayed locked by another process for too long ({msg}); "
            "check for a stuck fleet-tui process (`fleet-tui status` shows owners) and retry"
        )
    if "readonly" in msg or "unable to open" in msg:
        return StoreError(f"cannot write the store {path} ({msg}): check the folder's permissions")
    return StoreError(f"store error on {path}: {msg}")


class SqliteStore:
    """The Store contract on one SQLite file (see ``store.Store`` for each method's meaning)."""

    def __init__(self, path: str, *, busy_timeout_ms: int = 30_000) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        if is_nfs(folder):
            raise StoreError(
                f"{folder} is on a network filesystem (NFS/SMB): SQLite's locking is unsafe there. "
                "Use a local --home, or a PostgreSQL store (--store postgresql://...)"
            )
        self._lock = threading.RLock()
        self._specs: dict[str, TaskSpec] = {}
        try:
            self._db = sqlite3.connect(
                path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=OFF")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise _explain(e, path) from e

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
            except BaseException:
                self._db.execute("ROLLBACK")
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
            db.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )

    _TASK_SELECT = (
        "SELECT t.*, EXISTS(SELECT 1 FROM questions q WHERE q.task_id = t.id AND q.status = 'pending')"
        " AS asking FROM tasks t"
    )

    def _task(self, row: sqlite3.Row) -> Task:
        kw = {c: row[c] for c in TASK_COLUMNS}
        kw["paused_running"] = bool(kw["paused_running"])
        keys = row.keys()
        tid = row["id"]
        spec = self._specs.get(tid)
        if spec is None:  # a spec never changes after add: parse it once
            spec = self._specs[tid] = spec_from_json(row["spec"])
        return Task(
            id=tid,
            spec=spec,
            status=TaskStatus(row["status"]),
            waiting=row["waiting"],
            asking=bool(row["asking"]) if "asking" in keys else False,
            **kw,
        )

    def _get(self, db: sqlite3.Connection, task_id: str) -> Task | None:
        row = db.execute(self._TASK_SELECT + " WHERE t.id = ?", (task_id,)).fetchone()
        return self._task(row) if row else None

    # -- tasks ---------------------------------------------------------------------------------
    def add_tasks(self, specs: Sequence[TaskSpec], now: float) -> list[Task]:
        out: list[str] = []
        with self._tx() as db:
            names = {r[0]: r[1] for r in db.execute("SELECT name, id FROM tasks")}
            seq = db.execute("SELECT COALESCE(MAX(seqno), 0) FROM tasks").fetchone()[0]
            batch: dict[str, str] = {}
            for spec in specs:
                if spec.name in names or spec.name in batch:
                    raise DuplicateName(
                        f"a task named {spec.name!r} already exists; choose another name "
                        f"(or cancel/retry the existing one)"
                    )
                batch[spec.name] = new_id()
            for spec in specs:
                seq += 1
                tid = batch[spec.name]
                db.execute(
                    "INSERT INTO tasks (id, name, seqno, spec, status, priority, requires, spec_coder,"
                    " spec_model, attempt, retries_used, handoffs, false_completions, created_at,"
                    " updated_at, tokens, cost_usd, paused_running)"
                    " VALUES (?,?,?,?,?,?,?,?,?,0,0,0,0,?,?,0,0,0)",
                    (
                        tid,
                        spec.name,
                        seq,
                        spec_to_json(spec),
                        TaskStatus.QUEUED.value,
                        spec.priority,
                        json.dumps(list(spec.requires)),
                        spec.coder,
                        spec.model,
                        now,
                        now,
                    ),
                )
                for dep in spec.depends_on:
                    dep_id = batch.get(dep) or names.get(dep)
                    if dep_id is None:
                        raise StoreError(f"task {spec.name!r} depends on unknown task {dep!r}")
                    db.execute("INSERT OR IGNORE INTO deps(task_id, dep_id) VALUES (?,?)", (tid, dep_id))
                db.execute(
                    "INSERT INTO transitions(task_id, ts, src, dst, reason, attempt, actor)"
                    " VALUES (?,?,NULL,'queued','added',0,NULL)",
                    (tid, now),
                )
                out.append(tid)
            return [t for t in (self._get(db, i) for i in out) if t]

    def get_task(self, ref: str) -> Task | None:
        with self._lock:
            rows = self._q(self._TASK_SELECT + " WHERE t.id = ? OR t.name = ?", (ref, ref))
        return self._task(rows[0]) if rows else None

    def list_tasks(self, status: TaskStatus | None = None) -> list[Task]:
        if status is not None:
            rows = self._q(self._TASK_SELECT + " WHERE t.status = ? ORDER BY t.seqno", (status.value,))
        else:
            rows = self._q(self._TASK_SELECT + " ORDER BY t.seqno")
        return [self._task(r) for r in rows]

    def task_names(self) -> set[str]:
        return {r[0] for r in self._q("SELECT name FROM tasks")}

    def dependents(self, task_id: str) -> list[Task]:
        rows = self._q(
            self._TASK_SELECT + " JOIN deps d ON d.task_id = t.id WHERE d.dep_id = ? ORDER BY t.seqno",
            (task_id,),
        )
        return [self._task(r) for r in rows]

    def dependencies(self, task_id: str) -> list[Task]:
        rows = self._q(
            self._TASK_SELECT + " JOIN deps d ON d.dep_id = t.id WHERE d.task_id = ? ORDER BY t.seqno",
            (task_id,),
        )
        return [self._task(r) for r in rows]

    def claim(
        self,
        owner: str,
        host: str,
        tags: Iterable[str],
        now: float,
        lease_s: float,
        default_coder: str,
        default_model: str | None,
        exclude_coders: Iterable[str] = (),
        only_task: str | None = None,
    ) -> Task | None:
        args = {
            "owner": owner,
            "host": host,
            "now": now,
            "lease": now + lease_s,
            "dc": default_coder,
            "dm": default_model,
            "tags": json.dumps(sorted(set(tags))),
            "excl": json.dumps(sorted(set(exclude_coders))),
            "only": only_task,
        }
        sql = f"""
UPDATE tasks SET status = 'running', attempt = attempt + 1, owner = :owner, host = :host,
  lease_until = :lease, coder = COALESCE(coder, spec_coder, :dc),
  model = COALESCE(model, spec_model, :dm), started_at = COALESCE(started_at, :now),
  attempt_started_at = :now, updated_at = :now, waiting = NULL, reason = NULL, finished_at = NULL
WHERE id = (
  SELECT t.id FROM tasks t
  WHERE t.status = 'queued' AND (t.not_before IS NULL OR t.not_before <= :now)
    {"AND t.id = :only" if only_task else ""}
    AND NOT EXISTS (SELECT 1 FROM deps d JOIN tasks u ON u.id = d.dep_id
                    WHERE d.task_id = t.id AND u.status != 'done')
    AND NOT EXISTS (SELECT 1 FROM json_each(t.requires) r
                    WHERE r.value NOT IN (SELECT value FROM json_each(:tags)))
    AND COALESCE(t.coder, t.spec_coder, :dc) NOT IN (SELECT value FROM json_each(:excl))
  ORDER BY t.priority DESC, t.seqno LIMIT 1
) AND status = 'queued'
RETURNING *"""
        with self._tx() as db:
            row = db.execute(sql, args).fetchone()
            if row is None:
                return None
            db.execute(
                "INSERT INTO transitions(task_id, ts, src, dst, reason, attempt, actor)"
                " VALUES (?,?,'queued','running','claimed',?,?)",
                (row["id"], now, row["attempt"], owner),
            )
            return self._task(row)  # a task just claimed from the queue has no pending question

    def transition(
        self,
        task_id: str,
        dst: TaskStatus,
        *,
        reason: str | None,
        now: float,
        owner: str | None = None,
        attempt: int | None = None,
        expect: Iterable[TaskStatus] | None = None,
        actor: str | None = None,
        **fields: Any,
    ) -> Task | None:
        with self._tx() as db:
            cur = self._get(db, task_id)
            if cur is None:
                return None
            if owner is not None and cur.owner != owner:
                return None
            if attempt is not None and cur.attempt != attempt:
                return None
            if expect is not None and cur.status not in set(expect):
                return None
            if not allowed(cur.status, dst):
                raise IllegalTransition(cur.status, dst)
            sets = {"status": dst.value, "reason": reason, "updated_at": now, **fields}
            if (
                dst in (TaskStatus.DONE, TaskStatus.CANCELLED, TaskStatus.NEEDS_HUMAN)
                and "finished_at" not in fields
            ):
                sets["finished_at"] = now
            if (
                dst in (TaskStatus.QUEUED, TaskStatus.DONE, TaskStatus.CANCELLED, TaskStatus.NEEDS_HUMAN)
                and "owner" not in fields
            ):
                sets["owner"] = None
                sets["lease_until"] = None
            if dst != TaskStatus.QUEUED:
                sets.setdefault("waiting", None)
            cols = ", ".join(f"{k} = ?" for k in sets)
            n = db.execute(
                f"UPDATE tasks SET {cols} WHERE id = ? AND status = ? AND attempt = ?",
                (*sets.values(), task_id, cur.status.value, cur.attempt),
            ).rowcount
            if n != 1:
                return None
            db.execute(
                "INSERT INTO transitions(task_id, ts, src, dst, reason, attempt, actor)"
                " VALUES (?,?,?,?,?,?,?)",
                (task_id, now, cur.status.value, dst.value, reason, cur.attempt, actor or owner),
            )
            return self._get(db, task_id)

    def update_task(
        self, task_id: str, *, owner: str | None = None, attempt: int | None = None, **fields: Any
    ) -> Task | None:
        if not fields:
            return self.get_task(task_id)
        where, args = "id = ?", list[Any]([task_id])
        if owner is not None:
            where += " AND owner = ?"
            args.append(owner)
        if attempt is not None:
            where += " AND attempt = ?"
            args.append(attempt)
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx() as db:
            n = db.execute(f"UPDATE tasks SET {cols} WHERE {where}", (*fields.values(), *args)).rowcount
            return self._get(db, task_id) if n else None

    def set_waiting(self, reasons: dict[str, str | None]) -> None:
        """Record the waiting reason of queued tasks (only rows whose reason changed)."""
        with self._tx() as db:
            for tid, why in reasons.items():
                db.execute(
                    "UPDATE tasks SET waiting = ? WHERE id = ? AND status = 'queued' AND waiting IS NOT ?",
                    (why, tid, why),
                )

    def transitions(self, task_id: str) -> list[Transition]:
        rows = self._q(
            "SELECT task_id, ts, src, dst, reason, attempt, actor FROM transitions"
            " WHERE task_id = ? ORDER BY id",
            (task_id,),
        )
        return [Transition(**dict(r)) for r in rows]

    # -- engines and leases --------------------------------------------------------------------
    def register_engine(self, owner: str, host: str, pid: int, pid_create_time: float, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO engines(owner, host, pid, pid_create_time, heartbeat,"
                " started_at, stopped) VALUES (?,?,?,?,?,?,0)",
                (owner, host, pid, pid_create_time, now, now),
            )

    def heartbeat(self, owner: str, now: float, lease_s: float) -> int:
        with self._tx() as db:
            db.execute("UPDATE engines SET heartbeat = ? WHERE owner = ?", (now, owner))
            return db.execute(
                "UPDATE tasks SET lease_until = MAX(COALESCE(lease_until, 0), ?) WHERE owner = ?"
                " AND status IN ('running', 'verifying', 'paused')",
                (now + lease_s, owner),
            ).rowcount

    def extend_lease(self, task_id: str, owner: str, until: float) -> bool:
        with self._tx() as db:
            return (
                db.execute(
                    "UPDATE tasks SET lease_until = MAX(COALESCE(lease_until, 0), ?)"
                    " WHERE id = ? AND owner = ?",
                    (until, task_id, owner),
                ).rowcount
                == 1
            )

    def engine_info(self, owner: str) -> dict[str, Any] | None:
        rows = self._q("SELECT * FROM engines WHERE owner = ?", (owner,))
        return dict(rows[0]) if rows else None

    def live_engines(self, now: float, stale_s: float) -> list[dict[str, Any]]:
        rows = self._q("SELECT * FROM engines WHERE stopped = 0 AND heartbeat >= ?", (now - stale_s,))
        return [dict(r) for r in rows]

    def unregister_engine(self, owner: str, now: float) -> None:
        with self._tx() as db:
            db.execute("UPDATE engines SET stopped = 1, heartbeat = ? WHERE owner = ?", (now, owner))

    def orphaned_tasks(self, now: float, stale_s: float) -> list[Task]:
        rows = self._q(
            self._TASK_SELECT + " LEFT JOIN engines e ON e.owner = t.owner"
            " WHERE (t.status IN ('running', 'verifying') OR (t.status = 'paused' AND t.paused_running = 1))"
            " AND (e.owner IS NULL OR e.stopped = 1 OR e.heartbeat < ?) ORDER BY t.seqno",
            (now - stale_s,),
        )
        return [self._task(r) for r in rows]

    def take_over(
        self,
        task_id: str,
        old_owner: str | None,
        attempt: int,
        new_owner: str,
        host: str,
        now: float,
        lease_s: float,
        require_lease_expired: bool,
    ) -> Task | None:
        cond = " AND (lease_until IS NULL OR lease_until < :now)" if require_lease_expired else ""
        with self._tx() as db:
            n = db.execute(
                "UPDATE tasks SET owner = :new, host = :host, lease_until = :lease, updated_at = :now"
                " WHERE id = :id AND owner IS :old AND attempt = :attempt" + cond,
                {
                    "new": new_owner,
                    "host": host,
                    "lease": now + lease_s,
                    "now": now,
                    "id": task_id,
                    "old": old_owner,
                    "attempt": attempt,
                },
            ).rowcount
            if n != 1:
                return None
            cur = self._get(db, task_id)
            assert cur is not None
            db.execute(
                "INSERT INTO transitions(task_id, ts, src, dst, reason, attempt, actor)"
                " VALUES (?,?,?,?,?,?,?)",
                (
                    task_id,
                    now,
                    cur.status.value,
                    cur.status.value,
                    f"adopted from {old_owner}",
                    attempt,
                    new_owner,
                ),
            )
            return cur

    # -- attempts ------------------------------------------------------------------------------
    def put_attempt(self, a: Attempt) -> None:
        d = asdict(a)
        cols = ", ".join(d)
        with self._tx() as db:
            db.execute(
                f"INSERT OR REPLACE INTO attempts ({cols}) VALUES ({', '.join('?' * len(d))})",
                tuple(d.values()),
            )

    def update_attempt(self, task_id: str, n: int, *, owner: str | None = None, **fields: Any) -> bool:
        if not fields:
            return True
        cols = ", ".join(f"{k} = ?" for k in fields)
        fence, extra = "", tuple[Any, ...]()
        if owner is not None:  # fenced: only the engine that still holds the claim may write
            fence = " AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = ? AND t.owner = ? AND t.attempt = ?)"
            extra = (task_id, owner, n)
        with self._tx() as db:
            cur = db.execute(
                f"UPDATE attempts SET {cols} WHERE task_id = ? AND n = ?{fence}",
                (*fields.values(), task_id, n, *extra),
            )
            return bool(cur.rowcount)

    @staticmethod
    def _attempt(r: sqlite3.Row) -> Attempt:
        return Attempt(task_id=r["task_id"], n=r["n"], **{c: r[c] for c in ATTEMPT_COLUMNS})

    def get_attempt(self, task_id: str, n: int) -> Attempt | None:
        rows = self._q("SELECT * FROM attempts WHERE task_id = ? AND n = ?", (task_id, n))
        return self._attempt(rows[0]) if rows else None

    def attempts(self, task_id: str) -> list[Attempt]:
        return [
            self._attempt(r)
            for r in self._q("SELECT * FROM attempts WHERE task_id = ? ORDER BY n", (task_id,))
        ]

    # -- events --------------------------------------------------------------------------------
    def append_events(
        self, events: Sequence[Event], *, offset: tuple[str, int, int] | None = None, owner: str | None = None
    ) -> bool:
        with self._tx() as db:
            if owner is not None and offset is not None:
                row = db.execute(
                    "SELECT 1 FROM tasks WHERE id = ? AND owner = ? AND attempt = ?",
                    (offset[0], owner, offset[1]),
                ).fetchone()
                if row is None:
                    return False  # the claim was lost: a late writer changes nothing
            db.executemany(
                "INSERT OR IGNORE INTO events(task_id, attempt, seq, ts, kind, text, payload)"
                " VALUES (?,?,?,?,?,?,?)",
                [(e.task_id, e.attempt, e.seq, e.ts, e.kind, e.text, event_payload(e)) for e in events],
            )
            if offset is not None:
                tid, n, off = offset
                nxt = max((e.seq for e in events), default=-1) + 1
                db.execute(
                    "UPDATE attempts SET stdout_offset = ?, next_seq = MAX(next_seq, ?)"
                    " WHERE task_id = ? AND n = ?",
                    (off, nxt, tid, n),
                )
            return True

    def events(
        self,
        task_id: str,
        attempt: int | None = None,
        after: tuple[int, int] | None = None,
        limit: int = 10_000,
    ) -> list[Event]:
        sql = "SELECT * FROM events WHERE task_id = ?"
        args: list[Any] = [task_id]
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        if after is not None:
            sql += " AND (attempt > ? OR (attempt = ? AND seq > ?))"
            args += [after[0], after[0], after[1]]
        sql += " ORDER BY attempt, seq LIMIT ?"
        args.append(limit)
        return [
            event_from_row(r["task_id"], r["attempt"], r["seq"], r["ts"], r["kind"], r["text"], r["payload"])
            for r in self._q(sql, args)
        ]

    def last_events(self, task_id: str, limit: int) -> list[Event]:
        rows = self._q(
            "SELECT * FROM (SELECT * FROM events WHERE task_id = ? ORDER BY attempt DESC,"
            " seq DESC LIMIT ?) ORDER BY attempt, seq",
            (task_id, limit),
        )
        return [
            event_from_row(r["task_id"], r["attempt"], r["seq"], r["ts"], r["kind"], r["text"], r["payload"])
            for r in rows
        ]

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

    def maintenance(self) -> None:
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass  # a busy checkpoint is retried on the next tick

    def close(self) -> None:
        with self._lock:
            self._db.close()
