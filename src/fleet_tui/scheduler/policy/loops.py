"""Catching agents that are stuck in a loop, which the stall and timeout limits miss.

A stall is silence and a timeout is a wall clock; an agent that runs ``npm test`` for the sixth
time in a row, or spends tokens producing nothing it has not said before, is neither silent nor
necessarily slow — it burns money until the timeout. This module watches one attempt's normalized
events and says when it looks like a loop, with a reason a person understands
(``Bash "npm test" 6 times in a row``). Pure logic: the caller stops the attempt (the task is
parked ``needs_human`` with ``looping: <reason>``) and notifies.

Three signs, each configurable (0 or false turns it off):

- the same tool call with the same input ``same_call`` times in a row — or a short cycle of two
  or three calls repeated that many times (Read/Bash/Read/Bash...); text and thinking in between
  do not break the streak, any other call does;
- ``output_tokens`` output tokens spent without anything new: no text it had not already said,
  no tool call it had not already made;
- a question asked again after it was answered (checked by the caller against the store, which
  knows the answers: ``same_question``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fleet_tui.scheduler.model import Event


@dataclass(frozen=True)
class LoopLimits:
    same_call: int = 6
    output_tokens: int = 100_000
    max_period: int = 3  # longest cycle of distinct calls recognised


def call_signature(tool: str | None, tool_input: Any) -> str:
    try:
        inp = json.dumps(tool_input, sort_keys=True, default=str)
    except (TypeError, ValueError):
        inp = repr(tool_input)
    return f"{tool or '?'}\x00{inp}"


def describe_call(tool: str | None, tool_input: Any) -> str:
    """``Bash "npm test"``: the tool and its most telling input, short."""
    main: Any = tool_input
    if isinstance(tool_input, dict):
        for k in ("command", "file_path", "path", "pattern", "query", "url", "question", "prompt"):
            if k in tool_input:
                main = tool_input[k]
                break
        else:
            main = json.dumps(tool_input, sort_keys=True, default=str)
    text = " ".join(str(main).split())
    if len(text) > 60:
        text = text[:59] + "…"
    return f'{tool or "tool"} "{text}"'


#: texts and calls (their hashes) an attempt's watcher remembers as said, per kind: a repeat of
#: one forgotten counts as new, which only delays the "nothing new" sign. At 100,000 a loud
#: attempt's two sets held 14 MB, and 32 loud attempts at once several hundred
SEEN_LIMIT = 10_000


def _remember(seen: set[int], h: int, limit: int = SEEN_LIMIT) -> None:
    if len(seen) >= limit:  # an attempt this long: forget the oldest half of the past (any half)
        for x in list(seen)[: limit // 2]:
            seen.discard(x)
    seen.add(h)


@dataclass
class _Attempt:
    calls: list[tuple[int, Event]] = field(default_factory=list)  # (signature hash, the call)
    seen_calls: set[int] = field(default_factory=set)  # hashes: a long attempt stays small
    seen_texts: set[int] = field(default_factory=set)
    tokens_since_new: int = 0
    tripped: bool = False


class LoopDetector:
    """Feed it an attempt's events in order; ``feed`` returns a reason once it sees a loop."""

    def __init__(self, limits: LoopLimits) -> None:
        self.limits = limits
        self._att: dict[tuple[str, int], _Attempt] = {}

    def forget(self, task_id: str) -> None:
        for k in [k for k in self._att if k[0] == task_id]:
            del self._att[k]

    def feed(self, e: Event) -> str | None:
        a = self._att.get((e.task_id, e.attempt))
        if a is None:
            a = self._att[(e.task_id, e.attempt)] = _Attempt()
        if a.tripped:
            return None
        reason = self._feed(a, e)
        if reason:
            a.tripped = True
        return reason

    def _feed(self, a: _Attempt, e: Event) -> str | None:
        lim = self.limits
        if e.kind == "tool_call":
            sig = hash(call_signature(e.tool, e.tool_input))
            if sig not in a.seen_calls:
                _remember(a.seen_calls, sig)
                a.tokens_since_new = 0
            a.calls.append((sig, e))
            if len(a.calls) > 4 * lim.max_period * max(lim.same_call, 1):
                del a.calls[: len(a.calls) // 2]
            if lim.same_call > 1:
                return self._repeated(a.calls, lim.same_call, lim.max_period)
        elif e.kind == "text" and e.text:
            norm = hash(e.text.strip())
            if norm not in a.seen_texts:
                _remember(a.seen_texts, norm)
                a.tokens_since_new = 0
        if e.usage is not None and lim.output_tokens > 0:
            a.tokens_since_new += e.usage.output_tokens
            if a.tokens_since_new >= lim.output_tokens:
                return f"{a.tokens_since_new} output tokens without new output"
        return None

    @staticmethod
    def _repeated(calls: list[tuple[int, Event]], n: int, max_period: int) -> str | None:
        last = len(calls) - 1
        for p in range(1, max_period + 1):
            if len(calls) < p * n:
                return None
            if calls[last][0] != calls[last - p][0]:
                continue  # the cheap test first: most calls end every streak here
            tail = [s for s, _ in calls[-p * n :]]
            block = tail[:p]
            if p > 1 and len(set(block)) < p:
                continue  # a shorter period covers it
            if all(tail[i] == block[i % p] for i in range(len(tail))):
                said = [describe_call(e.tool, e.tool_input) for _, e in calls[-p:]]
                if p == 1:
                    return f"{said[0]} {n} times in a row"
                return f"{' / '.join(said)} repeated {n} times"
        return None
