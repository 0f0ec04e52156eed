"""The inbox pane: every pending question across all agents, answered inline.

Agents block on ``ask_human`` until someone answers, so answering must be quick: ``a`` opens an
input under the list (Enter sends it); when the question offers choices they are listed above the
input and Enter on one sends it. The pane posts ``Inbox.Answer``; the app sends it to the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from fleet_tui.app.format import inert, question_line, truncate
from fleet_tui.app.queue import focus_now
from fleet_tui.scheduler.humans.inbox import check_answer
from fleet_tui.scheduler.model import Question


@dataclass(frozen=True)
class InboxItem:
    question: Question
    task_name: str


class Inbox(Vertical):
    """The question list plus the inline answer form (hidden until ``a``)."""

    BINDINGS = [
        Binding("escape", "cancel_answer", "Cancel answer", show=False),
        Binding("up", "choice(-1)", "Previous choice", show=False),
        Binding("down", "choice(1)", "Next choice", show=False),
    ]

    class Answer(Message):
        def __init__(self, question_id: str, text: str) -> None:
            super().__init__()
            self.question_id = question_id
            self.text = text

    class Done(Message):
        """The answer form closed (sent or cancelled): the app puts focus back on the queue."""

    pending: reactive[tuple[InboxItem, ...]] = reactive((), init=False)
    """The pending questions shown, oldest first; the list is rebuilt only when they change."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.items: dict[str, InboxItem] = {}
        self.answering: Question | None = None

    def compose(self) -> ComposeResult:
        yield OptionList(id="questions")
        with Vertical(id="answer-form"):
            yield Static("", id="answer-question")
            choices = OptionList(id="answer-options")
            choices.can_focus = False  # picked with up/down from the text field (or the mouse)
            yield choices
            yield Input(placeholder="your answer (Enter sends, Esc cancels)", id="answer-input")

    def on_mount(self) -> None:
        self.query_one("#answer-form").display = False
        self._retitle()

    def _retitle(self) -> None:
        self.border_title = f"Inbox ({len(self.items)})"

    # ------------------------------------------------------------------ the list

    def set_items(self, items: list[InboxItem]) -> None:
        """Replace the pending questions (oldest first). Keeps the highlight where it was."""
        self.pending = tuple(items)

    def watch_pending(self, items: tuple[InboxItem, ...]) -> None:
        new = {i.question.id: i for i in items}
        olist = self.query_one("#questions", OptionList)
        current = olist.highlighted_option.id if olist.highlighted_option else None
        self.items = new
        olist.set_options(
            Option(Text(truncate(question_line(i.question, i.task_name), 300) + "  [a]"), id=qid)
            for qid, i in new.items()
        )
        if current in new:
            olist.highlighted = olist.get_option_index(current)
        elif new:
            olist.highlighted = 0
        self._retitle()
        if self.answering is not None and self.answering.id not in new:
            self.close_answer()
            self.notify("That question was answered or withdrawn.", severity="warning")

    @property
    def highlighted(self) -> Question | None:
        olist = self.query_one("#questions", OptionList)
        opt = olist.highlighted_option
        if opt is not None and opt.id in self.items:
            return self.items[opt.id].question
        first = next(iter(self.items.values()), None)
        return first.question if first else None

    # ------------------------------------------------------------------ answering

    def open_answer(self, question: Question) -> None:
        self.answering = question
        item = self.items.get(question.id)
        who = item.task_name if item else question.task_id
        self.query_one("#answer-question", Static).update(Text(inert(f"{who} asks: {question.text}")))
        options = self.query_one("#answer-options", OptionList)
        picks = question.choices  # without the marker of a question that also takes free text
        options.set_options(
            Option(Text(inert(f"{n}. {opt}", one_line=True)), id=str(n - 1)) for n, opt in enumerate(picks, 1)
        )
        options.display = bool(picks)
        self.query_one("#answer-form").display = True
        self.add_class("answering")
        if self.parent is not None:
            self.parent.add_class("answering")
        options.highlighted = None
        inp = self.query_one("#answer-input", Input)
        inp.value = ""
        if not picks:
            inp.placeholder = "type an answer; Enter sends, Esc cancels"
        elif question.free_text:  # the choices are suggestions
            inp.placeholder = "type an answer, or up/down to pick a choice; Enter sends, Esc cancels"
        else:  # one of the choices and nothing else: typing anything more is refused
            inp.placeholder = "up/down to pick a choice, or type its number; Enter sends, Esc cancels"
        # focus stays in the text field, so fast typing never lands on a cockpit key
        focus_now(inp)

    def action_choice(self, step: int) -> None:
        """Up/down while answering: move the highlighted choice (Enter on an empty field sends it)."""
        options = self.query_one("#answer-options", OptionList)
        if self.answering is None or not options.option_count:
            return
        current = options.highlighted
        if current is None:
            options.highlighted = 0 if step > 0 else options.option_count - 1
        else:
            options.highlighted = max(0, min(options.option_count - 1, current + step))

    def close_answer(self) -> None:
        self.answering = None
        self.remove_class("answering")
        if self.parent is not None:
            self.parent.remove_class("answering")
        self.query_one("#answer-form").display = False
        self.query_one("#answer-input", Input).value = ""

    def action_cancel_answer(self) -> None:
        if self.answering is not None:
            self.close_answer()
        self.post_message(self.Done())

    def _send(self, text: str) -> None:
        if self.answering is None:
            return
        if not text.strip():
            self.notify("An empty answer is not sent.", severity="warning")
            return
        answer, why = check_answer(self.answering, text.strip())
        if answer is None:  # not one of the choices: said here, the answer left to mend
            self.notify(f"{why}: pick one with up/down, or type it or its number", severity="warning")
            return
        self.post_message(self.Answer(self.answering.id, answer))
        self.close_answer()
        self.post_message(self.Done())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "answer-input":
            return
        event.stop()
        options = self.query_one("#answer-options", OptionList)
        if not event.value.strip() and self.answering is not None and options.highlighted is not None:
            self._send(self.answering.options[options.highlighted])
        else:
            self._send(event.value)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "answer-input" and event.value:
            self.query_one("#answer-options", OptionList).highlighted = None  # free text wins

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_list.id == "answer-options" and self.answering is not None:
            index = int(event.option.id or 0)
            self._send(self.answering.options[index])
        elif event.option_list.id == "questions" and event.option.id in self.items:
            self.open_answer(self.items[event.option.id].question)
