"""A fake Telegram Bot API on loopback: records what the bot sends, serves updates the test pushes.

Implements what fleet-tui's bot uses: ``sendMessage``, ``getUpdates`` (long polling: waits for an
update or the request's timeout), ``answerCallbackQuery``; any other token gets 401 like the real
API. ``push`` queues an update as Telegram would deliver it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeTelegram:
    def __init__(self, token: str) -> None:
        self.token = token
        self.sent: list[dict[str, Any]] = []
        self.acks: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.next_update = 1
        self.next_message = 100
        self.cond = threading.Condition()
        self.closed = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                prefix = f"/bot{outer.token}/"
                if not self.path.startswith(prefix):
                    return self.reply(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
                method = self.path[len(prefix) :]
                if method == "sendMessage":
                    with outer.cond:
                        outer.next_message += 1
                        msg = {"message_id": outer.next_message, "chat": {"id": int(body["chat_id"])}, **body}
                        outer.sent.append(msg)
                    return self.reply(200, {"ok": True, "result": msg})
                if method == "answerCallbackQuery":
                    outer.acks.append(body)
                    return self.reply(200, {"ok": True, "result": True})
                if method == "getUpdates":
                    offset = int(body.get("offset") or 0)
                    with outer.cond:
                        outer.cond.wait_for(
                            lambda: outer.closed or any(u["update_id"] >= offset for u in outer.updates),
                            timeout=float(body.get("timeout") or 0),
                        )
                        got = [u for u in outer.updates if u["update_id"] >= offset]
                    return self.reply(200, {"ok": True, "result": got})
                return self.reply(404, {"ok": False, "description": f"Not Found: {method}"})

            def reply(self, code: int, data: Any) -> None:
                raw = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.api = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def push(self, update: dict[str, Any]) -> None:
        with self.cond:
            self.updates.append({"update_id": self.next_update, **update})
            self.next_update += 1
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
