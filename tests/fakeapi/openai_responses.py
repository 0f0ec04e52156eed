"""A scripted fake of the OpenAI Responses API (``POST .../responses``, streaming SSE).

Why: Codex CLI only speaks the Responses wire API (``wire_api = "responses"``); pointing a
per-run model provider at this server lets a test drive the real ``codex exec`` through shell
calls, 429s and auth failures on loopback. Model calls are answered from a
:class:`~tests.fakeapi.Script`; requests that offer no tools (auxiliary calls) and other paths
(``GET /models``...) get a harmless answer without consuming the script.

Usage::

    with serve_openai_responses([ToolCall("exec_command", {"cmd": "echo hi > x"}), Text("done")]) as (
        url, rec):
        # url ends with /v1: use it as the provider's base_url
        ...
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
#: the name of Codex's tool-search tool: a ToolCall of it becomes a ``tool_search_call`` item
TOOL_SEARCH = "tool_search"

_ERRORS = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    429: ("rate_limit_exceeded", "rate_limit_exceeded"),
    500: ("server_error", "server_error"),
}


def _uid(prefix: str) -> str:
    return f"{prefix}_fake_{next(_ids):08d}"


def default_is_model_call(req: Request) -> bool:
    """A main-loop model call: a POST to .../responses that offers tools."""
    path = req.path.split("?", 1)[0].rstrip("/")
    if req.method != "POST" or not path.endswith("/responses"):
        return False
    return isinstance(req.body, dict) and bool(req.body.get("tools"))


def _error(h: FakeHandler, req: Request, e: HttpError) -> None:
    req.status = e.status
    headers = dict(e.headers)
    if e.retry_after is not None:
        headers.setdefault("retry-after", str(e.retry_after))
    headers.setdefault("x-request-id", _uid("req"))
    body = e.body
    if body is None:
        etype, code = _ERRORS.get(e.status, ("server_error", "server_error"))
        if e.error_type:
            etype = code = e.error_type
        body = {"error": {"message": e.message or etype, "type": etype, "param": None, "code": code}}
    h.send_json(e.status, body, headers)


def _items(turn: Text | ToolCall) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    text = turn.text
    if text:
        items.append(
            {
                "type": "message",
                "id": _uid("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    if isinstance(turn, ToolCall) and turn.name == TOOL_SEARCH:
        # Codex's client-executed tool search (models that defer MCP tools): Codex answers with a
        # tool_search_output item listing the tools it found, offered from then on
        items.append(
            {
                "type": "tool_search_call",
                "id": _uid("ts"),
                "call_id": _uid("call"),
                "status": "completed",
                "execution": "client",
                "arguments": turn.input,
            }
        )
    elif isinstance(turn, ToolCall):
        call: dict[str, Any] = {
            "type": "function_call",
            "id": _uid("fc"),
            "call_id": _uid("call"),
            "name": turn.name,
            "arguments": json.dumps(turn.input),
            "status": "completed",
        }
        if turn.namespace:
            call["namespace"] = turn.namespace
        items.append(call)
    return items


def _answer(h: FakeHandler, req: Request, turn: Text | ToolCall) -> None:
    body = req.body if isinstance(req.body, dict) else {}
    model = str(body.get("model") or "fake-model")
    items = _items(turn)
    in_tok = turn.input_tokens if turn.input_tokens is not None else estimate_tokens(body)
    out_tok = turn.output_tokens
    if out_tok is None:
        out_tok = max(1, sum(len(json.dumps(i)) for i in items) // 4)
    usage = {
        "input_tokens": in_tok,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out_tok,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": in_tok + out_tok,
    }
    rid = _uid("resp")
    response = {"id": rid, "object": "response", "model": model, "status": "in_progress", "output": []}
    if not body.get("stream", True):
        h.send_json(200, {**response, "status": "completed", "output": items, "usage": usage})
        return
    h.start_sse({"x-request-id": _uid("req")})
    seq = itertools.count()

    def send(event: str, **fields: Any) -> None:
        h.sse(event, {"type": event, "sequence_number": next(seq), **fields})

    send("response.created", response=response)
    for i, item in enumerate(items):
        added = {**item, "status": "in_progress"}
        if item["type"] == "message":
            added["content"] = []
        elif item["type"] == "function_call":
            added["arguments"] = ""
        send("response.output_item.added", output_index=i, item=added)
        if item["type"] == "message":
            text = item["content"][0]["text"]
            step = max(1, turn.chunk if isinstance(turn, Text) else 40)
            for k in range(0, len(text), step):
                send(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=i,
                    content_index=0,
                    delta=text[k : k + step],
                )
        elif item["type"] == "function_call":
            send(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=i,
                delta=item["arguments"],
            )
        send("response.output_item.done", output_index=i, item=item)
    send("response.completed", response={**response, "status": "completed", "output": items, "usage": usage})


class ResponsesFake:
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
        path = req.path.split("?", 1)[0].rstrip("/")
        if req.method == "POST" and path.endswith("/responses"):
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
            h.send_json(200, {"object": "list", "data": [], "models": []})
            return
        h.send_json(200, {})


@contextmanager
def serve_openai_responses(
    script: Script | Sequence[Turn | tuple[Turn, int | None]],
    is_model_call: Callable[[Request], bool] = default_is_model_call,
) -> Iterator[tuple[str, Recorder]]:
    """Serve a fake Responses API on 127.0.0.1 (random port): yields (base_url, recorder).

    ``base_url`` ends with ``/v1``: Codex appends ``/responses`` to a provider's base_url.
    """
    rec = Recorder()
    s = script if isinstance(script, Script) else Script(script)
    server = FakeServer(ResponsesFake(s, is_model_call), rec).start()
    try:
        yield server.base_url + "/v1", rec
    finally:
        server.stop()


def tool_search_outputs(req: Request) -> list[dict[str, Any]]:
    """The ``tool_search_output`` items a request sent (what Codex's tool search found)."""
    body = req.body if isinstance(req.body, dict) else {}
    return [
        i for i in body.get("input") or [] if isinstance(i, dict) and i.get("type") == "tool_search_output"
    ]


def offers_tool_search(req: Request) -> bool:
    """Codex offered its ``tool_search`` tool (the model defers MCP tools)."""
    body = req.body if isinstance(req.body, dict) else {}
    return any(isinstance(t, dict) and t.get("type") == TOOL_SEARCH for t in body.get("tools") or [])


def function_outputs(req: Request) -> list[dict[str, Any]]:
    """The ``function_call_output`` (and ``custom_tool_call_output``) items a request sent."""
    body = req.body if isinstance(req.body, dict) else {}
    items = body.get("input") or []
    return [
        i
        for i in items
        if isinstance(i, dict) and i.get("type") in ("function_call_output", "custom_tool_call_output")
    ]
