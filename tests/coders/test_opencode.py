"""The OpenCode coder against every OpenCode fixture stream, plus its argv/env/per-run config.

The fixtures live in the repository (``tests/fixtures/streams``);
PROVENANCE.md there says which lines are real captures of opencode 1.18.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet_tui.coders.base import AttemptContext
from fleet_tui.coders.opencode import OpenCodeCoder, OpenCodeNormalizer
from fleet_tui.scheduler.model import Event, Task, TaskSpec, Usage
from fleet_tui.scheduler.states import TaskStatus

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"
FILES = sorted(p.name for p in STREAMS.glob("opencode-*.jsonl"))


def run(name: str, exit_code: int | None = 0) -> tuple[list[Event], OpenCodeNormalizer]:
    n = OpenCodeNormalizer("t1", 1)
    events: list[Event] = []
    for i, line in enumerate((STREAMS / name).read_text().splitlines()):
        events += n.feed(line, 1000.0 + i)
    return events, n


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def test_fixtures_are_there() -> None:
    assert len(FILES) >= 9, f"expected the OpenCode fixtures in {STREAMS}"


@pytest.mark.parametrize("name", FILES)
def test_every_fixture_normalizes(name: str) -> None:
    events, n = run(name)
    assert events, name
    assert [e.seq for e in events] == list(range(len(events)))
    assert events[0].kind == "session_started" and events[0].session_id
    assert all(e.task_id == "t1" and e.attempt == 1 for e in events)
    calls = {e.tool_id: e for e in events if e.kind == "tool_call"}
    for r in (e for e in events if e.kind == "tool_result"):
        assert r.tool_id in calls, "every tool_result pairs with an earlier tool_call"
        assert events.index(calls[r.tool_id]) < events.index(r)
        assert r.tool == calls[r.tool_id].tool
    n.outcome(0), n.outcome(1), n.outcome(None)  # never raises


EXPECTED_KINDS = {
    "opencode-api-error.jsonl": ["session_started", "error"],
    "opencode-rate-limit.jsonl": ["session_started", "error", "rate_limit"],
    "opencode-real-local-1.18-rate-limited-forever.jsonl": ["session_started", "error", "rate_limit"],
    "opencode-real-local-1.18-rate-limited-then-ok.jsonl": ["session_started", "text", "usage", "result"],
}
TOOL_RUN = ["session_started", "tool_call", "tool_result", "usage", "text", "usage", "result"]
for _name in (
    "opencode-real-local-1.18-bash.jsonl",
    "opencode-real-local-1.18-mcp-tool.jsonl",
    "opencode-real-local-1.18-write-file.jsonl",
    "opencode-success-mcp.jsonl",
    "opencode-success-tool.jsonl",
):
    EXPECTED_KINDS[_name] = TOOL_RUN


@pytest.mark.parametrize("name", sorted(EXPECTED_KINDS))
def test_kinds_in_order(name: str) -> None:
    events, _ = run(name)
    assert kinds(events) == EXPECTED_KINDS[name]


def test_every_fixture_has_expected_kinds() -> None:
    assert set(FILES) == set(EXPECTED_KINDS), "a new fixture needs its expected kinds here"


@pytest.mark.parametrize(
    ("name", "tool", "tool_input_key", "output"),
    [
        ("opencode-real-local-1.18-bash.jsonl", "bash", "command", "README\nmarker.txt\n"),
        ("opencode-real-local-1.18-write-file.jsonl", "write", "filePath", "Wrote file successfully."),
        ("opencode-real-local-1.18-mcp-tool.jsonl", "fakemcp_echo", "text", "echo: ping from the fake model"),
        ("opencode-success-mcp.jsonl", "ask_human_ask_human", "question", "Yes, use PostgreSQL 16."),
        ("opencode-success-tool.jsonl", "bash", "command", "a\nb\n"),
    ],
)
def test_tool_call_and_result(name: str, tool: str, tool_input_key: str, output: str) -> None:
    events, n = run(name)
    call = next(e for e in events if e.kind == "tool_call")
    result = next(e for e in events if e.kind == "tool_result")
    assert call.tool == tool and tool_input_key in call.tool_input
    assert call.tool_id and call.tool_id == result.tool_id and call.tool_id.startswith(("toolu_", "call_"))
    assert result.text == output and not result.is_error
    out = n.outcome(0)
    assert out.kind == "success" and out.claimed_success
    assert out.result_text == events[-1].text


def test_bash_run_usage_cost_and_result() -> None:
    events, n = run("opencode-real-local-1.18-bash.jsonl")
    usages = [e for e in events if e.kind == "usage"]
    assert usages[0].usage == Usage(input_tokens=7653, output_tokens=46)
    assert usages[0].cost_usd == pytest.approx(0.023649)
    assert usages[0].context_tokens == 7653
    assert usages[1].context_tokens == 7747
    result = events[-1]
    assert result.kind == "result" and not result.is_error
    assert result.text == "The command ran. Output was:\nREADME\nmarker.txt\n"
    assert result.usage is None  # usage events are deltas; the result adds nothing to the sum
    assert n.totals == Usage(input_tokens=7653 + 7747, output_tokens=46 + 20)
    assert result.cost_usd == pytest.approx(0.023649 + 0.023541)
    out = n.outcome(0)
    assert out.cost_usd == pytest.approx(0.023649 + 0.023541)
    assert out.result_text == result.text
    assert result.session_id == "ses_dd9a82b0dffeFfil4HsUo0ws1b"


def test_cache_tokens_and_reasoning() -> None:
    events, _ = run("opencode-success-mcp.jsonl")
    u = next(e for e in events if e.kind == "usage")
    assert u.usage == Usage(
        input_tokens=65, output_tokens=119, cache_read_tokens=4623, cache_creation_tokens=12125
    )
    assert u.context_tokens == 65 + 4623 + 12125
    events, _ = run("opencode-success-tool.jsonl")
    u = next(e for e in events if e.kind == "usage")
    assert u.usage is not None and u.usage.output_tokens == 39 + 49  # reasoning counts as output


def test_api_error_401_is_auth_failed() -> None:
    events, n = run("opencode-api-error.jsonl")
    err = events[-1]
    assert err.is_error and err.text == "APIError: Insufficient balance. Manage your billing here"
    out = n.outcome(1)
    assert out.kind == "auth_failed" and "401" in out.detail


def test_non_retryable_429_is_rate_limited() -> None:
    events, n = run("opencode-rate-limit.jsonl")
    assert events[-1].rate_limit is not None and events[-1].rate_limit.status == "rejected"
    out = n.outcome(1)
    assert out.kind == "rate_limited" and "429" in out.detail and out.resets_at is None


def test_real_429_gives_up_with_retry_after() -> None:
    events, n = run("opencode-real-local-1.18-rate-limited-forever.jsonl")
    rl = events[-1].rate_limit
    assert rl is not None and rl.account == "opencode"
    assert rl.resets_at == pytest.approx(events[-1].ts + 1.0)  # retry-after: 1
    out = n.outcome(1)
    assert out.kind == "rate_limited" and out.resets_at == rl.resets_at


def test_resets_at_from_reset_headers_without_retry_after() -> None:
    n = OpenCodeNormalizer("t", 1)
    line = {
        "type": "error",
        "sessionID": "ses_x",
        "error": {
            "name": "APIError",
            "data": {
                "message": "slow down",
                "statusCode": 429,
                "responseHeaders": {
                    "anthropic-ratelimit-requests-reset": "2026-11-29T08:07:31Z",
                    "anthropic-ratelimit-tokens-reset": "2026-11-29T08:08:31Z",
                },
            },
        },
    }
    events = n.feed(json.dumps(line), 5.0)
    rl = events[-1].rate_limit
    assert rl is not None and rl.resets_at == pytest.approx(1795939711.0)


def test_rate_limited_then_ok_is_success() -> None:
    events, n = run("opencode-real-local-1.18-rate-limited-then-ok.jsonl")
    assert n.outcome(0).kind == "success"
    assert events[-1].text == "Finished after being rate limited twice."


def test_outcome_from_exit_codes_and_structure() -> None:
    n = OpenCodeNormalizer("t", 1)
    assert n.outcome(0).kind == "failure" and "no output" in n.outcome(0).detail
    _events, n = run("opencode-real-local-1.18-bash.jsonl")
    assert n.outcome(1).kind == "failure"
    assert n.outcome(None).kind == "failure"
    # a turn still running when the process ended (no final step_finish)
    n = OpenCodeNormalizer("t", 1)
    lines = (STREAMS / "opencode-real-local-1.18-bash.jsonl").read_text().splitlines()[:3]
    for line in lines:
        n.feed(line, 1.0)
    assert n.outcome(0).kind == "failure" and "no finished turn" in n.outcome(0).detail


def test_error_after_result_fails_and_provider_auth_error() -> None:
    _events, n = run("opencode-real-local-1.18-bash.jsonl")
    err = {
        "type": "error",
        "sessionID": "s",
        "error": {"name": "ProviderAuthError", "data": {"message": "x"}},
    }
    n.feed(json.dumps(err), 9.0)
    assert n.outcome(1).kind == "auth_failed"


def test_tool_error_state_and_reasoning_and_done() -> None:
    n = OpenCodeNormalizer("t", 1)
    tool = {
        "type": "tool_use",
        "sessionID": "s",
        "part": {"type": "tool", "tool": "bash", "callID": "c1",
                 "state": {"status": "error", "input": {"command": "false"}, "error": "exit 1"}},
    }  # fmt: skip
    reasoning = {"type": "reasoning", "sessionID": "s", "part": {"type": "reasoning", "text": "hmm"}}
    events = n.feed(json.dumps(reasoning), 1.0) + n.feed(json.dumps(tool), 2.0)
    assert kinds(events) == ["session_started", "thinking", "tool_call", "tool_result"]
    assert events[-1].is_error and events[-1].text == "exit 1" and events[-1].tool_id == "c1"
    done = n.feed(json.dumps({"type": "done", "sessionID": "s", "reason": "idle"}), 3.0)
    assert kinds(done) == ["result"]
    assert n.feed(json.dumps({"type": "done", "sessionID": "s"}), 4.0) == []


def test_bad_finish_reason_is_an_error_result() -> None:
    n = OpenCodeNormalizer("t", 1)
    line = {"type": "step_finish", "sessionID": "s", "part": {"reason": "length", "tokens": {"input": 1}}}
    events = n.feed(json.dumps(line), 1.0)
    assert kinds(events) == ["session_started", "usage", "result"]
    assert events[-1].is_error and n.outcome(0).kind == "failure"


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "not json at all",
        "{broken",
        "[1, 2, 3]",
        '"a string"',
        "{}",
        '{"type": 5}',
        '{"type": "tool_use", "part": "nope"}',
        '{"type": "tool_use", "part": {"state": [1]}}',
        '{"type": "step_finish", "part": {"tokens": [1], "cost": "x"}}',
        '{"type": "step_finish", "part": {"tokens": {"input": "7", "cache": 3}}}',
        '{"type": "error", "error": "boom"}',
        '{"type": "error", "error": {"data": {"statusCode": "429"}}}',
        '{"type": "text", "part": {"text": null}}',
        '{"type": "brand_new_event", "sessionID": "s"}',
        '{"type": "text", "sessionID": 7}',
    ],
)
def test_never_raises_on_garbage(line: str) -> None:
    n = OpenCodeNormalizer("t", 1, start_seq=10)
    events = n.feed(line, 1.0)
    for e in events:
        assert e.seq >= 10
    if line.strip() and not line.lstrip().startswith("{"):
        assert kinds(events) == ["text"] and events[0].text == line
    n.outcome(0), n.outcome(2), n.outcome(None)


# -- the coder: argv, env, per-run config -------------------------------------------------------


def make_ctx(tmp_path: Path, **kw: object) -> AttemptContext:
    task = Task(id="t1", spec=TaskSpec(name="t", prompt="p"), status=TaskStatus.RUNNING)
    work = tmp_path / "repo"
    work.mkdir(exist_ok=True)
    args: dict = {
        "task": task, "attempt": 2, "prompt": "-do the thing", "workdir": work,
        "attempt_dir": tmp_path / "attempts" / "2", "home": tmp_path / "home",
    }  # fmt: skip
    args.update(kw)
    return AttemptContext(**args)


def test_argv_has_no_prompt_and_stdin_has_it(tmp_path: Path) -> None:
    c = OpenCodeCoder()
    ctx = make_ctx(tmp_path)
    assert c.argv(ctx) == ["opencode", "run", "--format", "json", "--dir", str(ctx.workdir)]
    assert c.stdin(ctx) == b"-do the thing"  # never argv: no ARG_MAX, never in ps
    ctx = make_ctx(tmp_path, model="anthropic/claude-sonnet-4-5")
    argv = c.argv(ctx)
    assert argv[argv.index("--model") + 1] == "anthropic/claude-sonnet-4-5"
    assert (c.name, c.program, c.install_hint) == ("opencode", "opencode", "npm install -g opencode-ai")


def test_env_keeps_the_users_config_dir(tmp_path: Path) -> None:
    """OPENCODE_CONFIG layers on the user's config; XDG_CONFIG_HOME would hide it (issue 13)."""
    c = OpenCodeCoder()
    ctx = make_ctx(tmp_path)
    env = c.env(ctx)
    assert env["PWD"] == str(ctx.workdir)
    assert env["OPENCODE_CONFIG"] == str(c.config_path(ctx))
    assert "XDG_CONFIG_HOME" not in env
    for key in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        assert Path(env[key]).is_relative_to(ctx.attempt_dir)


