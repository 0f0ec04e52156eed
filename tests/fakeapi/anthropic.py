"""A scripted fake of the Anthropic Messages API (``POST /v1/messages``, streaming SSE).

Why: Claude Code (and OpenCode's ``anthropic`` provider) can be pointed at it through
``ANTHROPIC_BASE_URL`` so a test drives a real CLI through tool calls, 429s and auth failures
on loopback. Model calls are answered from a :class:`~tests.fakeapi.Script`; auxiliary calls
(requests that offer no tools, such as title or topic generation, token counting, and any
other path a CLI probes at startup) get a harmless answer and do not consume the script.

Usage::

    with serve_anthropic([ToolCall("Bash", {"command": "echo hi > x"}), Text("done")]) as (url, rec):
        env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-fake"}
        ...
        rec.model_requests()[1].body["messages"]  # what the CLI sent back after the tool ran
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

_ids = itertools.count(1)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def _uid(prefix: str) -> str:
    return f"{prefix}_fake_{next(_ids):08d}"


def default_is_model_call(req: Request) -> bool:
    """A main-loop model call: a POST to /v1/messages (not count_tokens) that offers tools."""
    if req.method != "POST" or "/messages" not in req.path or "count_tokens" in req.path:
        return False
    return isinstance(req.body, dict) and bool(req.body.get("tools"))


def _error(h: FakeHandler, req: Request, e: HttpError) -> None:
    req.status = e.status
    headers = dict(e.headers)
    if e.retry_after is not None:
        headers.setdefault("retry-after", str(e.retry_after))
    headers.setdefault("request-id", _uid("req"))
    body = e.body
    if body is None:
        etype = e.error_type or _ERROR_TYPES.get(e.status, "api_error")
        body = {"type": "error", "error": {"type": etype, "message": e.message or etype}}
    h.send_json(e.status, body, headers)


def _blocks(turn: Text | ToolCall) -> list[dict[str, Any]]:
    if isinstance(turn, Text):
        return [{"type": "text", "text": turn.text}]
    blocks: list[dict[str, Any]] = []
    if turn.text:
        blocks.append({"type": "text", "text": turn.text})
    blocks.append({"type": "tool_use", "id": _uid("toolu"), "name": turn.name, "input": turn.input})
    return blocks


def _answer(h: FakeHandler, req: Request, turn: Text | ToolCall) -> None:
    body = req.body if isinstance(req.body, dict) else {}
    model = str(body.get("model") or "claude-fake")
    in_tok = turn.input_tokens if turn.input_tokens is not None else estimate_tokens(body)
    blocks = _blocks(turn)
    out_tok = turn.output_tokens
    if out_tok is None:
        out_tok = max(1, sum(len(json.dumps(b)) for b in blocks) // 4)
    stop = "tool_use" if isinstance(turn, ToolCall) else "end_turn"
    usage = {
        "input_tokens": in_tok,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": out_tok,
    }
    message = {
        "id": _uid("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "stop_reason": stop,
        "stop_sequence": None,
        "content": blocks,
        "usage": usage,
    }
    rid = _uid("req")
    if not body.get("stream"):
        h.send_json(200, message, {"request-id": rid})
        return
    h.start_sse({"request-id": rid})
    h.sse(
        "message_start",
        {
            "type": "message_start",
            "message": {
                **message,
                "content": [],
                "stop_reason": None,
                "usage": {**usage, "output_tokens": 1},
            },
        },
    )
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            h.sse(
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
            )
            text = b["text"]
            step = turn.chunk if isinstance(turn, Text) else 40
            for k in range(0, len(text), max(1, step)):
                h.sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "text_delta", "text": text[k : k + step]},
                    },
                )
        else:
            h.sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": i,
                    "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}},
                },
            )
            h.sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": i,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(b["input"])},
                },
            )
        h.sse("content_block_stop", {"type": "content_block_stop", "index": i})
    h.sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": out_tok},
        },
    )
    h.sse("message_stop", {"type": "message_stop"})


class AnthropicFake:
    """The protocol function for :class:`FakeServer`; holds the script and the call predicate."""

    def __init__(
        self,
        script: Script,
        is_model_call: Callable[[Request], bool] = default_is_model_call,
        aux_text: str = "Fake summary.",
    ) -> None:
        self.script = script
        self.is_model_call = is_model_call
        self.aux_text = aux_text

    def __call__(self, h: FakeHandler, req: Request) -> None:
        path = req.path.split("?", 1)[0]
        if req.method == "POST" and path.endswith("/messages/count_tokens"):
            h.send_json(200, {"input_tokens": estimate_tokens(req.body)})
            return
        if req.method == "POST" and path.endswith("/messages"):
            if self.is_model_call(req):
                req.model_call = True
                turn, req.turn_index = self.script.next(req)
            else:
                turn = Text(self.aux_text)
            if isinstance(turn, HttpError):
                _error(h, req, turn)
            else:
                _answer(h, req, turn)
            return
        if req.method == "GET" and path.endswith("/models"):
            h.send_json(200, {"data": [], "has_more": False, "first_id": None, "last_id": None})
            return
        # anything else a CLI probes at startup (telemetry, feature flags, oauth...): harmless
        h.send_json(200, {})


def as_script(script: Script | Sequence[Turn | tuple[Turn, int | None]]) -> Script:
    return script if isinstance(script, Script) else Script(script)


@contextmanager
def serve_anthropic(
    script: Script | Sequence[Turn | tuple[Turn, int | None]],
    is_model_call: Callable[[Request], bool] = default_is_model_call,
) -> Iterator[tuple[str, Recorder]]:
    """Serve a fake Anthropic API on 127.0.0.1 (random port): yields (base_url, recorder).

    ``base_url`` has no trailing ``/v1``: set it as ``ANTHROPIC_BASE_URL``.
    """
    rec = Recorder()
    server = FakeServer(AnthropicFake(as_script(script), is_model_call), rec).start()
    try:
        yield server.base_url, rec
    finally:
        server.stop()


def tool_results(req: Request) -> list[dict[str, Any]]:
    """The ``tool_result`` blocks in the last user message of a recorded request."""
    body = req.body if isinstance(req.body, dict) else {}
    msgs = body.get("messages") or []
    for m in reversed(msgs):
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), list):
            return [b for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    return []
