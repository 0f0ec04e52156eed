"""The question after a takeover: verify now, requeue, mark done, or leave parked.

Why its own small modal: the cockpit asks the same four-way question as ``fleet-tui takeover``
when the person comes back from the agent's interactive session; one key each, Escape leaves the
task parked (the safe choice: nothing runs without being asked).
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from fleet_tui.app.format import inert

CHOICES = (("v", "verify", "Verify now"), ("r", "requeue", "Requeue"), ("d", "done", "Mark done"),
           ("l", "leave", "Leave parked"))  # fmt: skip


class TakeoverDoneScreen(ModalScreen[str]):
    BINDINGS = [
        *(Binding(key, f"choose('{choice}')", label) for key, choice, label in CHOICES),
        Binding("escape", "choose('leave')", "Leave parked"),
    ]

    def __init__(self, task_name: str) -> None:
        super().__init__()
        self.task_name = task_name

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(inert(f"{self.task_name}: you are back from the takeover.")), id="dialog-title")
            with Horizontal(id="dialog-buttons"):
                for key, choice, label in CHOICES:
                    yield Button(f"{label} ({key})", id=f"choice-{choice}")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss((event.button.id or "choice-leave").removeprefix("choice-"))

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
