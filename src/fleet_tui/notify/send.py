"""Sending notifications without ever holding up the engine.

Each target (an apprise URL, the terminal, the Telegram bot) gets its own daemon thread and a
small queue: a service that hangs for its whole timeout delays only its own later messages, never
another target, never an agent's events. A full queue drops the message and counts it as failed.
When every target has answered for one notice, the result is written to the store's
notifications row, which ``doctor`` reads.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fleet_tui.notify.notice import Notice
from fleet_tui.scheduler.model import Task

QUEUE_LIMIT = 200


class Target(Protocol):
    name: str
    kinds: tuple[str, ...] | None  # None: the config's notify_events

    def send(self, n: Notice) -> None:
        """Deliver or raise an exception whose text says why not (a worker thread calls it)."""
        ...


def wants(kinds: tuple[str, ...] | None, default: tuple[str, ...], n: Notice, task: Task | None) -> bool:
    if n.kind == "test":
        return True
    if kinds is not None:
        return n.kind in kinds
    return n.kind in default or (n.kind == "done" and task is not None and task.spec.notify_done)


# -- apprise -----------------------------------------------------------------------------------
class _LastLog(logging.Handler):
    """Remembers apprise's last warning per thread: its notify() only returns False."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        self.local.last = record.getMessage()


_apprise_log: _LastLog | None = None


def _apprise_handler() -> _LastLog:
    global _apprise_log
    if _apprise_log is None:
        _apprise_log = _LastLog()
        logging.getLogger("apprise").addHandler(_apprise_log)
    return _apprise_log


def split_entry(entry: str) -> tuple[tuple[str, ...] | None, str]:
    """``"question,needs_human ntfys://t"`` -> (("question", "needs_human"), "ntfys://t")."""
    head, _, url = entry.strip().rpartition(" ")
    kinds = tuple(k.strip() for k in head.split(",") if k.strip())
    return (kinds or None), url


class AppriseTarget:
    """One apprise URL (any of its ~100 services)."""

    def __init__(self, entry: str, timeout_s: float) -> None:
        import apprise

        self.kinds, url = split_entry(entry)
        plugin = apprise.Apprise.instantiate(url)
        if plugin is None:
            raise ValueError(f"not a notification URL apprise knows: {_redact(url)}")
        for attr in ("socket_connect_timeout", "socket_read_timeout"):
            if hasattr(plugin, attr):
                setattr(plugin, attr, timeout_s)
        self.plugin: Any = plugin
        try:
            self.name = str(plugin.url(privacy=True)).split("?")[0]
        except Exception:
            self.name = _redact(url)

    def send(self, n: Notice) -> None:
        log = _apprise_handler()
        log.local.last = None
        ok = self.plugin.notify(body=f"{n.body}\n→ {n.action}", title=n.title)
        if not ok:
            raise RuntimeError(log.local.last or "the service refused it")


def _redact(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/')[0].split('@')[-1]}/…" if rest else url


# -- the terminal --------------------------------------------------------------------------------
def terminal_sequence(n: Notice, style: str, in_tmux: bool) -> str:
    """A bell, plus an OSC 9 (iTerm2, WezTerm, Windows Terminal, Ghostty, kitty) or OSC 777
    (VTE, foot, urxvt) desktop notification; inside tmux the OSC is wrapped for passthrough
    (``set -g allow-passthrough on``) — tmux itself turns the bell into its window alert."""
    clean = (n.title + ": " + n.body).replace("\x1b", "").replace("\x07", "").replace(";", ",")
    if style == "osc9":
        osc = f"\x1b]9;{clean}\x1b\\"
    elif style == "osc777":
        title = n.title.replace("\x1b", "").replace("\x07", "").replace(";", ",")
        osc = f"\x1b]777;notify;{title};{n.body.replace(';', ',')}\x1b\\"
    else:
        osc = ""
    if osc and in_tmux:
        osc = "\x1bPtmux;" + osc.replace("\x1b", "\x1b\x1b") + "\x1b\\"
    return osc + "\a"


class TerminalTarget:
    def __init__(self, write: Callable[[str], Any], style: str) -> None:
        self.name = "terminal"
        self.kinds: tuple[str, ...] | None = None
        self.write = write
        self.style = style

    def send(self, n: Notice) -> None:
        self.write(terminal_sequence(n, self.style, bool(os.environ.get("TMUX"))))


def stdout_writer() -> Callable[[str], Any] | None:
    """Writes to the engine's own terminal, when it has one (``fleet-tui run`` in a tmux pane)."""
    try:
        if not os.isatty(1):
            return None
    except OSError:
        return None

    def write(s: str) -> None:
        os.write(1, s.encode("utf-8", "replace"))

    return write


# -- the workers -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Result:
    """How sending a notice to one target went."""

    target: str
    ok: bool
    detail: str = ""


class Tracker:
    """Collects every target's result for one notice; calls ``finish`` once with all of them."""

    def __init__(self, n: Notice, expected: int, finish: Callable[[Notice, list[Result]], None]) -> None:
        self.notice = n
        self.expected = expected
        self.results: list[Result] = []
        self.finish = finish
        self.lock = threading.Lock()
        self.done = threading.Event()

    def report(self, r: Result) -> None:
        with self.lock:
            self.results.append(r)
            complete = len(self.results) == self.expected
        if complete:
            try:
                self.finish(self.notice, list(self.results))
            finally:
                self.done.set()


class Worker:
    """A target's thread and queue."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.q: queue.Queue[tuple[Notice, Tracker] | None] = queue.Queue(QUEUE_LIMIT)
        self.thread = threading.Thread(target=self._loop, name=f"notify {target.name}", daemon=True)
        self.thread.start()

    def submit(self, n: Notice, tracker: Tracker) -> None:
        try:
            self.q.put_nowait((n, tracker))
        except queue.Full:
            tracker.report(Result(self.target.name, False, "dropped: too many notifications waiting"))

    def stop(self) -> None:
        try:
            self.q.put_nowait(None)
        except queue.Full:
            pass

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            n, tracker = item
            try:
                self.target.send(n)
                res = Result(self.target.name, True)
            except Exception as e:
                res = Result(self.target.name, False, f"{self.target.name}: {e}".replace("\n", " ")[:300])
            try:
                tracker.report(res)
            except Exception:
                pass  # recording failed (store closed at shutdown): nothing else to do


def send_now(targets: list[Target], n: Notice, timeout_s: float) -> list[Result]:
    """Send one notice to each target in parallel and wait (``notify test``, the engine's last words)."""
    done = threading.Event()
    tracker = Tracker(n, len(targets), lambda _n, _rs: done.set())
    workers = [Worker(t) for t in targets]
    for w in workers:
        w.submit(n, tracker)
    if targets:
        done.wait(timeout_s + 5)
    for w in workers:
        w.stop()
    got = {r.target for r in tracker.results}
    return list(tracker.results) + [
        Result(t.name, False, "no answer in time") for t in targets if t.name not in got
    ]
