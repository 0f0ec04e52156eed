"""The task file loader: every error class with its exact file:line, and good files -> specs."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from fleet_tui.scheduler.model import TaskSpec, VerifySpec
from fleet_tui.taskfile import (
    TaskFileError,
    load_taskfile,
    toml_key_lines,
    validate_spec,
)

pytestmark = pytest.mark.timeout(60)

CODERS = ("claude", "codex", "opencode", "gemini", "shell", "sim")


def write(tmp_path: Path, body: str, name: str = "tasks.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip("\n"), encoding="utf-8")
    return path


def load(path: Path, **kw: object) -> list[str]:
    res = load_taskfile(path, known_coders=kw.pop("known_coders", CODERS), **kw)  # type: ignore[arg-type]
    return [str(e) for e in res.errors]


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(path),
        "PATH": "/usr/bin:/bin",
    }
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env, capture_output=True)
    return path


GOOD = """
[defaults]
coder = "claude"
model = "sonnet"
max_retries = 2
env = { LANG = "C", MODE = "default" }

[[task]]
name        = "user-schema"
cwd         = "."
prompt      = "Add a users table migration."
priority    = 10
timeout_min = 30
requires    = ["docker"]
  [[task.verify]]
  run = "pytest -q"
  [[task.verify]]
  agent = "Review the diff for missing auth checks."
  model = "haiku"
  coder = "codex"
  [[task.artifact]]
  path = "report.md"
  min_chars = 800
  contains = ["Conclusion"]

[[task]]
name = "user-api"
prompt = '''
Build the API.
[[task]] inside a string is not a header
name = "not-a-key"
'''
depends_on = ["user-schema"]
coder = "sim"
merge = "auto"
budget_usd = 1.5
env = { MODE = "task" }
"""


def test_good_file_parses_into_specs(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    res = load_taskfile(path, known_coders=CODERS)
    assert res.errors == ()
    assert res.ok
    a, b = res.specs
    assert a == TaskSpec(
        name="user-schema",
        prompt="Add a users table migration.",
        cwd=str(tmp_path.resolve()),
        coder="claude",
        model="sonnet",
        priority=10,
        timeout_min=30.0,
        max_retries=2,
        requires=("docker",),
        verify=(
            VerifySpec(kind="run", run="pytest -q"),
            VerifySpec(
                kind="agent", agent="Review the diff for missing auth checks.", model="haiku", coder="codex"
            ),
            VerifySpec(kind="artifact", path="report.md", min_chars=800, contains=("Conclusion",)),
        ),
        env=(("LANG", "C"), ("MODE", "default")),
        source=f"{path}:7",
    )
    assert b.name == "user-api"
    assert b.coder == "sim" and b.model == "sonnet"  # task wins, default fills in
    assert b.depends_on == ("user-schema",)
    assert b.merge == "auto" and b.budget_usd == 1.5
    assert b.env == (("LANG", "C"), ("MODE", "task"))  # env tables merge, the task's value wins
    assert b.prompt.startswith("Build the API.")
    assert b.source == f"{path}:25"


def test_key_lines_skip_strings_and_index_arrays_of_tables(tmp_path: Path) -> None:
    lines = toml_key_lines(textwrap.dedent(GOOD).lstrip("\n"))
    assert lines[("defaults",)] == 1
    assert lines[("defaults", "env")] == 5
    assert lines[("task", 0)] == 7
    assert lines[("task", 0, "requires")] == 13
    assert lines[("task", 0, "verify", 0)] == 14
    assert lines[("task", 0, "verify", 1, "model")] == 18
    assert lines[("task", 0, "artifact", 0, "contains")] == 23
    assert lines[("task", 1)] == 25
    assert lines[("task", 1, "prompt")] == 27
    assert lines[("task", 1, "depends_on")] == 32
    assert ("task", 2) not in lines  # the [[task]] inside the multi-line string
    assert ("task", 1, "not-a-key") not in lines
    assert lines[("task", 1, "budget_usd")] == 35


def test_bad_toml_reports_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        name = "a"
        prompt = "x"
        priority = = 3
    """,
    )
    (err,) = load(path)
    assert err.startswith(f"{path}:4: bad TOML:")
    assert "column" in err


