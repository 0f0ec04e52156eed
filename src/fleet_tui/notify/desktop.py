"""Desktop notifications (freedesktop D-Bus on Linux, the notification centre on macOS), answerable.

A question's notification carries its choices as buttons and a reply field (where the
notification server offers one), so a person can answer without finding the terminal: the click
lands in ``answer`` and the first answer wins, as in the cockpit. desktop-notifier speaks D-Bus
through dbus-fast on the engine's own asyncio loop, so sending is a non-blocking call with a
timeout and the button callbacks arrive on the loop.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import anyio

from fleet_tui.notify.notice import Notice


def desktop_session() -> bool:
    """A desktop to show notifications on: macOS, or a session bus plus a display."""
    if sys.platform == "darwin":
        return True
    return bool(os.environ.get("DBUS_SESSION_BUS_ADDRESS")) and bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )


class Desktop:
    def __init__(self, timeout_s: float) -> None:
        self.name = "desktop"
        self.kinds: tuple[str, ...] | None = None
        self.timeout_s = timeout_s
        self._notifier: Any = None
        self.shown: dict[str, str] = {}  # task id -> its question's notification, until answered

    def _get(self) -> Any:
        if self._notifier is None:
            from desktop_notifier import DesktopNotifier

            self._notifier = DesktopNotifier(app_name="fleet-tui")
        return self._notifier

    async def send(self, n: Notice, on_answer: Callable[[str, str], None] | None = None) -> None:
        """Show ``n``; a question's buttons/reply call ``on_answer(question_id, text)``."""
        from desktop_notifier import Button, ReplyField, Urgency

        buttons: list[Any] = []
        reply = None
        if n.question_id and on_answer is not None:
            qid = n.question_id
            buttons = [
                Button(title=o[:40], on_pressed=lambda o=o: on_answer(qid, o))  # type: ignore[misc]
                for o in n.options[:3]
            ]
            reply = ReplyField(
                title="Answer", button_title="Send", on_replied=lambda text: on_answer(qid, text)
            )
        urgent = n.kind in ("question", "needs_human", "error")
        with anyio.fail_after(self.timeout_s):
            ident = await self._get().send(
                title=f"fleet-tui: {n.title}",
                message=f"{n.body}\n{n.action}",
                urgency=Urgency.Critical if urgent else Urgency.Normal,
                buttons=buttons,
                reply_field=reply,
                timeout=0 if n.question_id else -1,
            )
        if n.question_id and n.task_id:
            self.shown[n.task_id] = str(ident)

    async def withdraw(self, task_id: str) -> None:
        """The task's question was answered (anywhere): its buttons would do nothing now."""
        ident = self.shown.pop(task_id, None)
        if ident is not None and self._notifier is not None:
            try:
                with anyio.move_on_after(self.timeout_s):
                    await self._notifier.clear(ident)
            except Exception:
                pass  # already gone (clicked, dismissed, or the server restarted)
