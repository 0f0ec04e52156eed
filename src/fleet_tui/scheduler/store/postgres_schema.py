"""The PostgreSQL store's schema, migrations, URL handling and error messages.

Kept apart from ``postgres_store`` so the store module holds only the Store contract's queries,
and so a reader can see the whole on-disk layout (and how it evolves) on one screen. The tables
mirror ``sqlite_store``'s one for one; the differences are PostgreSQL types: timestamps and money
are ``DOUBLE PRECISION`` (epoch seconds, like SQLite's REAL), counters ``BIGINT``, tag and option
lists ``TEXT[]`` (so a claim tests ``requires <@ tags`` in the index scan instead of parsing JSON).

URL forms (``open_store`` hands the URL over unchanged)::

    postgresql://USER[:PASSWORD]@HOST[:PORT]/DB                 tables in the default schema
    postgresql://USER@HOST/DB?schema=fleet_abc                  tables in schema fleet_abc
    postgresql://USER@HOST/DB?options=-csearch_path%3Dfleet_abc the same via libpq options

``schema=`` is ours (removed before libpq sees the URL); the schema is created when missing.
Without it the connection's ``current_schema()`` is used (``public`` unless ``options`` or the
role's settings say otherwise). Any other libpq parameter (``sslmode``, ``connect_timeout``...)
passes through. Keep passwords out of URLs (use ``~/.pgpass`` or ``PGPASSWORD``): ``Store.url``
drops the password, so a subprocess that reopens the store from it needs one of those anyway.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from fleet_tui.scheduler.store.protocol import ATTEMPT_COLUMNS, TASK_COLUMNS, StoreError

SCHEMA_VERSION = 1

#: the LISTEN/NOTIFY channel; the payload is the schema name so stores in other schemas of the
#: same database ignore each other's wake-ups
CHANNEL = "fleet_tui"

_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

#: tasks columns besides id/name/seqno/spec/status/priority/requires/spec_coder/spec_model/waiting
_TASK_TYPES: dict[str, str] = {
    "reason": "TEXT",
    "attempt": "BIGINT NOT NULL DEFAULT 0",
    "retries_used": "BIGINT NOT NULL DEFAULT 0",
    "handoffs": "BIGINT NOT NULL DEFAULT 0",
    "false_completions": "BIGINT NOT NULL DEFAULT 0",
    "coder": "TEXT",
    "model": "TEXT",
    "owner": "TEXT",
    "host": "TEXT",
    "lease_until": "DOUBLE PRECISION",
    "not_before": "DOUBLE PRECISION",
    "created_at": "DOUBLE PRECISION NOT NULL",
    "updated_at": "DOUBLE PRECISION NOT NULL",
    "started_at": "DOUBLE PRECISION",
    "attempt_started_at": "DOUBLE PRECISION",
    "finished_at": "DOUBLE PRECISION",
    "tokens": "BIGINT NOT NULL DEFAULT 0",
    "cost_usd": "DOUBLE PRECISION NOT NULL DEFAULT 0",
    "context_tokens": "BIGINT",
    "context_window": "BIGINT",
    "result_text": "TEXT",
    "branch": "TEXT",
    "worktree": "TEXT",
    "workdir": "TEXT",
    # INTEGER 0/1 like SQLite: the engine writes paused_running=0/1
    "paused_running": "INTEGER NOT NULL DEFAULT 0",
    "merged_commit": "TEXT",
}

_ATTEMPT_TYPES: dict[str, str] = {
    "owner": "TEXT NOT NULL",
    "dir": "TEXT NOT NULL",
    "started_at": "DOUBLE PRECISION NOT NULL",
    "prompt": "TEXT NOT NULL DEFAULT ''",
    "shim_pid": "BIGINT",
    "shim_create_time": "DOUBLE PRECISION",
    "agent_pid": "BIGINT",
    "ended_at": "DOUBLE PRECISION",
    "exit_code": "BIGINT",
    "outcome": "TEXT",
    "detail": "TEXT",
    "stdout_offset": "BIGINT NOT NULL DEFAULT 0",
    "next_seq": "BIGINT NOT NULL DEFAULT 0",
    "verify_output": "TEXT",
    "cost_usd": "DOUBLE PRECISION NOT NULL DEFAULT 0",
    "tokens": "BIGINT NOT NULL DEFAULT 0",
}


def _cols(types: dict[str, str]) -> str:
    return ",\n".join(f"  {c} {t}" for c, t in types.items())


#: MIGRATIONS[v] takes a schema from version v to v+1.  Append, never edit a released entry.
MIGRATIONS: list[str] = [
    # version 1: the first release (the same tables as sqlite_store's version 1)
    f"""
