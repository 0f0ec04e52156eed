"""Unit tests of the cockpit's pure parts: formatting, the filter language, form validation, and
the rule that the cockpit imports no engine internals."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from rich.style import Style

from fleet_tui.app import format as fmt
from fleet_tui.app.forms import field_of, validate_new_task
from fleet_tui.scheduler.model import Event, RateLimit, Usage
from fleet_tui.scheduler.states import TaskStatus as S

from . import scenarios as sc
from .fake_engine import task


def test_durations_counts_sizes() -> None:
    assert fmt.duration(None) == "-"
    assert fmt.duration(42) == "42s"
    assert fmt.duration(187) == "3m07s"
    assert fmt.duration(7500) == "2h05m"
    assert fmt.count(0) == "-"
    assert fmt.count(950) == "950"
    assert fmt.count(5100) == "5.1k"
    assert fmt.count(12_400) == "12k"
    assert fmt.count(1_200_000) == "1.2M"
    assert fmt.size(None) == "?"
    assert fmt.size(int(9.8 * (1 << 30))) == "9.8G"
    assert fmt.size(41 * (1 << 30)) == "41G"
    assert fmt.truncate("a\nb", 10) == "a b"
    assert fmt.truncate("abcdef", 4) == "abc…"


def test_state_text_shows_reasons() -> None:
    queued = task(id="a", name="a", status=S.QUEUED, waiting="after user-api")
    assert fmt.state_text(queued) == "after user-api"
    parked = task(id="b", name="b", status=S.NEEDS_HUMAN, reason="retries_exhausted")
    assert fmt.state_text(parked) == "retries_exhausted"
    paused = task(id="c", name="c", status=S.PAUSED, reason="by user")
    assert fmt.state_text(paused) == "paused: by user"
    running = task(id="d", name="d", status=S.RUNNING, asking=True)
    assert fmt.state_text(running, asking=True) == "asks a question"
    assert fmt.row_values(running, 0.0, asking=True)["glyph"] == "?"


def test_row_values_elapsed_and_context() -> None:
    t = task(id="x", name="x", status=S.RUNNING, attempt=2, started_at=100.0, attempt_started_at=160.0,
             tokens=12_400, cost_usd=0.12, context_tokens=50_000, context_window=200_000, coder="claude",
             model="sonnet")  # fmt: skip
    row = fmt.row_values(t, now=200.0)
    assert row["elapsed"] == "40s"
    assert row["ctx"] == "25%"
    assert row["cost"] == "$0.12"
    assert fmt.coder_model(t) == "claude/sonnet"
    assert row["coder"] == "claude/son…"  # cut to the column width, with an ellipsis
    assert row["attempt"] == "2"
    # one definition with `status`: the current or last attempt; time in the queue never counts
    done = replace(t, status=S.DONE, finished_at=172.0)
    assert fmt.row_values(done, now=999.0)["elapsed"] == "12s"
    backoff = replace(t, status=S.QUEUED, updated_at=175.0, not_before=900.0)
    assert fmt.row_values(backoff, now=800.0)["elapsed"] == "15s"


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("state:running", {"states": ("running",)}),
        ("coder:claude api", {"coders": ("claude",), "words": ("api",)}),
        ("host:box1", {"hosts": ("box1",)}),
    ],
)
def test_parse_filter(text: str, expect: dict[str, tuple[str, ...]]) -> None:
    flt = fmt.parse_filter(text)
    for key, value in expect.items():
        assert getattr(flt, key) == value
    assert not flt.errors


def test_parse_filter_errors_and_matching() -> None:
    assert fmt.parse_filter("colour:red").errors
    assert fmt.parse_filter("state:").errors
    t = task(id="x", name="user-api", status=S.NEEDS_HUMAN, coder="claude", model="sonnet", host="box1")
    assert fmt.parse_filter("state:need").matches(t)
    assert fmt.parse_filter("coder:sonnet").matches(t)
    assert not fmt.parse_filter("state:running").matches(t)
    assert fmt.parse_filter("state:asking").matches(t, asking=True)
    assert fmt.parse_filter("").empty


def test_header_text() -> None:
    snap = sc.rate_limited().snapshot()
    head = fmt.header_text("fleet-tui", snap, questions=2, now=sc.NOW)
    assert head.startswith("fleet-tui ─ 1 running · 2 queued · 2 questions · rate limited (resets 16:30)")
    assert "mem 9.8G free" in head


def test_an_event_lines_segments_are_those_rich_renders_its_text_to() -> None:
    """The stream pane makes an event line's segments itself: they are the ones rendering
    ``event_line``'s ``Text`` gives, for every kind, errors, any width, wide and control
    characters, with and without styles; a line with a tab is left to the ``Text``."""
    console = Console(width=200)
    styles = {
        name: Style(color=f"#{i:02x}{i:02x}{i:02x}", bold=i % 2 == 0) for i, name in enumerate(STYLE_NAMES)
    }
    texts = ["pytest -q", "", "界" * 30, "a\nb\x1b[2J\x07c", "x" * 300, "\u202eevil", "ok 😀 done"]
    events = [
        Event("t", 1, seq, sc.NOW, kind, text=text, tool="Bash", is_error=error)
        for seq, (kind, text, error) in enumerate(
            (kind, text, error)
            for kind in sorted({*fmt.KIND_LABELS, *fmt.KIND_VARIABLES, "unknown-kind"})
            for text in texts
            for error in (False, True)
        )
    ]
    for ev in events:
        for width in (0, 1, 5, 8, 9, 10, 12, 40, 80, 200):
            for style_for in (None, styles.__getitem__):
                made = fmt.event_segments(ev, width, style_for)
                assert made == list(fmt.event_line(ev, width, style_for).render(console)), (ev, width)
    tabbed = Event("t", 1, 0, sc.NOW, "text", text="a\tb")
    assert "\t" in fmt.event_line(tabbed, 80).plain
    assert fmt.event_segments(tabbed, 80, styles.__getitem__) is None


#: the theme variables an event line is styled with
STYLE_NAMES = sorted({"foreground-muted", "foreground", *fmt.KIND_VARIABLES.values()})


def test_event_lines() -> None:
    ev = Event("t", 1, 0, sc.NOW, "tool_call", tool="Bash", tool_input={"command": "pytest -q"})
    assert fmt.event_line(ev, 80).plain == "16:00:00 tool   Bash  pytest -q"
    long = Event("t", 1, 1, sc.NOW, "text", text="x" * 500)
    assert len(fmt.event_line(long, 60).plain) == 60
    usage = Event("t", 1, 2, sc.NOW, "usage", usage=Usage(1000, 200), context_tokens=10, context_window=100)
    assert fmt.event_summary(usage) == "1.2k tok · ctx 10%"
    # a usage that counts no tokens (the context only, or nothing) says so, not "- tok"
    ctx_only = Event("t", 1, 2, sc.NOW, "usage", usage=Usage(0, 0), context_tokens=8, context_window=100)
    assert fmt.event_summary(ctx_only) == "ctx 8%"
    assert fmt.event_summary(Event("t", 1, 2, sc.NOW, "usage", usage=Usage(0, 0))) == "0 tok"
    rl = Event("t", 1, 3, sc.NOW, "rate_limit", rate_limit=RateLimit("claude", "allowed", 0.5, sc.NOW + 60))
    assert fmt.event_summary(rl) == "claude 50% (resets 16:01)"
    assert fmt.log_matches(ev, "PYTEST") and not fmt.log_matches(ev, "nothing")


def test_diffstat() -> None:
    diff = sc.parked().diffs["t-0201"]
    stat = fmt.diffstat(diff)
    assert "2 files changed" in stat and "diff --git" not in stat
    bare = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert fmt.diffstat(bare).startswith("1 file(s) changed, +1 -1")


def test_validate_new_task(tmp_path: Path) -> None:
    ok = validate_new_task(
        {"prompt": "do it", "name": "new-task", "cwd": str(tmp_path), "priority": "3", "depends_on": "a, b"},
        existing_names={"a", "b"},
    )
    assert ok.ok, ok.errors
    assert ok.spec is not None and ok.spec.depends_on == ("a", "b") and ok.spec.priority == 3
    bad = validate_new_task({"prompt": "", "name": "New", "cwd": str(tmp_path / "no"), "priority": "1.5",
                             "depends_on": "zzz", "coder": "bad coder"}, existing_names=set())  # fmt: skip
    assert set(bad.errors) == {"prompt", "name", "cwd", "priority", "depends_on", "coder"}
    loop = validate_new_task({"prompt": "x", "name": "a", "cwd": str(tmp_path), "depends_on": "a"}, {"b"})
    assert loop.errors == {"depends_on": "unknown: a"}
    assert field_of("unknown coder 'nope' (known: claude)") == "coder"
    assert field_of("name already queued: 'b'") == "name"


def test_cockpit_imports_no_engine_internals() -> None:
    # inbox (and the store protocol it names) is allowed: it holds sanitize_for_display, the one
    # rule for showing agent text, shared by the CLI and the cockpit; series holds the pulse's
    # pure arithmetic, shared with `status --gauges`; notify_store comes with store (its stats type)
    code = (
        "import sys, fleet_tui.app.app, fleet_tui.screens.detail;"
        "ok = {'api', 'model', 'states', 'humans', 'humans.inbox', 'store', 'store.protocol', 'series'};"
        "bad = [m for m in sys.modules if m.startswith('fleet_tui.scheduler.') "
        "and m.removeprefix('fleet_tui.scheduler.') not in ok];"
        "print(','.join(sorted(bad)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_inert_shows_escapes_visibly() -> None:
    assert fmt.inert("\x1b[31mred\x1b[0m") == "red"  # colours are dropped quietly
    assert fmt.inert("a\x1b]52;c;eA==\x07b") == "a␛]52;c;eA==␇b"
    assert fmt.inert("\x9b2J\x9d0;t\x9c") == "␛[2J␛]0;t␛\\"
    assert fmt.inert("x\u202ey\x00\x7f") == "x<U+202E>y␀␡"
    assert fmt.inert("one\r\ntwo\rthree") == "one\ntwo\nthree"
    assert fmt.inert("one\ntwo  three", one_line=True) == "one two three"
    assert fmt.truncate("\x1b]0;title\x07rest", 80) == "␛]0;title␇rest"


def test_header_says_when_no_engine_is_live_and_how_old_the_figures_are() -> None:
    snap = replace(sc.rate_limited().snapshot(), stale_since=sc.NOW - 125)
    head = fmt.header_text("fleet-tui", snap, questions=0, now=sc.NOW)
    assert head.startswith("fleet-tui ─ NO ENGINE (figures 2m05s old) · 1 running")
    narrow = fmt.header_text("fleet-tui", snap, questions=0, now=sc.NOW, width=60)
    assert narrow.startswith("NO ENGINE (figures 2m05s old)")  # kept when the title gives way
    assert "NO ENGINE" not in fmt.header_text("fleet-tui", sc.rate_limited().snapshot(), 0, sc.NOW)


@pytest.mark.anyio
async def test_attached_view_marks_its_snapshot_stale_without_a_live_engine(tmp_path: Path) -> None:
    """Headless: an attached view on a store no engine runs on says its figures are old."""
    from fleet_tui.config import Config
    from fleet_tui.scheduler.model import TaskSpec
    from fleet_tui.scheduler.store.opener import open_store
    from fleet_tui.scheduler.view import AttachedView

    store = open_store(None, str(tmp_path))
    store.add_tasks([TaskSpec(name="one", prompt="p", cwd=str(tmp_path), coder="sim")], sc.NOW - 300)
    view = AttachedView(store, tmp_path, Config(), clock=lambda: sc.NOW)
    try:
        await view.refresh()
        snap = view.snapshot()
        assert snap.stale_since is not None and snap.stale_since <= sc.NOW
        assert "NO ENGINE" in fmt.header_text("fleet-tui", snap, 0, sc.NOW)
    finally:
        store.close()