def test_a_byte_order_mark_and_windows_line_ends_are_read_as_any_editor_writes_them(tmp_path: Path) -> None:
    """A task file saved by a Windows editor starts with a UTF-8 byte order mark and ends its lines
    with CRLF: it loads, with its problems at the right lines (the mark read as "Invalid
    statement (column 1)" on line 1)."""
    path = tmp_path / "tasks.toml"
    body = '[[task]]\nname = "a"\nprompt = "x"\n\n[[task]]\nname = "b"\nprompt = "y"\nprority = 1\n'
    path.write_bytes(b"\xef\xbb\xbf" + body.replace("\n", "\r\n").encode())
    (err,) = load(path)
    assert err.startswith(f"{path}:8: unknown key 'prority'"), err
    path.write_bytes(b"\xef\xbb\xbf" + body.replace("prority = 1\n", "").replace("\n", "\r\n").encode())
    res = load_taskfile(path, known_coders=CODERS)
    assert not res.errors and [s.name for s in res.specs] == ["a", "b"]


def test_bad_toml_duplicate_key_and_unclosed_string(tmp_path: Path) -> None:
    path = write(tmp_path, '[[task]]\nname = "a"\nname = "b"\n')
    assert load(path)[0].startswith(f"{path}:3: bad TOML:")
    path = write(tmp_path, '[[task]]\nname = "a"\nprompt = """never closed\n\n')
    (err,) = load(path)
    assert err.startswith(f"{path}:") and "bad TOML" in err


def test_unknown_keys_with_did_you_mean(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [defaults]
        modle = "x"

        [[task]]
        name = "a"
        prompt = "x"
        depends_onn = []
          [[task.verify]]
          rnu = "true"
          [[task.artifact]]
          path = "r.md"
          min_char = 3

        [[tasks]]
        name = "b"
    """,
    )
    assert load(path) == [
        f"{path}:2: unknown key 'modle' in [defaults] — did you mean 'model'?",
        f"{path}:7: unknown key 'depends_onn' — did you mean 'depends_on'?",
        f'{path}:8: a [[task.verify]] needs exactly one of run = "command" or agent = "review instructions"',
        f"{path}:9: unknown key 'rnu' in [[task.verify]] — did you mean 'run'?",
        f"{path}:12: unknown key 'min_char' in [[task.artifact]] — did you mean 'min_chars'?",
        f"{path}:14: unknown top-level key 'tasks' — did you mean 'task'?",
    ]


def test_wrong_types_each_at_their_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        name = "a"
        prompt = 42
        priority = "high"
        depends_on = "b"
        timeout_min = -1
        max_retries = 1.5
        merge = "sometimes"
        env = { N = 1 }
        requires = [1, 2]
        stall_min = true
    """,
    )
    errs = load(path)
    assert [e.split(": ", 1)[0] for e in errs] == [f"{path}:{n}" for n in range(3, 12)]
    assert "prompt must be a string, got an integer" in errs[0]
    assert "priority must be an integer" in errs[1]
    assert 'depends_on must be an array of strings like ["other-task"], got a string' in errs[2]
    assert "timeout_min must be greater than 0" in errs[3]
    assert "max_retries must be a whole number >= 0" in errs[4]
    assert 'merge must be "manual", "auto" or "pr"' in errs[5]
    assert "env values must be strings: N" in errs[6]
    assert "requires must be an array of strings" in errs[7]
    assert "stall_min must be a number, got a boolean" in errs[8]


