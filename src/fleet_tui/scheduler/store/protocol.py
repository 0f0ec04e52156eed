"""The Store contract: the durable queue every engine, CLI command and cockpit shares.

Two implementations keep the same behaviour (one behavioural test suite runs against both):
``sqlite_store`` (embedded, the default) and ``postgres_store`` (several machines). All methods
are synchronous; the engine calls them through ``anyio.to_thread`` so a write that waits on a lock
never blocks the event loop.

Fencing: every write made on behalf of a running attempt carries ``owner`` and ``attempt``; such a
write that matches no row returns None / False, which means the claim was lost and the caller must
stop its agent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from fleet_tui.scheduler.model import (
    Attempt,
    Command,
    Event,
    Host,
    NotifyStats,
    Question,
    RateLimit,
    Task,
    TaskSpec,
    Transition,
    Usage,
    VerifySpec,
)
from fleet_tui.scheduler.states import TaskStatus


class StoreError(RuntimeError):
    """A store problem a user can act on (the message names the problem and the fix)."""


class DuplicateName(StoreError):
    pass


#: columns of the tasks table that map 1:1 to Task fields (besides id/spec/status)
TASK_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in fields(Task) if f.name not in ("id", "spec", "status", "waiting", "asking")
)

#: columns of the attempts table (besides task_id, n)
ATTEMPT_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Attempt) if f.name not in ("task_id", "n"))
#: every field of an attempt, in the order ``attempt_values`` gives them
ATTEMPT_FIELDS: tuple[str, ...] = ("task_id", "n", *ATTEMPT_COLUMNS)


def attempt_values(a: Attempt) -> tuple[Any, ...]:
    """An attempt's values in ``ATTEMPT_FIELDS`` order (``asdict`` would deep-copy each one)."""
    return tuple(getattr(a, f) for f in ATTEMPT_FIELDS)


def attempt_record(
    record: Mapping[str, Any] | None, owner: str | None, attempt: int | None
) -> dict[str, Any]:
    """The attempt-record fields a ``transition`` writes along (checked: only known columns, and
    only with a move fenced by owner and attempt, the claim that makes the record this engine's)."""
    if not record:
        return {}
    if owner is None or attempt is None:
        raise ValueError("an attempt's record is written only with a move fenced by owner and attempt")
    unknown = set(record) - set(ATTEMPT_COLUMNS)
    if unknown:
        raise ValueError(f"not attempt columns: {', '.join(sorted(unknown))}")
    return dict(record)


# Starts at a random value per process: two processes adding tasks in the same millisecond would
# otherwise share the counter's value and rely on 16 random bits alone (a collision was seen).


#: a task in one of these states frees its name: a new task may take it (the old one keeps its id,
#: its records and its place in the views; commands by name act on the newest)
REUSABLE = ("done", "cancelled")


def taken_message(name: str, status: str) -> str:
    """Why a new task cannot take ``name``: an unfinished task has it."""
    return (
        f"a task named {name!r} is {status}: names are unique among unfinished tasks; choose another "
        "name, or let that task finish (or cancel it) first"
    )


_last_id = [0, 0]  # (ms, counter) of this process's last id
_id_lock = threading.Lock()


