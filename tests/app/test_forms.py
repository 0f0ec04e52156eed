"""The new-task form (issue 15, point 18): every task key settable, the advanced ones folded away,
and keys typed in a burst (a paste, a batch over ssh: text, Tab, more text) land in the right
fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual import events
from textual.widgets import Collapsible, Input, TextArea

from fleet_tui.app.forms import FIELDS, validate_new_task
from fleet_tui.screens.new_task import NewTaskScreen

from . import scenarios as sc
from .helpers import KEY_NAMES, wait_for

pytestmark = pytest.mark.anyio


def burst(app: object, *chunks: str) -> None:
    """Queue keys all at once, as a fast typist or a pasted batch over ssh delivers them:
    ``"<tab>"`` is the Tab key, anything else is typed character by character."""
    for chunk in chunks:
        if chunk == "<tab>":
            app.post_message(events.Key("tab", None))  # type: ignore[attr-defined]
            continue
        for ch in chunk:
            app.post_message(events.Key(KEY_NAMES.get(ch, ch), ch))  # type: ignore[attr-defined]


async def test_a_burst_after_n_lands_in_the_right_fields() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=(100, 40)) as pilot:
        burst(app, "n", "fix the bug", "<tab>", "fix-bug", "<tab>", "<tab>", "shell", "<tab>", "make fix")
        await wait_for(pilot, lambda: isinstance(app.screen, NewTaskScreen), "form")
        form = app.screen
        await wait_for(
            pilot, lambda: form.query_one("#f-command", Input).value == "make fix", "the burst typed"
        )
        assert form.query_one("#f-prompt", TextArea).text == "fix the bug"
        assert form.query_one("#f-name", Input).value == "fix-bug"
        assert form.query_one("#f-cwd", Input).value == ""
        assert form.query_one("#f-coder", Input).value == "shell"
        assert engine.calls == []  # no keystroke reached a cockpit binding (k, p, r, c, m...)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: engine.calls, "add")
    ((_, (specs,)),) = engine.calls
    (spec,) = specs
    assert (spec.name, spec.prompt, spec.coder, spec.command) == (
        "fix-bug",
        "fix the bug",
        "shell",
        "make fix",
    )


async def test_a_paste_fills_the_focused_field() -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, NewTaskScreen), "form")
        form = app.screen
        prompt = "Refactor the parser.\nKeep the tests green; do not touch cli.py."
        app.post_message(events.Paste(prompt))
        burst(app, "<tab>", "parser-refactor")
        await wait_for(pilot, lambda: form.query_one("#f-name", Input).value == "parser-refactor", "name")
        assert form.query_one("#f-prompt", TextArea).text == prompt


async def test_every_task_key_from_the_form(tmp_path: Path) -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, NewTaskScreen), "form")
        form = app.screen
        advanced = form.query_one("#form-advanced", Collapsible)
        assert advanced.collapsed  # folded away until wanted
        values = {
            "name": "all-keys", "cwd": str(tmp_path), "coder": "shell", "command": "./run.sh {prompt}",
            "model": "m1", "git_ref": "", "verify": "pytest -q", "priority": "7", "depends_on": "user-api",
            "max_retries": "4", "timeout_min": "12.5", "stall_min": "3", "budget_usd": "1.5", "merge": "auto",
            "env": 'A=1 B="two words"', "setup": "uv sync", "requires": "gpu, docker",
            "review": "Check auth.",
            "review_model": "haiku", "artifact": "report.md", "artifact_min_chars": "800",
            "artifact_contains": "Conclusion, Risks",
        }  # fmt: skip
        form.query_one("#f-prompt", TextArea).text = "Do everything."
        for key, value in values.items():
            form.query_one(f"#f-{key}", Input).value = value
        form.query_one("#f-timeout_min", Input).value = "nan"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not advanced.collapsed  # an advanced field's error unfolds the section
        assert isinstance(app.focused, Input) and app.focused.id == "f-timeout_min"
        assert engine.calls == []
        form.query_one("#f-timeout_min", Input).value = "12.5"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: engine.calls, "add")
    ((_, (specs,)),) = engine.calls
    (s,) = specs
    assert (s.command, s.model, s.priority, s.depends_on) == ("./run.sh {prompt}", "m1", 7, ("user-api",))
    assert (s.max_retries, s.timeout_min, s.stall_min, s.budget_usd, s.merge) == (4, 12.5, 3.0, 1.5, "auto")
    assert (
        s.env == (("A", "1"), ("B", "two words")) and s.setup == "uv sync" and s.requires == ("gpu", "docker")
    )
    kinds = [(v.kind, v.run or v.agent or v.path) for v in s.verify]
    assert kinds == [("run", "pytest -q"), ("agent", "Check auth."), ("artifact", "report.md")]
    assert s.verify[1].model == "haiku"
    assert (s.verify[2].min_chars, s.verify[2].contains) == (800, ("Conclusion", "Risks"))


def test_form_rules(tmp_path: Path) -> None:
    base = {"prompt": "p", "name": "n1", "cwd": str(tmp_path)}
    bad = validate_new_task(
        {**base, "coder": "shell", "max_retries": "-1", "budget_usd": "inf", "merge": "sometimes",
         "env": "NOEQUALS", "artifact_min_chars": "10", "stall_min": "0"},
        existing_names=set(),
    )  # fmt: skip
    assert set(bad.errors) == {
        "command",
        "max_retries",
        "budget_usd",
        "merge",
        "env",
        "artifact",
        "stall_min",
    }
    assert bad.errors["command"] == "the shell coder needs a command"
    assert validate_new_task({**base, "env": "A='x"}, set()).errors["env"].startswith("unbalanced quotes")


def test_the_command_hint_says_where_the_shell_coder_puts_the_prompt() -> None:
    """It said "{prompt} is replaced": the shell coder replaces nothing, so `echo {prompt}` printed
    "{prompt}". The prompt is in $FLEET_PROMPT (tests/coders/test_shell.py)."""
    hint = {key: placeholder for key, _, placeholder in FIELDS}["command"]
    assert "{prompt}" not in hint and "$FLEET_PROMPT" in hint