def test_missing_name_and_prompt_point_at_the_header(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        prompt = "no name"

        [[task]]
        name = "no-prompt"

        [[task]]
        name = "shell-ok"
        coder = "shell"
        command = "make test"

        [[task]]
        name = "shell-no-command"
        coder = "shell"
        prompt = "x"
    """,
    )
    errs = load(path)
    assert errs == [
        f'{path}:1: task has no name: add name = "..." (lowercase letters, digits, - and _)',
        f'{path}:4: task \'no-prompt\' has no prompt: add prompt = "..." (or coder = "shell" with a command)',
        f'{path}:14: the shell coder runs a command: add command = "..."'
        " (it gets the prompt in $FLEET_PROMPT)",
    ]
    res = load_taskfile(path, known_coders=CODERS)
    shell = next(s for s in res.specs if s.name == "shell-ok")
    assert shell.prompt == "" and shell.command == "make test"


def test_bad_names_and_duplicates(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        name = "Bad Name"
        prompt = "x"
        [[task]]
        name = "dup"
        prompt = "x"
        [[task]]
        name = "dup"
        prompt = "y"
        [[task]]
        name = "queued-before"
        prompt = "z"
    """,
    )
    errs = load(path, existing_names={"queued-before": "queued"})
    assert errs[0].startswith(f"{path}:2: bad name 'Bad Name': use only lowercase letters")
    assert "'bad-name'" in errs[0]
    assert errs[1] == f"{path}:8: duplicate task name 'dup' (first used at line 5)"
    assert errs[2] == (
        f"{path}:11: a task named 'queued-before' is queued: names are unique among unfinished tasks "
        "(pick another name, or let that task finish or cancel it first)"
    )
    assert len(errs) == 3


def test_dangling_depends_on_and_existing_names(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        name = "api"
        prompt = "x"
        depends_on = ["schemaa", "old-task"]
    """,
    )
    errs = load(path, existing_names=["old-task", "schema"])
    assert errs == [
        f"{path}:4: depends_on 'schemaa': no such task in this file or the queue — did you mean 'schema'?"
    ]


def test_cycles_are_named(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        name = "a"
        prompt = "x"
        depends_on = ["b"]

        [[task]]
        name = "b"
        prompt = "x"
        depends_on = ["a"]

        [[task]]
        name = "self"
        prompt = "x"
        depends_on = ["self"]

        [[task]]
        name = "c"
        prompt = "x"
        depends_on = ["a"]
    """,
    )
    assert load(path) == [
        f"{path}:4: depends_on cycle: a -> b -> a (no task in it could ever start)",
        f"{path}:14: depends_on cycle: self -> self (no task in it could ever start)",
    ]


def test_long_cycle_reported_once(tmp_path: Path) -> None:
    body = "".join(
        f'[[task]]\nname = "t{i}"\nprompt = "x"\ndepends_on = ["t{(i + 1) % 4}"]\n' for i in range(4)
    )
    path = write(tmp_path, body)
    assert load(path) == [
        f"{path}:4: depends_on cycle: t0 -> t1 -> t2 -> t3 -> t0 (no task in it could ever start)"
    ]


def test_missing_cwd_and_cwd_is_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "sub" / "proj").mkdir(parents=True)
    path = write(
        tmp_path / "sub",
        """
        [[task]]
        name = "ok"
        prompt = "x"
        cwd = "proj"

        [[task]]
        name = "missing"
        prompt = "x"
        cwd = "nope"
    """,
    )
    errs = load(path)
    assert len(errs) == 1
    assert errs[0].startswith(f"{path}:9: cwd 'nope' does not exist ({tmp_path.resolve()}/sub/nope;")
    res = load_taskfile(path, known_coders=CODERS)
    assert res.specs[0].cwd == str((tmp_path / "sub" / "proj").resolve())