def user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: dict) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "userconfig"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "userdata"))
    monkeypatch.delenv("OPENCODE_CONFIG", raising=False)
    path = tmp_path / "userconfig" / "opencode" / "opencode.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cfg))
    path.chmod(0o644)
    return path


USER_CFG = {
    "model": "anthropic/claude-sonnet-4-5",
    "mcp": {"facts": {"type": "local", "command": ["facts-server"]}},
}


def test_prepare_layers_only_fleets_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = user_config(tmp_path, monkeypatch, USER_CFG)
    before = path.read_bytes()
    c = OpenCodeCoder()
    ctx = make_ctx(tmp_path, mcp_command=("python", "-m", "fleet_tui.scheduler.humans.mcp_ask_human"),
                   mcp_env={"FLEET_TASK_ID": "t1"})  # fmt: skip
    c.prepare(ctx)
    cfg = json.loads(c.config_path(ctx).read_text())
    assert cfg["permission"]["edit"] == "allow" and cfg["permission"]["bash"] == "allow"
    mcp = cfg["mcp"]
    assert set(mcp) == {"ask_human"}  # the user's servers come from their own file, untouched
    assert mcp["ask_human"]["type"] == "local"
    assert mcp["ask_human"]["command"] == ["python", "-m", "fleet_tui.scheduler.humans.mcp_ask_human"]
    assert mcp["ask_human"]["environment"] == {"FLEET_TASK_ID": "t1"}
    assert "provider" not in cfg and "model" not in cfg
    assert c.config_path(ctx).stat().st_mode & 0o777 == 0o600
    assert path.read_bytes() == before
    for d in c.xdg_dirs(ctx).values():
        assert d.is_dir()


