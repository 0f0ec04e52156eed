"""The key reference (``?``): every binding of the cockpit and its panes, plus the filter syntax.

Built from the live binding tables handed in by the app, so it cannot drift from what the keys do.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

FILTER_HELP = (
    "Filter (/): words match task names; state:running, coder:claude, host:box1 narrow by field "
    "(prefixes work: state:need). Terms combine. Enter keeps the filter, Esc clears it."
)


class HelpScreen(ModalScreen[None]):
    # priority: the cockpit closes the help as it takes the key, instead of handing the key to
    # the scrolling body, which passes it up to the dialog and on to the app (a turn of the
    # loop each: under a loud fleet, a third of a close's time); the help has no text field
    BINDINGS = [
        Binding("escape", "dismiss_help", "Close", priority=True),
        Binding("question_mark", "dismiss_help", "Close", show=False, priority=True),
    ]

    def __init__(self, sections: Sequence[tuple[str, Sequence[tuple[str, str]]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        table = Table.grid()
        table.add_column(no_wrap=True)
        table.add_column(ratio=1)
        width = max((len(key) for _, rows in self.sections for key, _ in rows), default=4) + 2
        for title, rows in self.sections:
            table.add_row(Text(title, style="bold"), "")
            for key, description in rows:
                table.add_row(Text(f"  {key:<{width}}"), Text(description))
            table.add_row("", "")
        with Vertical(id="help-dialog"):
            with VerticalScroll(id="help-body"):
                yield Static(table)
                yield Static(Text(FILTER_HELP))
            yield Static(Text("esc or ? closes"), id="help-hint")

    def on_mount(self) -> None:
        self.border_title = "Keys"
        self.query_one("#help-body").focus()

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
