"""What to do with running agents when the cockpit closes.

Agents run under their own shims, so closing the cockpit need not stop them: "leave running"
hands them to the next engine that adopts them, "stop all" ends them. The choice is explicit
because either default would surprise someone.
"""

from __future__ import annotations

from typing import Literal

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

QuitChoice = Literal["leave", "stop"]


class QuitScreen(ModalScreen[QuitChoice | None]):
    BINDINGS = [
        Binding("l", "choose('leave')", "Leave running"),
        Binding("x", "choose('stop')", "Stop all"),
        Binding("escape", "choose(None)", "Cancel"),
    ]

    def __init__(self, running: int) -> None:
        super().__init__()
        self.running = running

    def compose(self) -> ComposeResult:
        n = self.running
        with Vertical(id="dialog"):
            yield Static(
                Text(
                    f"{n} agent{'s are' if n != 1 else ' is'} running. Quit and leave "
                    f"{'them' if n != 1 else 'it'} running, or stop {'them all' if n != 1 else 'it'}?"
                ),
                id="dialog-title",
            )
            with Horizontal(id="dialog-buttons"):
                yield Button("Leave running (l)", variant="primary", id="leave")
                yield Button("Stop all (x)", variant="error", id="stop")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#leave", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        choice = event.button.id
        self.dismiss(choice if choice in ("leave", "stop") else None)  # type: ignore[arg-type]

    def action_choose(self, choice: QuitChoice | None) -> None:
        self.dismiss(choice)
