"""``fleet-tui mcp-ask-human``: the stdio MCP server that lets an agent ask a person (DESIGN 12).

Why it exists: an agent running unattended sometimes needs a decision only a person can make,
or a login, captcha or one-time code. Every coder registers this server under the name
``ask_human`` in its CLI's per-run MCP config, so every vendor's agent gets the same tool. A call
stores the question in the fleet's store (task, attempt, time, options), where the cockpit's inbox
and ``fleet-tui questions`` show it, then blocks until the first answer arrives (``fleet-tui
answer`` or the cockpit, from any process or machine sharing the store) and returns that answer
as the tool result. It never hangs forever: after ``FLEET_QUESTION_TIMEOUT_S`` the question is
marked expired and the agent is told to proceed with care or stop. A question whose task stopped
is cancelled, and the agent is told so.

The server learns its context from the environment the engine sets (``AttemptContext.mcp_env``):
FLEET_HOME, FLEET_STORE (a store URL), FLEET_TASK_ID, FLEET_ATTEMPT, FLEET_QUESTION_TIMEOUT_S.
Started without them (outside fleet-tui) it still serves the tool, whose calls then explain that.

stdout carries the MCP protocol only: logging goes to stderr, and the SDK's stdio transport
diverts file descriptor 1 so a stray print cannot corrupt the stream. The question text is the
agent's data: stored as is, never interpreted (displays sanitize it, see ``inbox``).

The official ``mcp`` SDK (2.x, ``MCPServer``) is imported only when the server is built, so
importing this module stays cheap. This module deliberately does not use ``from __future__ import
annotations``: the SDK resolves the tool's annotations (``Context``) at registration.
"""

import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, unquote, urlsplit

import anyio
import anyio.to_thread

from fleet_tui.scheduler.humans import inbox, mcp_stdio
from fleet_tui.scheduler.humans.mcp_stdio import (
    FREE_TEXT_DESCRIPTION,
    INSTRUCTIONS,
    OPTIONS_DESCRIPTION,
    QUESTION_DESCRIPTION,
    SERVER_NAME,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    TOOL_TITLE,
)
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store.changes import changed
from fleet_tui.scheduler.store.opener import open_store
from fleet_tui.scheduler.store.protocol import Store, StoreError

log = logging.getLogger("fleet_tui.mcp_ask_human")

#: the longest wait between two reads of the question: an answer wakes the server at once
#: through the store's change token (store/changes.py), this only bounds a lost wake-up
POLL_S = 5.0
#: how often the task's state is checked (a stopped task cancels its question)
TASK_CHECK_S = 2.0
#: how often a progress notification is sent while waiting (when the client asked for progress)
PROGRESS_S = 15.0
#: the timeout when FLEET_QUESTION_TIMEOUT_S is missing or unusable (config default: 60 min)
DEFAULT_TIMEOUT_S = 3600.0

REQUIRED_ENV = ("FLEET_TASK_ID", "FLEET_ATTEMPT")


def no_answer_text(timeout_s: float) -> str:
    """The tool result when nobody answered within ``timeout_s``."""
    return (
        f"No answer from a person within {_duration(timeout_s)}. Proceed with your best judgement "
        "if it is safe, or stop and explain what you need."
    )


CANCELLED_TEXT = "The question was cancelled (the task was stopped)"
GONE_TEXT = (
    "The question was removed from the fleet's store; nobody will answer it. Stop and explain what you need."
)


