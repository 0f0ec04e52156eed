"""A Telegram bot as a two-way channel: notifications out, answers to questions back in.

Apprise's ``tgram://`` only sends. A person away from the keyboard wants to *answer* too, so this
talks to the Bot API directly (stdlib HTTP, a configurable base URL for self-hosted Bot API
servers): a question goes out with its choices as inline buttons; a tap on one, a reply to the
question's message, or ``/answer Q-ID TEXT`` answers it. Only the configured chat may answer;
everything else is ignored. The question id travels inside the message (button data, message
text), so any engine on the store can take the answer, and the first answer wins as everywhere.

Long polling (``getUpdates`` with a timeout) needs no public address; the poller runs as a task
of the engine, its blocking calls on a thread of its own.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

from fleet_tui.notify.notice import Notice

QID_RE = re.compile(r"\b(q-[0-9a-f]{6,})\b")
POLL_S = 25
T = TypeVar("T")


class TelegramError(RuntimeError):
    pass


class Telegram:
    def __init__(self, token: str, chat: str, api: str, timeout_s: float) -> None:
        self.name = "telegram"
        self.kinds: tuple[str, ...] | None = None
        self.token = token
        self.chat = str(chat)
        self.api = api.rstrip("/")
        self.timeout_s = timeout_s
        self.offset = 0
        self.stopped = False  # set when the config replaced this bot: its poller ends

    def call(self, method: str, payload: dict[str, Any], timeout: float | None = None) -> Any:
        import urllib.error  # only a configured bot needs it (~20 ms at start otherwise)
        import urllib.request

        req = urllib.request.Request(
            f"{self.api}/bot{self.token}/{method}",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as resp:
                body = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                desc = json.loads(e.read() or b"{}").get("description") or str(e)
            except ValueError:
                desc = str(e)
            raise TelegramError(f"{method}: HTTP {e.code}: {desc}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise TelegramError(f"{method}: {getattr(e, 'reason', e)}") from None
        if not body.get("ok"):
            raise TelegramError(f"{method}: {body.get('description') or 'refused'}")
        return body.get("result")

    # -- out -----------------------------------------------------------------------------------
    def send(self, n: Notice) -> None:
        text = n.text
        payload: dict[str, Any] = {"chat_id": self.chat, "text": text}
        if n.question_id:
            buttons = [
                [{"text": o[:60], "callback_data": f"a:{n.question_id}:{i}"}]
                for i, o in enumerate(n.options[:8])
                if len(f"a:{n.question_id}:{i}") <= 64
            ]
            if buttons:
                payload["reply_markup"] = {"inline_keyboard": buttons}
            payload["text"] = text + "\n(tap a choice, or reply to this message with your answer)"
        self.call("sendMessage", payload)

    # -- in ------------------------------------------------------------------------------------
    def poll_once(self) -> list[dict[str, Any]]:
        updates = self.call(
            "getUpdates",
            {"offset": self.offset, "timeout": POLL_S, "allowed_updates": ["message", "callback_query"]},
            timeout=POLL_S + 10,
        )
        for u in updates or ():
            self.offset = max(self.offset, int(u.get("update_id", 0)) + 1)
        return list(updates or ())

    def parse(
        self, u: dict[str, Any], options_of: Callable[[str], tuple[str, ...]]
    ) -> tuple[str, str, str] | None:
        """An update from the configured chat -> (question id, answer, who), else None."""
        if cq := u.get("callback_query"):
            chat = str(((cq.get("message") or {}).get("chat") or {}).get("id"))
            if chat != self.chat:
                return None
            parts = str(cq.get("data") or "").split(":")
            if len(parts) != 3 or parts[0] != "a":
                return None
            opts = options_of(parts[1])
            try:
                answer = opts[int(parts[2])]
            except (ValueError, IndexError):
                return None
            return parts[1], answer, _who(cq.get("from"))
        msg = u.get("message") or {}
        if str((msg.get("chat") or {}).get("id")) != self.chat:
            return None
        text = str(msg.get("text") or "").strip()
        if text.startswith("/answer"):
            m = re.match(r"/answer(?:@\w+)?\s+(q-[0-9a-f]+)\s+(.+)", text, re.S)
            return (m.group(1), m.group(2).strip(), _who(msg.get("from"))) if m else None
        replied = (msg.get("reply_to_message") or {}).get("text") or ""
        m = QID_RE.search(replied)
        if m and text:
            return m.group(1), text, _who(msg.get("from"))
        return None

    async def run(
        self,
        answer: Callable[[str, str, str], Awaitable[str]],
        options_of: Callable[[str], tuple[str, ...]],
        report: Callable[[str], None],
    ) -> None:
        """Poll until cancelled; ``answer(qid, text, who)`` returns the line sent back to the chat."""
        limiter = anyio.CapacityLimiter(1)  # never takes a thread the engine's own work needs
        backoff = 1.0
        while not self.stopped:
            try:
                updates = await in_daemon_thread(self.poll_once)
                backoff = 1.0
            except TelegramError as e:
                if "HTTP 409" in str(e):  # another engine on this store polls the same bot: let it
                    await anyio.sleep(30)
                    continue
                report(f"telegram: {e}")
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
                continue
            for u in updates:
                got = await anyio.to_thread.run_sync(self.parse, u, options_of, limiter=limiter)
                if got is None:
                    continue
                reply = await answer(*got)
                cq = u.get("callback_query")
                try:
                    if cq:
                        ack = {"callback_query_id": cq.get("id"), "text": reply[:190]}
                        await anyio.to_thread.run_sync(self.call, "answerCallbackQuery", ack, limiter=limiter)
                    out = {"chat_id": self.chat, "text": reply}
                    await anyio.to_thread.run_sync(self.call, "sendMessage", out, limiter=limiter)
                except TelegramError as e:
                    report(f"telegram: {e}")


async def in_daemon_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a daemon thread of its own: a long poll left hanging when the engine stops must
    not keep the process alive (anyio's worker threads are joined at exit)."""
    done = anyio.Event()
    box: dict[str, Any] = {}
    token = anyio.lowlevel.current_token()

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e
        try:
            anyio.from_thread.run_sync(done.set, token=token)
        except Exception:
            pass  # the loop is gone: nobody waits any more

    threading.Thread(target=work, name="telegram poll", daemon=True).start()
    await done.wait()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return,unused-ignore]


def _who(user: Any) -> str:
    if not isinstance(user, dict):
        return "telegram"
    return "telegram:" + str(user.get("username") or user.get("id") or "?")