def test_missing_cwd_from_defaults_points_at_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [defaults]
        cwd = "gone"
        [[task]]
        name = "a"
        prompt = "x"
    """,
    )
    (err,) = load(path)
    assert err.startswith(f"{path}:2: cwd 'gone' does not exist")


def test_git_ref_needs_a_repo_and_an_existing_ref(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    git_repo(tmp_path / "repo")
    path = write(
        tmp_path,
        """
        [[task]]
        name = "in-repo"
        prompt = "x"
        cwd = "repo"
        git_ref = "main"

        [[task]]
        name = "no-repo"
        prompt = "x"
        cwd = "plain"
        git_ref = "main"

        [[task]]
        name = "bad-ref"
        prompt = "x"
        cwd = "repo"
        git_ref = "mian"
    """,
    )
    errs = load(path)
    assert len(errs) == 2
    assert errs[0].startswith(f"{path}:11: git_ref 'main' needs a git repository, but ")
    assert "is not inside one" in errs[0]
    assert errs[1].startswith(f"{path}:17: git_ref 'mian' is not a branch, tag or commit in ")


def test_unknown_coder_did_you_mean_and_unavailable_coder(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        name = "a"
        prompt = "x"
        coder = "cluade"

        [[task]]
        name = "b"
        prompt = "x"
        coder = "codex"
          [[task.verify]]
          agent = "review"
          coder = "gemni"

        [[task]]
        name = "c"
        prompt = "x"
        coder = "codex"
    """,
    )
    calls: list[str] = []

    def available(coder: str) -> tuple[bool, str]:
        calls.append(coder)
        return (coder != "codex", "install it with: npm install -g @openai/codex")

    errs = load(path, coder_available=available)
    assert errs[0].startswith(f"{path}:4: unknown coder 'cluade' — did you mean 'claude'? (known: ")
    assert errs[1] == (
        f"{path}:9: coder 'codex' cannot run on this machine: install it with: npm install -g @openai/codex"
    )
    assert errs[2].startswith(f"{path}:12: verifier: unknown coder 'gemni' — did you mean 'gemini'?")
    assert errs[3].startswith(f"{path}:17: coder 'codex' cannot run")
    assert calls == ["codex"]  # probed once


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        name = "a"
        promt = "x"
        coder = "nope"
        cwd = "missing"
        depends_on = ["zzz"]
    """,
    )
    errs = load(path)
    assert [e.split(": ", 1)[0] for e in errs] == [f"{path}:{n}" for n in (1, 3, 4, 5, 6)]


def test_empty_and_missing_files(tmp_path: Path) -> None:
    path = write(tmp_path, "# nothing yet\n")
    res = load_taskfile(path, known_coders=CODERS)
    assert res.ok and res.specs == ()
    assert "no tasks" in str(res.warnings[0])
    missing = tmp_path / "nope.toml"
    assert load(missing) == [f"{missing}:0: no such file"]


def test_command_with_non_shell_coder_warns(tmp_path: Path) -> None:
    path = write(tmp_path, '[[task]]\nname = "a"\nprompt = "x"\ncoder = "claude"\ncommand = "make"\n')
    res = load_taskfile(path, known_coders=CODERS)
    assert res.ok
    assert res.warnings == (
        TaskFileError(str(path), 5, "command is only run by the shell coder; coder 'claude' ignores it"),
    )


def test_name_in_defaults_and_inline_verify(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [defaults]
        name = "x"
        [[task]]
        name = "a"
        prompt = "x"
        verify = [{ run = "true" }, { agent = "check", model = "haiku" }]
    """,
    )
    res = load_taskfile(path, known_coders=CODERS)
    assert [str(e) for e in res.errors] == [
        f"{path}:2: name cannot be a default: every task needs its own name"
    ]
    assert [v.kind for v in res.specs[0].verify] == ["run", "agent"]


def test_error_str_format() -> None:
    assert str(TaskFileError("t.toml", 7, "boom")) == "t.toml:7: boom"


