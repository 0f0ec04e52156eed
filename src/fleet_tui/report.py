"""How tasks and events look on a terminal and in ``--json``: the stable keys of ``status --json``,
one-line event rendering for ``logs``, the depends_on tree of ``status --graph`` and the gauges
of ``status --gauges`` (figures from ``fleet_tui.gauges``).

Agent-provided text is sanitized before it reaches the terminal (it is data, never escape codes).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_tui.repos import group_order, repo_labels, repo_root, urgency
from fleet_tui.scheduler.humans.inbox import sanitize_for_display
from fleet_tui.scheduler.timing import elapsed


def task_json(t: Any, now: float) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "status": t.status.value,
        "reason": t.reason,
        "waiting": t.waiting,
        "asking": t.asking,
        "attempt": t.attempt,
        "retries_used": t.retries_used,
        "handoffs": t.handoffs,
        "false_completions": t.false_completions,
        "priority": t.spec.priority,
        "depends_on": list(t.spec.depends_on),
        "coder": t.coder or t.spec.coder,
        "model": t.model or t.spec.model,
        "host": t.host,
        "owner": t.owner,
        "created_at": t.created_at,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "elapsed_s": elapsed(t, now),
        "tokens": t.tokens,
        "cost_usd": t.cost_usd,
        "context_tokens": t.context_tokens,
        "context_window": t.context_window,
        "branch": t.branch,
        "worktree": t.worktree,
        "workdir": t.workdir,
        "merged_commit": t.merged_commit,
        "result_text": t.result_text,
    }


def fmt_dur(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def why(t: Any, by_name: dict[str, Any] | None = None) -> str:
    """Why a task is where it is: its question, its waiting reason, or its parked reason."""
    if t.asking:
        return "asks a question"
    if t.status.value == "queued":
        if t.waiting:
            return str(t.waiting)
        if by_name is not None:  # no engine has looked at it yet: dependencies are known anyway
            after = [d for d in t.spec.depends_on if d in by_name and by_name[d].status.value != "done"]
            if after:
                return "after " + ", ".join(after)
        return t.reason or ""
    return t.reason or ""


def group_by_repo(tasks: list[Any]) -> list[tuple[str, list[Any]]]:
    """``status --group repo``: the cockpit's groups (same repositories, labels and order), each
    with a header line counting its states; tasks keep ``status``'s order inside a group."""
    by_root: dict[str, list[Any]] = {}
    for t in tasks:
        by_root.setdefault(repo_root(t.spec.cwd), []).append(t)
    labels = repo_labels(by_root)
    urgencies = {r: min(urgency(t.status.value, t.asking) for t in ts) for r, ts in by_root.items()}
    out = []
    for root in group_order(labels, urgencies):
        members = by_root[root]
        counts: dict[str, int] = {}
        for t in members:
            state = "asking" if t.asking and t.status.value not in ("done", "cancelled") else t.status.value
            counts[state] = counts.get(state, 0) + 1
        states = " · ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(counts.items(), key=_state_rank))
        where = "" if labels[root] == root else f" ({sanitize_for_display(root, one_line=True)})"
        label = sanitize_for_display(labels[root], one_line=True)
        out.append(
            (f"{label}{where} · {len(members)} task{'s' if len(members) != 1 else ''} · {states}", members)
        )
    return out


_STATES = ("asking", "needs_human", "running", "verifying", "paused", "queued", "done", "cancelled")


def _state_rank(item: tuple[str, int]) -> int:
    return _STATES.index(item[0]) if item[0] in _STATES else len(_STATES)


#: deeper than this, a line of ``status --graph`` shows its depth instead of the tree's lines
GRAPH_MAX_INDENT = 30


def print_graph(tasks: list[Any]) -> int:
    """The depends_on tree, walked without recursion (a chain may be thousands of tasks deep).

    A task with several dependencies is shown under each of them; a task in a cycle (a store
    filled before cycles were refused) is shown once, where the walk first meets it."""
    by_name = {t.name: t for t in tasks}
    children: dict[str, list[str]] = {}
    roots = []
    for t in tasks:
        deps = [d for d in t.spec.depends_on if d in by_name]
        if not deps:
            roots.append(t.name)
        for d in deps:
            children.setdefault(d, []).append(t.name)
    shown: set[str] = set()
    # (name, prefix, last, depth, path of ancestors)
    stack: list[tuple[str, str, bool, int, frozenset[str]]] = [
        (r, "", True, 0, frozenset()) for r in reversed(roots)
    ]
    while stack:
        name, prefix, last, depth, path = stack.pop()
        t = by_name[name]
        reason = sanitize_for_display(why(t, by_name), one_line=True)
        line = f"{name} [{t.status.value}]" + (f" {reason}" if reason else "")
        if depth == 0:
            print(line)
        elif depth > GRAPH_MAX_INDENT:
            print(f"{' ' * (3 * GRAPH_MAX_INDENT)}[depth {depth}] {line}")
        else:
            print(f"{prefix}{'└─ ' if last else '├─ '}{line}")
        shown.add(name)
        kids = [k for k in children.get(name, []) if k not in path and k != name]
        sub = prefix + ("" if depth == 0 else ("   " if last else "│  "))
        if depth >= GRAPH_MAX_INDENT:
            sub = prefix
        for i in range(len(kids) - 1, -1, -1):
            stack.append((kids[i], sub, i == len(kids) - 1, depth + 1, path | {name}))
    for t in tasks:  # only in a cycle: no root leads to it
        if t.name not in shown:
            print(f"{t.name} [{t.status.value}] (in a depends_on cycle)")
    return 0


