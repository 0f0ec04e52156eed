"""Pure formatting and parsing for the cockpit: glyphs, durations, sizes, the queue's row values,
the filter language and event lines.

Kept out of the widgets so that parsing never runs in a widget (DESIGN section 3), and so each
rule can be tested without starting an app. Nothing here imports Textual; styles are passed in.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from fleet_tui import gauges
from fleet_tui.scheduler.humans.inbox import sanitize_for_display
from fleet_tui.scheduler.model import Event, Question, RateLimit, Snapshot, Task
from fleet_tui.scheduler.states import TaskStatus

#: one glyph per state; "asking" overrides the state's glyph
GLYPHS: dict[str, str] = {
    TaskStatus.QUEUED.value: "◌",
    TaskStatus.RUNNING.value: "◐",
    TaskStatus.VERIFYING.value: "◑",
    TaskStatus.DONE.value: "●",
    TaskStatus.NEEDS_HUMAN.value: "!",
    TaskStatus.PAUSED.value: "‖",
    TaskStatus.CANCELLED.value: "×",
    "asking": "?",
}

#: the queue's columns: (key, label, width). Widths are the defaults at 80 columns.
QUEUE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("glyph", " ", 1),
    ("name", "name", 12),
    ("state", "state", 24),
    ("attempt", "#", 2),
    ("elapsed", "time", 6),
    ("tokens", "tok", 5),
    ("ctx", "ctx", 4),
    ("cost", "cost", 6),
    ("coder", "coder/model", 11),
    ("host", "host", 7),
)
COLUMN_WIDTHS: dict[str, int] = {key: width for key, _, width in QUEUE_COLUMNS}


#: colour and style sequences (CSI ... m): harmless, common in tool output, dropped quietly
_SGR = re.compile(r"\x1b\[[0-9;:]*m")


def inert(text: object, *, one_line: bool = False) -> str:
    """Text that came from an agent, a verifier, git or a task file, made inert for the screen.

    Colour sequences are dropped; everything else goes through ``sanitize_for_display``
    (``scheduler.inbox``, the rule the CLI uses too), which shows every other escape and control
    character visibly (an OSC 52 clipboard write reads ``␛]52;c;…␇``, a bidi override
    ``<U+202E>``) so a person sees that something tried and nothing reaches the terminal as a
    control. Newlines are kept unless ``one_line``. Every widget passes such text through here."""
    s = text if isinstance(text, str) else str(text)
    return sanitize_for_display(_SGR.sub("", s), one_line=one_line)


def truncate(text: str, width: int) -> str:
    """One display line, inert: newlines folded, cut to ``width`` with an ellipsis."""
    line = " ".join(inert(text).split("\n"))
    if width <= 0:
        return ""
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def duration(seconds: float | None) -> str:
    """``42s``, ``3m07s``, ``2h05m``, ``3d04h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def count(n: int | None) -> str:
    """Token counts: ``950``, ``12k``, ``1.2M``."""
    if not n:
        return "-"
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.0f}k" if n >= 10_000 else f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"


def size(n: int | None) -> str:
    """Bytes as ``9.8G``, ``512M``; ``?`` when unknown (an unknown reading is never plenty)."""
    return gauges.size(n)  # one rule for the header, the gauges and ``status --gauges``


def cost(usd: float) -> str:
    return f"${usd:.2f}" if usd else "-"


def clock_time(ts: float | None) -> str:
    """Wall-clock ``HH:MM`` in local time."""
    if ts is None:
        return "?"
    return time.strftime("%H:%M", time.localtime(ts))


