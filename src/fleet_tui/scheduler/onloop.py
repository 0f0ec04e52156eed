"""Calling into the engine's event loop from its worker threads, without waiting for the loop.

Why: the engine's blocking work (store writes, a task's move) runs in worker threads, and what it
publishes (a task that moved, a notice) must reach the bus on the loop. ``anyio.from_thread``
does that by a round trip: the worker blocks until the loop has run the call, and the loop, the
worker and the interpreter lock each change hands twice. That cost ~0.1–0.3 ms of CPU per call on
a busy two-core machine, several times per attempt. A publish needs no answer, so it is queued on
the loop instead (``call_soon_threadsafe``) and the worker goes on. Order is kept: the loop runs
callbacks in the order they were queued, so what a worker published is on the bus before its
result (queued the same way by anyio when the worker returns) reaches the coroutine awaiting it.
"""

from __future__ import annotations

import asyncio
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
