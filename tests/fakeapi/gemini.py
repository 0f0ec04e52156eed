"""A scripted fake of the Gemini API (``generateContent`` / ``streamGenerateContent?alt=sse``).

Why: gemini-cli can be pointed at it through ``GOOGLE_GEMINI_BASE_URL`` (plain http is allowed
for 127.0.0.1), so a test drives the real ``gemini`` program through tool calls, 429s and
failures on loopback. Model calls (requests that offer ``functionDeclarations``) are answered
from a :class:`~tests.fakeapi.Script`; auxiliary calls (the ``auto`` model router, the
next-speaker check, token counting, anything else probed at startup) get a harmless answer and
do not consume the script.

Usage::

    with serve_gemini([ToolCall("write_file", {"file_path": p, "content": "x"}), Text("done")]) as (url, rec):
        env = {"GOOGLE_GEMINI_BASE_URL": url, "GEMINI_API_KEY": "fake"}
        ...
        function_responses(rec.model_requests()[1])  # what the CLI sent back after the tool ran
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from . import (
    FakeHandler,
    FakeServer,
    HttpError,
    Recorder,
    Request,
    Script,
    Text,
    ToolCall,
    Turn,
    estimate_tokens,
)

__all__ = [
    "AUX_JSON",
    "GeminiFake",
    "function_responses",
    "gemini_tool_names",
    "serve_gemini",
]

_ids = itertools.count(1)

#: Answer to auxiliary JSON-mode calls: satisfies the ``auto`` model router's classifiers
#: (``model_choice``; ``complexity_*`` for 0.61's numerical one) and the next-speaker check.
AUX_JSON = {
    "reasoning": "fake",
    "model_choice": "flash",
    "next_speaker": "user",
    "complexity_reasoning": "fake",
    "complexity_score": 10,
}

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def gemini_tool_names(req: Request) -> list[str]:
    """Names of the function declarations the CLI offered the model in this request."""
    body = req.body if isinstance(req.body, dict) else {}
    names: list[str] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        for decl in tool.get("functionDeclarations") or tool.get("function_declarations") or []:
            if isinstance(decl, dict) and isinstance(decl.get("name"), str):
                names.append(decl["name"])
    return names


def default_is_model_call(req: Request) -> bool:
    """A main-loop model call: a POST to ``:generateContent`` / ``:streamGenerateContent`` with tools."""
    if req.method != "POST" or "enerateContent" not in req.path:
        return False
    return bool(gemini_tool_names(req))


def function_responses(req: Request) -> list[dict[str, Any]]:
    """The ``functionResponse`` parts of the last user turn of a recorded request."""
    body = req.body if isinstance(req.body, dict) else {}
    for content in reversed(body.get("contents") or []):
        if isinstance(content, dict) and content.get("role") == "user":
            parts = content.get("parts") or []
            found = [p["functionResponse"] for p in parts if isinstance(p, dict) and "functionResponse" in p]
            if found:
                return found
    return []


def _model_of(path: str) -> str:
    # /v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse
    tail = path.split("?", 1)[0].rsplit("/", 1)[-1]
    return tail.split(":", 1)[0] or "gemini-fake"


def _error(h: FakeHandler, req: Request, e: HttpError) -> None:
    req.status = e.status
    headers = dict(e.headers)
    if e.retry_after is not None:
        headers.setdefault("retry-after", str(int(e.retry_after)))
    body = e.body
    if body is None:
        err: dict[str, Any] = {
            "code": e.status,
            "message": e.message or _STATUS.get(e.status, "error"),
            "status": e.error_type or _STATUS.get(e.status, "UNKNOWN"),
        }
        if e.retry_after is not None:
            err["details"] = [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{int(e.retry_after)}s"}
            ]
        body = {"error": err}
    h.send_json(e.status, body, headers)


def _usage(req: Request, turn: Text | ToolCall, out_text: str) -> dict[str, int]:
    prompt = turn.input_tokens if turn.input_tokens is not None else estimate_tokens(req.body)
    out = turn.output_tokens if turn.output_tokens is not None else max(1, len(out_text) // 4)
    return {"promptTokenCount": prompt, "candidatesTokenCount": out, "totalTokenCount": prompt + out}


def _chunks(turn: Text | ToolCall) -> list[dict[str, Any]]:
    """The response parts, one list element per streamed chunk."""
    if isinstance(turn, Text):
        step = max(1, turn.chunk)
        return [{"text": turn.text[k : k + step]} for k in range(0, len(turn.text), step)] or [{"text": ""}]
    parts: list[dict[str, Any]] = []
    if turn.text:
        parts.append({"text": turn.text})
    parts.append(
        {"functionCall": {"id": f"call_fake_{next(_ids):06d}", "name": turn.name, "args": turn.input}}
    )
    return parts


def _answer(h: FakeHandler, req: Request, turn: Text | ToolCall, stream: bool, model: str) -> None:
    chunks = _chunks(turn)
    usage = _usage(req, turn, json.dumps(chunks))
    response_id = f"resp_fake_{next(_ids):06d}"

    def response(parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
        cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        r: dict[str, Any] = {"candidates": [cand], "modelVersion": model, "responseId": response_id}
        if last:
            cand["finishReason"] = "STOP"
            r["usageMetadata"] = usage
        return r

    if not stream:
        h.send_json(200, response(chunks, True))
        return
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Cache-Control", "no-cache")
    h.send_header("Connection", "close")
    h.end_headers()
    h.close_connection = True
    for i, part in enumerate(chunks):
        data = json.dumps(response([part], i == len(chunks) - 1))
        h.wfile.write(f"data: {data}\r\n\r\n".encode())
        h.wfile.flush()


class GeminiFake:
    """The protocol function for :class:`FakeServer`; holds the script and the call predicate."""

    def __init__(
        self,
        script: Script,
        is_model_call: Callable[[Request], bool] = default_is_model_call,
        aux_text: str = "Fake summary.",
        aux_json: dict[str, Any] | None = None,
    ) -> None:
        self.script = script
        self.is_model_call = is_model_call
        self.aux_text = aux_text
        self.aux_json = aux_json if aux_json is not None else AUX_JSON

    def __call__(self, h: FakeHandler, req: Request) -> None:
        path = req.path.split("?", 1)[0]
        model = _model_of(req.path)
        if req.method == "POST" and path.endswith(":countTokens"):
            h.send_json(200, {"totalTokens": estimate_tokens(req.body)})
            return
        if req.method == "POST" and (
            path.endswith(":generateContent") or path.endswith(":streamGenerateContent")
        ):
            stream = path.endswith(":streamGenerateContent")
            turn: Text | ToolCall | HttpError
            if self.is_model_call(req):
                req.model_call = True
                turn, req.turn_index = self.script.next(req)
            else:
                body = req.body if isinstance(req.body, dict) else {}
                gen = body.get("generationConfig") or {}
                wants_json = isinstance(gen, dict) and gen.get("responseMimeType") == "application/json"
                turn = Text(json.dumps(self.aux_json) if wants_json else self.aux_text, chunk=10_000)
            if isinstance(turn, HttpError):
                _error(h, req, turn)
            else:
                _answer(h, req, turn, stream, model)
            return
        if req.method == "GET" and path.rstrip("/").endswith("/models"):
            h.send_json(200, {"models": []})
            return
        # anything else probed at startup (experiments, quota, telemetry): a harmless empty answer
        h.send_json(200, {})


def as_script(script: Script | Sequence[Turn | tuple[Turn, int | None]]) -> Script:
    return script if isinstance(script, Script) else Script(script)


@contextmanager
def serve_gemini(
    script: Script | Sequence[Turn | tuple[Turn, int | None]],
    is_model_call: Callable[[Request], bool] = default_is_model_call,
    aux_json: dict[str, Any] | None = None,
) -> Iterator[tuple[str, Recorder]]:
    """Serve a fake Gemini API on 127.0.0.1 (random port): yields (base_url, recorder).

    Set ``base_url`` as ``GOOGLE_GEMINI_BASE_URL`` (the CLI adds ``/v1beta/models/...``).
    """
    rec = Recorder()
    server = FakeServer(GeminiFake(as_script(script), is_model_call, aux_json=aux_json), rec).start()
    try:
        yield server.base_url, rec
    finally:
        server.stop()