def test_validate_spec(tmp_path: Path) -> None:
    git_repo(tmp_path / "repo")
    good = TaskSpec(name="fine", prompt="do it", cwd=str(tmp_path), coder="sim")
    assert validate_spec(good, known_coders=CODERS) == []
    bad = TaskSpec(
        name="Bad!",
        prompt="  ",
        cwd=str(tmp_path / "nope"),
        coder="cladue",
        depends_on=("ghost",),
        max_retries=-1,
        verify=(VerifySpec(kind="run", run=""),),
    )
    problems = validate_spec(bad, known_coders=CODERS, existing_names=["host"])
    assert any(p.startswith("bad name 'Bad!'") for p in problems)
    assert 'task \'#1\' has no prompt: add prompt = "..." (or coder = "shell" with a command)' in problems
    assert any(p.startswith("unknown coder 'cladue' — did you mean 'claude'?") for p in problems)
    assert "depends_on 'ghost': no such task in this file or the queue — did you mean 'host'?" in problems
    assert any(p.startswith("max_retries must be") for p in problems)
    assert "run must not be empty" in problems
    assert any(p.startswith("cwd ") and "does not exist" in p for p in problems)
    assert all(":" not in p.split(" ")[0] for p in problems)  # no file:line prefix
    dup = TaskSpec(name="fine", prompt="x", cwd=str(tmp_path / "repo"), git_ref="nope")
    problems = validate_spec(dup, known_coders=CODERS, existing_names=["fine"])
    assert len(problems) == 2
    assert any(p.startswith("a task named 'fine' is not finished") for p in problems)
    # a finished task's name may be taken again (the store keeps the old task under its id)
    again = validate_spec(dup, known_coders=CODERS, existing_names={"fine": "done"})
    assert not any("'fine'" in p for p in again), again
    assert any(p.startswith("git_ref 'nope' is not a branch, tag or commit") for p in problems)
    shell = TaskSpec(name="sh", prompt="", cwd=str(tmp_path), coder="shell", command="make")
    assert validate_spec(shell, known_coders=CODERS) == []


TRICKY = "\n".join(
    [
        '# a comment with [[task]] and name = "x" and \'\'\' and """',
        "[ defaults ]",
        '"model" = "m" # trailing [[task]]',
        "[[ task ]]",
        'name = "a"   # comment with \' and "',
        'prompt = "escaped \\" quote [[task]] \\\\"',
        "depends_on = [",
        "  \"b\", # a comment ] with brackets [ and '''",
        "  'c\\',",
        "]",
        'env.FOO = "1"',
        'env."BAR.BAZ" = """',
        'multi "" line',
        '\\"""',
        '"""',
        "[[task]]",
        "name = 'b'",
        'prompt = """ends with quotes"""""',
        "[task.env]",
        'X = "y"',
        "[[task]]",
        'name = "c"',
        "prompt = ''''quoted' literal'''",
        "[[task.verify]]",
        "run = \"echo 'a = b'\"",
        "",
    ]
)


def test_key_lines_tricky_toml() -> None:
    import tomllib

    text = TRICKY
    doc = tomllib.loads(text)  # the text is valid TOML
    assert doc["task"][1]["env"] == {"X": "y"}
    lines = toml_key_lines(text)
    assert lines[("defaults",)] == 2
    assert lines[("defaults", "model")] == 3
    assert lines[("task", 0)] == 4
    assert lines[("task", 0, "prompt")] == 6
    assert lines[("task", 0, "depends_on")] == 7
    assert lines[("task", 0, "env")] == 11
    assert lines[("task", 0, "env", "BAR.BAZ")] == 12
    assert lines[("task", 1)] == 16
    assert lines[("task", 1, "prompt")] == 18
    assert lines[("task", 1, "env")] == 19
    assert lines[("task", 1, "env", "X")] == 20
    assert lines[("task", 2)] == 21
    assert lines[("task", 2, "prompt")] == 23
    assert lines[("task", 2, "verify", 0)] == 24
    assert lines[("task", 2, "verify", 0, "run")] == 25
    assert len([p for p in lines if len(p) == 2 and p[0] == "task"]) == 3


