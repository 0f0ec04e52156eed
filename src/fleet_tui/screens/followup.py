"""The follow-up dialog: one line for the agent, sent as the next turn of its own conversation.

Kept as a small modal of its own (like the confirm dialog) so the cockpit's ``F`` key asks for the
message where the person is looking: Enter sends, Escape cancels, an empty line sends nothing.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from fleet_tui.app.format import inert


class FollowUpScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, task_name: str) -> None:
        super().__init__()
        self.task_name = task_name

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(
                Text(inert(f"Follow-up for {self.task_name}: the agent continues its conversation")),
                id="dialog-title",
            )
            yield Input(
                placeholder="what should the agent do next? (enter sends, esc cancels)", id="followup"
            )

    def on_mount(self) -> None:
        self.query_one("#followup", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        self.dismiss(text or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