def after(prefix: str) -> str:
    """The least string greater than every string starting with ``prefix`` (non-empty): a key
    range ``[prefix, after(prefix))`` finds them by the index, with no ``LIKE`` to escape."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def new_id(prefix: str = "t") -> str:
    """A short, roughly time-ordered, unique id: <prefix>-<8 hex of ms><2 hex counter><4 hex random>.

    Within a process (ms, counter) never repeats: past 256 ids in one millisecond the id borrows
    the next millisecond, so a batch of thousands cannot collide; the random part keeps ids of
    different processes apart."""
    with _id_lock:
        ms = int(time.time() * 1000)
        last_ms, last_n = _last_id
        if ms <= last_ms:
            ms, n = (last_ms, last_n + 1) if last_n < 0xFF else (last_ms + 1, 0)
        else:
            n = 0
        _last_id[:] = [ms, n]
    return f"{prefix}-{ms & 0xFFFFFFFF:08x}{n:02x}{os.urandom(2).hex()}"


#: the dataclasses' field names, read once: these run for every task read and every event
#: written or read (thousands a second from a loud fleet), and ``fields`` builds its tuple anew
_SPEC_FIELDS = frozenset(f.name for f in fields(TaskSpec))
_EVENT_FIELDS = frozenset(f.name for f in fields(Event))
#: ``json.dumps(..., default=str)`` without making a new encoder for every event
_PAYLOAD_JSON = json.JSONEncoder(default=str)


def _payload_encoder() -> Callable[[Any], str]:
    """``_PAYLOAD_JSON.encode`` without its per-call set-up: the C encoder it builds for every
    call, built once (5.3 -> 1.6 us for a usage event's payload, two of which a Claude line
    makes). Without the circular-reference markers, as ``json.dumps(check_circular=False)``:
    a payload comes from parsed JSON and dataclasses, and a cycle would still end (in a
    RecursionError) rather than loop. Where the C encoder is missing or takes other arguments
    (not CPython 3.11-3.13), or encodes differently, the standard ``encode``."""
    make = getattr(json.encoder, "c_make_encoder", None)
    standard: Callable[[Any], str] = _PAYLOAD_JSON.encode
    if make is None:
        return standard
    try:
        iterencode = make(
            None, str, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True
        )
    except TypeError:
        return standard

    def encode(o: Any) -> str:
        return "".join(iterencode(o, 0))

    sample = {"usage": {"input_tokens": 3}, "raw": ["é", 1.5, None, True, {"k": float("nan")}], "x": 2**70}
    try:
        return encode if encode(sample) == standard(sample) else standard
    except Exception:  # pragma: no cover - another interpreter's encoder
        return standard


_encode_payload = _payload_encoder()
#: an event's fields beyond its columns (task_id, attempt, seq, ts, kind, text): its payload
_EVENT_EXTRA = tuple(
    f.name
    for f in fields(Event)
    if f.name not in ("task_id", "attempt", "seq", "ts", "kind", "text", "raw_json")
)


def spec_to_json(spec: TaskSpec) -> str:
    return json.dumps(asdict(spec), sort_keys=True)


def spec_from_json(text: str) -> TaskSpec:
    d = json.loads(text)
    d["verify"] = tuple(
        VerifySpec(**{**v, "contains": tuple(v.get("contains") or ())}) for v in d.get("verify") or ()
    )
    for k in ("depends_on", "requires", "sandbox_rw", "sandbox_ro"):
        d[k] = tuple(d.get(k) or ())
    if isinstance(d.get("network"), list):
        d["network"] = tuple(d["network"])
    d["env"] = tuple(tuple(p) for p in d.get("env") or ())
    return TaskSpec(**{k: v for k, v in d.items() if k in _SPEC_FIELDS})


def event_payload(e: Event) -> str:
    """The event's fields beyond (task_id, attempt, seq, ts, kind, text) as JSON."""
    d: dict[str, Any] = {}
    for name in _EVENT_EXTRA:
        v = getattr(e, name)
        if v is None or v is False:
            continue
        if isinstance(v, Usage | RateLimit):  # flat: their fields, in order (``asdict`` copies deep)
            v = dict(vars(v))
        d[name] = v
    raw_json = e.raw_json
    if raw_json is not None and "raw" in d:  # raw is last: its text as the agent printed it
        del d["raw"]
        return (_encode_payload(d)[:-1] + ", " if d else "{") + '"raw": ' + raw_json + "}"
    return _encode_payload(d) if d else "{}"  # most events carry nothing beyond their text


def event_from_row(
    task_id: str, attempt: int, seq: int, ts: float, kind: str, text: str | None, payload: str | None
) -> Event:
    d = json.loads(payload) if payload else {}
    if "usage" in d and isinstance(d["usage"], dict):
        d["usage"] = Usage(**d["usage"])
    if "rate_limit" in d and isinstance(d["rate_limit"], dict):
        d["rate_limit"] = RateLimit(**d["rate_limit"])
    d = {k: v for k, v in d.items() if k in _EVENT_FIELDS}
    return Event(task_id=task_id, attempt=attempt, seq=seq, ts=ts, kind=kind, text=text, **d)