CREATE TABLE tasks (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  seqno BIGSERIAL NOT NULL,
  spec TEXT NOT NULL,
  status TEXT NOT NULL,
  priority BIGINT NOT NULL DEFAULT 0,
  requires TEXT[] NOT NULL DEFAULT '{{}}',
  spec_coder TEXT,
  spec_model TEXT,
  waiting TEXT,
{_cols(_TASK_TYPES)}
);
CREATE INDEX tasks_ready ON tasks(status, priority DESC, seqno);
CREATE INDEX tasks_owner ON tasks(owner);
CREATE TABLE deps (task_id TEXT NOT NULL, dep_id TEXT NOT NULL, PRIMARY KEY (task_id, dep_id));
CREATE INDEX deps_dep ON deps(dep_id);
CREATE TABLE transitions (
  id BIGSERIAL PRIMARY KEY, task_id TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL, src TEXT,
  dst TEXT NOT NULL, reason TEXT, attempt BIGINT NOT NULL, actor TEXT
);
CREATE INDEX transitions_task ON transitions(task_id, id);
CREATE TABLE attempts (
  task_id TEXT NOT NULL, n BIGINT NOT NULL,
{_cols(_ATTEMPT_TYPES)},
  PRIMARY KEY (task_id, n)
);
CREATE INDEX attempts_started ON attempts(started_at);
CREATE TABLE events (
  task_id TEXT NOT NULL, attempt BIGINT NOT NULL, seq BIGINT NOT NULL, ts DOUBLE PRECISION NOT NULL,
  kind TEXT NOT NULL, text TEXT, payload TEXT, PRIMARY KEY (task_id, attempt, seq)
);
CREATE TABLE questions (
  id TEXT PRIMARY KEY, task_id TEXT NOT NULL, attempt BIGINT NOT NULL,
  asked_at DOUBLE PRECISION NOT NULL, text TEXT NOT NULL, options TEXT[] NOT NULL DEFAULT '{{}}',
  status TEXT NOT NULL DEFAULT 'pending', answer TEXT, answered_at DOUBLE PRECISION, answered_by TEXT
);
CREATE INDEX questions_status ON questions(status);
CREATE INDEX questions_task ON questions(task_id);
CREATE TABLE engines (
  owner TEXT PRIMARY KEY, host TEXT NOT NULL, pid BIGINT NOT NULL,
  pid_create_time DOUBLE PRECISION NOT NULL, heartbeat DOUBLE PRECISION NOT NULL,
  started_at DOUBLE PRECISION NOT NULL, stopped INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE hosts (
  name TEXT PRIMARY KEY, heartbeat DOUBLE PRECISION NOT NULL, cores BIGINT, load DOUBLE PRECISION,
  mem_available BIGINT, disk_free BIGINT, running BIGINT, tags TEXT[], version TEXT
);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE rate_limits (
  account TEXT PRIMARY KEY, status TEXT, utilization DOUBLE PRECISION,
  resets_at DOUBLE PRECISION, "window" TEXT, observed_at DOUBLE PRECISION,
  blocked_until DOUBLE PRECISION
);
CREATE TABLE commands (
  id BIGSERIAL PRIMARY KEY, task_id TEXT, verb TEXT NOT NULL, arg TEXT,
  created_at DOUBLE PRECISION NOT NULL, target_owner TEXT, status TEXT NOT NULL DEFAULT 'pending',
  result TEXT
);
CREATE INDEX commands_pending ON commands(status, target_owner)
""",
]

# the tables must carry every field the model holds (a new Task/Attempt field needs a migration)
assert set(_TASK_TYPES) == set(TASK_COLUMNS), set(_TASK_TYPES) ^ set(TASK_COLUMNS)
assert set(_ATTEMPT_TYPES) == set(ATTEMPT_COLUMNS), set(_ATTEMPT_TYPES) ^ set(ATTEMPT_COLUMNS)


def lock_key(schema: str) -> int:
    """The advisory-lock key that serializes migrations of one schema (a signed 64-bit int)."""
    return zlib.crc32(f"fleet_tui:{schema}".encode()) - 2**31


@dataclass(frozen=True)
class Target:
    """Where a PostgresStore connects: ``conninfo`` for libpq (may hold a password), ``url`` to show."""

    conninfo: str
    url: str
    schema: str | None


def check_schema_name(schema: str) -> str:
    if not _SCHEMA_RE.match(schema):
        raise StoreError(
            f"schema name {schema!r} is not a plain identifier: use letters, digits and _ "
            "(at most 63 characters, not starting with a digit)"
        )
    return schema


def parse_url(url: str, schema: str | None = None) -> Target:
    """Split ``?schema=`` off a postgresql:// URL and build the password-free display URL."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    from_url = [v for k, v in query if k == "schema"]
    rest = [(k, v) for k, v in query if k != "schema"]
    chosen = schema if schema is not None else (from_url[-1] if from_url and from_url[-1] else None)
    if chosen is not None:
        check_schema_name(chosen)
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment))
    netloc = parts.hostname or ""
    if netloc and ":" in netloc:  # an IPv6 literal
        netloc = f"[{netloc}]"
    if parts.port is not None:
        netloc += f":{parts.port}"
    if parts.username:
        netloc = f"{quote(unquote(parts.username), safe='')}@{netloc}"
    shown = [(k, v) for k, v in rest if k.lower() not in ("password", "passfile")]
    if chosen is not None:
        shown.append(("schema", chosen))
    display = urlunsplit((parts.scheme, netloc, parts.path, urlencode(shown), ""))
    return Target(conninfo=conninfo, url=display, schema=chosen)


