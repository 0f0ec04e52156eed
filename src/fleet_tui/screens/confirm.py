"""A yes/no question before a destructive command (kill, cancel, merge).

Kept as one small modal so every destructive key goes through the same confirmation: ``y``
confirms, ``escape`` declines; Tab/Enter work on the buttons too. The body can carry detail, such
as the diffstat of a merge.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from fleet_tui.app.format import inert


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("escape", "answer(False)", "No"),
    ]

    def __init__(self, title: str, body: str = "", *, yes: str = "Yes") -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(inert(self.title_text)), id="dialog-title")
            if self.body:
                with VerticalScroll(id="dialog-body"):
                    yield Static(Text(inert(self.body)))
            with Horizontal(id="dialog-buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="yes")
                yield Button("Cancel (esc)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
