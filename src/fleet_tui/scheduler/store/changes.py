"""One wake-up source per store: a change token that moves when another connection committed.

Everybody who waits for "something changed in the store" (the engine's schedule and command
loops, a caller waiting for a command's result, the attached cockpit, the MCP server waiting for
an answer) waits on the same token with a timeout, instead of each polling the store on its own
clock. Behind the token runs ONE thread per store, started on first use:

* SQLite: the thread sleeps on an inotify watch of the database's folder (the ``-wal`` file is
  written by every commit of every process) and, when it fires, compares ``PRAGMA data_version``
  (which moves only for commits by *other* connections). Without inotify (not Linux) it asks
  ``data_version`` four times a second. Either way it also asks every few seconds, so a missed
  file event costs a few seconds, never a change.
* PostgreSQL: the thread blocks on the LISTEN connection; a NOTIFY from another session moves
  the token (postgres_base.py).

Own commits never move the token: whoever wrote knows (the engine wakes itself). A failure in
the thread moves the token (the waiters re-read and meet the error themselves) and the thread
backs off before it tries again.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio

log = logging.getLogger("fleet_tui.store")

_IN_MODIFY = 0x002
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_EVENT = struct.Struct("iIII")

#: the longest one worker thread blocks in ``wait_for_change`` for an async waiter: a waiter that
#: is cancelled leaves its thread behind for at most this long (a process exits only after it,
#: so it bounds how long a stopping engine lingers; shorter slices cost idle CPU)
SLICE_S = 1.0


async def changed(store: Any, token: int, timeout: float) -> int:
    """``store.wait_for_change`` for async code: the next change token, or ``token`` once
    ``timeout`` passed.

    A store that calls back on a change (``on_change``) wakes the waiting task through its event
    loop: an idle waiter takes no thread and no CPU at all (``token`` came from a
    ``change_token`` called in a worker thread, which made the store's watcher: making it reads
    the store, so not on the loop; subscribing and reading the token after that only take the
    watcher's own short lock). Any other store is waited on in slices of ``SLICE_S`` on a worker
    thread, so a cancelled wait (an engine stopping) never holds the process open for longer
    than that."""
    on_change = getattr(store, "on_change", None)
    if on_change is not None:
        import asyncio  # loaded already under a running loop; a CLI command need not load it

        loop = asyncio.get_running_loop()
        moved = asyncio.Event()

        def wake() -> None:  # on the watcher's thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                loop.call_soon_threadsafe(moved.set)

        off = on_change(wake)
        try:
            now: int = store.change_token()  # after subscribing: a change in between still wakes
            if now == token:
                with anyio.move_on_after(timeout):
                    await moved.wait()
                now = store.change_token()
            return now
        finally:
            off()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        new: int = await anyio.to_thread.run_sync(
            store.wait_for_change, token, min(SLICE_S, max(0.0, left)), abandon_on_cancel=True
        )
        if new != token or left <= SLICE_S:
            return new


class ChangeWatcher:
    """A token moved by one thread that runs ``step`` in a loop.

    ``step(timeout)`` blocks at most ``timeout`` seconds and says whether a change arrived.
    ``wait(token, timeout)`` returns as soon as the token differs from ``token`` (or at the
    timeout) with the current token; ``listen(callback)`` calls back on every move (and on
    ``close``), for waiters that are not threads. Thread-safe; the thread is a daemon and ends
    within one ``period_s`` of ``close`` (then ``cleanup`` runs on it)."""

    def __init__(
        self,
        step: Callable[[float], bool],
        *,
        period_s: float,
        name: str,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        self._step = step
        self._cleanup = cleanup
        self._period = period_s
        self._name = name
        self._cond = threading.Condition()
        self._token = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._listeners: list[Callable[[], None]] = []

    @property
    def started(self) -> bool:
        return self._thread is not None

    def token(self) -> int:
        self._ensure()
        with self._cond:
            return self._token

    def bump(self) -> None:
        with self._cond:
            self._token += 1
            self._cond.notify_all()
            calls = list(self._listeners)
        self._call(calls)

    def wait(self, token: int, timeout: float) -> int:
        self._ensure()
        with self._cond:
            self._cond.wait_for(lambda: self._token != token or self._closed, max(0.0, timeout))
            return self._token

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on the watcher's thread: it must only hand over, never block) on
        every move of the token and on ``close``; returns what stops it."""
        self._ensure()
        with self._cond:
            self._listeners.append(callback)

        def off() -> None:
            with self._cond, contextlib.suppress(ValueError):
                self._listeners.remove(callback)

        return off

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            calls = list(self._listeners)
        self._call(calls)

    def _call(self, calls: list[Callable[[], None]]) -> None:
        for call in calls:  # outside the lock: a callback may read the token
            try:
                call()
            except Exception as e:  # one waiter's failure is not the watcher's
                log.debug("change watcher %s: a listener failed: %s", self._name, e)

    def _ensure(self) -> None:
        if self._thread is not None:
            return
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        backoff = 0.5
        while not self._closed:
            try:
                changed = self._step(self._period)
                backoff = 0.5
            except Exception as e:  # the waiters re-read and meet the error themselves
                log.debug("change watcher %s: %s", self._name, e)
                changed = True
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            if changed and not self._closed:
                self.bump()
        if self._cleanup is not None:
            self._cleanup()


class FolderWatch:
    """inotify on one folder, for writes to a few file names (Linux; ``open`` returns None
    elsewhere or when the kernel refuses). Used through ``wait``; one file descriptor."""

    def __init__(self, fd: int, names: frozenset[str]) -> None:
        self._fd = fd
        self._names = names

    @classmethod
    def open(cls, folder: str, names: Iterable[str]) -> FolderWatch | None:
        try:
            # the process's own symbols hold libc's: find_library would run `ldconfig -p` (a
            # process start and a parse, at every engine's start) to name the same library
            libc = ctypes.CDLL(None, use_errno=True)
            init = libc.inotify_init1
            add = libc.inotify_add_watch
        except (OSError, AttributeError):
            return None
        fd = int(init(os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            return None
        mask = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
        if int(add(fd, os.fsencode(folder), mask)) < 0:
            os.close(fd)
            return None
        return cls(fd, frozenset(names))

    def wait(self, timeout: float) -> bool:
        """True once one of the names was written (events in the next 10 ms are taken along)."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return False
        time.sleep(0.01)  # a commit writes several times: take them as one
        hit = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return hit
            i = 0
            while i + _EVENT.size <= len(data):
                _, _, _, n = _EVENT.unpack_from(data, i)
                name = data[i + _EVENT.size : i + _EVENT.size + n].rstrip(b"\0").decode(errors="replace")
                hit = hit or name in self._names
                i += _EVENT.size + n

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