def clock_seconds(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def percent(fraction: float | None) -> str:
    return "?" if fraction is None else f"{fraction * 100:.0f}%"


def is_asking(task: Task, asking_ids: Iterable[str] = ()) -> bool:
    return task.asking or task.id in set(asking_ids)


def state_text(task: Task, asking: bool = False) -> str:
    """The state column: the waiting reason when queued, the reason when parked, or asking.
    Reasons carry agent and git text, so the result is inert (one line)."""
    return inert(_state_text(task, asking), one_line=True)


def _state_text(task: Task, asking: bool) -> str:
    if asking:
        return "asks a question"
    status = task.status
    if status == TaskStatus.QUEUED and task.waiting:
        return task.waiting
    if status in (TaskStatus.NEEDS_HUMAN, TaskStatus.PAUSED, TaskStatus.CANCELLED) and task.reason:
        prefix = "paused: " if status == TaskStatus.PAUSED else ""
        return prefix + task.reason
    if status == TaskStatus.DONE and "pull request #" in (task.reason or ""):  # merge = "pr"
        return "done: " + (task.reason or "").split(": http", 1)[0]
    return status.value


def elapsed(task: Task, now: float) -> float | None:
    """The one definition the CLI uses too (``Task.elapsed``): the current or last attempt."""
    return task.elapsed(now)


def context_pct(task: Task) -> str:
    if not task.context_tokens or not task.context_window:
        return "-"
    return f"{100 * task.context_tokens / task.context_window:.0f}%"


def coder_model(task: Task) -> str:
    coder = task.coder or task.spec.coder or "default"
    model = task.model or task.spec.model
    return f"{coder}/{model}" if model else coder


def row_values(task: Task, now: float, asking: bool = False) -> dict[str, str]:
    """The queue row of a task, keyed like ``QUEUE_COLUMNS``."""
    glyph = GLYPHS["asking"] if asking else GLYPHS.get(task.status.value, "?")
    w = COLUMN_WIDTHS
    return {
        "glyph": glyph,
        "name": truncate(task.name, w["name"]),
        "state": truncate(state_text(task, asking), w["state"]),
        "attempt": str(task.attempt) if task.attempt else "-",
        "elapsed": duration(elapsed(task, now)),
        "tokens": count(task.tokens),
        "ctx": context_pct(task),
        "cost": cost(task.cost_usd),
        "coder": truncate(coder_model(task), w["coder"]),
        "host": truncate(task.host or "-", w["host"]),
    }


# ---------------------------------------------------------------------------------------- filter


@dataclass(frozen=True)
class TaskFilter:
    """``state:running coder:claude api``: every term must match (state and coder by prefix,
    free words as substrings of the name). ``host:`` and ``name:`` work too; ``repo:`` is matched
    by the queue's model, which knows each task's repository."""

    states: tuple[str, ...] = ()
    coders: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    errors: tuple[str, ...] = field(default=())
    repos: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.states or self.coders or self.hosts or self.words or self.repos)

    def matches(self, task: Task, asking: bool = False) -> bool:
        name = task.name.lower()
        if any(w not in name for w in self.words):
            return False
        if self.states:
            status = "asking" if asking else task.status.value
            if not any(status.startswith(s) or task.status.value.startswith(s) for s in self.states):
                return False
        if self.coders:
            coder = coder_model(task).lower()
            if not any(coder.startswith(c) or f"/{c}" in coder for c in self.coders):
                return False
        return not self.hosts or any((task.host or "").lower().startswith(h) for h in self.hosts)


def parse_filter(text: str) -> TaskFilter:
    states: list[str] = []
    coders: list[str] = []
    hosts: list[str] = []
    words: list[str] = []
    repos: list[str] = []
    errors: list[str] = []
    for term in text.lower().split():
        key, sep, value = term.partition(":")
        if not sep:
            words.append(term)
        elif not value:
            errors.append(f"{key}: needs a value")
        elif key in ("state", "status", "s"):
            states.append(value)
        elif key in ("coder", "model", "c"):
            coders.append(value)
        elif key in ("host", "h"):
            hosts.append(value)
        elif key in ("name", "n"):
            words.append(value)
        elif key in ("repo", "r"):
            repos.append(value)
        else:
            errors.append(f"unknown filter key {key!r} (state, coder, host, name, repo)")
    return TaskFilter(tuple(states), tuple(coders), tuple(hosts), tuple(words), tuple(errors), tuple(repos))


# ---------------------------------------------------------------------------------------- header


