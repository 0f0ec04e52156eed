"""Calling into the engine's event loop from its worker threads, without waiting for the loop;
and the points inside the loop's long callbacks where it gives way to whoever hosts it.

Why: the engine's blocking work (store writes, a task's move) runs in worker threads, and what it
publishes (a task that moved, a notice) must reach the bus on the loop. ``anyio.from_thread``
does that by a round trip: the worker blocks until the loop has run the call, and the loop, the
worker and the interpreter lock each change hands twice. That cost ~0.1–0.3 ms of CPU per call on
a busy two-core machine, several times per attempt. A publish needs no answer, so it is queued on
the loop instead (``call_soon_threadsafe``) and the worker goes on. Order is kept: the loop runs
callbacks in the order they were queued, so what a worker published is on the bus before its
result (queued the same way by anyio when the worker returns) reaches the coroutine awaiting it.

Giving way: a host can ask the engine's loop to stand aside between callbacks (the cockpit does,
for a key in hand: app/hosted.py), but under a loud fleet one callback can run for tens of
milliseconds (an agent's backlog of output parsed in one go), and a key that comes meanwhile
shares the interpreter with it. ``give_way()``, called every so many lines inside such loops,
calls what the host set for the loop's thread (``set_give_way``); it does nothing where no host
set anything (a headless ``run``, the tests) or on any other thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import anyio.from_thread

#: the interpreter's switch interval in a process that runs an engine (seconds; Python's default
#: is 5 ms). The loop hands blocking work to worker threads and waits on files and pipes; each
#: time it gives the interpreter lock up while a worker computes, it waits up to this long to get
#: it back, on the path from an agent's end to the next agent's start (bench/bench_attempts.py)
#: and between a key and the screen in the cockpit (bench/bench_cockpit.py).
SWITCH_INTERVAL = 0.001


class LoopPost:
    """Posts calls to one event loop (bound once it runs); runs them in place when called on
    that loop's own thread, or when no loop is bound (no engine running)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self) -> None:
        """Called on the loop: calls from other threads are queued to it from now on."""
        self._loop = asyncio.get_running_loop()

    def __call__(self, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is None:  # not bound: a worker of some loop waits for it, or we are on no loop
            try:
                anyio.from_thread.run_sync(fn, *args)
            except RuntimeError:
                fn(*args)
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            fn(*args)
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody listens any more; keep it local
            fn(*args)


_this_thread = threading.local()


def set_give_way(fn: Callable[[], None] | None) -> None:
    """On the thread that runs an engine's loop: what ``give_way`` calls there (None: nothing)."""
    _this_thread.give_way = fn


def give_way() -> None:
    """A point inside a long callback of the engine's loop where the loop's host may have it
    stand aside for a moment (``set_give_way``)."""
    fn = getattr(_this_thread, "give_way", None)
    if fn is not None:
        fn()
