"""Notifications wherever the person is, answers from there, and agents caught looping.

The entry points the rest of fleet-tui uses: ``watch(engine)`` (a task of every engine: it follows
the engine's events, notifies and guards against loops, see watcher.py), ``use_terminal`` (the
cockpit hands over its own terminal writer so notifications never tear its screen),
``engine_failed`` (the engine's last words) and ``send_test`` (``fleet-tui notify test``).
Nothing here imports textual or rich: it runs inside the headless engine too.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from fleet_tui.notify.notice import Notice, error_notice, test_notice
from fleet_tui.notify.send import Result, send_now

if TYPE_CHECKING:
    from fleet_tui.config import Config
    from fleet_tui.notify.host import NotifierHost

_terminals: weakref.WeakKeyDictionary[Any, Callable[[str], Any]] = weakref.WeakKeyDictionary()


def use_terminal(engine: NotifierHost, write: Callable[[str], Any]) -> None:
    """Terminal notifications of ``engine`` go through ``write`` (the cockpit's driver) instead of
    straight to file descriptor 1."""
    _terminals[engine] = write


async def watch(engine: NotifierHost) -> None:
    """Run the notifier and loop guard of ``engine`` until cancelled. A failure in here must never
    take the engine down: it is reported as a notice and the watcher starts afresh."""
    from fleet_tui.notify.watcher import Watcher
    from fleet_tui.scheduler.model import EngineEvent

    while True:
        try:
            await Watcher(engine, _terminals.get(engine)).run()
            return
        except Exception as e:
            text = f"notifications: {type(e).__name__}: {e}; restarting them"
            engine.bus.publish([EngineEvent(kind="notice", text=text)])
            await anyio.sleep(1.0)


async def engine_failed(engine: NotifierHost, error: BaseException) -> None:
    """The engine stops on an error: tell the person (bounded by notify_timeout_s, never raises)."""
    from fleet_tui.notify.send import wants
    from fleet_tui.notify.watcher import build_targets

    try:
        cfg = engine.cfg
        n = error_notice(engine.owner, error)
        targets = [
            t
            for t in build_targets(cfg, _terminals.get(engine))
            if wants(t.kinds, cfg.notify_events, n, None)
        ]
        if not targets:
            return
        mine = await anyio.to_thread.run_sync(
            engine.store.claim_notification,
            n.key,
            n.kind,
            None,
            n.title,
            n.body,
            engine.owner,
            engine.clock(),
        )
        if mine:
            results = await anyio.to_thread.run_sync(send_now, targets, n, cfg.notify_timeout_s)
            bad = [r for r in results if not r.ok]
            detail = "; ".join(r.detail for r in bad) or None
            await anyio.to_thread.run_sync(
                engine.store.finish_notification, n.key, "failed" if bad else "sent", detail, engine.clock()
            )
    except Exception:
        pass  # the engine is failing already; its own error is the one to report


def send_test(cfg: Config) -> list[Result]:
    """Send a test notification to every configured target, each result (``notify test``)."""
    from fleet_tui.notify.desktop import Desktop
    from fleet_tui.notify.watcher import build_targets, desktop_wanted

    problems: list[str] = []
    targets = build_targets(cfg, None, problems)
    n = test_notice()
    results = [Result(p.split(":", 1)[0], False, p) for p in problems]
    results += send_now(targets, n, cfg.notify_timeout_s)
    if desktop_wanted(cfg):
        d = Desktop(cfg.notify_timeout_s)

        async def desk() -> Result:
            try:
                await d.send(n)
                return Result("desktop", True)
            except Exception as e:
                return Result("desktop", False, f"desktop: {type(e).__name__}: {e}")

        results.append(anyio.run(desk))
    return results


__all__ = ["Notice", "engine_failed", "send_test", "use_terminal", "watch"]