def header_text(title: str, snap: Snapshot, questions: int, now: float, width: int | None = None) -> str:
    """``fleet-tui ─ 3 running · 5 queued · 1 question · rate 42% (resets 14:05) · mem 9.8G free``

    With ``width``, the least useful words give way first (``free``, finished counts, the reset
    time, the title) so that what needs the person (paused, running, parked, questions) shows."""
    # counted in C (ten thousand tasks, several times a second under load): no .value per task
    counts = {status.value: n for status, n in Counter(map(attrgetter("status"), snap.tasks)).items()}
    active = counts.get("running", 0) + counts.get("verifying", 0)
    parts = [f"{active} running"] if active else []
    order = ["queued", "needs_human", "paused"]
    parts += [f"{counts[s]} {s.replace('_', ' ')}" for s in order if counts.get(s)]
    if not snap.tasks:
        parts.append("no tasks")
    if questions:
        parts.append(f"{questions} question{'s' if questions != 1 else ''}")
    if snap.gauges.paused:
        parts.insert(0, "PAUSED")
    if snap.stale_since is not None:  # attached, and no engine is live: nothing moves
        parts.insert(0, f"NO ENGINE (figures {duration(now - snap.stale_since)} old)")
    worst = worst_rate_limit(snap.gauges.rate_limits)
    finished = [f"{counts[s]} {s}" for s in ("done", "cancelled") if counts.get(s)]
    mem = size(snap.gauges.mem_available)
    variants = [(True, True, True, True), (True, False, True, True), (True, False, False, True)]
    variants += [(True, False, False, False), (False, False, False, False)]
    text = ""
    for with_title, with_free, with_finished, with_reset in variants:
        shown = list(parts)
        if worst is not None:
            rate = rate_limit_text(worst, now, short=True)
            shown.append(rate if with_reset else rate.split(" (")[0])
        shown.append(f"mem {mem} free" if with_free else f"mem {mem}")
        if with_finished:
            shown += finished
        text = (f"{title} ─ " if with_title else "") + " · ".join(shown)
        if width is None or len(text) <= width:
            return text
    return text


def worst_rate_limit(limits: Iterable[RateLimit]) -> RateLimit | None:
    def key(r: RateLimit) -> float:
        return 2.0 if r.status == "rejected" else (r.utilization or 0.0)

    ordered = sorted(limits, key=key, reverse=True)
    return ordered[0] if ordered else None


def rate_limit_text(rl: RateLimit, now: float, short: bool = False) -> str:
    label = "rate" if short else inert(rl.account, one_line=True)
    util = "limited" if rl.status == "rejected" else percent(rl.utilization)
    text = f"{label} {util}"
    if rl.resets_at is not None and rl.resets_at > now:
        text += f" (resets {clock_time(rl.resets_at)})"
    if not short and rl.window:
        text += f" [{inert(rl.window, one_line=True)}]"
    return text


def question_line(q: Question, task_name: str) -> str:
    picks = list(q.choices) + (["…"] if q.options and q.free_text else [])
    opts = f" [{' / '.join(picks)}]" if picks else ""
    return inert(f"{task_name}: {q.text}{opts}", one_line=True)


# ---------------------------------------------------------------------------------------- events

#: the theme variable each event kind is coloured with
KIND_VARIABLES: dict[str, str] = {
    "session_started": "text-primary",
    "text": "foreground",
    "thinking": "foreground-muted",
    "tool_call": "text-accent",
    "tool_result": "text-secondary",
    "usage": "foreground-muted",
    "rate_limit": "text-warning",
    "question": "text-warning",
    "answer": "text-success",
    "api_retry": "text-warning",
    "error": "text-error",
    "result": "text-success",
    "stderr": "text-warning",
    "oversized": "text-warning",
    "lifecycle": "text-primary",
    "verify": "text-primary",
}

#: short labels of event kinds for the stream (so columns line up)
KIND_LABELS: dict[str, str] = {
    "session_started": "start",
    "tool_call": "tool",
    "tool_result": "result",
    "rate_limit": "rate",
    "api_retry": "retry",
    "lifecycle": "life",
    "oversized": "big",
    "thinking": "think",
    "question": "ask",
    "result": "done",
}


