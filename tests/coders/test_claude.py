"""The Claude coder against every Claude fixture stream, plus its argv/env/per-run config.

The fixtures live in the repository (``tests/fixtures/streams``);
PROVENANCE.md there says which lines are real captures (Claude Code 2.1.332 against a fake API,
2.1.195 verbatim) and which are adapted. These tests pin the traps DESIGN section 6 names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet_tui.coders.base import AttemptContext, get_coder
from fleet_tui.coders.claude import (
    ASK_HUMAN_TOOL,
    DEFAULT_CONTEXT_WINDOW,
    SEEN_MESSAGES,
    ClaudeCoder,
    ClaudeNormalizer,
)
from fleet_tui.scheduler.model import EVENT_KINDS, Event, Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"
FILES = sorted(p.name for p in STREAMS.glob("claude-*.jsonl"))


def lines(name: str) -> list[str]:
    return (STREAMS / name).read_text(encoding="utf-8").splitlines()


def run(name: str) -> tuple[list[Event], ClaudeNormalizer]:
    n = ClaudeNormalizer("t1", 1)
    events: list[Event] = []
    for i, line in enumerate(lines(name)):
        events += n.feed(line, 1000.0 + i)
    return events, n


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def message_usage(events: list[Event]) -> list[Event]:
    """Usage events of API messages (not the reconciliation from the result line)."""
    return [
        e
        for e in events
        if e.kind == "usage" and not (isinstance(e.raw, dict) and "reconciled_from" in e.raw)
    ]


def test_fixtures_are_there() -> None:
    assert len(FILES) >= 13, f"expected the Claude fixtures in {STREAMS}"


@pytest.mark.parametrize("name", FILES)
def test_every_fixture_normalizes(name: str) -> None:
    events, _ = run(name)
    assert events[0].kind == "session_started"
    assert events[0].session_id
    assert events[-1].kind == "result"
    assert all(e.kind in EVENT_KINDS for e in events)
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(e.task_id == "t1" and e.attempt == 1 for e in events)
    # every tool result answers a call made before it, and every call is answered
    calls = {e.tool_id for e in events if e.kind == "tool_call"}
    results = [e.tool_id for e in events if e.kind == "tool_result"]
    assert set(results) == calls
    for e in events:
        if e.kind == "tool_result":
            first_call = next(x for x in events if x.kind == "tool_call" and x.tool_id == e.tool_id)
            assert first_call.seq < e.seq


EXPECTED_KINDS = {
    # a recorded bash run edited to repeat one tool call six times (loop detection's input)
    "claude-real-local-2.1.332-bash-loop.jsonl": [
        "session_started",
        *["tool_call", "usage", "tool_result"] * 6,
        "text",
        "usage",
        "usage",
        "result",
    ],
    "claude-success-tool.jsonl": [
        "session_started",
        "text",
        "tool_call",
        "usage",
        "tool_result",
        "tool_call",
        "usage",
        "tool_result",
        "rate_limit",
        "text",
        "usage",
        "usage",
        "result",
    ],
    "claude-real-local-2.1.332-bash.jsonl": [
        "session_started",
        "tool_call",
        "usage",
        "tool_result",
        "text",
        "usage",
        "usage",
        "result",
    ],
    "claude-real-local-2.1.332-mcp.jsonl": [
        "session_started",
        "text",
        "usage",
        "tool_call",
        "tool_result",
        "text",
        "usage",
        "usage",
        "result",
    ],
    "claude-real-local-2.1.332-429-then-ok.jsonl": [
        "session_started",
        "api_retry",
        "api_retry",
        "tool_call",
        "usage",
        "tool_result",
        "text",
        "usage",
        "usage",
        "result",
    ],
    "claude-real-local-2.1.332-529-then-ok.jsonl": [
        "session_started",
        "api_retry",
        "text",
        "usage",
        "usage",
        "result",
    ],
    "claude-real-local-2.1.332-429-max-retries-2.jsonl": [
        "session_started",
        "api_retry",
        "api_retry",
        "error",
        "result",
    ],
    "claude-real-local-2.1.332-429-exhausted.jsonl": ["session_started"]
    + ["api_retry"] * 10
    + ["error", "result"],
    "claude-real-local-2.1.332-partial.jsonl": ["session_started", "text", "usage", "usage", "result"],
    "claude-partial-messages.jsonl": ["session_started", "text", "usage", "usage", "result"],
    "claude-real-verbatim-2.1.195.jsonl": ["session_started", "text", "usage", "usage", "result"],
    "claude-api-error-429.jsonl": ["session_started", "api_retry", "api_retry", "result"],
    "claude-auth-failure.jsonl": ["session_started", "error", "result"],
    "claude-rate-limit.jsonl": ["session_started", "rate_limit", "error", "result"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_KINDS))
def test_kinds_in_order(name: str) -> None:
    events, _ = run(name)
    assert kinds(events) == EXPECTED_KINDS[name]


def test_every_fixture_has_expected_kinds() -> None:
    assert set(FILES) <= set(EXPECTED_KINDS), "a new fixture needs its expected kinds here"


EXPECTED_OUTCOMES = {
    "claude-success-tool.jsonl": ("success", 0.0841),
    "claude-real-local-2.1.332-bash.jsonl": ("success", 0.10167599999999999),
    "claude-real-local-2.1.332-mcp.jsonl": ("success", 0.101616),
    "claude-real-local-2.1.332-429-then-ok.jsonl": ("success", 0.101784),
    "claude-real-local-2.1.332-529-then-ok.jsonl": ("success", 0.050172),
    "claude-real-local-2.1.332-partial.jsonl": ("success", 0.050368),
    "claude-partial-messages.jsonl": ("success", 0.0062),
    "claude-real-verbatim-2.1.195.jsonl": ("success", 0.122623),
    "claude-real-local-2.1.332-429-max-retries-2.jsonl": ("rate_limited", 0.0),
    "claude-real-local-2.1.332-429-exhausted.jsonl": ("rate_limited", 0.0),
    "claude-api-error-429.jsonl": ("rate_limited", 0.0),
    "claude-rate-limit.jsonl": ("rate_limited", 0.0),
    "claude-auth-failure.jsonl": ("auth_failed", 0.0),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_OUTCOMES))
def test_outcomes(name: str) -> None:
    events, n = run(name)
    kind, cost = EXPECTED_OUTCOMES[name]
    result = events[-1]
    out = n.outcome(1 if result.is_error else 0)
    assert out.kind == kind, out
    assert out.cost_usd == pytest.approx(cost)
    assert result.cost_usd == pytest.approx(cost)
    assert out.claimed_success is (kind == "success")
    assert out.result_text == result.text
    if kind != "success":
        assert out.detail


def test_api_error_reported_as_subtype_success_is_a_failure() -> None:
    """The trap: subtype "success" with is_error true is an API failure, not a success."""
    events, n = run("claude-api-error-429.jsonl")
    raw = json.loads(lines("claude-api-error-429.jsonl")[-1])
    assert raw["subtype"] == "success" and raw["is_error"] is True
    assert events[-1].is_error
    assert n.outcome(1).kind == "rate_limited"
    # the same line with the status cleared and no 429 anywhere is a plain failure
    n2 = ClaudeNormalizer("t1", 1)
    n2.feed(json.dumps({**raw, "api_error_status": None}), 1.0)
    assert n2.outcome(1).kind == "failure"


def test_usage_is_counted_once_per_message_id() -> None:
    events, _ = run("claude-real-local-2.1.332-mcp.jsonl")
    ids = []
    for line in lines("claude-real-local-2.1.332-mcp.jsonl"):
        obj = json.loads(line)
        if obj.get("type") == "assistant":
            ids.append(obj["message"]["id"])
    assert len(ids) == 3 and len(set(ids)) == 2  # two lines share one message id
    assert len(message_usage(events)) == 2


def test_a_long_attempt_remembers_only_its_latest_message_ids() -> None:
    """Usage is counted once per message id, and the ids remembered for it are the latest
    ``SEEN_MESSAGES``: an agent writing a message a line (a burst of 200 lines a second) made the
    engine keep every id of the attempt, 130 bytes a line, without bound."""
    n = ClaudeNormalizer("t1", 1)

    def line(i: int, block: str) -> str:
        msg = {
            "id": f"msg_{i:06d}",
            "content": [{"type": "text", "text": block}],
            "usage": {"output_tokens": 1},
        }
        return json.dumps({"type": "assistant", "message": msg})

    counted = 0
    for i in range(SEEN_MESSAGES + 500):
        counted += len(message_usage(n.feed(line(i, "a"), 1.0)))
        counted += len(message_usage(n.feed(line(i, "b"), 1.0)))  # its next block: the same id
    assert counted == SEEN_MESSAGES + 500  # once per message
    assert len(n._seen_messages) == SEEN_MESSAGES
    assert "msg_000000" not in n._seen_messages and f"msg_{SEEN_MESSAGES + 499:06d}" in n._seen_messages


@pytest.mark.parametrize(
    "name",
    [
        "claude-success-tool.jsonl",
        "claude-real-local-2.1.332-bash.jsonl",
        "claude-real-local-2.1.332-mcp.jsonl",
        "claude-real-local-2.1.332-429-then-ok.jsonl",
        "claude-real-local-2.1.332-partial.jsonl",
    ],
)
def test_usage_sum_matches_the_result_totals(name: str) -> None:
    events, n = run(name)
    result = json.loads(lines(name)[-1])
    u = result["usage"]
    total = sum(e.usage.total for e in events if e.kind == "usage" and e.usage)
    expected = (
        u["input_tokens"]
        + u["output_tokens"]
        + u["cache_read_input_tokens"]
        + u["cache_creation_input_tokens"]
    )
    assert total == expected
    assert n.total_usage.total == expected


def test_context_tokens_and_window() -> None:
    events, _ = run("claude-success-tool.jsonl")
    usage = message_usage(events)
    # input + cache_read + cache_creation of the latest message
    assert usage[-1].context_tokens == 2 + 31084 + 220
    assert all(e.context_window == DEFAULT_CONTEXT_WINDOW for e in usage)
    # 2.1.332 reports a 1M window for its model in result.modelUsage: later events carry it
    events, n = run("claude-real-local-2.1.332-bash.jsonl")
    assert message_usage(events)[0].context_window == DEFAULT_CONTEXT_WINDOW
    assert events[-2].kind == "usage" and events[-2].context_window == 1_000_000
    assert n.context_window == 1_000_000
    assert events[-2].context_tokens == 12568


def test_tool_calls_and_results() -> None:
    events, _ = run("claude-success-tool.jsonl")
    calls = [e for e in events if e.kind == "tool_call"]
    assert [c.tool for c in calls] == ["Bash", ASK_HUMAN_TOOL]
    assert calls[0].tool_input == {"command": "pytest -q", "description": "Run the test suite"}
    assert calls[0].tool_id == "toolu_01E9xFiJ"
    results = [e for e in events if e.kind == "tool_result"]
    assert results[0].text == "2 failed, 40 passed in 1.93s" and not results[0].is_error
    assert results[1].text == "Yes, use PostgreSQL 16."  # a block list joined to text


def test_mcp_tool_result_block_list() -> None:
    events, _ = run("claude-real-local-2.1.332-mcp.jsonl")
    (call,) = [e for e in events if e.kind == "tool_call"]
    (res,) = [e for e in events if e.kind == "tool_result"]
    assert call.tool == "mcp__fakemcp__echo" and call.tool_input == {"text": "ping from the fake model"}
    assert res.tool_id == call.tool_id and res.text == "echo: ping from the fake model"


def test_rate_limit_events() -> None:
    events, n = run("claude-success-tool.jsonl")
    (rl,) = [e.rate_limit for e in events if e.kind == "rate_limit"]
    assert rl is not None
    assert (rl.account, rl.status, rl.resets_at, rl.window) == (
        "claude",
        "allowed",
        1785274800.0,
        "five_hour",
    )
    assert n.outcome(0).kind == "success"
    events, n = run("claude-rate-limit.jsonl")
    out = n.outcome(1)
    assert out.kind == "rate_limited" and out.resets_at == 1788360600.0
    assert events[1].rate_limit is not None and events[1].rate_limit.status == "rejected"


def test_api_retry_events_carry_the_status() -> None:
    events, _ = run("claude-real-local-2.1.332-529-then-ok.jsonl")
    (retry,) = [e for e in events if e.kind == "api_retry"]
    assert retry.raw["error_status"] == 529 and "529" in (retry.text or "")
    events, _ = run("claude-real-local-2.1.332-429-exhausted.jsonl")
    retries = [e for e in events if e.kind == "api_retry"]
    assert all(e.raw["error_status"] == 429 and "429" in (e.text or "") for e in retries)


def test_synthetic_error_message_is_an_error_event() -> None:
    events, _ = run("claude-auth-failure.jsonl")
    err = events[1]
    assert err.kind == "error" and err.is_error and err.text == "Not logged in · Please run /login"
    assert not message_usage(events)  # the synthetic message's zero usage is not counted


def test_partial_messages_do_not_duplicate_text() -> None:
    events, _ = run("claude-real-local-2.1.332-partial.jsonl")
    texts = [e.text for e in events if e.kind == "text"]
    assert texts == ["This answer trickles in slowly, a few characters at a time."]


def test_thinking_blocks() -> None:
    n = ClaudeNormalizer("t1", 1)
    line = {
        "type": "assistant",
        "message": {
            "id": "m1",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "ok"},
            ],
            "usage": {"input_tokens": 5, "output_tokens": 2},
        },
        "parent_tool_use_id": None,
    }
    events = n.feed(json.dumps(line), 1.0)
    assert kinds(events) == ["thinking", "text", "usage"]
    assert events[0].text == "hmm"
    assert kinds(n.feed(json.dumps(line), 2.0)) == ["thinking", "text"]  # same id: no usage again


@pytest.mark.parametrize(
    "line",
    [
        "not json at all",
        "{broken json",
        "[1, 2, 3]",
        '{"no_type": true}',
        '{"type": "assistant", "message": "not a dict"}',
        '{"type": "assistant", "message": {"content": "a string", "usage": 7}}',
        '{"type": "user", "message": {"content": [{"type": "tool_result", "content": {"odd": 1}}]}}',
        '{"type": "result", "is_error": "yes", "total_cost_usd": "free", "usage": null}',
        '{"type": "rate_limit_event", "rate_limit_info": {"status": null, "utilization": "high"}}',
        '{"type": "system", "subtype": "api_retry", "error_status": "abc"}',
        '{"type": "future_kind", "x": 1}',
    ],
)
def test_garbage_never_raises(line: str) -> None:
    n = ClaudeNormalizer("t1", 1)
    events = n.feed(line, 1.0)
    assert all(e.kind in EVENT_KINDS for e in events)
    if not line.startswith("{") or line.startswith("{broken"):
        assert kinds(events) == ["text"] and events[0].text == line
    n.outcome(None)


def test_blank_line_gives_nothing() -> None:
    assert ClaudeNormalizer("t1", 1).feed("   ", 1.0) == []


def test_outcome_without_a_result_line() -> None:
    # stopped (inactivity timeout) while Claude was still retrying 429s: a rate limit
    n = ClaudeNormalizer("t1", 1)
    for line in lines("claude-real-local-2.1.332-429-exhausted.jsonl")[:4]:
        n.feed(line, 1.0)
    assert n.outcome(None).kind == "rate_limited"
    # crashed after init
    n = ClaudeNormalizer("t1", 1)
    n.feed(lines("claude-success-tool.jsonl")[0], 1.0)
    out = n.outcome(137)
    assert out.kind == "failure" and "137" in out.detail


def test_context_full_is_context_pressure() -> None:
    n = ClaudeNormalizer("t1", 1)
    n.feed(
        json.dumps(
            {
                "type": "result",
                "subtype": "success",
                "is_error": True,
                "terminal_reason": "blocking_limit",
                "result": "Prompt is too long",
            }
        ),
        1.0,
    )
    assert n.outcome(1).kind == "context_pressure"


def test_start_seq_and_attempt_dir() -> None:
    n = ClaudeNormalizer("t9", 3, start_seq=40, attempt_dir=Path("/nonexistent"))
    (e,) = n.feed(lines("claude-success-tool.jsonl")[0], 5.0)
    assert (e.task_id, e.attempt, e.seq, e.ts) == ("t9", 3, 40, 5.0)
    assert n.poll(6.0) == []


# -- the coder --------------------------------------------------------------------------------


def make_ctx(
    tmp_path: Path, mcp: bool = True, model: str | None = None, env: tuple[tuple[str, str], ...] = ()
) -> AttemptContext:
    spec = TaskSpec(name="demo", prompt="Write marker.txt", env=env)
    task = Task(id="t1", spec=spec, status=TaskStatus.RUNNING, attempt=1)
    return AttemptContext(
        task=task,
        attempt=1,
        prompt="Write marker.txt, then stop.",
        workdir=tmp_path / "work",
        attempt_dir=tmp_path / "attempts" / "1",
        home=tmp_path / "home",
        model=model,
        mcp_command=("python3", "-m", "fleet_tui.scheduler.humans.mcp_ask_human") if mcp else (),
        mcp_env={"FLEET_TASK_ID": "t1", "FLEET_ATTEMPT": "1"} if mcp else {},
    )


def test_argv_without_mcp(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, mcp=False)
    assert ClaudeCoder().argv(ctx) == [
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
    ]


def test_argv_with_mcp_and_model(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, model="claude-sonnet-4-6")
    argv = ClaudeCoder().argv(ctx)
    assert argv[:5] == ["claude", "-p", "--output-format", "stream-json", "--verbose"]
    assert argv[argv.index("--model") + 1] == "claude-sonnet-4-6"
    assert argv[argv.index("--mcp-config") + 1] == str(ctx.attempt_dir / "mcp.json")
    assert "--strict-mcp-config" not in argv  # the user's own MCP servers stay (issue 13)
    assert argv[argv.index("--allowedTools") + 1] == "mcp__ask_human__ask_human"
    assert ctx.prompt not in argv  # the prompt goes on stdin


def test_stdin_env_and_prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    coder = ClaudeCoder()
    ctx = make_ctx(tmp_path)
    assert coder.stdin(ctx) == b"Write marker.txt, then stop."
    env = coder.env(ctx)
    assert env["IS_SANDBOX"] == "1"
    assert "CLAUDE_CONFIG_DIR" not in env  # a subscription login lives in the user's config
    coder.prepare(ctx)
    data = json.loads((ctx.attempt_dir / "mcp.json").read_text())
    assert data == {
        "mcpServers": {
            "ask_human": {
                "type": "stdio",
                "command": "python3",
                "args": ["-m", "fleet_tui.scheduler.humans.mcp_ask_human"],
                "env": {"FLEET_TASK_ID": "t1", "FLEET_ATTEMPT": "1"},
            }
        }
    }
    # with an API key the whole config dir is per run, under the attempt directory
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    env = coder.env(ctx)
    assert env["CLAUDE_CONFIG_DIR"] == str(ctx.attempt_dir / "claude_config")
    coder.prepare(ctx)
    assert (ctx.attempt_dir / "claude_config").is_dir()
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    ctx2 = make_ctx(tmp_path, env=(("ANTHROPIC_AUTH_TOKEN", "tok"),))
    assert "CLAUDE_CONFIG_DIR" in coder.env(ctx2)


def test_fleet_only_is_strict(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    ctx = AttemptContext(**{**ctx.__dict__, "user_mcp": False})
    argv = ClaudeCoder().argv(ctx)
    assert "--strict-mcp-config" in argv and "--mcp-config" in argv


def test_isolated_run_gets_private_copies_of_the_users_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "userhome"
    (home / ".claude" / "agents").mkdir(parents=True)
    state = {"mcpServers": {"facts": {"type": "stdio", "command": "facts"}}}
    (home / ".claude.json").write_text(json.dumps(state))
    (home / ".claude.json").chmod(0o644)
    (home / ".claude" / "settings.json").write_text(json.dumps({"model": "opus"}))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    monkeypatch.delenv("ANTHROPIC_MODEL", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    coder = ClaudeCoder()
    ctx = make_ctx(tmp_path)
    coder.prepare(ctx)
    d = ctx.attempt_dir / "claude_config"
    assert json.loads((d / ".claude.json").read_text()) == state
    assert json.loads((d / "settings.json").read_text()) == {"model": "opus"}
    for name in (".claude.json", "settings.json"):
        assert (d / name).stat().st_mode & 0o777 == 0o600
    assert (ctx.attempt_dir / "mcp.json").stat().st_mode & 0o777 == 0o600
    assert (d / "agents").is_symlink()
    assert json.loads((home / ".claude.json").read_text()) == state  # untouched
    s = coder.setup()
    assert s.mcp_servers == ("facts", "ask_human") and s.model == "opus"
    assert s.config_files == (str(home / ".claude.json"), str(home / ".claude" / "settings.json"))


def test_prepare_without_mcp_writes_no_mcp_config(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, mcp=False)
    ClaudeCoder().prepare(ctx)
    assert not (ctx.attempt_dir / "mcp.json").exists()


def test_registered_and_named() -> None:
    coder = get_coder("claude")
    assert isinstance(coder, ClaudeCoder)
    assert (coder.name, coder.program) == ("claude", "claude")
    assert "npm install -g @anthropic-ai/claude-code" in coder.install_hint
    n = coder.normalizer("t1", 2, 5, None)
    assert isinstance(n, ClaudeNormalizer) and n.seq == 5