def event_json(e: Any) -> dict[str, Any]:
    """One event as the stable JSON object of ``logs --json`` (unset fields left out)."""
    d = dataclasses.asdict(e)
    d.pop("raw_json", None)  # how the store keeps ``raw``, not a field of the event's JSON
    return {k: v for k, v in d.items() if v is not None and v is not False}


def event_line(e: Any) -> str:
    """One event as a terminal line: time, attempt, kind, a short sanitized body."""
    ts = time.strftime("%H:%M:%S", time.localtime(e.ts))
    body = e.text or ""
    if e.kind == "tool_call":
        body = f"{e.tool} {json.dumps(e.tool_input)[:200] if e.tool_input is not None else ''}"
    elif e.kind == "usage" and e.usage:
        body = f"{e.usage.total} tokens" + (f", context {e.context_tokens}" if e.context_tokens else "")
    elif e.kind == "rate_limit" and e.rate_limit:
        body = f"{e.rate_limit.status} {e.rate_limit.window or ''}"
    body = sanitize_for_display(body.replace("\n", " ⏎ "), one_line=True)
    if len(body) > 400:
        body = body[:400] + "…"
    return f"{ts} a{e.attempt} {e.kind:<12} {body}"


def fresh_waiting(
    store: Any,
    tasks: list[Any],
    now: float,
    stale_s: float,
    plan: Callable[[], list[tuple[Any, Any]]],
    cap: int,
) -> list[Any]:
    """With no engine live, stored waiting reasons are stale (nobody re-plans): say so on stderr
    and compute them now with ``plan`` (as ``fleet-tui plan`` does). With an engine live, they are
    its own, fresh."""
    if store.live_engines(now, stale_s):
        return tasks
    seen = [h.heartbeat for h in store.hosts()]
    last = f" (last seen {fmt_dur(now - max(seen))} ago)" if seen else ""
    print(
        f"fleet-tui: no engine is running on this store{last}: nothing starts until one does "
        "(`fleet-tui run` or the cockpit); waiting reasons below are computed now",
        file=sys.stderr,
    )
    if not any(t.status.value == "queued" for t in tasks):
        return tasks
    decisions = {t.id: d for t, d in plan()}
    out = []
    for t in tasks:
        d = decisions.get(t.id)
        if d is not None:
            t = dataclasses.replace(t, waiting=_without_engine(d.ok, d.reason, cap))
        out.append(t)
    return out


def _without_engine(ok: bool, reason: str | None, cap: int) -> str | None:
    """A waiting reason computed with no engine running, in words true of that: nothing runs or
    starts, so a task behind the cap (``max_concurrent``) waits for the ones ahead of it once an
    engine starts them (the planner's "slots full: 0/4 running + 4 starting before it" said
    otherwise)."""
    if ok:
        return "ready: starts when an engine runs"
    if (reason or "").startswith("slots full"):
        return f"ready: starts when an engine runs and a slot is free ({cap} at a time)"
    return reason


def print_gauges(store: Any, cfg: Any, home: Path, *, as_json: bool) -> int:
    """``status --gauges``: the cockpit's gauges from the store (every host's pulse included);
    with no live engine the headroom is read on this machine."""
    import shutil

    from fleet_tui import gauges
    from fleet_tui.scheduler.policy.headroom import read_headroom
    from fleet_tui.scheduler.view import build_snapshot

    now = time.time()
    reading: dict[str, Any] = {}
    if not any(now - h.heartbeat < 60 for h in store.hosts()):
        hr = read_headroom(home)
        reading = {"load": hr.load_per_core, "mem": hr.mem_available, "disk": hr.disk_free}
    snap = build_snapshot(store, cfg, now, **reading)
    if as_json:
        print(json.dumps(gauges.as_json(snap, now), indent=1))
    else:
        print("\n".join(gauges.text_report(snap, now, width=shutil.get_terminal_size((100, 24)).columns)))
    return 0
