"""The shared store for several machines: the Store contract on PostgreSQL (psycopg 3).

Each machine runs ``fleet-tui run --store postgresql://...`` and a cockpit anywhere sees them
all. Behaviour mirrors ``sqlite_store`` exactly (one behavioural suite runs against both); what
differs is how concurrency is made safe without SQLite's single writer lock:

* a claim is one conditional ``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED)``, so
  racing engines take different tasks instead of queueing behind each other's row locks;
* a transition locks its row (``SELECT ... FOR UPDATE``), checks owner/attempt/expected state and
  the ALLOWED table, then updates and writes the transition row in the same transaction;
* names are unique by constraint, so two racing ``add``s cannot both queue the same name.

Connections, transactions, NOTIFY wake-ups and ``change_marker()`` live in ``postgres_base``;
the tables, migrations and URL forms (``?schema=NAME``) in ``postgres_schema``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

import psycopg
from psycopg.rows import DictRow

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
from fleet_tui.scheduler.states import TaskStatus, path_of
from fleet_tui.scheduler.store.postgres_base import PgBase, Tx
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

#: task columns a transition / update_task may set
_TASK_WRITABLE = frozenset(TASK_COLUMNS) | {"waiting", "priority"}
_ATTEMPT_WRITABLE = frozenset(ATTEMPT_COLUMNS)
#: an add of at least this many tasks refreshes the planner's statistics
_ANALYZE_BATCH = 20


def _val(col: str, v: Any) -> Any:
    if isinstance(v, Enum):
        return v.value
    if col == "paused_running":
        return int(bool(v))
    return v


def _sets(fields: dict[str, Any], writable: frozenset[str], what: str) -> tuple[str, list[Any]]:
    bad = set(fields) - writable
    if bad:
        raise StoreError(f"unknown {what} field(s): {', '.join(sorted(bad))}")
    return ", ".join(f"{k} = %s" for k in fields), [_val(k, v) for k, v in fields.items()]


class PostgresStore(PgBase):
    """The Store contract on PostgreSQL (see ``store.Store`` for each method's meaning).

    ``PostgresStore(url, schema=None, pool_size=8, fallback_s=30.0)``: see ``PgBase``.
    """

    _TASK_SELECT = (
        "SELECT t.*, EXISTS(SELECT 1 FROM questions q WHERE q.task_id = t.id AND q.status = 'pending')"
        " AS asking FROM tasks t"
    )

    @staticmethod
    def _task(row: DictRow) -> Task:
        kw = {c: row[c] for c in TASK_COLUMNS}
        kw["paused_running"] = bool(kw["paused_running"])
        return Task(
            id=row["id"],
            spec=spec_from_json(row["spec"]),
            status=TaskStatus(row["status"]),
            waiting=row["waiting"],
            asking=bool(row.get("asking", False)),
            **kw,
        )

    def _get(self, tx: Tx, task_id: str) -> Task | None:
        row = tx.one(self._TASK_SELECT + " WHERE t.id = %s", (task_id,))
        return self._task(row) if row else None

    # -- tasks ---------------------------------------------------------------------------------
    def update_spec(self, task_id: str, spec: TaskSpec, now: float) -> Task | None:
        """Replace a queued task's spec (``fleet-tui edit``); None when it is no longer queued."""
        with self._tx() as tx:
            row = tx.execute(
                "SELECT spec FROM tasks WHERE id = %s AND status = 'queued' FOR UPDATE", (task_id,)
            ).fetchone()
            if row is None:
                return None
            old = spec_from_json(row["spec"])
            reset = (old.coder, old.model) != (spec.coder, spec.model)
            tx.execute(
                "UPDATE tasks SET spec = %s, priority = %s, requires = %s, spec_coder = %s, spec_model = %s,"
                " coder = CASE WHEN %s THEN NULL ELSE coder END,"
                " model = CASE WHEN %s THEN NULL ELSE model END, updated_at = %s WHERE id = %s",
                (spec_to_json(spec), spec.priority, list(spec.requires), spec.coder, spec.model,
                 reset, reset, now, task_id),
            )  # fmt: skip
        return self.get_task(task_id)

    def add_tasks(self, specs: Sequence[TaskSpec], now: float) -> list[Task]:
        out: list[str] = []
        wanted = sorted({s.name for s in specs} | {d for s in specs for d in s.depends_on})
        try:
            with self._tx() as tx:
                rows = tx.execute(
                    "SELECT name, id, status FROM tasks WHERE name = ANY(%s)", (wanted,)
                ).fetchall()
                names = {r["name"]: r["id"] for r in rows}
                status = {r["name"]: r["status"] for r in rows}
                batch: dict[str, str] = {}
                for spec in specs:
                    if spec.name in batch:
                        raise self._duplicate(spec.name)
                    if spec.name in names and status[spec.name] not in REUSABLE:
                        raise DuplicateName(taken_message(spec.name, status[spec.name]))
                    batch[spec.name] = new_id()
                for spec in specs:
                    if spec.name in names:  # a finished task frees its name; it keeps its id and records
                        tx.execute(
                            "UPDATE tasks SET name = name || '~' || id WHERE id = %s", (names[spec.name],)
                        )
                for spec in specs:
                    tid = batch[spec.name]
                    tx.execute(
                        "INSERT INTO tasks (id, name, spec, status, priority, requires, spec_coder,"
                        " spec_model, attempt, retries_used, handoffs, false_completions, created_at,"
                        " updated_at, tokens, cost_usd, paused_running)"
                        " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,0,0,0,0,%s,%s,0,0,0)",
                        (
                            tid,
                            spec.name,
                            spec_to_json(spec),
                            TaskStatus.QUEUED.value,
                            spec.priority,
                            list(spec.requires),
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
                        tx.execute(
                            "INSERT INTO deps(task_id, dep_id) VALUES (%s,%s) ON CONFLICT DO NOTHING",
                            (tid, dep_id),
                        )
                    tx.execute(
                        "INSERT INTO transitions(task_id, ts, src, dst, reason, attempt, actor)"
                        " VALUES (%s,%s,NULL,'queued','added',0,NULL)",
                        (tid, now),
                    )
                    out.append(tid)
                added = [t for t in (self._get(tx, i) for i in out) if t]
        except StoreError as e:
            # a concurrent add took the name between our check and our insert
            cause = e.__cause__
            if (
                isinstance(cause, psycopg.errors.UniqueViolation)
                and cause.diag.constraint_name == "tasks_name_key"
            ):
                m = re.search(r"\(name\)=\((.*)\) already exists", cause.diag.message_detail or "")
                raise self._duplicate(m.group(1) if m else "?") from e
            raise
        if len(specs) >= _ANALYZE_BATCH:
            self._analyze()
        return added

    def _analyze(self) -> None:
        """Refresh the planner's statistics after a bulk load: with stale ones (autovacuum runs a
        minute later) the claim sorts every queued task instead of walking ``tasks_ready``."""
        try:
            self._run("ANALYZE tasks, deps")
        except StoreError:
            pass  # only a speed-up

    @staticmethod
    def _duplicate(name: str) -> DuplicateName:
        return DuplicateName(
            f"a task named {name!r} already exists; choose another name (or cancel/retry the existing one)"
        )

    def get_task(self, ref: str) -> Task | None:
        rows = self._all(
            self._TASK_SELECT + " WHERE t.id = %s OR t.name = %s ORDER BY (t.id = %s) DESC", (ref, ref, ref)
        )
        return self._task(rows[0]) if rows else None

    def list_tasks(self, status: TaskStatus | None = None) -> list[Task]:
        if status is not None:
            rows = self._all(self._TASK_SELECT + " WHERE t.status = %s ORDER BY t.seqno", (status.value,))
        else:
            rows = self._all(self._TASK_SELECT + " ORDER BY t.seqno")
        return [self._task(r) for r in rows]

    def tasks_changed_since(self, marker: int | None) -> TaskChanges:
        # no change counter here yet: every task, each time (correct; not incremental)
        return TaskChanges(0, tuple(self.list_tasks()), full=True, incremental=False)

    def task_names(self) -> set[str]:
        return {r["name"] for r in self._all("SELECT name FROM tasks") if "~" not in r["name"]}

    def dependents(self, task_id: str) -> list[Task]:
        rows = self._all(
            self._TASK_SELECT + " JOIN deps d ON d.task_id = t.id WHERE d.dep_id = %s ORDER BY t.seqno",
            (task_id,),
        )
        return [self._task(r) for r in rows]

    def dependencies(self, task_id: str) -> list[Task]:
        rows = self._all(
            self._TASK_SELECT + " JOIN deps d ON d.dep_id = t.id WHERE d.task_id = %s ORDER BY t.seqno",
            (task_id,),
        )
        return [self._task(r) for r in rows]

    def queued_stamps(self) -> dict[str, tuple[Any, ...]]:
        rows = self._all(
            "SELECT id, updated_at, attempt, not_before, priority, requires, spec_coder, spec_model,"
            " coder, model, length(spec) FROM tasks WHERE status = 'queued'"
        )
        return {str(t[0]): t[1:] for t in (tuple(r.values()) for r in rows)}

    def unfinished_dependencies(self, touching: Collection[str] | None = None) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        if touching is None:
            for r in self._all(
                "SELECT d.task_id AS task_id, u.name AS name FROM deps d JOIN tasks q ON q.id = d.task_id"
                " JOIN tasks u ON u.id = d.dep_id WHERE q.status = 'queued' AND u.status <> 'done'"
                " ORDER BY u.seqno"
            ):
                out.setdefault(str(r["task_id"]), []).append(str(r["name"]))
            return out
        ids = sorted(set(touching))
        for r in self._all(
            "WITH ex(id) AS (SELECT t.id FROM tasks t WHERE t.status = 'queued' AND t.id = ANY(%s)"
            " UNION SELECT d.task_id FROM deps d JOIN tasks q ON q.id = d.task_id"
            " WHERE q.status = 'queued' AND d.dep_id = ANY(%s))"
            " SELECT ex.id AS task_id, u.name AS name FROM ex LEFT JOIN deps d ON d.task_id = ex.id"
            " LEFT JOIN tasks u ON u.id = d.dep_id AND u.status <> 'done' ORDER BY u.seqno",
            (ids, ids),
        ):
            names = out.setdefault(str(r["task_id"]), [])
            if r["name"] is not None:
                names.append(str(r["name"]))
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
            "tags": sorted(set(tags)),
            "excl": sorted(set(exclude_coders)),
            "only": only_task,
        }
        text = f"""
UPDATE tasks SET status = 'running', attempt = attempt + 1, owner = %(owner)s, host = %(host)s,
  lease_until = %(lease)s, coder = COALESCE(coder, spec_coder, %(dc)s::text),
  model = COALESCE(model, spec_model, %(dm)s::text), started_at = COALESCE(started_at, %(now)s),
  attempt_started_at = %(now)s, updated_at = %(now)s, waiting = NULL, reason = NULL, finished_at = NULL
WHERE id = (
  SELECT t.id FROM tasks t
  WHERE t.status = 'queued' AND (t.not_before IS NULL OR t.not_before <= %(now)s)
    {"AND t.id = %(only)s" if only_task else ""}
    AND NOT EXISTS (SELECT 1 FROM deps d JOIN tasks u ON u.id = d.dep_id
                    WHERE d.task_id = t.id AND u.status <> 'done')
    AND t.requires <@ %(tags)s::text[]
    AND NOT (COALESCE(t.coder, t.spec_coder, %(dc)s::text) = ANY(%(excl)s::text[]))
  ORDER BY t.priority DESC, t.seqno LIMIT 1
  FOR UPDATE OF t SKIP LOCKED
) AND status = 'queued'
RETURNING id, attempt"""
        with self._tx() as tx:
            row = tx.one(text, args)
            if row is None:
                return None
            tx.execute(
                "INSERT INTO transitions(task_id, ts, src, dst, reason, attempt, actor)"
                " VALUES (%s,%s,'queued','running','claimed',%s,%s)",
                (row["id"], now, row["attempt"], owner),
            )
            return self._get(tx, row["id"])

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
        with self._tx() as tx:
            row = tx.one(
                "SELECT status, owner, attempt, finished_at FROM tasks WHERE id = %s FOR UPDATE", (task_id,)
            )
            if row is None:
                return None
            src = TaskStatus(row["status"])
            if owner is not None and row["owner"] != owner:
                return None
            if attempt is not None and row["attempt"] != attempt:
                return None
            if expect is not None and src not in set(expect):
                return None
            done_at = row["finished_at"]
            rows, entry = path_of(src, dst, via, reason, now=now, finished_at=done_at, fields=fields)
            sets: dict[str, Any] = {"reason": reason, "updated_at": now, **entry}
            cols, vals = _sets(sets, _TASK_WRITABLE, "task")
            tx.execute(f"UPDATE tasks SET status = %s, {cols} WHERE id = %s", (dst.value, *vals, task_id))
            for a, b, why in rows:
                tx.execute(
                    "INSERT INTO transitions(task_id, ts, src, dst, reason, attempt, actor)"
                    " VALUES (%s,%s,%s,%s,%s,%s,%s)",
                    (task_id, now, a.value, b.value, why, row["attempt"], actor or owner),
                )
            if rec:
                cols, vals = _sets(rec, _ATTEMPT_WRITABLE, "attempt")
                tx.execute(
                    f"UPDATE attempts SET {cols} WHERE task_id = %s AND n = %s",
                    (*vals, task_id, row["attempt"]),
                )
            return self._get(tx, task_id)

    def update_task(
        self, task_id: str, *, owner: str | None = None, attempt: int | None = None, **fields: Any
    ) -> Task | None:
        if not fields:
            return self.get_task(task_id)
        where = "id = %s"
        args: list[Any] = [task_id]
        if owner is not None:
            where += " AND owner = %s"
            args.append(owner)
        if attempt is not None:
            where += " AND attempt = %s"
            args.append(attempt)
        cols, vals = _sets(fields, _TASK_WRITABLE, "task")
        with self._tx() as tx:
            n = tx.execute(f"UPDATE tasks SET {cols} WHERE {where}", (*vals, *args)).rowcount
            return self._get(tx, task_id) if n else None

    def set_waiting(self, reasons: dict[str, str | None]) -> None:
        """Record the waiting reason of queued tasks (only rows whose reason changed)."""
        if not reasons:
            return
        with self._tx() as tx:
            # rows are locked in id order: two engines refreshing overlapping sets cannot deadlock
            tx.execute(
                "WITH l AS (SELECT t.id, r.why FROM tasks t"
                " JOIN unnest(%s::text[], %s::text[]) AS r(id, why) ON r.id = t.id"
                " WHERE t.status = 'queued' AND t.waiting IS DISTINCT FROM r.why"
                " ORDER BY t.id FOR UPDATE OF t)"
                " UPDATE tasks t SET waiting = l.why FROM l WHERE t.id = l.id AND t.status = 'queued'",
                (list(reasons), list(reasons.values())),
            )

    def transitions(self, task_id: str) -> list[Transition]:
        rows = self._all(
            "SELECT task_id, ts, src, dst, reason, attempt, actor FROM transitions"
            " WHERE task_id = %s ORDER BY id",
            (task_id,),
        )
        return [Transition(**r) for r in rows]

    # -- engines and leases --------------------------------------------------------------------
    def register_engine(self, owner: str, host: str, pid: int, pid_create_time: float, now: float) -> None:
        with self._tx() as tx:
            tx.execute(
                "INSERT INTO engines(owner, host, pid, pid_create_time, heartbeat, started_at,"
                " stopped) VALUES (%s,%s,%s,%s,%s,%s,0) ON CONFLICT (owner) DO UPDATE SET"
                " host = EXCLUDED.host,"
                " pid = EXCLUDED.pid, pid_create_time = EXCLUDED.pid_create_time,"
                " heartbeat = EXCLUDED.heartbeat, started_at = EXCLUDED.started_at, stopped = 0",
                (owner, host, pid, pid_create_time, now, now),
            )

    def heartbeat(self, owner: str, now: float, lease_s: float) -> int:
        with self._tx() as tx:
            tx.execute("UPDATE engines SET heartbeat = %s WHERE owner = %s", (now, owner))
            # the rows locked in id order first (as append_events_batch does): no deadlock
            tx.execute(
                "SELECT id FROM tasks WHERE owner = %s AND status IN ('running', 'verifying', 'paused')"
                " ORDER BY id FOR UPDATE",
                (owner,),
            )
            return tx.execute(
                "UPDATE tasks SET lease_until = GREATEST(COALESCE(lease_until, 0), %s) WHERE owner = %s"
                " AND status IN ('running', 'verifying', 'paused')",
                (now + lease_s, owner),
            ).rowcount

    def extend_lease(self, task_id: str, owner: str, until: float) -> bool:
        with self._tx() as tx:
            return (
                tx.execute(
                    "UPDATE tasks SET lease_until = GREATEST(COALESCE(lease_until, 0), %s)"
                    " WHERE id = %s AND owner = %s",
                    (until, task_id, owner),
                ).rowcount
                == 1
            )

    def engine_info(self, owner: str) -> dict[str, Any] | None:
        rows = self._all("SELECT * FROM engines WHERE owner = %s", (owner,))
        return dict(rows[0]) if rows else None

    def live_engines(self, now: float, stale_s: float) -> list[dict[str, Any]]:
        rows = self._all(
            "SELECT * FROM engines WHERE stopped = 0 AND heartbeat >= %s ORDER BY owner", (now - stale_s,)
        )
        return [dict(r) for r in rows]

    def unregister_engine(self, owner: str, now: float) -> None:
        with self._tx() as tx:
            tx.execute("UPDATE engines SET stopped = 1, heartbeat = %s WHERE owner = %s", (now, owner))

    def orphaned_tasks(self, now: float, stale_s: float) -> list[Task]:
        rows = self._all(
            self._TASK_SELECT + " LEFT JOIN engines e ON e.owner = t.owner"
            " WHERE (t.status IN ('running', 'verifying') OR (t.status = 'paused' AND t.paused_running = 1))"
            " AND (e.owner IS NULL OR e.stopped = 1 OR e.heartbeat < %s) ORDER BY t.seqno",
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
        cond = " AND (lease_until IS NULL OR lease_until < %(now)s)" if require_lease_expired else ""
        with self._tx() as tx:
            n = tx.execute(
                "UPDATE tasks SET owner = %(new)s, host = %(host)s, lease_until = %(lease)s,"
                " updated_at = %(now)s WHERE id = %(id)s AND owner IS NOT DISTINCT FROM %(old)s::text"
                " AND attempt = %(attempt)s" + cond,
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
            cur = self._get(tx, task_id)
            assert cur is not None
            tx.execute(
                "INSERT INTO transitions(task_id, ts, src, dst, reason, attempt, actor)"
                " VALUES (%s,%s,%s,%s,%s,%s,%s)",
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
        f"INSERT INTO attempts ({', '.join(ATTEMPT_FIELDS)})"
        f" VALUES ({', '.join(['%s'] * len(ATTEMPT_FIELDS))})"
        f" ON CONFLICT (task_id, n) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in ATTEMPT_COLUMNS)}"
    )

    def put_attempt(self, a: Attempt) -> None:
        with self._tx() as tx:
            tx.execute(self._PUT_ATTEMPT, attempt_values(a))

    def start_attempt(self, a: Attempt, workdir: str) -> None:
        with self._tx() as tx:
            tx.execute(self._PUT_ATTEMPT, attempt_values(a))
            tx.execute(
                "UPDATE tasks SET workdir = %s WHERE id = %s AND owner = %s AND attempt = %s",
                (workdir, a.task_id, a.owner, a.n),
            )

    def update_attempt(self, task_id: str, n: int, *, owner: str | None = None, **fields: Any) -> bool:
        if not fields:
            return True
        cols, vals = _sets(fields, _ATTEMPT_WRITABLE, "attempt")
        fence, extra = "", tuple[Any, ...]()
        if owner is not None:
            fence = " AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = %s AND t.owner = %s AND t.attempt = %s)"
            extra = (task_id, owner, n)
        with self._tx() as tx:
            cur = tx.execute(
                f"UPDATE attempts SET {cols} WHERE task_id = %s AND n = %s{fence}",
                (*vals, task_id, n, *extra),
            )
            return bool(cur.rowcount)

    @staticmethod
    def _attempt(r: DictRow) -> Attempt:
        return Attempt(task_id=r["task_id"], n=r["n"], **{c: r[c] for c in ATTEMPT_COLUMNS})

    def get_attempt(self, task_id: str, n: int) -> Attempt | None:
        rows = self._all("SELECT * FROM attempts WHERE task_id = %s AND n = %s", (task_id, n))
        return self._attempt(rows[0]) if rows else None

    def attempts(self, task_id: str) -> list[Attempt]:
        return [
            self._attempt(r)
            for r in self._all("SELECT * FROM attempts WHERE task_id = %s ORDER BY n", (task_id,))
        ]

    # -- events --------------------------------------------------------------------------------
    def append_events(
        self, events: Sequence[Event], *, offset: tuple[str, int, int] | None = None, owner: str | None = None
    ) -> bool:
        if not events and offset is None:
            return True
        with self._tx() as tx:
            return self._append(tx, events, offset, owner)

    def append_events_batch(
        self, batches: Sequence[tuple[Sequence[Event], tuple[str, int, int]]], owner: str | None = None
    ) -> list[bool]:
        """Several attempts' events and offsets in one transaction (each fenced on its own).

        Rows are locked in task id order, like ``heartbeat`` does: two transactions that lock
        the same tasks in different orders deadlock."""
        order = sorted(range(len(batches)), key=lambda i: (batches[i][1][0], batches[i][1][1]))
        out = [False] * len(batches)
        with self._tx() as tx:
            for i in order:
                events, offset = batches[i]
                out[i] = self._append(tx, events, offset, owner)
        return out

    @staticmethod
    def _append(
        tx: Any, events: Sequence[Event], offset: tuple[str, int, int] | None, owner: str | None
    ) -> bool:
        if owner is not None and offset is not None:
            row = tx.execute(
                "SELECT 1 FROM tasks WHERE id = %s AND owner = %s AND attempt = %s FOR SHARE",
                (offset[0], owner, offset[1]),
            ).fetchone()
            if row is None:
                return False  # the claim was lost: a late writer changes nothing
        if events:
            tx.executemany(
                "INSERT INTO events(task_id, attempt, seq, ts, kind, text, payload)"
                " VALUES (%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING",
                [(e.task_id, e.attempt, e.seq, e.ts, e.kind, e.text, event_payload(e)) for e in events],
            )
        if offset is not None:
            tid, n, off = offset
            nxt = max((e.seq for e in events), default=-1) + 1
            tx.execute(
                "UPDATE attempts SET stdout_offset = %s, next_seq = GREATEST(next_seq, %s)"
                " WHERE task_id = %s AND n = %s",
                (off, nxt, tid, n),
            )
        return True

    @staticmethod
    def _event(r: DictRow) -> Event:
        return event_from_row(
            r["task_id"], r["attempt"], r["seq"], r["ts"], r["kind"], r["text"], r["payload"]
        )

    def events(
        self,
        task_id: str,
        attempt: int | None = None,
        after: tuple[int, int] | None = None,
        limit: int = 10_000,
    ) -> list[Event]:
        text = "SELECT * FROM events WHERE task_id = %s"
        args: list[Any] = [task_id]
        if attempt is not None:
            text += " AND attempt = %s"
            args.append(attempt)
        if after is not None:
            text += " AND (attempt, seq) > (%s, %s)"
            args += [after[0], after[1]]
        text += " ORDER BY attempt, seq LIMIT %s"
        args.append(limit)
        return [self._event(r) for r in self._all(text, args)]

    def last_events(self, task_id: str, limit: int) -> list[Event]:
        rows = self._all(
            "SELECT * FROM (SELECT * FROM events WHERE task_id = %s ORDER BY attempt DESC,"
            " seq DESC LIMIT %s) AS last ORDER BY attempt, seq",
            (task_id, limit),
        )
        return [self._event(r) for r in rows]

    # -- questions -----------------------------------------------------------------------------
    @staticmethod
    def _question(r: DictRow) -> Question:
        d = dict(r)
        d["options"] = tuple(d["options"] or ())
        return Question(**d)

    def add_question(
        self, task_id: str, attempt: int, text: str, options: Sequence[str], now: float
    ) -> Question:
        qid = new_id("q")
        with self._tx() as tx:
            row = tx.one(
                "INSERT INTO questions(id, task_id, attempt, asked_at, text, options, status)"
                " VALUES (%s,%s,%s,%s,%s,%s,'pending') RETURNING *",
                (qid, task_id, attempt, now, text, list(options)),
            )
            assert row is not None
            return self._question(row)

    def get_question(self, qid: str) -> Question | None:
        rows = self._all("SELECT * FROM questions WHERE id = %s", (qid,))
        return self._question(rows[0]) if rows else None

    def answer_question(self, qid: str, answer: str, by: str, now: float) -> bool:
        with self._tx() as tx:
            return (
                tx.execute(
                    "UPDATE questions SET status = 'answered', answer = %s, answered_at = %s,"
                    " answered_by = %s WHERE id = %s AND status = 'pending'",
                    (answer, now, by, qid),
                ).rowcount
                == 1
            )

    def close_questions(self, task_id: str, status: str, now: float) -> int:
        with self._tx() as tx:
            return tx.execute(
                "UPDATE questions SET status = %s, answered_at = %s WHERE task_id = %s"
                " AND status = 'pending'",
                (status, now, task_id),
            ).rowcount

    def expire_question(self, qid: str, now: float) -> bool:
        with self._tx() as tx:
            return (
                tx.execute(
                    "UPDATE questions SET status = 'expired', answered_at = %s WHERE id = %s"
                    " AND status = 'pending'",
                    (now, qid),
                ).rowcount
                == 1
            )

    def pending_questions(self) -> list[Question]:
        return [
            self._question(r)
            for r in self._all("SELECT * FROM questions WHERE status = 'pending' ORDER BY asked_at, id")
        ]

    def questions(self, task_id: str) -> list[Question]:
        return [
            self._question(r)
            for r in self._all("SELECT * FROM questions WHERE task_id = %s ORDER BY asked_at, id", (task_id,))
        ]

    # -- hosts, settings, rate limits, commands --------------------------------------------------
    def upsert_host(self, h: Host) -> None:
        with self._tx() as tx:
            tx.execute(
                "INSERT INTO hosts(name, heartbeat, cores, load, mem_available, disk_free, running,"
                " tags, version) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (name) DO UPDATE SET"
                " heartbeat = EXCLUDED.heartbeat, cores = EXCLUDED.cores, load = EXCLUDED.load,"
                " mem_available = EXCLUDED.mem_available, disk_free = EXCLUDED.disk_free,"
                " running = EXCLUDED.running, tags = EXCLUDED.tags, version = EXCLUDED.version",
                (
                    h.name,
                    h.heartbeat,
                    h.cores,
                    h.load,
                    h.mem_available,
                    h.disk_free,
                    h.running,
                    list(h.tags),
                    h.version,
                ),
            )

    def hosts(self) -> list[Host]:
        out = []
        for r in self._all("SELECT * FROM hosts ORDER BY name"):
            d = dict(r)
            d["tags"] = tuple(d["tags"] or ())
            out.append(Host(**d))
        return out

    def get_setting(self, key: str) -> str | None:
        rows = self._all("SELECT value FROM settings WHERE key = %s", (key,))
        return rows[0]["value"] if rows else None

    def set_setting(self, key: str, value: str | None) -> None:
        with self._tx() as tx:
            if value is None:
                tx.execute("DELETE FROM settings WHERE key = %s", (key,))
            else:
                tx.execute(
                    "INSERT INTO settings(key, value) VALUES (%s,%s)"
                    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    (key, value),
                )

    def settings_with_prefix(self, prefix: str) -> dict[str, str]:
        # not a key range: under a locale's collation ':' may weigh nothing
        rows = self._all("SELECT key, value FROM settings WHERE starts_with(key, %s)", (prefix,))
        return {str(r["key"]): str(r["value"]) for r in rows if r["value"] is not None}

    def put_rate_limit(self, rl: RateLimit, blocked_until: float | None) -> None:
        with self._tx() as tx:
            tx.execute(
                'INSERT INTO rate_limits(account, status, utilization, resets_at, "window",'
                " observed_at, blocked_until) VALUES (%s,%s,%s,%s,%s,%s,%s)"
                " ON CONFLICT (account) DO UPDATE SET status = EXCLUDED.status,"
                " utilization = EXCLUDED.utilization, resets_at = EXCLUDED.resets_at,"
                ' "window" = EXCLUDED."window", observed_at = EXCLUDED.observed_at,'
                " blocked_until = EXCLUDED.blocked_until",
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
        for r in self._all("SELECT * FROM rate_limits ORDER BY account"):
            d = dict(r)
            blocked = d.pop("blocked_until")
            out.append((RateLimit(**d), blocked))
        return out

    def add_command(
        self, task_id: str | None, verb: str, arg: str | None, target_owner: str | None, now: float
    ) -> int:
        with self._tx() as tx:
            row = tx.one(
                "INSERT INTO commands(task_id, verb, arg, created_at, target_owner)"
                " VALUES (%s,%s,%s,%s,%s) RETURNING id",
                (task_id, verb, arg, now, target_owner),
            )
            assert row is not None
            return int(row["id"])

    def pending_commands(self, owner: str) -> list[Command]:
        rows = self._all(
            "SELECT * FROM commands WHERE status = 'pending' AND target_owner = %s ORDER BY id", (owner,)
        )
        return [Command(**r) for r in rows]

    def finish_command(self, cid: int, status: str, result: str | None) -> None:
        with self._tx() as tx:
            tx.execute("UPDATE commands SET status = %s, result = %s WHERE id = %s", (status, result, cid))

    def get_command(self, cid: int) -> Command | None:
        rows = self._all("SELECT * FROM commands WHERE id = %s", (cid,))
        return Command(**rows[0]) if rows else None

    def spent_since(self, since: float) -> float:
        rows = self._all(
            "SELECT COALESCE(SUM(cost_usd), 0) AS s FROM attempts WHERE started_at >= %s", (since,)
        )
        return float(rows[0]["s"] or 0.0)
