"""The Coder protocol's promises, checked on every registered coder alike.

Why: each coder has its own test file pinning its vendor's flags and stream traps; this suite is
the other axis, as ``tests/engine/test_store_contract.py`` is for the stores. Every coder in the
``fleet_tui.coders`` entry-point group (a third party's too, once registered) must keep what
``fleet_tui/coders/base.py`` promises the engine:

- the command is an argv list of str, never a shell string (only ``shell`` runs ``sh -c``, on the
  task's own command); the prompt goes on stdin, never on the command line; the model reaches it;
- ``env`` is str to str, and every path in it lies under the attempt directory (per-run config
  goes there, never in ``~``); ``argv``/``env``/``stdin`` write nothing;
- ``prepare`` writes under the attempt directory only, leaves the user's HOME as it was, registers
  the ask_human MCP server when asked (and only then), and keeps secrets in 0600 files;
- a normalizer never raises on a line, whatever it holds (an unexpected line becomes an event
  carrying it), numbers its events from ``start_seq``, and classifies every end as an outcome
  kind; every recorded stream of its CLI (``tests/fixtures/streams``) yields events and an outcome;
- ``can_resume`` matches ``resume_argv``: a coder that cannot resume says so with CannotResume; one
  that can continues a recorded session with the same command (plus the session), and says
  CannotResume when the session is gone;
- ``available``/``version``/``setup`` answer without raising, with the install hint when the CLI
  is missing, and ``mcp = "fleet-only"`` leaves only ask_human.

The user's HOME is a temporary one holding each CLI's config the way its users write it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

from fleet_tui.coders.base import (
    AttemptContext,
    CannotResume,
    Coder,
    CoderNotFound,
    Setup,
    coder_names,
    get_coder,
    setup_lines,
)
from fleet_tui.scheduler.model import EVENT_KINDS, Event, OutcomeKind, Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

ROOT = Path(__file__).resolve().parents[2]
STREAMS = ROOT / "tests" / "fixtures" / "streams"
NAMES = sorted(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["fleet_tui.coders"]
)

#: whose recorded streams each coder reads (the simulated agent writes Claude's stream-json)
STREAM_PREFIX = {
    "sim": "claude",
    "claude": "claude",
    "codex": "codex",
    "opencode": "opencode",
    "gemini": "gemini",
}
#: recorded side files, not stdout streams (Codex's rollout, read by its normalizer's poll)
SIDE_FILES = {"codex-rollout-token-count.jsonl"}
#: the coders that read the user's own CLI config (the built-in ones have none)
READS_USER_CONFIG = {"claude", "codex", "opencode", "gemini"}
#: what a resumed command may leave out of a fresh one (``codex exec resume`` has no ``-C``)
RESUME_DROPS = {"codex": {"-C", "<workdir>"}}

PROMPT = "Contract prompt 7f3e: write marker.txt, then stop."
MODEL = "contract-model-5b1d"
MCP_MARK = "ask-human-contract-9c2a"
SECRET = "secret-token-4e8f"  # in the MCP server's environment (a store password, say)
USER_SECRET = "user-secret-0d6b"  # in the user's CLI login/config files
SESSION = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish"}
ENV_VARS = (
    "CLAUDE_CONFIG_DIR",
    "CODEX_HOME",
    "GEMINI_CLI_HOME",
    "OPENCODE_CONFIG",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "ANTHROPIC_MODEL",
    "GEMINI_API_KEY",
    "GEMINI_MODEL",
    "GOOGLE_GENAI_USE_GCA",
    "GOOGLE_GENAI_USE_VERTEXAI",
)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def user_home(home: Path) -> Path:
    """A user's HOME as each CLI's users set it up: a login and one MCP server of their own."""
    server = {"command": "user-mcp-server", "args": []}
    write(home / ".claude.json", json.dumps({"mcpServers": {"user-srv": server}, "oauth": USER_SECRET}))
    write(home / ".claude" / "settings.json", json.dumps({"model": "user-claude-model"}))
    write(
        home / ".codex" / "config.toml", 'model = "user-codex-model"\n[mcp_servers.user-srv]\ncommand = "x"\n'
    )
    write(home / ".codex" / "auth.json", json.dumps({"OPENAI_API_KEY": USER_SECRET}))
    write(
        home / ".config" / "opencode" / "opencode.json", json.dumps({"mcp": {"user-srv": {"type": "local"}}})
    )
    write(home / ".local" / "share" / "opencode" / "auth.json", json.dumps({"key": USER_SECRET}))
    write(
        home / ".gemini" / "settings.json", json.dumps({"mcpServers": {"user-srv": server}, "k": USER_SECRET})
    )
    return home


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's HOME for this test (and none of the machine's CLI settings in the environment)."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return user_home(tmp_path / "user")


def make_ctx(
    tmp: Path,
    *,
    mcp: bool = True,
    model: str | None = MODEL,
    user_mcp: bool = True,
    attempt: int = 1,
    prompt: str = PROMPT,
) -> AttemptContext:
    spec = TaskSpec(name="contract", prompt=prompt, cwd=str(tmp / "work"), command="echo hello")
    task = Task(id="t-contract", spec=spec, status=TaskStatus.RUNNING, attempt=attempt)
    (tmp / "work").mkdir(parents=True, exist_ok=True)
    return AttemptContext(
        task=task,
        attempt=attempt,
        prompt=prompt,
        workdir=tmp / "work",
        attempt_dir=tmp / "fleet" / "tasks" / task.id / "attempts" / str(attempt),
        home=tmp / "fleet",
        model=model,
        mcp_command=(sys.executable, "-m", MCP_MARK) if mcp else (),
        mcp_env={"FLEET_TASK_ID": task.id, "FLEET_STORE_PASSWORD": SECRET} if mcp else {},
        user_mcp=user_mcp,
    )


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and folder under ``root``: its mode and (for files) its bytes."""
    out: dict[str, tuple[int, bytes]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        data = (
            p.read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(p).encode() if p.is_symlink() else b""
        )
        out[str(p.relative_to(root))] = (st.st_mode, data)
    return out


def written(root: Path) -> Iterator[tuple[Path, str]]:
    """The regular files (not symlinks) under ``root`` with their text."""
    if root.is_dir():
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.is_symlink():
                yield p, p.read_text(encoding="utf-8", errors="replace")


def is_under(path: Path, root: Path) -> bool:
    """Whether ``path`` is spelled under ``root`` (a symlink there to the user's file counts)."""
    return Path(os.path.normpath(path)).is_relative_to(os.path.normpath(root))


@pytest.fixture(params=NAMES)
def coder(request: pytest.FixtureRequest) -> Coder:
    return get_coder(request.param)


# -- the registry ------------------------------------------------------------------------------


def test_every_entry_point_is_a_registered_coder_under_its_own_name() -> None:
    assert NAMES == ["claude", "codex", "gemini", "opencode", "shell", "sim"]
    assert set(NAMES) <= set(coder_names())  # a third party's may be there too
    for name in NAMES:
        assert get_coder(name).name == name
    with pytest.raises(CoderNotFound, match="unknown coder 'no-such'"):
        get_coder("no-such")


def test_declarations_have_the_promised_types(coder: Coder) -> None:
    assert isinstance(coder.name, str) and coder.name
    assert coder.program is None or (isinstance(coder.program, str) and coder.program)
    assert isinstance(coder.install_hint, str) and coder.install_hint
    assert isinstance(getattr(coder, "can_resume", False), bool)
    state = getattr(coder, "sandbox_state", ())
    assert isinstance(state, tuple) and all(isinstance(s, str) and s.startswith("~/") for s in state)


# -- the command line ----------------------------------------------------------------------------


def test_argv_is_a_list_of_str_and_no_shell_string(coder: Coder, tmp_path: Path, home: Path) -> None:
    ctx = make_ctx(tmp_path)
    argv = coder.argv(ctx)
    assert isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
    assert argv == coder.argv(ctx)  # the same context, the same command
    if coder.name == "shell":  # the one coder that runs a shell, on the task's own command
        assert argv[1:] == ["-c", "echo hello"] and Path(argv[0]).name in SHELLS
        return
    assert Path(argv[0]).name not in SHELLS
    assert argv[0] == (coder.program or sys.executable)


def test_the_prompt_goes_on_stdin_never_on_the_command_line(coder: Coder, tmp_path: Path, home: Path) -> None:
    ctx = make_ctx(tmp_path)
    assert not any("7f3e" in a for a in coder.argv(ctx))
    assert coder.stdin(ctx) == PROMPT.encode()


def test_the_model_reaches_the_agent_only_when_set(coder: Coder, tmp_path: Path, home: Path) -> None:
    ctx = make_ctx(tmp_path)
    assert MODEL in coder.argv(ctx) + list(coder.env(ctx).values())
    plain = make_ctx(tmp_path, model=None)
    assert not any(MODEL in a for a in coder.argv(plain) + list(coder.env(plain).values()))


def test_env_is_str_to_str_and_its_paths_stay_in_the_attempt(
    coder: Coder, tmp_path: Path, home: Path
) -> None:
    for ctx in (make_ctx(tmp_path), make_ctx(tmp_path, mcp=False)):
        env = coder.env(ctx)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        if "PWD" in env:
            assert env["PWD"] == str(ctx.workdir)
        for key, value in env.items():
            if key in ctx.mcp_env or key == "PWD" or not value.startswith("/"):
                continue
            assert is_under(Path(value), ctx.attempt_dir), (key, value)


def test_building_the_command_writes_nothing(coder: Coder, tmp_path: Path, home: Path) -> None:
    ctx = make_ctx(tmp_path)
    before = tree(tmp_path)
    coder.argv(ctx), coder.env(ctx), coder.stdin(ctx)
    assert tree(tmp_path) == before


# -- per-run configuration -------------------------------------------------------------------------


@pytest.mark.parametrize("credentials_in_env", [False, True], ids=["login", "api-key"])
def test_prepare_writes_under_the_attempt_only(
    coder: Coder, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, credentials_in_env: bool
) -> None:
    if credentials_in_env:  # a CLI that authenticates from the environment may isolate its config
        for var in ("ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
            monkeypatch.setenv(var, "k-contract")
    ctx = make_ctx(tmp_path)
    user_before, work_before = tree(home), tree(ctx.workdir)
    coder.prepare(ctx)
    assert tree(home) == user_before, "prepare changed the user's HOME"
    assert tree(ctx.workdir) == work_before, "prepare wrote into the working directory"
    outside = [p for p in (tmp_path / "fleet").rglob("*") if not is_under(p, ctx.attempt_dir)]
    assert [p for p in outside if p.is_file()] == []
    # anything holding a secret (the store's password, the user's login) is this user's only
    for path, text in written(ctx.attempt_dir):
        if SECRET in text or USER_SECRET in text:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_prepare_registers_ask_human_when_asked_and_only_then(
    coder: Coder, tmp_path: Path, home: Path
) -> None:
    ctx = make_ctx(tmp_path / "with")
    coder.prepare(ctx)
    seen = [text for _, text in written(ctx.attempt_dir)] + coder.argv(ctx) + list(coder.env(ctx).values())
    assert any(MCP_MARK in s for s in seen), "the ask_human server's command is nowhere the agent looks"
    assert any(SECRET in s for s in seen), "the ask_human server's environment is nowhere the agent looks"

    bare = make_ctx(tmp_path / "without", mcp=False)
    coder.prepare(bare)
    seen = [text for _, text in written(bare.attempt_dir)] + coder.argv(bare) + list(coder.env(bare).values())
    assert not any(MCP_MARK in s or "ask_human" in s for s in seen)


# -- the normalizer ----------------------------------------------------------------------------


GARBAGE = [
    "",
    "   ",
    "not json at all",
    "{",
    "[1, 2",
    "{}",
    "[]",
    "null",
    "42",
    '"a string"',
    '{"type": 5}',
    '{"type": null}',
    '{"type": "result"}',
    '{"type": "assistant", "message": "nope"}',
    "\x00\x7f\ufffd\u202e",
    "{" * 5000,
    "[" * 100_000,
    "x" * 300_000,
]
EXITS = (0, 1, 2, 41, 137, -9, None)


def check_events(events: list[Event], start: int, *, gapless: bool = True) -> None:
    """Valid kinds, this attempt's ids, and numbers from ``start`` on, in order (without gaps
    for a well-formed stream; a line the coder gave up on half way may have used a number)."""
    assert all(isinstance(e, Event) and e.kind in EVENT_KINDS for e in events)
    assert all(e.task_id == "t-contract" and e.attempt == 3 for e in events)
    seqs = [e.seq for e in events]
    if gapless:
        assert seqs == list(range(start, start + len(events)))
    else:
        assert seqs == sorted(set(seqs)) and all(s >= start for s in seqs)


def check_outcomes(coder: Coder, feed: list[str]) -> None:
    kinds = set(get_args(OutcomeKind))
    n = coder.normalizer("t-contract", 3)
    for i, line in enumerate(feed):
        n.feed(line, 1.0 + i)
    for code in EXITS:
        assert n.outcome(code).kind in kinds, (code, n.outcome(code))


def test_a_garbage_line_gives_events_never_an_exception(coder: Coder, tmp_path: Path) -> None:
    n = coder.normalizer("t-contract", 3, start_seq=40, attempt_dir=tmp_path)
    events: list[Event] = []
    for i, line in enumerate(GARBAGE):
        got = n.feed(line, 100.0 + i)
        assert isinstance(got, list)
        if line == "not json at all":  # not what the coder expects: an event carrying the line
            assert any(line in (e.text or "") for e in got), got
        events += got
    events += n.poll(200.0)
    check_events(events, 40, gapless=False)
    check_outcomes(coder, GARBAGE)


def mutations(line: str) -> Iterator[str]:
    """``line`` (a JSON object) with each value in its first two levels replaced by a wrong type."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        return
    junk: list[object] = [None, 7, "x", [None], {"a": None}]
    paths: list[tuple[str | int, ...]] = []
    for k, v in obj.items():
        paths.append((k,))
        inner = v.items() if isinstance(v, dict) else enumerate(v[:3]) if isinstance(v, list) else ()
        paths += [(k, kk) for kk, _ in inner]
    for path in paths:
        for value in junk:
            copy = json.loads(line)
            cur = copy
            for key in path[:-1]:
                cur = cur[key]
            cur[path[-1]] = value
            yield json.dumps(copy)


def streams(coder_name: str) -> list[Path]:
    prefix = STREAM_PREFIX.get(coder_name)
    if prefix is None:  # the shell coder reads any program's output: every stream is text to it
        return sorted(p for p in STREAMS.glob("*.jsonl") if p.name not in SIDE_FILES)
    return sorted(p for p in STREAMS.glob(f"{prefix}-*.jsonl") if p.name not in SIDE_FILES)


def test_recorded_lines_with_wrong_types_never_raise(coder: Coder) -> None:
    files = streams(coder.name)[:: 8 if coder.name == "shell" else 1]  # all text to the shell
    lines = {line for p in files for line in p.read_text(encoding="utf-8").splitlines()}
    fed = 0
    for line in sorted(lines):
        for bad in mutations(line):
            n = coder.normalizer("t-contract", 3)
            check_events(n.feed(bad, 1.0), 0, gapless=False)
            check_outcomes(coder, [bad])
            fed += 1
    assert fed > 100


# per stream name, what every coder must make of it (the others: only a valid outcome)
def expected_outcome(name: str) -> tuple[int, OutcomeKind] | None:
    if "then-ok" in name or "success" in name:
        return 0, "success"
    if "rate-limit" in name or "429" in name:
        return 1, "rate_limited"
    if "auth" in name:
        return 1, "auth_failed"
    return None


@pytest.mark.parametrize("name", NAMES)
def test_every_recorded_stream_gives_events_and_an_outcome(name: str, tmp_path: Path) -> None:
    coder = get_coder(name)
    files = streams(name)
    assert files, f"no recorded stream for {name} in {STREAMS}"
    for path in files:
        n = coder.normalizer("t-contract", 3, attempt_dir=tmp_path)
        events: list[Event] = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            events += n.feed(line, 1000.0 + i)
        events += n.poll(2000.0)
        assert events, path.name
        check_events(events, 0)
        if getattr(coder, "can_resume", False):  # the engine records it to continue the session
            assert any(e.session_id for e in events), f"{path.name}: no session id"
        want = expected_outcome(path.name) if name != "shell" else None
        if want is not None:
            code, kind = want
            assert n.outcome(code).kind == kind, (path.name, n.outcome(code))
            assert n.outcome(code).claimed_success is (kind == "success")
        check_outcomes(coder, path.read_text(encoding="utf-8").splitlines())


# -- continuing a session ----------------------------------------------------------------------------


def plant_session(name: str, previous: Path, home: Path) -> None:
    """Where each CLI keeps a session, as the earlier attempt (or the user's CLI) left it."""
    if name == "claude":  # a login (no API key) keeps its transcripts in the user's config dir
        write(home / ".claude" / "projects" / "-work" / f"{SESSION}.jsonl", "{}\n")
    elif name == "codex":
        write(
            previous / "codex_home" / "sessions" / "2026" / "12" / "01" / f"rollout-x-{SESSION}.jsonl", "{}\n"
        )
    elif name == "opencode":
        write(previous / "opencode" / "xdg" / "data" / "opencode" / "opencode.db", "")
    elif name == "gemini":
        write(
            previous / "gemini" / "home" / ".gemini" / "tmp" / "p" / "chats" / f"session-{SESSION[:8]}.json",
            "{}",
        )
    else:
        raise AssertionError(f"say where {name} keeps a session")


def test_resume_is_declared_as_the_command_builds_it(coder: Coder, tmp_path: Path, home: Path) -> None:
    previous = tmp_path / "fleet" / "tasks" / "t-contract" / "attempts" / "1"
    previous.mkdir(parents=True)
    ctx = make_ctx(tmp_path, attempt=2)
    coder.prepare(ctx)
    if not getattr(coder, "can_resume", False):
        with pytest.raises(CannotResume):
            coder.resume_argv(ctx, SESSION, previous)  # type: ignore[attr-defined]
        return
    with pytest.raises(CannotResume):  # the session is gone: a fresh start follows, not a crash
        coder.resume_argv(ctx, SESSION, previous)  # type: ignore[attr-defined]
    plant_session(coder.name, previous, home)
    resumed = coder.resume_argv(ctx, SESSION, previous)  # type: ignore[attr-defined]
    fresh = coder.argv(ctx)
    assert isinstance(resumed, list) and all(isinstance(a, str) for a in resumed)
    assert resumed[0] == fresh[0] and SESSION in resumed
    drops = {str(ctx.workdir) if d == "<workdir>" else d for d in RESUME_DROPS.get(coder.name, set())}
    assert [a for a in fresh if a not in resumed] == [a for a in fresh if a in drops]
    assert not any("7f3e" in a for a in resumed)  # the next turn still goes on stdin


def test_a_takeover_command_or_a_reason(coder: Coder, tmp_path: Path) -> None:
    for session in (None, SESSION):
        try:
            argv, env = coder.interactive_argv(session, tmp_path)  # type: ignore[attr-defined]
        except CannotResume as e:
            assert str(e)
            continue
        assert argv and all(isinstance(a, str) for a in argv)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        if session and getattr(coder, "can_resume", False):
            assert session in argv


# -- the user's setup ------------------------------------------------------------------------------


def test_a_missing_cli_is_reported_with_its_install_hint(
    coder: Coder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no CLI is installed
    ok, detail = coder.available()
    assert isinstance(detail, str) and detail
    if coder.program is None:
        assert ok
        return
    assert not ok and coder.install_hint in detail
    assert coder.version() is None


def test_setup_shows_the_users_servers_and_fleet_only_leaves_ask_human(coder: Coder, home: Path) -> None:
    mine = coder.setup(True)
    assert isinstance(mine, Setup) and mine.mcp_servers[-1] == "ask_human"
    assert ("user-srv" in mine.mcp_servers) is (coder.name in READS_USER_CONFIG)
    assert coder.setup(False).mcp_servers == ("ask_human",)
    lines = setup_lines(coder, True, None)
    assert lines and all(isinstance(s, str) for s in lines)


def test_builtin_coders_are_the_declared_entry_points_and_load_without_metadata() -> None:
    """The built-in coders are found without reading installed packages' metadata (a start-up
    cost); the table must say what pyproject.toml declares."""
    from fleet_tui.coders import base

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["fleet_tui.coders"]
    assert {k: f"{m}:{c}" for k, (m, c) in base.BUILTIN.items()} == declared
    assert set(base.coder_names()) >= set(declared)
    for name in declared:
        assert type(base.get_coder(name)).__name__ == declared[name].split(":")[1]
    probe = (
        "import sys\n"
        "from fleet_tui.coders.base import get_coder, account_of\n"
        "get_coder('shell'); account_of('claude', 'opus')\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", "a built-in coder was looked up through the packages' metadata"
