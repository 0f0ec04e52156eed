"""The new-task form (``n``): fields in, validated TaskSpec out to ``engine.add``.

Validation runs in ``fleet_tui.app.forms`` (no parsing in widgets); this screen only collects the
strings, shows each error next to its field, and closes once the engine accepted the task. If the
engine refuses, its message stays on the form so nothing typed is lost. Every task key has a
field; the advanced ones sit in a folded section that opens by itself when one of them has an
error. Focus is set while the screen is composed (not after it mounts), so keys typed in a burst
right after ``n`` (a paste, a batch over ssh: text, Tab, more text) land in the fields in order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Collapsible, Input, Label, Static, TextArea

from fleet_tui.app.format import inert
from fleet_tui.app.forms import ADVANCED, FIELDS, validate_new_task
from fleet_tui.app.queue import focus_now
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.model import TaskSpec


class NewTaskScreen(ModalScreen[TaskSpec | None]):
    AUTO_FOCUS = "#f-prompt"
    BINDINGS = [
        Binding("ctrl+s", "submit", "Add task"),
        Binding("escape", "cancel", "Cancel"),
        # priority: focus moves as the key arrives, so text typed right after Tab (in one burst)
        # goes to the next field rather than to the one Tab was typed in
        Binding("tab", "field(1)", "Next field", show=False, priority=True),
        Binding("shift+tab", "field(-1)", "Previous field", show=False, priority=True),
    ]

    def __init__(
        self,
        submit: Callable[[TaskSpec], Awaitable[CommandResult]],
        existing_names: Collection[str],
        base_dir: str | None = None,
    ) -> None:
        super().__init__()
        self._submit = submit
        self.existing_names = existing_names
        self.base_dir = base_dir

    def compose(self) -> ComposeResult:
        with Vertical(id="form-dialog"):
            with VerticalScroll(id="form-body", can_focus=False):
                for key, label, placeholder in FIELDS:
                    if key not in ADVANCED:
                        yield from self._row(key, label, placeholder)
                with Collapsible(
                    title="Advanced: retries, timeouts, budget, merge, env, setup, tags, review, artifact",
                    collapsed=True,
                    id="form-advanced",
                ):
                    for key, label, placeholder in FIELDS:
                        if key in ADVANCED:
                            yield from self._row(key, label, placeholder)
            yield Static("", id="form-message")
            with Horizontal(id="dialog-buttons"):
                yield Button("Add (ctrl+s)", variant="primary", id="add")
                yield Button("Cancel (esc)", id="cancel")

    def _row(self, key: str, label: str, placeholder: str) -> ComposeResult:
        with Horizontal(classes="form-row"):
            yield Label(label, classes="form-label")
            if key == "prompt":
                yield TextArea(id="f-prompt", classes="form-field")
            else:
                yield Input(placeholder=placeholder, id=f"f-{key}", classes="form-field")
        error = Static("", id=f"e-{key}", classes="form-error")
        error.display = False
        yield error

    def on_mount(self) -> None:
        self.query_one("#form-dialog").border_title = "New task"
        self.focus_first()

    def focus_first(self) -> None:
        if not isinstance(self.focused, Input | TextArea):
            focus_now(self.query_one("#f-prompt", TextArea))

    def action_field(self, step: int) -> None:
        if step > 0:
            self.focus_next()
        else:
            self.focus_previous()

    def values(self) -> dict[str, str]:
        out = {"prompt": self.query_one("#f-prompt", TextArea).text}
        for key, _, _ in FIELDS:
            if key != "prompt":
                out[key] = self.query_one(f"#f-{key}", Input).value
        return out

    def show_errors(self, errors: dict[str, str]) -> None:
        for key, _, _ in FIELDS:
            widget = self.query_one(f"#e-{key}", Static)
            message = errors.get(key, "")
            widget.update(Text(inert(message)))
            widget.display = bool(message)
        if any(k in ADVANCED for k in errors):
            self.query_one("#form-advanced", Collapsible).collapsed = False
        first = next((k for k, _, _ in FIELDS if k in errors), None)
        if first is not None:
            self.query_one(f"#f-{first}").focus()

    async def action_submit(self) -> None:
        result = validate_new_task(self.values(), self.existing_names, base_dir=self.base_dir)
        self.show_errors(result.errors)
        if result.spec is None:
            return
        reply = await self._submit(result.spec)
        if reply.ok:
            self.dismiss(result.spec)
        else:
            self.query_one("#form-message", Static).update(Text(inert(reply.message)))

    def action_cancel(self) -> None:
        self.dismiss(None)

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        await self.action_submit()

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "add":
            await self.action_submit()
        else:
            self.dismiss(None)