def explain_connect(e: Exception, url: str) -> StoreError:
    """A connection failure as a message that names the URL (no password) and the fix."""
    msg = str(e).strip()
    low = msg.lower()
    if "does not exist" in low and "database" in low:
        return StoreError(
            f"cannot open the store {url}: the database does not exist ({_last_line(msg)}). "
            "Create it (e.g. `createdb -h HOST -U USER DBNAME`) or fix the database name in --store"
        )
    if (
        "password authentication failed" in low
        or ("role" in low and "does not exist" in low)
        or "no password supplied" in low
        or "authentication" in low
        or "pg_hba.conf" in low
    ):
        return StoreError(
            f"cannot log in to the store {url}: {_last_line(msg)}. Check the user in --store and "
            "supply the password via ~/.pgpass or PGPASSWORD (pg_hba.conf must allow this host)"
        )
    if (
        "refused" in low
        or "could not connect" in low
        or "timeout" in low
        or "timed out" in low
        or "could not translate host name" in low
        or "no route" in low
    ):
        return StoreError(
            f"cannot reach the PostgreSQL server of the store {url}: {_last_line(msg)}. "
            "Start PostgreSQL (or fix host/port in --store) and check a firewall allows it"
        )
    return StoreError(f"cannot open the store {url}: {_last_line(msg)}")


def explain(e: Exception, url: str) -> StoreError:
    """Any other database error as a StoreError naming the store."""
    if "connection" in str(e).lower() and ("closed" in str(e).lower() or "lost" in str(e).lower()):
        return StoreError(
            f"lost the connection to the store {url} ({_last_line(str(e))}); "
            "check that PostgreSQL is up, then retry"
        )
    return StoreError(f"store error on {url}: {_last_line(str(e))}")


def _last_line(msg: str) -> str:
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip() and not ln.strip().startswith("Is the")]
    text = lines[0] if lines else msg
    return text.removeprefix("connection failed: ")
