"""The embedded default store: one SQLite file in the fleet home, shared by every process on it.

SQLite in WAL mode with ``synchronous=NORMAL`` and a ``busy_timeout`` lets several ``fleet-tui``
processes (engines, CLI commands, cockpits) share one queue. Every writing transaction is
``BEGIN IMMEDIATE`` so a writer takes the lock up front instead of failing on upgrade. A claim is
one conditional ``UPDATE ... WHERE id = (SELECT ...) AND status = 'queued' RETURNING``; writes on
behalf of an attempt are fenced by owner and attempt number.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from fleet_tui.scheduler.model import (
    Attempt,
    Event,
    Task,
    TaskSpec,
    Transition,
)
from fleet_tui.scheduler.states import TaskStatus, path_of
from fleet_tui.scheduler.store.protocol import (
    ATTEMPT_COLUMNS,
    ATTEMPT_FIELDS,
    REUSABLE,
    TASK_COLUMNS,
    DuplicateName,
    StoreError,
    TaskChanges,
    attempt_record,
    attempt_values,
    event_from_row,
    event_payload,
    new_id,
    spec_from_json,
    spec_to_json,
    taken_message,
)
from fleet_tui.scheduler.store.sqlite_base import SCHEMA_VERSION, SqliteBase

__all__ = ["SCHEMA_VERSION", "SqliteStore"]


class SqliteStore(SqliteBase):
    """The Store contract on one SQLite file (see ``store.Store`` for each method's meaning)."""

    def _task(self, row: sqlite3.Row) -> Task:
        return self._tasks([row])[0]

    def _tasks(self, rows: Sequence[sqlite3.Row]) -> list[Task]:
        """Rows of ``tasks`` (one query's: the same columns) as tasks. Columns are read by
        position, found once per query: by name, ``sqlite3.Row`` compares the name with every
        column before it, 26 times a row (half of a 200-task read's conversion). Positions come
        from the query, not the schema: a migrated file may hold its columns in another order."""
        if not rows:
            return []
        at = {k: i for i, k in enumerate(rows[0].keys())}
        cols = tuple((c, at[c]) for c in TASK_COLUMNS)
        i_id, i_spec, i_status, i_waiting = at["id"], at["spec"], at["status"], at["waiting"]
        i_asking = at.get("asking")  # not in a claim's RETURNING row: just claimed, nothing asked
        specs, texts = self._specs, self._spec_texts
        out = []
        for row in rows:
            kw = {c: row[i] for c, i in cols}
            kw["paused_running"] = bool(kw["paused_running"])
            tid = row[i_id]
            spec = specs.get(tid)
            text = row[i_spec]
            if spec is None or texts.get(tid) != text:  # parsed once per version (edit)
                spec = specs[tid] = spec_from_json(text)
                texts[tid] = text
            out.append(
                Task(
                    id=tid,
                    spec=spec,
                    status=TaskStatus(row[i_status]),
                    waiting=row[i_waiting],
                    asking=bool(row[i_asking]) if i_asking is not None else False,
                    **kw,
                )
            )
        return out

    def _get(self, db: sqlite3.Connection, task_id: str) -> Task | None:
        row = db.execute(self._TASK_SELECT + " WHERE t.id = ?", (task_id,)).fetchone()
        return self._task(row) if row else None

    # -- tasks ---------------------------------------------------------------------------------
    def add_tasks(self, specs: Sequence[TaskSpec], now: float) -> list[Task]:
        out: list[str] = []
        with self._tx() as db:
            rows = db.execute("SELECT name, id, status FROM tasks").fetchall()
            names = {r[0]: r[1] for r in rows}
            status = {r[0]: r[2] for r in rows}
            seq = db.execute("SELECT COALESCE(MAX(seqno), 0) FROM tasks").fetchone()[0]
            batch: dict[str, str] = {}
            for spec in specs:
                if spec.name in batch:
                    raise DuplicateName(f"two new tasks are named {spec.name!r}; name each one differently")
                if spec.name in names and status[spec.name] not in REUSABLE:
                    raise DuplicateName(taken_message(spec.name, status[spec.name]))
                batch[spec.name] = new_id()
            for spec in specs:
                if spec.name in names:  # a finished task frees its name; it keeps its id and records
                    db.execute("UPDATE tasks SET name = name || '~' || id WHERE id = ?", (names[spec.name],))
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

    def update_spec(self, task_id: str, spec: TaskSpec, now: float) -> Task | None:
        """Replace a queued task's spec (``fleet-tui edit``); None when it is no longer queued.
        A changed coder or model is resolved again at the next claim."""
        with self._tx() as db:
            row = db.execute(
                "SELECT spec FROM tasks WHERE id = ? AND status = 'queued'", (task_id,)
            ).fetchone()
            if row is None:
                return None
            old = spec_from_json(row["spec"])
            reset = (old.coder, old.model) != (spec.coder, spec.model)
            db.execute(
                "UPDATE tasks SET spec = ?, priority = ?, requires = ?, spec_coder = ?, spec_model = ?,"
                " coder = CASE WHEN ? THEN NULL ELSE coder END,"
                " model = CASE WHEN ? THEN NULL ELSE model END, updated_at = ? WHERE id = ?",
                (spec_to_json(spec), spec.priority, json.dumps(list(spec.requires)), spec.coder, spec.model,
                 reset, reset, now, task_id),
            )  # fmt: skip
            return self._get(db, task_id)

    def get_task(self, ref: str) -> Task | None:
        with self._lock:
            rows = self._q(self._TASK_SELECT + " WHERE t.id = ? OR t.name = ?", (ref, ref))
        return self._task(rows[0]) if rows else None

    def list_tasks(self, status: TaskStatus | None = None) -> list[Task]:
        if status is not None:
            rows = self._q(self._TASK_SELECT + " WHERE t.status = ? ORDER BY t.seqno", (status.value,))
        else:
            rows = self._q(self._TASK_SELECT + " ORDER BY t.seqno")
        return self._tasks(rows)

    def tasks_changed_since(self, marker: int | None) -> TaskChanges:
        with self._lock:  # the counter first: a row changed after it is read again next time
            now = int(self._q("SELECT n FROM revs WHERE name = 'tasks'")[0][0])
            if marker is None or marker > now:  # the first call, or another store file
                return TaskChanges(now, tuple(self.list_tasks()), full=True)
            if marker == now:
                return TaskChanges(now)
            rows = self._q(self._TASK_SELECT + " WHERE t.rev > ? ORDER BY t.seqno", (marker,))
            return TaskChanges(now, tuple(self._tasks(rows)))

    def task_names(self) -> set[str]:
        return {r[0] for r in self._q("SELECT name FROM tasks") if "~" not in r[0]}

    def dependents(self, task_id: str) -> list[Task]:
        rows = self._q(
            self._TASK_SELECT + " JOIN deps d ON d.task_id = t.id WHERE d.dep_id = ? ORDER BY t.seqno",
            (task_id,),
        )
        return self._tasks(rows)

    def dependencies(self, task_id: str) -> list[Task]:
        rows = self._q(
            self._TASK_SELECT + " JOIN deps d ON d.dep_id = t.id WHERE d.task_id = ? ORDER BY t.seqno",
            (task_id,),
        )
        return self._tasks(rows)

    def queued_stamps(self) -> dict[str, tuple[Any, ...]]:
        rows = self._q(
            "SELECT id, updated_at, attempt, not_before, priority, requires, spec_coder, spec_model,"
            " coder, model, length(spec) FROM tasks WHERE status = 'queued'"
        )
        return {str(t[0]): t[1:] for t in (tuple(r) for r in rows)}

    def unfinished_dependencies(self, touching: Collection[str] | None = None) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        if touching is None:
            for r in self._q(
                "SELECT d.task_id, u.name FROM deps d JOIN tasks q ON q.id = d.task_id"
                " JOIN tasks u ON u.id = d.dep_id WHERE q.status = 'queued' AND u.status != 'done'"
                " ORDER BY u.seqno"
            ):
                out.setdefault(r[0], []).append(r[1])
            return out
        ids = json.dumps(sorted(set(touching)))
        for r in self._q(
            "WITH ex(id) AS (SELECT t.id FROM tasks t WHERE t.status = 'queued'"
            " AND t.id IN (SELECT value FROM json_each(:ids))"
            " UNION SELECT d.task_id FROM deps d JOIN tasks q ON q.id = d.task_id"
            " WHERE q.status = 'queued' AND d.dep_id IN (SELECT value FROM json_each(:ids)))"
            " SELECT ex.id, u.name FROM ex LEFT JOIN deps d ON d.task_id = ex.id"
            " LEFT JOIN tasks u ON u.id = d.dep_id AND u.status != 'done' ORDER BY u.seqno",
            {"ids": ids},
        ):
            names = out.setdefault(r[0], [])
            if r[1] is not None:
                names.append(r[1])
        return out

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
        via: TaskStatus | None = None,
        record: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> Task | None:
        rec = attempt_record(record, owner, attempt)
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
            rows, entry = path_of(
                cur.status, dst, via, reason, now=now, finished_at=cur.finished_at, fields=fields
            )
            sets = {"status": dst.value, "reason": reason, "updated_at": now, **entry}
            cols = ", ".join(f"{k} = ?" for k in sets)
            n = db.execute(
                f"UPDATE tasks SET {cols} WHERE id = ? AND status = ? AND attempt = ?",
                (*sets.values(), task_id, cur.status.value, cur.attempt),
            ).rowcount
            if n != 1:
                return None
            db.executemany(
                "INSERT INTO transitions(task_id, ts, src, dst, reason, attempt, actor)"
                " VALUES (?,?,?,?,?,?,?)",
                [(task_id, now, a.value, b.value, why, cur.attempt, actor or owner) for a, b, why in rows],
            )
            if rec:
                cols = ", ".join(f"{k} = ?" for k in rec)
                db.execute(
                    f"UPDATE attempts SET {cols} WHERE task_id = ? AND n = ?",
                    (*rec.values(), task_id, cur.attempt),
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
        return self._tasks(rows)

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
    _PUT_ATTEMPT = (
        f"INSERT OR REPLACE INTO attempts ({', '.join(ATTEMPT_FIELDS)})"
        f" VALUES ({', '.join('?' * len(ATTEMPT_FIELDS))})"
    )

    def put_attempt(self, a: Attempt) -> None:
        with self._tx() as db:
            db.execute(self._PUT_ATTEMPT, attempt_values(a))

    def start_attempt(self, a: Attempt, workdir: str) -> None:
        with self._tx() as db:
            db.execute(self._PUT_ATTEMPT, attempt_values(a))
            db.execute(
                "UPDATE tasks SET workdir = ? WHERE id = ? AND owner = ? AND attempt = ?",
                (workdir, a.task_id, a.owner, a.n),
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
            return self._append(db, events, offset, owner)

    def append_events_batch(
        self, batches: Sequence[tuple[Sequence[Event], tuple[str, int, int]]], owner: str | None = None
    ) -> list[bool]:
        """Several attempts' events and offsets in one transaction (each fenced on its own)."""
        with self._tx() as db:
            return [self._append(db, events, offset, owner) for events, offset in batches]

    def _append(
        self,
        db: sqlite3.Connection,
        events: Sequence[Event],
        offset: tuple[str, int, int] | None,
        owner: str | None,
    ) -> bool:
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