def test_key_lines_on_generated_documents() -> None:
    """Seeded random documents with tricky strings: every recorded line must match."""
    import random
    import tomllib

    values = [
        '"plain"',
        "'literal [[task]] # not a comment'",
        '"""\nmulti\n[[task]]\nname = "x"\n"""',
        "'''\nit's '' two [[task]]\n'''",
        '"""ends with two quotes"""""',
        '"""\\\n  line continuation\\\n"""',
        '[\n  "a", # comment ] [\n  "b",\n]',
        '{ x = "}", y = [1, 2] }',
    ]
    rng = random.Random(1234)
    for _ in range(30):
        out: list[str] = []
        expected: dict[tuple[str | int, ...], int] = {}
        for t in range(rng.randint(1, 5)):
            if rng.random() < 0.3:
                out.append(f"# task {t} ''' \"\"\" [[task]]")
            expected[("task", t)] = len(out) + 1
            out.append("[[task]]" if rng.random() < 0.5 else "[[ task ]]  # header")
            for k in range(rng.randint(1, 4)):
                expected[("task", t, f"k{k}")] = len(out) + 1
                out.extend(f"k{k} = {rng.choice(values)}".split("\n"))
            for v in range(rng.randint(0, 2)):
                expected[("task", t, "verify", v)] = len(out) + 1
                out.append("  [[task.verify]]")
                expected[("task", t, "verify", v, "run")] = len(out) + 1
                out.extend(f"  run = {rng.choice(values)}".split("\n"))
        text = "\n".join(out) + "\n"
        tomllib.loads(text)  # the generator makes valid TOML
        lines = toml_key_lines(text)
        assert {p: lines.get(p) for p in expected} == expected, text


def test_mcp_key_per_task_and_its_check(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        name = "only-fleet"
        prompt = "p"
        mcp = "fleet-only"

        [[task]]
        name = "inherits"
        prompt = "p"
        """,
    )
    res = load_taskfile(path, known_coders=CODERS)
    assert [str(e) for e in res.errors] == []
    assert [s.mcp for s in res.specs] == ["fleet-only", None]
    bad = write(tmp_path, '[[task]]\nname = "x"\nprompt = "p"\nmcp = "none"\n', name="bad.toml")
    errors = load(bad)
    assert len(errors) == 1 and "bad.toml:4" in errors[0] and 'mcp must be "inherit"' in errors[0]


def test_verify_and_artifact_shorthands(tmp_path: Path) -> None:
    """``verify = "cmd"`` or a list of commands (tables may sit among them), and ``artifact`` as a
    path or a list of paths: what people write first, read as the tables they stand for."""
    path = write(
        tmp_path,
        """
        [defaults]
        verify = "make lint"
        [[task]]
        name = "a"
        prompt = "x"
        [[task]]
        name = "b"
        prompt = "x"
        verify = ["pytest -q", { agent = "review it", model = "haiku" }]
        artifact = ["report.md", { path = "notes.md", min_chars = 10 }]
        [[task]]
        name = "c"
        prompt = "x"
        artifact = "out.txt"
    """,
    )
    res = load_taskfile(path, known_coders=CODERS)
    assert res.ok, res.errors
    a, b, c = res.specs
    assert a.verify == (VerifySpec(kind="run", run="make lint"),)
    assert b.verify == (
        VerifySpec(kind="run", run="pytest -q"),
        VerifySpec(kind="agent", agent="review it", model="haiku"),
        VerifySpec(kind="artifact", path="report.md"),
        VerifySpec(kind="artifact", path="notes.md", min_chars=10),
    )
    assert [v.kind for v in c.verify] == ["run", "artifact"]  # the default's, then its own
    assert c.verify[1].path == "out.txt"


def test_verify_shorthand_problems_name_the_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[task]]
        name = "a"
        prompt = "x"
        verify = 3
        [[task]]
        name = "b"
        prompt = "x"
        verify = ["", "true"]
        artifact = [7]
    """,
    )
    assert load(path) == [
        f"{path}:4: verify must be a command, a list of them, or [[task.verify]] tables",
        f"{path}:8: run must not be empty",
        f"{path}:9: artifact must be a file's path, a list of them, or [[task.artifact]] tables",
    ]