def outside_fleet_text(missing: list[str]) -> str:
    return (
        "ask_human is not available: this MCP server was started outside fleet-tui (the environment "
        f"lacks {', '.join(missing)}), so no person can see the question. It works only in an agent run "
        "started by fleet-tui, which sets FLEET_HOME/FLEET_STORE, FLEET_TASK_ID and FLEET_ATTEMPT. "
        "Continue without asking, or stop and explain what you need."
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        n = max(round(seconds), 1) if seconds >= 1 else seconds
        return f"{n:g} second{'' if n == 1 else 's'}"
    m = round(seconds / 60, 1)
    return f"{m:g} minute{'' if m == 1 else 's'}"


class AskError(Exception):
    """The call cannot be served; the message is returned to the agent as a tool error."""


@dataclass(frozen=True)
class AskEnv:
    """Where the question goes and how long to wait, from the engine's environment."""

    home: str
    store_url: str | None
    task_id: str
    attempt: int
    timeout_s: float


def load_env(environ: Mapping[str, str]) -> AskEnv | str:
    """The AskEnv from ``environ``, or the text explaining why the tool cannot work."""
    missing = [k for k in REQUIRED_ENV if not environ.get(k)]
    if not environ.get("FLEET_HOME") and not environ.get("FLEET_STORE"):
        missing.append("FLEET_HOME or FLEET_STORE")
    if missing:
        return outside_fleet_text(missing)
    try:
        attempt = int(environ["FLEET_ATTEMPT"])
    except ValueError:
        return f"ask_human is misconfigured: FLEET_ATTEMPT={environ['FLEET_ATTEMPT']!r} is not a number"
    timeout = DEFAULT_TIMEOUT_S
    raw = environ.get("FLEET_QUESTION_TIMEOUT_S")
    if raw:
        try:
            timeout = float(raw)
        except ValueError:
            timeout = -1.0
        if not (0 < timeout < float("inf")):
            log.warning(
                "FLEET_QUESTION_TIMEOUT_S=%r is not a positive number; using %gs", raw, DEFAULT_TIMEOUT_S
            )
            timeout = DEFAULT_TIMEOUT_S
    home = environ.get("FLEET_HOME") or os.path.dirname(environ.get("FLEET_STORE", "")) or "."
    return AskEnv(
        home=home,
        store_url=environ.get("FLEET_STORE") or None,
        task_id=environ["FLEET_TASK_ID"],
        attempt=attempt,
        timeout_s=timeout,
    )


def _store_secrets(store: Store) -> tuple[str | None, str | None]:
    """(password, passfile) of a PostgreSQL store's connection URL; (None, None) for SQLite.

    ``store.url`` is the display URL, without them; the full connection string stays inside the
    store object (``_conninfo``).
    """
    conninfo = getattr(store, "_conninfo", None)
    if not isinstance(conninfo, str) or not conninfo.startswith(("postgresql://", "postgres://")):
        return None, None
    parts = urlsplit(conninfo)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    password = unquote(parts.password) if parts.password else query.get("password") or None
    return password, query.get("passfile") or None


def _pgpass_line(password: str) -> str:
    """A ~/.pgpass line matching any host, port, database and user (this file serves one store)."""
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    return f"*:*:*:*:{escaped}\n"


def server_launch(
    store: Store, home: Path, task_id: str, attempt: int, timeout_s: float, attempt_dir: Path
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The argv and environment that start ``ask_human`` for one attempt.

    The argv is the lean stdio entry point (``mcp_stdio.command()``), which answers the handshake
    at once and runs the SDK server behind it. The environment names the store without its
    password: a password from the store URL goes into ``<attempt_dir>/pgpass`` (mode 0600, as
    libpq requires) and the server gets ``PGPASSFILE`` pointing at it, so the password is on no
    command line, in no per-run CLI config and in no file other users can read. A ``passfile=``
    of the URL is passed on the same way; without either, libpq's own ``PGPASSFILE`` /
    ``~/.pgpass`` apply as usual.
    """
    env = {
        "FLEET_HOME": str(home),
        "FLEET_STORE": getattr(store, "url", "") or "",
        "FLEET_TASK_ID": task_id,
        "FLEET_ATTEMPT": str(attempt),
        "FLEET_QUESTION_TIMEOUT_S": str(timeout_s),
    }
    password, passfile = _store_secrets(store)
    if password:
        path = attempt_dir / "pgpass"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(_pgpass_line(password))
        env["PGPASSFILE"] = str(path)
    elif passfile:
        env["PGPASSFILE"] = passfile
    return mcp_stdio.command(), env


Progress = Callable[[float, str], Awaitable[None]]


class Asker:
    """Stores a question and waits for its outcome; independent of MCP so it can be tested alone."""

    def __init__(
        self,
        env: AskEnv,
        *,
        store_factory: Callable[[str | None, str], Store] = open_store,
        poll_s: float = POLL_S,
        task_check_s: float = TASK_CHECK_S,
        progress_s: float = PROGRESS_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.env = env
        self._store_factory = store_factory
        self._store: Store | None = None
        self._lock = anyio.Lock()
        self.poll_s, self.task_check_s, self.progress_s = poll_s, task_check_s, progress_s
        self.clock, self.monotonic = clock, monotonic

    async def store(self) -> Store:
        async with self._lock:
            if self._store is None:
                try:
                    self._store = await anyio.to_thread.run_sync(
                        self._store_factory, self.env.store_url, self.env.home
                    )
                except (StoreError, OSError) as e:
                    where = self.env.store_url or self.env.home
                    raise AskError(f"ask_human cannot open the fleet's store ({where}): {e}") from e
            return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    async def ask(
        self,
        question: str,
        options: list[str] | None = None,
        progress: Progress | None = None,
        allow_free_text: bool = False,
    ) -> str:
        """Store the question, wait for it to be answered / cancelled / expired, return the text."""
        store = await self.store()
        env = self.env
        task = await anyio.to_thread.run_sync(store.get_task, env.task_id)
        if task is None:
            raise AskError(
                f"ask_human: task {env.task_id!r} is not in the fleet's store; nobody would see "
                "the question. Continue without asking, or stop and explain what you need."
            )
        try:
            q = await anyio.to_thread.run_sync(
                inbox.ask, store, env.task_id, env.attempt, question, options, self.clock(), allow_free_text
            )
        except inbox.InboxError as e:
            raise AskError(str(e)) from e
        log.info(
            "question %s of task %s attempt %d stored; waiting up to %gs",
            q.id,
            env.task_id,
            env.attempt,
            env.timeout_s,
        )
        try:
            return await self._wait(store, q.id, progress)
        finally:
            # the call was abandoned (client gone, call cancelled): nobody waits for the answer now
            with anyio.CancelScope(shield=True):
                cur = await anyio.to_thread.run_sync(store.get_question, q.id)
                if cur is not None and cur.status == "pending":
                    await anyio.to_thread.run_sync(inbox.expire, store, q.id, self.clock())
                    log.info("question %s abandoned by the caller; marked expired", q.id)

    async def _wait(self, store: Store, qid: str, progress: Progress | None) -> str:
        env = self.env
        start = self.monotonic()
        deadline = start + env.timeout_s
        next_task_check = start  # check at once: a question of a stopped task is cancelled
        next_progress = start + self.progress_s
        token = await anyio.to_thread.run_sync(store.change_token)
        while True:
            q = await anyio.to_thread.run_sync(store.get_question, qid)
            if q is None:
                return GONE_TEXT
            if q.status == "answered":
                log.info("question %s answered by %s", qid, q.answered_by)
                return q.answer or ""
            if q.status == "cancelled":
                return CANCELLED_TEXT
            if q.status == "expired":
                return no_answer_text(env.timeout_s)
            now = self.monotonic()
            if now >= deadline:
                if await anyio.to_thread.run_sync(inbox.expire, store, qid, self.clock()):
                    log.info("question %s expired after %gs", qid, env.timeout_s)
                    return no_answer_text(env.timeout_s)
                continue  # answered or closed at the last moment: read the outcome
            if now >= next_task_check:
                next_task_check = now + self.task_check_s
                if await self._task_stopped(store):
                    await anyio.to_thread.run_sync(inbox.cancel_for_task, store, env.task_id, self.clock())
                    continue
            if progress is not None and now >= next_progress:
                next_progress = now + self.progress_s
                try:
                    await progress(now - start, f"waiting for a person to answer question {qid}")
                except Exception as e:  # progress is best effort; the answer is what matters
                    log.debug("progress notification failed: %s", e)
            # the answer is another process's commit: the store's change token wakes us at once
            # (store/changes.py); the timeout is for the task check, progress and the deadline
            due = min(self.poll_s, deadline - now, next_task_check - now)
            if progress is not None:
                due = min(due, next_progress - now)
            token = await changed(store, token, max(0.0, due))

    async def _task_stopped(self, store: Store) -> bool:
        """The task is gone, finished, parked, or a newer attempt runs: nobody needs the answer."""
        task = await anyio.to_thread.run_sync(store.get_task, self.env.task_id)
        if task is None:
            return True
        if task.status in (TaskStatus.DONE, TaskStatus.CANCELLED, TaskStatus.NEEDS_HUMAN):
            return True
        return task.attempt > self.env.attempt


def build_server(environ: Mapping[str, str] | None = None, **asker_kw: Any) -> Any:
    """The MCPServer with the ``ask_human`` tool, configured from ``environ`` (os.environ)."""
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations
    from pydantic import Field

    loaded = load_env(os.environ if environ is None else environ)
    asker = Asker(loaded, **asker_kw) if isinstance(loaded, AskEnv) else None
    server = MCPServer(
        SERVER_NAME,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
    )

    @server.tool(
        name=TOOL_NAME,
        title=TOOL_TITLE,
        description=TOOL_DESCRIPTION,
        structured_output=False,
        annotations=ToolAnnotations(
            title=TOOL_TITLE,
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=True,
        ),
    )
    async def ask_human(
        question: Annotated[str, Field(description=QUESTION_DESCRIPTION)],
        options: Annotated[
            list[str] | None,
            Field(description=OPTIONS_DESCRIPTION),
        ] = None,
        allow_free_text: Annotated[
            bool,
            Field(description=FREE_TEXT_DESCRIPTION),
        ] = False,
        ctx: Context | None = None,
    ) -> str:
        if asker is None:
            assert isinstance(loaded, str)
            raise ToolError(loaded)

        async def progress(elapsed: float, message: str) -> None:
            if ctx is not None:
                await ctx.report_progress(elapsed, None, message)

        try:
            return await asker.ask(question, options, progress, allow_free_text)
        except AskError as e:
            raise ToolError(str(e)) from e

    return server


def main() -> int:
    """Serve ``ask_human`` over stdio until the client closes stdin."""
    level = os.environ.get("FLEET_MCP_LOG_LEVEL", "WARNING").upper()
    if level not in logging.getLevelNamesMapping():
        level = "WARNING"
    logging.basicConfig(
        stream=sys.stderr, level=level, format="fleet-tui mcp-ask-human: %(levelname)s %(name)s: %(message)s"
    )
    loaded = load_env(os.environ)
    if isinstance(loaded, str):
        log.warning("%s", loaded)
    try:
        server = build_server()
        server.run("stdio")
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