def is_nfs(path: str, mounts: str = "/proc/mounts") -> bool:
    """True when ``path`` lives on an NFS (or other network) mount, where SQLite locking lies."""
    try:
        real = os.path.realpath(path)
        best, fstype = "", ""
        with open(mounts, encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, fstype = mnt, parts[2]
        return fstype.startswith(("nfs", "cifs", "smb", "9p", "fuse.sshfs"))
    except OSError:
        return False


@dataclass(frozen=True)
class TaskChanges:
    """The answer of ``Store.tasks_changed_since``: what to apply to a copy of the task list."""

    #: hand this back next time
    marker: int
    #: tasks added or changed since the marker, in queue order (every task when ``full``)
    tasks: tuple[Task, ...] = ()
    #: ``tasks`` is every task (the first call, or a store that cannot tell what changed)
    full: bool = False
    #: False: this store cannot tell what changed (every answer is ``full``): a caller that needs
    #: only part of the list (the planner: the queue) does better asking for that part
    incremental: bool = True


class Store(Protocol):
    """What an engine, a CLI command or a cockpit may ask of the durable queue."""

    url: str

    # -- tasks -------------------------------------------------------------------------------
    def add_tasks(self, specs: Sequence[TaskSpec], now: float) -> list[Task]:
        """Queue all of them in one transaction, or none (DuplicateName / StoreError)."""
        ...

    def update_spec(self, task_id: str, spec: TaskSpec, now: float) -> Task | None:
        """Replace a queued task's spec (``edit``); None (nothing written) when it is not queued."""
        ...

    def get_task(self, ref: str) -> Task | None:
        """By id, or by unique name."""
        ...

    def list_tasks(self, status: TaskStatus | None = None) -> list[Task]:
        """Every task in queue order, or only those in ``status``."""
        ...

    def tasks_changed_since(self, marker: int | None) -> TaskChanges:
        """The tasks added or changed (a state, a field, a question asked or answered) since
        ``marker`` (None: every task), and the marker to pass next time. What keeps a snapshot of
        ten thousand tasks current by reading only the rows that changed. Tasks are never
        deleted, so nothing is ever missing from an answer."""
        ...

    def task_names(self) -> set[str]: ...

    def dependents(self, task_id: str) -> list[Task]:
        """Tasks whose depends_on names this task (one level)."""
        ...

    def dependencies(self, task_id: str) -> list[Task]:
        """The tasks this task depends on."""
        ...

    def unfinished_dependencies(self, touching: Collection[str] | None = None) -> dict[str, list[str]]:
        """For every queued task with dependencies not done: their names (in queue order), in one
        query; queued tasks whose dependencies are all done are left out. (The planner's batch
        form of ``dependencies``.)

        ``touching``: only the queued tasks among these ids and the queued tasks that depend on
        one of them (what a change to those tasks can release or hold), and every one of those
        gets an entry, an empty list when nothing holds it."""
        ...

    def queued_stamps(self) -> dict[str, tuple[Any, ...]]:
        """Every queued task's id and a stamp that changes whenever the task changes in a way
        planning sees (a transition, a claim's attempt, an edit, not_before): the planner
        re-reads only the tasks whose stamp moved, not the whole queue."""
        ...

    def set_waiting(self, reasons: dict[str, str | None]) -> None:
        """Record why queued tasks wait (the gate's first failing reason), None to clear."""
        ...

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
        """Claim the best ready task (queued, not_before passed, dependencies done, requires
        within tags, coder not excluded), by priority then age, in one fenced conditional
        UPDATE. Sets status running, attempt+1, owner, host, lease; freezes coder/model."""
        ...

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
        """Move a task to ``dst`` and write the transition row in the same transaction.

        With ``owner``/``attempt`` the write is fenced; with ``expect`` only those source
        states match. Returns the new Task, or None when no row matched (claim lost, or the
        task moved meanwhile). Raises IllegalTransition for a move the table forbids.

        ``via``: pass through that state first (two transition rows, each step checked against
        the table): an attempt with nothing to verify goes ``running -> verifying -> done``.
        ``record``: fields of the attempt's record (``update_attempt``) written in the same
        transaction, only with a fenced move (``owner`` and ``attempt``): an ended attempt's
        record and its task's move are written together or not at all."""
        ...

    def update_task(
        self, task_id: str, *, owner: str | None = None, attempt: int | None = None, **fields: Any
    ) -> Task | None:
        """Update non-state fields (tokens, cost, context, workdir...), fenced when asked."""
        ...

    def transitions(self, task_id: str) -> list[Transition]: ...

    # -- engines and leases ------------------------------------------------------------------
    def register_engine(
        self, owner: str, host: str, pid: int, pid_create_time: float, now: float
    ) -> None: ...

    def heartbeat(self, owner: str, now: float, lease_s: float) -> int:
        """Refresh the engine's heartbeat and extend the lease of every task it owns.
        Returns how many tasks it still owns."""
        ...

    def extend_lease(self, task_id: str, owner: str, until: float) -> bool:
        """Extend one task's lease (the cockpit's "leave running"), fenced by owner."""
        ...

    def live_engines(self, now: float, stale_s: float) -> list[dict[str, Any]]: ...

    def engine_info(self, owner: str) -> dict[str, Any] | None:
        """{owner, host, pid, pid_create_time, heartbeat, stopped} or None."""
        ...

    def unregister_engine(self, owner: str, now: float) -> None: ...

    def orphaned_tasks(self, now: float, stale_s: float) -> list[Task]:
        """Running/verifying/paused-running tasks whose owner's heartbeat is older than
        ``stale_s`` (or whose owner stopped) — candidates for adoption or reclaim."""
        ...

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
        """Fenced change of owner (adoption of a live shim, or reclaim after expiry)."""
        ...

    # -- attempts ----------------------------------------------------------------------------
    def put_attempt(self, a: Attempt) -> None: ...

    def start_attempt(self, a: Attempt, workdir: str) -> None:
        """An attempt whose agent was just started: its record (``put_attempt``) and the task's
        ``workdir`` (only while ``a.owner`` holds the task's claim for attempt ``a.n``), in one
        transaction."""
        ...

    def update_attempt(self, task_id: str, n: int, *, owner: str | None = None, **fields: Any) -> bool:
        """Update an attempt; with ``owner`` only while that engine still holds the task's claim."""
        ...

    def get_attempt(self, task_id: str, n: int) -> Attempt | None: ...

    def attempts(self, task_id: str) -> list[Attempt]: ...

    # -- events ------------------------------------------------------------------------------
    def append_events(
        self, events: Sequence[Event], *, offset: tuple[str, int, int] | None = None, owner: str | None = None
    ) -> bool:
        """Insert events (idempotent on task_id/attempt/seq). With ``offset`` = (task_id, n,
        stdout_offset) the attempt's read offset and next_seq move in the same transaction. With
        ``owner`` nothing is written (False) unless that engine still holds attempt n's claim."""
        ...

    def append_events_batch(
        self, batches: Sequence[tuple[Sequence[Event], tuple[str, int, int]]], owner: str | None = None
    ) -> list[bool]:
        """``append_events`` for several attempts in one transaction; one verdict per batch."""
        ...

    def events(
        self,
        task_id: str,
        attempt: int | None = None,
        after: tuple[int, int] | None = None,
        limit: int = 10_000,
    ) -> list[Event]:
        """Events of a task in order; ``after`` = (attempt, seq) for tailing."""
        ...

    def last_events(self, task_id: str, limit: int) -> list[Event]:
        """The newest ``limit`` events of a task, oldest first."""
        ...

    # -- questions ---------------------------------------------------------------------------
    def questions(self, task_id: str) -> list[Question]: ...

    def add_question(
        self, task_id: str, attempt: int, text: str, options: Sequence[str], now: float
    ) -> Question: ...

    def get_question(self, qid: str) -> Question | None: ...

    def answer_question(self, qid: str, answer: str, by: str, now: float) -> bool:
        """First answer wins: True when this answer was recorded, False when it was not pending."""
        ...

    def close_questions(self, task_id: str, status: str, now: float) -> int:
        """Cancel/expire every pending question of a task; returns how many."""
        ...

    def expire_question(self, qid: str, now: float) -> bool: ...

    def pending_questions(self) -> list[Question]: ...

    # -- hosts, settings, rate limits, commands ------------------------------------------------
    def upsert_host(self, h: Host) -> None: ...

    def hosts(self) -> list[Host]: ...

    def get_setting(self, key: str) -> str | None: ...

    def set_setting(self, key: str, value: str | None) -> None: ...

    def settings_with_prefix(self, prefix: str) -> dict[str, str]:
        """Every setting whose key starts with ``prefix`` (a non-empty string), by key."""
        ...

    def put_rate_limit(self, rl: RateLimit, blocked_until: float | None) -> None: ...

    def rate_limits(self) -> list[tuple[RateLimit, float | None]]: ...

    def add_command(
        self, task_id: str | None, verb: str, arg: str | None, target_owner: str | None, now: float
    ) -> int: ...

    def pending_commands(self, owner: str) -> list[Command]: ...

    def finish_command(self, cid: int, status: str, result: str | None) -> None: ...

    def get_command(self, cid: int) -> Command | None: ...

    def spent_since(self, since: float) -> float:
        """Sum of reported cost of attempts started since ``since`` (fleet budget)."""
        ...

    def maintenance(self) -> None:
        """Periodic housekeeping (SQLite: WAL checkpoint)."""
        ...

    # notifications (notify_store.py): claimed once per event key across engines
    def claim_notification(
        self, key: str, kind: str, task_id: str | None, title: str, body: str, owner: str, now: float
    ) -> bool: ...

    def finish_notification(self, key: str, status: str, detail: str | None, now: float) -> None: ...

    def notification_stats(self) -> NotifyStats: ...

    # change notification (changes.py): one wake-up source for every waiter in a process
    def change_token(self) -> int:
        """A number that moves when another connection (process, host) committed a change to
        this store; this store's own commits never move it (whoever wrote knows)."""
        ...

    def wait_for_change(self, token: int, timeout: float) -> int:
        """Block until the change token differs from ``token`` or ``timeout`` seconds passed;
        returns the token then. One watcher thread per store serves every waiter."""
        ...

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` each time the change token moves (and once when the store closes),
        on the watcher's thread: it must only hand over (``loop.call_soon_threadsafe``), never
        block. Returns what stops it. An async waiter needs no thread of its own this way."""
        ...

    def close(self) -> None: ...


STORE_URL_FORMS = "postgresql://USER@HOST[:PORT]/DB or sqlite:///ABSOLUTE/PATH.db"


def _shown(url: str) -> str:
    """A URL for a message: a password in it is replaced by ***."""
    import re

    return re.sub(r"^([a-z]+://[^:/@?#]*):[^@/?#]*@", r"\1:***@", url)


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///ABSOLUTE/PATH`` URL; StoreError for any other form."""
    rest = url[len("sqlite://") :]
    if not rest.startswith("/") or rest.strip("/") == "" or "?" in rest or "#" in rest:
        raise StoreError(
            f"bad store URL {url!r}: a SQLite store is sqlite:///ABSOLUTE/PATH.db "
            "(three slashes, then an absolute path)"
        )
    return "/" + rest.lstrip("/")


def check_store_url(url: str) -> None:
    """Refuse a store URL that names no store this fleet-tui can open (StoreError, one line)."""
    if url.startswith(("postgresql://", "postgres://")):
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number 0-65535
        except ValueError as e:
            raise StoreError(f"bad store URL {_shown(url)!r}: {e} (the form is {STORE_URL_FORMS})") from None
        return
    if url.startswith("sqlite:"):
        sqlite_path(url)
        return
    raise StoreError(
        f"unsupported store URL {_shown(url)!r}: use {STORE_URL_FORMS}, or leave it unset for fleet.db "
        "in the home"
    )
