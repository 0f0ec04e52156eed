"""Review comments on a task's diff, sent to its agent as a follow-up.

Why: replying to a diff line by line is how people review code; here the replies go straight to
the agent that wrote it, as the next turn of its own conversation (``fleet-tui send``). From the
Diff tab, ``c`` opens this dialog: the diff's lines with their ``file:line``, Enter on a line
edits its comment, ``s`` sends every comment as one follow-up, Escape closes (the comments stay
with the detail screen until sent). The parsing is plain functions, tested on their own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from fleet_tui.app.format import inert

#: diff lines offered for comments (a longer diff is cut; the whole one is in the Diff tab)
MAX_LINES = 4000
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


@dataclass(frozen=True)
class DiffLine:
    text: str
    file: str | None = None  # None: not a line of a file (headers, the diffstat)
    line: int = 0
    removed: bool = False

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" + (" (removed line)" if self.removed else "")


def _path(header: str) -> str | None:
    path = header[4:].split("\t")[0].strip()
    if path == "/dev/null":
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def diff_lines(diff: str) -> list[DiffLine]:
    """The lines of a unified diff, each added/kept/removed one with its file and line number
    (new-file numbers; a removed line carries its old number)."""
    out: list[DiffLine] = []
    old_file = new_file = None
    old = new = 0
    in_hunk = False
    for raw in diff.splitlines():
        if raw.startswith("diff --git"):
            in_hunk = False
        if not in_hunk and raw.startswith("--- "):
            old_file = _path(raw)
        elif not in_hunk and raw.startswith("+++ "):
            new_file = _path(raw)
        elif m := _HUNK.match(raw):
            old, new, in_hunk = int(m.group(1)), int(m.group(2)), True
        elif in_hunk and raw.startswith("+") and new_file:
            out.append(DiffLine(raw, new_file, new))
            new += 1
            continue
        elif in_hunk and raw.startswith("-") and (old_file or new_file):
            out.append(DiffLine(raw, old_file or new_file, old, removed=True))
            old += 1
            continue
        elif in_hunk and raw.startswith(" ") and new_file:
            out.append(DiffLine(raw, new_file, new))
            old += 1
            new += 1
            continue
        out.append(DiffLine(raw))
    return out


def comments_message(comments: dict[tuple[str, int, bool], tuple[str, str]]) -> str:
    """Review comments as one follow-up: each ``file:line``, the line itself and the comment."""
    lines = ["Review comments on your diff (file:line; line numbers of the new version):"]
    for (file, line, removed), (code, text) in sorted(comments.items()):
        where = f"{file}:{line}" + (" (removed line)" if removed else "")
        lines.append(f"- {where} `{code.strip()[:200]}`: {text}")
    lines.append("Address each comment in the same working directory, then finish the task.")
    return "\n".join(lines)


class ReviewScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("s", "send", "Send comments"),
    ]

    def __init__(
        self,
        task_name: str,
        diff: str,
        comments: dict[tuple[str, int, bool], tuple[str, str]],
        send: Callable[[str], None],
    ) -> None:
        super().__init__()
        self.task_name = task_name
        self.lines = [ln for ln in diff_lines(diff) if ln.file][:MAX_LINES]
        self.comments = comments  # shared with the detail screen: kept until sent
        self.send_text = send

    def _prompt(self, ln: DiffLine) -> Text:
        text = Text(inert(f"{ln.where:<28} {ln.text}", one_line=True), no_wrap=True)
        note = self.comments.get((ln.file or "", ln.line, ln.removed))
        if note:
            text.append(inert(f"   << {note[1]}", one_line=True), style="bold")
        return text

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(
                Text(inert(f"Review {self.task_name}: enter comments a line, s sends all, esc closes")),
                id="dialog-title",
            )
            yield OptionList(*[Option(self._prompt(ln)) for ln in self.lines], id="review-lines")
            yield Input(
                placeholder="comment on the highlighted line (enter saves, empty removes)", id="review-input"
            )
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#review-input", Input).display = False
        self.query_one("#review-lines", OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        ln = self.lines[event.option_index]
        box = self.query_one("#review-input", Input)
        box.value = (self.comments.get((ln.file or "", ln.line, ln.removed)) or ("", ""))[1]
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        lst = self.query_one("#review-lines", OptionList)
        index = lst.highlighted
        if index is not None:
            ln = self.lines[index]
            key = (ln.file or "", ln.line, ln.removed)
            if event.value.strip():
                self.comments[key] = (ln.text[1:], event.value.strip())
            else:
                self.comments.pop(key, None)
            lst.replace_option_prompt_at_index(index, self._prompt(ln))
        event.input.value = ""
        event.input.display = False
        lst.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # "s" is a letter while a comment is typed
        return not (action == "send" and isinstance(self.focused, Input))

    def action_send(self) -> None:
        if not self.comments:
            self.notify("No comments yet: enter on a line to write one.", severity="warning")
            return
        self.send_text(comments_message(self.comments))
        self.comments.clear()
        self.dismiss(None)

    def action_close(self) -> None:
        box = self.query_one("#review-input", Input)
        if box.display:
            box.display = False
            self.query_one("#review-lines", OptionList).focus()
            return
        self.dismiss(None)
