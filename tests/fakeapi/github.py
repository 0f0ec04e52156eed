"""A fake GitHub REST API on loopback: just the endpoints fleet-tui uses, with their real shapes.

Tests start it in a thread (``FakeGitHub().start()`` returns the API root to put in
``GITHUB_API_URL``), arrange its state (issues, reviews, checks, a merge), make it fail on demand
(``bad_token``, ``rate_limited``) and read ``calls`` to see what fleet-tui asked. Objects carry
absolute ``url`` fields on this server because PyGithub follows them, as it does on github.com.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

TOKEN = "ghp_fake_token_for_tests"


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


@dataclass
class FakeGitHub:
    """The state of one fake GitHub; every repository is created on first use."""

    token: str = TOKEN
    issues: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # repo -> issues
    pulls: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # repo -> number -> pull
    reviews: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    check_runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # sha -> runs
    comments: list[tuple[str, int, str]] = field(default_factory=list)  # (repo, issue, body)
    calls: list[Call] = field(default_factory=list)
    rate_limited: bool = False
    bad_token: bool = False

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self._next = 1
        self.base = ""
        self._server: ThreadingHTTPServer | None = None

    # -- arranging --------------------------------------------------------------------------------
    def add_issue(
        self, repo: str, title: str, body: str = "", labels: tuple[str, ...] = (), pull: bool = False
    ) -> int:
        with self.lock:
            n = self._number()
            issue = {
                "number": n,
                "title": title,
                "body": body,
                "state": "open",
                "labels": [{"name": x} for x in labels],
                "html_url": f"https://github.example/{repo}/issues/{n}",
                "url": f"{self.base}/repos/{repo}/issues/{n}",
                "pull_request": {"url": "x"} if pull else None,
            }
            self.issues.setdefault(repo, []).append(issue)
            return n

    def merge(self, repo: str, number: int, sha: str = "abc123def4567890") -> None:
        with self.lock:
            p = self.pulls[repo][number]
            p.update(state="closed", merged=True, merge_commit_sha=sha)

    def request_changes(self, repo: str, number: int, body: str, who: str = "reviewer") -> None:
        with self.lock:
            rid = self._number() + 1000
            self.reviews.setdefault((repo, number), []).append(
                {"id": rid, "state": "CHANGES_REQUESTED", "body": body, "user": {"login": who}}
            )

    def set_check(self, sha: str, conclusion: str | None) -> None:
        with self.lock:
            status = "completed" if conclusion else "in_progress"
            self.check_runs[sha] = [{"id": 1, "name": "ci", "status": status, "conclusion": conclusion}]

    def calls_to(self, method: str, pattern: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.method == method and re.fullmatch(pattern, c.path)]

    # -- serving ----------------------------------------------------------------------------------
    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _go(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                u = urlparse(self.path)
                query = parse_qs(u.query)
                with fake.lock:
                    fake.calls.append(Call(method, u.path, query, body))
                auth = self.headers.get("Authorization") or ""
                if fake.bad_token or auth.split(" ", 1)[-1] != fake.token:
                    return self._send(401, {"message": "Bad credentials"})
                if fake.rate_limited:
                    reset = str(int(time.time()) + 3600)
                    headers = {
                        "x-ratelimit-remaining": "0",
                        "x-ratelimit-limit": "5000",
                        "x-ratelimit-reset": reset,
                    }
                    return self._send(403, {"message": "API rate limit exceeded for user."}, headers)
                with fake.lock:
                    code, out = fake.route(method, u.path, query, body)
                self._send(code, out)

            def _send(self, code: int, data: Any, headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._go("GET")

            def do_POST(self) -> None:
                self._go("POST")

            def do_PATCH(self) -> None:
                self._go("PATCH")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.base

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- the API ----------------------------------------------------------------------------------
    def _number(self) -> int:
        n = self._next
        self._next += 1
        return n

    def _pull_json(self, repo: str, p: dict[str, Any]) -> dict[str, Any]:
        return {
            **p,
            "url": f"{self.base}/repos/{repo}/pulls/{p['number']}",
            "html_url": f"https://github.example/{repo}/pull/{p['number']}",
        }

    def route(self, method: str, path: str, q: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        m = re.fullmatch(r"/repos/([^/]+/[^/]+)(/.*)?", path)
        if not m:
            return 404, {"message": "Not Found"}
        repo, rest = m.group(1), m.group(2) or ""
        pulls = self.pulls.setdefault(repo, {})
        if rest == "/pulls" and method == "POST":
            if any(p["head"]["ref"] == body["head"] and p["state"] == "open" for p in pulls.values()):
                return 422, {
                    "message": "Validation Failed",
                    "errors": [{"message": "A pull request already exists"}],
                }
            n = self._number()
            pulls[n] = {
                "number": n,
                "state": "open",
                "merged": False,
                "merge_commit_sha": None,
                "title": body["title"],
                "body": body["body"],
                "head": {"ref": body["head"], "sha": f"sha-{n}"},
                "base": {"ref": body["base"]},
            }
            return 201, self._pull_json(repo, pulls[n])
        if rest == "/pulls" and method == "GET":
            head = (q.get("head") or [""])[0].split(":")[-1]
            state = (q.get("state") or ["open"])[0]
            found = [
                self._pull_json(repo, p)
                for p in pulls.values()
                if (not head or p["head"]["ref"] == head) and (state == "all" or p["state"] == state)
            ]
            return 200, found
        if pm := re.fullmatch(r"/pulls/(\d+)(/reviews)?", rest):
            n = int(pm.group(1))
            if n not in pulls:
                return 404, {"message": "Not Found"}
            if pm.group(2):
                return 200, self.reviews.get((repo, n), [])
            if method == "PATCH":
                pulls[n].update({k: v for k, v in body.items() if k in ("title", "body", "state")})
            return 200, self._pull_json(repo, pulls[n])
        if cm := re.fullmatch(r"/commits/([^/]+)(/check-runs|/status)?", rest):
            sha = cm.group(1)
            if cm.group(2) == "/check-runs":
                runs = self.check_runs.get(sha, [])
                return 200, {"total_count": len(runs), "check_runs": runs}
            if cm.group(2) == "/status":
                return 200, {"state": "pending", "total_count": 0, "statuses": [], "sha": sha}
            return 200, {"sha": sha, "url": f"{self.base}/repos/{repo}/commits/{sha}"}
        if rest == "/issues" and method == "GET":
            label = (q.get("labels") or [""])[0]
            out = [
                i
                for i in self.issues.get(repo, [])
                if i["state"] == "open" and (not label or label in [x["name"] for x in i["labels"]])
            ]
            return 200, out
        if im := re.fullmatch(r"/issues/(\d+)(/comments)?", rest):
            n = int(im.group(1))
            issue = next((i for i in self.issues.get(repo, []) if i["number"] == n), None)
            if issue is None:
                return 404, {"message": "Not Found"}
            if im.group(2) and method == "POST":
                self.comments.append((repo, n, body["body"]))
                return 201, {"id": len(self.comments), "body": body["body"]}
            return 200, issue
        return 404, {"message": "Not Found"}