def test_fleet_only_disables_the_users_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user_config(tmp_path, monkeypatch, USER_CFG)
    c = OpenCodeCoder()
    ctx = make_ctx(tmp_path, mcp_command=("ask",), user_mcp=False)
    c.prepare(ctx)
    mcp = json.loads(c.config_path(ctx).read_text())["mcp"]
    assert mcp["facts"] == {"enabled": False} and mcp["ask_human"]["enabled"] is True
    assert c.setup(user_mcp=False).mcp_servers == ("ask_human",)


def test_setup_names_files_servers_and_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = user_config(tmp_path, monkeypatch, USER_CFG)
    monkeypatch.chdir(tmp_path)
    s = OpenCodeCoder().setup()
    assert s.config_files == (str(path),)
    assert s.mcp_servers == ("facts", "ask_human")
    assert s.model == "anthropic/claude-sonnet-4-5"


def test_prepare_without_mcp_links_the_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = tmp_path / "userdata" / "opencode" / "auth.json"
    auth.parent.mkdir(parents=True)
    auth.write_text("{}")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "userdata"))
    c = OpenCodeCoder()
    ctx = make_ctx(tmp_path)
    c.prepare(ctx)
    c.prepare(ctx)  # idempotent
    cfg = json.loads(c.config_path(ctx).read_text())
    assert "mcp" not in cfg
    linked = c.xdg_dirs(ctx)["XDG_DATA_HOME"] / "opencode" / "auth.json"
    assert linked.is_symlink() and linked.resolve() == auth.resolve()


def test_normalizer_factory(tmp_path: Path) -> None:
    n = OpenCodeCoder().normalizer("t9", 3, start_seq=5, attempt_dir=tmp_path)
    assert isinstance(n, OpenCodeNormalizer) and n.seq == 5 and n.attempt_dir == tmp_path
    assert n.poll(1.0) == []