def event_summary(ev: Event) -> str:
    """The text of one event on one line (without time and kind)."""
    if ev.kind == "tool_call":
        arg = ev.tool_input
        if isinstance(arg, Mapping):
            arg = (
                next(iter(arg.values()), "")
                if len(arg) == 1
                else " ".join(f"{k}={v}" for k, v in arg.items())
            )
        body = f"{ev.tool or '?'}  {arg if arg is not None else ''}".rstrip()
    elif ev.kind == "usage" and ev.usage is not None:
        # a usage that counts no tokens (a final report of the context only) says so, not "- tok"
        parts = [f"{count(ev.usage.total)} tok"] if ev.usage.total else []
        if ev.context_tokens and ev.context_window:
            parts.append(f"ctx {100 * ev.context_tokens / ev.context_window:.0f}%")
        body = " · ".join(parts) or "0 tok"
    elif ev.kind == "rate_limit" and ev.rate_limit is not None:
        body = rate_limit_text(ev.rate_limit, ev.ts)
    elif ev.kind == "result" and ev.cost_usd is not None:
        body = f"{ev.text or ''} ({cost(ev.cost_usd)})".strip()
    else:
        body = ev.text or ev.tool or ""
    if ev.is_error and ev.kind not in ("error", "stderr"):
        body = "ERROR " + body
    return inert(body)


def event_line(ev: Event, width: int, style_for: Callable[[str], Style] | None = None) -> Text:
    """``14:02:11 tool   Bash  pytest -q`` truncated to ``width``, styled by kind."""
    plain = _event_plain(ev, width)
    text = Text(plain)
    if style_for is not None:
        clock, rest = _event_styles(ev, style_for)
        text.stylize(clock, 0, min(8, len(plain)))
        text.stylize(rest, min(9, len(plain)))
    return text


def event_segments(ev: Event, width: int, style_for: Callable[[str], Style] | None) -> list[Segment] | None:
    """``event_line(ev, width, style_for)`` as the segments Rich renders it to, made directly
    (the stream pane writes a loud agent's lines at a score a frame, and rendering each ``Text``
    through the console was most of a line's cost); None for a line with a tab (expanded at the
    console's tab size, as the stream does with the ``Text``)."""
    plain = _event_plain(ev, width)
    if "\t" in plain:
        return None
    if style_for is None or not plain:  # no spans: one segment, even an empty one
        return [Segment(plain)]
    clock, rest = _event_styles(ev, style_for)
    parts = ((plain[:8], clock), (plain[8:9], Style.null()), (plain[9:], rest))
    return [Segment(part, style) for part, style in parts if part]


def _event_plain(ev: Event, width: int) -> str:
    label = KIND_LABELS.get(ev.kind, ev.kind)[:6]
    return truncate(f"{clock_seconds(ev.ts)} {label:<6} {event_summary(ev)}", width)


def _event_styles(ev: Event, style_for: Callable[[str], Style]) -> tuple[Style, Style]:
    """An event line's styles: its clock's, and its kind's for the rest."""
    kind = "error" if ev.is_error else ev.kind
    return style_for("foreground-muted"), style_for(KIND_VARIABLES.get(kind, "foreground"))


def log_matches(ev: Event, needle: str) -> bool:
    """The detail screen's log search: case-insensitive substring of the event's line."""
    if not needle:
        return True
    return needle.lower() in f"{ev.kind} {event_summary(ev)}".lower()


def diff_text(diff: str, style_for: Callable[[str], Style] | None = None) -> Text:
    """A unified diff coloured through theme variables (added, removed, hunk, file lines)."""
    text = Text()
    for line in diff.splitlines():
        var = None
        if line.startswith(("+++", "---", "diff ", "index ")):
            var = "text-primary"
        elif line.startswith("+"):
            var = "text-success"
        elif line.startswith("-"):
            var = "text-error"
        elif line.startswith("@@"):
            var = "text-accent"
        style = style_for(var) if (style_for is not None and var) else Style()
        text.append(inert(line) + "\n", style=style)
    return text


def diffstat(diff: str, limit: int = 30) -> str:
    """The stat part of ``engine.diff`` (lines before the first ``diff --git``), or a count."""
    head: list[str] = []
    for line in diff.splitlines():
        if line.startswith(("diff --git", "--- ", "@@")):
            break
        head.append(line)
    stat = inert("\n".join(head)).strip()
    if stat:
        lines = stat.splitlines()
        return "\n".join(lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else []))
    files = [ln[len("+++ b/") :] for ln in diff.splitlines() if ln.startswith("+++ b/")]
    added = sum(1 for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    removed = sum(1 for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---"))
    if not files:
        return inert(diff.strip()[:500]) or "(empty diff)"
    return f"{len(files)} file(s) changed, +{added} -{removed}\n" + inert("\n".join(files[:limit]))
