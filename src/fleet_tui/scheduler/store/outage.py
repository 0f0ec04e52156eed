"""Store outages: the engine waits them out instead of dying.

A PostgreSQL restart, a killed postmaster, a SQLite writer that holds the lock longer than the
busy timeout, a full disk: each makes a store call fail for a while, and none is a reason to
lose the fleet. ``Resilient`` wraps the engine's store: a call that fails for such a *transient*
reason is tried again with backoff (0.2 s doubling up to 5 s) until it succeeds, while the engine
says what it waits for (a log line and a notice, once when the outage starts, every 30 s while it
lasts, once when it ends). Anything else (a bug, a forbidden transition, a schema from a newer
version) is raised at once. The agents go on meanwhile: their leases are renewed from the last
heartbeat the store accepted (engine.py), so they stop only when another engine could take
their tasks.

``call_once`` is for callers with a schedule of their own (the heartbeat): no retry.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fleet_tui.engine")

_SQLITE_TRANSIENT = ("locked", "busy", "disk is full", "disk i/o error", "unable to open")


def is_transient(e: BaseException) -> bool:
    """True for a failure that goes away by itself: a lost connection, a lock, a full disk."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, sqlite3.OperationalError):
            return any(k in str(cur).lower() for k in _SQLITE_TRANSIENT)
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT):
            return True
        mod = type(cur).__module__
        if mod.startswith("psycopg") and type(cur).__name__ in (
            "OperationalError",
            "InterfaceError",
            "AdminShutdown",
            "CrashShutdown",
            "CannotConnectNow",
            "ConnectionTimeout",
            "SerializationFailure",
            "DeadlockDetected",
        ):
            return True
        if mod.startswith("psycopg"):
            # subclasses of OperationalError (connection failures) keep their own names
            try:
                import psycopg

                if isinstance(cur, psycopg.OperationalError | psycopg.InterfaceError):
                    return True
            except ImportError:  # pragma: no cover - psycopg is a dependency
                pass
        cur = cur.__cause__ or cur.__context__
    return False


class Resilient:
    """The engine's view of its store: transient failures are retried until the store is back."""

    def __init__(self, store: Any, notify: Callable[[str], None] | None = None) -> None:
        self._store = store
        self._notify = notify or (lambda text: None)
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self._said_at = 0.0
        #: set when the engine stops: waiting calls give up instead of holding the exit
        self.giving_up = threading.Event()

    @property
    def inner(self) -> Any:
        return self._store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._retrying(attr, args, kwargs)

        call.__name__ = name
        return call

    def call_once(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """One try (raises); a success still ends an outage."""
        try:
            out = getattr(self._store, name)(*args, **kwargs)
        except Exception as e:
            if is_transient(e):
                self._down(e)
            raise
        self._up()
        return out

    def _retrying(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        delay = 0.2
        failed = False
        while True:
            try:
                out = fn(*args, **kwargs)
            except Exception as e:
                if not is_transient(e) or self.giving_up.is_set():
                    raise
                failed = True
                self._down(e)
                if self.giving_up.wait(delay):
                    raise
                delay = min(delay * 2, 5.0)
                continue
            if failed:  # (a read that works on a full disk says nothing about writes)
                self._up()
            return out

    def _down(self, e: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            first = self.down_since is None
            if first:
                self.down_since = now
            elif now - self._said_at < 30.0:
                return
            self._said_at = now
            since = now - (self.down_since or now)
        what = str(e).splitlines()[0] if str(e) else type(e).__name__
        text = (
            f"store unavailable ({what}); waiting for it, agents keep running while their leases last"
            if first
            else f"store still unavailable after {since:.0f}s ({what}); still waiting"
        )
        log.warning("%s", text)
        self._notify(text)

    def _up(self) -> None:
        with self._lock:
            if self.down_since is None:
                return
            since = time.monotonic() - self.down_since
            self.down_since = None
        text = f"store available again after {since:.1f}s; resuming"
        log.warning("%s", text)
        self._notify(text)


def store_error_of(e: BaseException) -> BaseException | None:
    """The store error inside ``e`` (an exception group from task groups, possibly nested)."""
    from fleet_tui.scheduler.store.protocol import StoreError

    if isinstance(e, StoreError):
        return e
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            found = store_error_of(sub)
            if found is not None:
                return found
    return None
