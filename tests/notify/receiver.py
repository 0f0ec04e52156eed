"""A real HTTP receiver on loopback for notification tests: records every POST, or holds it."""

from __future__ import annotations

import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """``Receiver()`` listens on 127.0.0.1:PORT; ``posts`` is every JSON body received, in order.
    With ``hold=True`` it reads each request and then answers nothing until ``release()``."""

    def __init__(self, hold: bool = False) -> None:
        self.posts: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.holding = 0
        self.hold = hold
        self.released = threading.Event()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    data = json.loads(body or b"{}")
                except ValueError:
                    data = {"raw": body.decode("utf-8", "replace")}
                with outer.lock:
                    outer.posts.append(data)
                    outer.paths.append(self.path)
                if outer.hold:
                    with outer.lock:
                        outer.holding += 1
                    outer.released.wait(120)
                    with outer.lock:
                        outer.holding -= 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "hook") -> str:
        return f"json://127.0.0.1:{self.port}/{path}"

    def titled(self, needle: str) -> list[dict[str, Any]]:
        with self.lock:
            return [p for p in self.posts if needle in str(p.get("title", ""))]

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def need_program(program: str, package: str) -> str:
    """A system program's path; skip (fail under CI=true) saying which Debian package has it."""
    import pytest

    path = shutil.which(program)
    if path is None:
        msg = f"{program} is not installed: apt-get install {package}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path
