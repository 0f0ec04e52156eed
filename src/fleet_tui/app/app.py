"""FleetApp: the cockpit. It holds an ``EngineAPI`` and nothing else (DESIGN sections 3 and 14).

The app pulls ``engine.snapshot()`` once a second for the header, gauges and elapsed times (a
frozen view, like memray's live TUI), consumes ``engine.subscribe()`` in a worker for live task
changes, agent events and questions, and turns keys into engine commands whose
``CommandResult.message`` becomes a notification. Both feeds go through the view model
(``viewmodel.CockpitState``), which says what changed; ``show`` turns that into pane updates, in
one place. ``fleet-tui`` hands the app its engine on a thread of its own (``hosted.EngineThread``):
store I/O, parsing and snapshot building never run on the app's loop. Given ``run_engine``, the
app awaits it in a worker (the engine stopping on its own is news); for ``--attach`` the attached
view is hosted the same way.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import ClassVar, Literal

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult, SuspendNotSupported
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Input, TextArea
from textual.worker import Worker, WorkerState

from fleet_tui.app import strips
from fleet_tui.app.collector import CollectorHold
from fleet_tui.app.commands import FleetCommands
from fleet_tui.app.format import diffstat, inert, parse_filter, state_text
from fleet_tui.app.hosted import EngineThread, KeyPriority
from fleet_tui.app.inbox import Inbox, InboxItem
from fleet_tui.app.keybar import KeyBar
from fleet_tui.app.main_screen import MainScreen
from fleet_tui.app.order import SORTS, Row
from fleet_tui.app.panes import FleetHeader, GaugesPane
from fleet_tui.app.queue import FilterInput, JumpInput, QueueView, focus_now
from fleet_tui.app.stream import FILL_LIMIT, StreamLog
from fleet_tui.app.viewmodel import Changes, CockpitState
from fleet_tui.app.wheel import WheelKeys
from fleet_tui.gauges import Gauge, gauges
from fleet_tui.scheduler.api import CommandResult, EngineAPI
from fleet_tui.scheduler.model import EngineEvent, Question, Snapshot, Task, TaskChanged, TaskSpec
from fleet_tui.scheduler.states import ACTIVE, TERMINAL, TaskStatus
from fleet_tui.screens.confirm import ConfirmScreen
from fleet_tui.screens.detail import DetailScreen
from fleet_tui.screens.help import HelpScreen
from fleet_tui.screens.new_task import NewTaskScreen
from fleet_tui.screens.quit import QuitChoice, QuitScreen

OnQuit = Literal["ask", "leave", "stop"]
PULL_SECONDS = 1.0
#: live changes reach the screen at most this often (one frame: the stream's new lines and the
#: queue's changed cells together); agents publish far faster than a person reads
FRAME_SECONDS = 0.1
#: a live frame (or a snapshot's panes) due while a key is in hand waits for the key's change to
#: be drawn, at most this long for one key and ``FRAME_SECONDS`` in all (``FleetApp._frame``): the
#: key may never come back to the app (a text field took it, or it changed nothing), and keys
#: typed fast must not hold the fleet's lines back for long
KEY_FIRST_S = 0.02
STYLES = Path(__file__).resolve().parent.parent / "styles" / "fleet.tcss"
#: the start-up heap (imports, the panes, the engine's first state) is frozen out of the
#: collector's walks this long after mount, and young collections wait for ``GC_YOUNG``
#: allocations instead of Python's 700 (``FleetApp._settle_heap``)
FREEZE_SECONDS = 2.0
GC_YOUNG = 10_000


#: how long a cockpit closed by SIGHUP or SIGTERM may take to restore its terminal (``_close``)
HANGUP_EXIT_S = 5.0


def _nowhere(data: str) -> None:
    """Where a cockpit whose terminal hung up writes its frames."""


def _exit_after(seconds: float, code: int) -> None:
    time.sleep(seconds)
    os._exit(code)


class FleetApp(WheelKeys, App[None]):
    """The cockpit. ``FleetApp(engine, title=..., on_quit="ask", clock=None, run_engine=None)``."""

    CSS_PATH = STYLES
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (140, "-wide")]
    COMMANDS = App.COMMANDS | {FleetCommands}
    ENABLE_COMMAND_PALETTE = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "new_task", "new", priority=True),  # priority: see "a" below
        Binding("enter", "detail", "detail", key_display="⏎"),
        # priority: handled as the key arrives, so keys typed right after it (fast typing, a paste,
        # a batch over ssh) already land in the input it opens instead of on cockpit bindings
        Binding("a", "answer", "answer", priority=True),
        Binding("k", "kill", "kill"),
        Binding("p", "pause_task", "pause"),
        Binding("P", "pause_fleet", "pause all"),
        Binding("r", "retry", "retry"),
        Binding("c", "cancel_task", "cancel"),
        Binding("m", "merge", "merge"),
        Binding("s", "shell", "shell"),
        Binding("F", "follow_up", "follow-up", show=False),  # in the help; the footer is full
        Binding("A", "approve", "approve", show=False),
        Binding("T", "takeover", "take over", show=False),
        Binding("slash", "filter", "filter", key_display="/", priority=True),
        Binding("j", "jump", "jump", priority=True),
        # while the jump box has the focus: handled as the key arrives, so that a key typed right
        # after Enter/Escape (one burst over ssh) reaches the queue and not the closing box
        Binding("enter", "jump_close(1)", "stay there", show=False, priority=True),
        Binding("escape", "jump_close(0)", "go back", show=False, priority=True),
        # the same for the filter box (Enter keeps the filter, Escape clears it)
        Binding("enter", "filter_close(1)", "keep the filter", show=False, priority=True),
        Binding("escape", "filter_close(0)", "clear the filter", show=False, priority=True),
        Binding("exclamation_mark", "next_attention", "next !", key_display="!"),
        Binding("o", "cycle_sort", "sort"),
        Binding("f", "toggle_finished", "finished"),
        # shown pinned at the right of the footer (keybar.PINNED), so no width ever hides them
        Binding("question_mark", "help", "help", key_display="?", show=False),
        Binding("q", "quit", "quit", show=False),
        Binding("g", "top", "top", show=False),
        Binding("G", "bottom", "bottom", show=False),
    ]
    #: the longer wording of each action for the help screen and the command palette
    ACTION_HELP: ClassVar[dict[str, str]] = {
        "new_task": "New task: a form, validated before it is queued",
        "detail": "Task detail: prompt, attempts, verifier output, diff, full log",
        "answer": "Answer a pending question inline (the selected task's, else the inbox's)",
        "kill": "Kill the selected task's agent (asks first; the task is parked)",
        "pause_task": "Pause the selected task, or resume it when paused",
        "pause_fleet": "Pause the whole fleet, or resume it when paused",
        "retry": "Retry the selected task",
        "cancel_task": "Cancel the selected task (asks first)",
        "merge": "Merge the selected task's branch (asks first, shows the diffstat)",
        "shell": "Open a shell in the selected task's working directory",
        "follow_up": "Send the selected task's agent a follow-up: it continues its own conversation",
        "approve": "Approve a parked task: it becomes done, with you as its verifier (asks first)",
        "takeover": "Take over the selected task: its agent stops, its CLI's own session opens (asks first)",
        "filter": "Filter the queue: words, state:running, coder:claude, host:box1, repo:api",
        "jump": "Jump to a task by typing its name (fuzzy; down/up: other matches, escape: back)",
        "next_attention": "Next task that needs you (asking a question or needs_human)",
        "cycle_sort": "Sort order within each state band: priority, age, name, cost",
        "toggle_finished": "Show or fold away finished tasks (done, cancelled)",
        "help": "This help",
        "quit": "Quit (asks whether to leave running agents or stop them)",
        "top": "First row of the queue / top of a pane",
        "bottom": "Last row of the queue / bottom of a pane",
    }
    MAIN_ACTIONS: ClassVar[frozenset[str]] = frozenset(
        {"new_task", "detail", "answer", "kill", "pause_task", "pause_fleet", "retry", "cancel_task",
         "merge", "shell", "filter", "help", "top", "bottom", "jump", "next_attention", "cycle_sort",
         "toggle_finished"}
    )  # fmt: skip
    #: keys handled by widgets (listed in the help; not app bindings)
    OTHER_KEYS: ClassVar[list[tuple[str, str]]] = [
        ("up/down", "move in a list"),
        ("pgup/pgdn home/end", "page through the queue / first and last row"),
        ("space, left/right", "fold / unfold the repository group under the cursor"),
        ("enter / escape (jump)", "stay on the task found / go back to where the cursor was"),
        ("tab / shift+tab", "next / previous pane"),
        ("escape", "close a dialog, cancel an answer, clear the filter"),
        ("ctrl+p", "command palette (every action)"),
        ("ctrl+q", "quit (same as q)"),
        ("h (gauges pane)", "sparklines per host / for the whole fleet"),
    ]

    def __init__(
        self,
        engine: EngineAPI,
        *,
        title: str = "fleet-tui",
        on_quit: OnQuit = "ask",
        clock: Callable[[], float] | None = None,
        run_engine: Callable[[], Awaitable[None]] | None = None,
        base_dir: str | None = None,
        hangup: bool = False,
        adoptable: bool = True,
    ) -> None:
        strips.install()  # screen lines freed when dropped, not by the cyclic collector (strips.py)
        super().__init__()
        self.engine = engine
        #: SIGHUP and SIGTERM close the cockpit as ``q`` does (``_on_hangup``); set by the launcher
        #: for a cockpit on a terminal, never in tests that share their process's signals
        self.hangup = hangup
        #: a later engine or cockpit can reach this home and adopt agents left running; False for
        #: ``demo`` on a temporary home, whose next run makes a new one (so a hangup stops them)
        self.adoptable = adoptable
        self.fleet_title = title
        self.title = title
        self.on_quit = on_quit
        self.clock: Callable[[], float] = clock or time.time
        self.run_engine = run_engine
        self.base_dir = base_dir
        #: the fleet as shown: tasks, questions, the last snapshot (Textual-free, viewmodel.py)
        self.state = CockpitState()
        self._painted = False
        self._quitting = False
        self.bells = 0
        # the panes live on the main screen; keep references (app.query_one would search
        # whichever screen is on top, e.g. the detail screen)
        self.header = FleetHeader(id="header")
        self.filter_input = FilterInput(placeholder="filter: words, state:running, repo:api", id="filter")
        self.jump_input = JumpInput(placeholder="jump to: type part of a name", id="jump")
        self.queue = QueueView(clock=lambda: self.clock(), id="queue")
        self.queue_pane = Vertical(self.filter_input, self.jump_input, self.queue, id="queue-pane")
        self._jump_from: Row | None = None
        self._jump_matches: list[str] = []
        self._jump_at = 0
        self._tasks_version = 0
        self._stream_titles: tuple[str, str] = ("", "")
        self._frame_pending = False
        self._frame_held = False  # a live frame that waits for the main screen (``_frame``)
        self._snapshot_held = False  # a snapshot's panes that wait for it too (``show``)
        #: when the last key arrived whose change is not drawn yet (monotonic; 0.0: none)
        self._key_came = 0.0
        #: the frame due waited for the key that came at this time (``_key_came``), since this
        #: time (monotonic; 0.0: it has not waited)
        self._frame_waited: tuple[float, float] = (0.0, 0.0)
        self._frame_timer: Timer | None = None
        self._header_for: tuple[object, ...] = ()
        self._header_pending = False
        self._header_at = -1.0
        self._gc_threshold: tuple[int, int, int] | None = None
        self.stream = StreamLog(id="stream")
        self.inbox = Inbox(id="inbox")
        self.gauges = GaugesPane(id="gauges")
        #: a hosted engine's loop stands aside while a key is in hand (hosted.KeyPriority)
        self._key_priority: KeyPriority | None = engine.priority if isinstance(engine, EngineThread) else None
        self.collector = CollectorHold()

    # ------------------------------------------------------------------ layout

    def get_default_screen(self) -> MainScreen:
        return MainScreen(id="_default")

    async def on_event(self, event: events.Event) -> None:
        """A key comes first: the hosted engine's loop stands aside for a moment after each one
        (``hosted.KeyPriority``), and Python's garbage collector waits (``collector.py``), while
        the cockpit handles it and draws what it changed, at once (``MainScreen.key_in_hand``)."""
        came_back = isinstance(event, events.Key) and event.is_forwarded  # (forwarding marks it)
        if isinstance(event, events.Key) and not came_back:
            self._key_came = time.monotonic()
            self.collector.key()
            if self._key_priority is not None:
                self._key_priority.key()
        await super().on_event(event)
        if came_back:
            # the key came back up from the focused widget and its bindings' actions have run:
            # the next change drawn is the key's own (armed as the key came, the screen drew a
            # loud fleet's live frame at once, before the key was handled)
            screen = self.screen
            if isinstance(screen, MainScreen):
                screen.key_in_hand()

    async def _replace_screen(self, screen: Screen[object]) -> Screen[object]:
        """Textual puts a closed dialog away here, and first asks for a whole repaint of the
        screen now on top, which the close drew whole already (``MainScreen.putting_away``)."""
        top = self.screen if self._screen_stack else None
        if isinstance(top, MainScreen):
            top.putting_away()  # taken by that refresh, Textual's first act here
        return await super()._replace_screen(screen)

    def live_panes(self) -> tuple[Widget, ...]:
        """The panes only live frames change (a key's own draw leaves them for the next tick:
        ``MainScreen._draw_keys_own``)."""
        return (self.stream, self.gauges, self.header)

    def _keys_in_hand_from_the_driver(self) -> None:
        """A key is in hand from the moment the terminal's driver hands it over (on its input
        thread), not only when this loop gets to it: a key typed while the cockpit draws a live
        frame (a loud fleet's frame was 5-13 ms of work, twice that with the engine taking the
        interpreter lock half the time) finds the engine standing aside for the rest of it, and
        live work that falls due before the loop gets to the key waits for it (``_key_first``)."""
        driver, priority = self._driver, self._key_priority
        if driver is None:
            return
        send = driver.send_message

        def send_message(message: Message) -> None:
            if isinstance(message, events.Key):
                self._key_came = time.monotonic()  # live work due waits for it (``_key_first``)
                if priority is not None:
                    priority.key()
            send(message)

        driver.send_message = send_message  # type: ignore[method-assign]

    def compose(self) -> ComposeResult:
        yield self.header
        with Horizontal(id="top"):
            yield self.queue_pane
            yield self.stream
        with Horizontal(id="bottom"):
            yield self.inbox
            yield self.gauges
        yield KeyBar(id="footer-bar")

    def on_mount(self) -> None:
        self._keys_in_hand_from_the_driver()
        self.filter_input.display = False
        self.jump_input.display = False
        self.queue_pane.border_title = "Queue"
        self.stream.border_title = "Stream"
        self.pull()
        self._painted = True
        self.queue.focus()
        self._settle_stream()
        self.set_interval(PULL_SECONDS, self.pull)
        if self.run_engine is not None:
            self.run_worker(self.run_engine(), exclusive=False, group="engine", exit_on_error=False)
        self.run_worker(self._consume(), exclusive=False, group="subscribe", exit_on_error=False)
        if self.hangup:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_hangup, sig)
        self.set_timer(FREEZE_SECONDS, self._settle_heap)

    def _settle_heap(self) -> None:
        """Under a loud fleet the cockpit allocates fast (lines, strips, events): Python's full
        collection ran every second or so, walking every object of the process with the loop
        held (60-80 ms, the longest wait a key met), and its young collections ran every 700
        allocations, moving short-lived strips into the older generations. What start-up built
        stays for the cockpit's life, so it is taken out of the collector's walks
        (``gc.freeze``), and young objects get ``GC_YOUNG`` allocations to die by reference
        count first. ``on_unmount`` restores both."""
        if self._gc_threshold is None:
            self._gc_threshold = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(max(GC_YOUNG, self._gc_threshold[0]), *self._gc_threshold[1:])

    def on_unmount(self) -> None:
        self.collector.release()
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            gc.unfreeze()
            self._gc_threshold = None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Cockpit keys act on the queue's selection, so they work only on the main screen
        (a dialog or the detail screen on top hides them from the footer too)."""
        if self._covered and action in self.MAIN_ACTIONS:
            return False
        # the priority keys are plain characters while someone types in a text field
        if action == "jump_close":
            return self.focused is self.jump_input
        if action == "filter_close":
            return self.focused is self.filter_input
        return not (
            action in ("filter", "answer", "jump", "new_task") and isinstance(self.focused, Input | TextArea)
        )

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The hosted engine stopping on its own is news: say so rather than go quietly stale."""
        worker = event.worker
        if worker.group != "engine" or self._quitting:
            return
        if event.state == WorkerState.ERROR:
            self.notify(f"The engine stopped: {worker.error!r}", severity="error", timeout=30)
        elif event.state == WorkerState.SUCCESS:
            self.notify("The engine stopped.", severity="warning", timeout=30)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Toasts carry engine messages (agent reasons, git errors): inert text, never markup (a
        widget's ``notify`` asks for markup by default; agent text could then make a link)."""
        del markup
        super().notify(inert(message), title=inert(title), severity=severity, timeout=timeout, markup=False)

    # ------------------------------------------------------------------ engine -> view

    @property
    def tasks(self) -> dict[str, Task]:
        return self.state.tasks

    @property
    def questions(self) -> dict[str, Question]:
        return self.state.questions

    @property
    def snap(self) -> Snapshot:
        return self.state.snap

    @property
    def asking(self) -> frozenset[str]:
        return self.state.asking

    def pull(self) -> None:
        """Take the engine's latest snapshot (an immutable value it keeps ready: no I/O here) and
        bring the panes up to date."""
        if self._quitting:
            return
        try:
            snap = self.engine.snapshot()
        except Exception as exc:
            self.notify(f"snapshot failed: {exc}", severity="error")
            return
        self.show(self.state.apply_snapshot(snap))

    def apply(self, batch: Iterable[EngineEvent]) -> None:
        """Apply one batch of live engine events to the panes."""
        self.show(self.state.apply(batch))

    def show(self, changes: Changes) -> None:
        """The one fan-out from state to panes: each pane touched only for what changed."""
        now = self.clock()
        panes = changes.panes
        if "inbox" in panes:
            tasks = self.tasks
            self.inbox.set_items(
                [
                    InboxItem(q, tasks[q.task_id].name if q.task_id in tasks else q.task_id)
                    for q in sorted(self.questions.values(), key=lambda q: q.asked_at)
                ]
            )
            if changes.new_questions and self._painted:
                self.bell()
                self.bells += 1
        if "queue" in panes:
            asking = self.asking
            flipped = [self.tasks[tid] for tid in changes.asking_flipped if tid in self.tasks]
            self.queue.apply([*changes.tasks, *flipped], changes.gone, asking)
        if changes.tasks or changes.gone:
            self._tasks_version += 1
        for text in changes.notices:
            self.notify(text, severity="warning")
        if changes.events:
            self.stream.offer(list(changes.events))
            for screen in self.screen_stack:  # an open detail screen follows its task's log
                if isinstance(screen, DetailScreen):
                    screen.offer(list(changes.events))
        selected = self.queue.selected_id
        if selected is not None and selected in changes.rows:
            self._retitle_stream(selected)
        if changes.snapshot:
            if self._covered or self._key_first():
                # the gauges, sparklines and elapsed times wait for the frame after the
                # uncovering too, so the uncovered screen is drawn from the panes' kept lines
                # (redrawn under a loud fleet they were 8 of a slow close's 14 ms)
                self._snapshot_held = True
                self._frame_soon()
            else:
                self._show_snapshot(now)
        else:
            if "queue" in panes or changes.questions:
                self._retitle_queue()
            if changes.counts or changes.questions or changes.gauges:
                # recounting every task: at once for a question or the first change in a while,
                # then at most 4 times a second while tasks keep changing
                if changes.questions or time.monotonic() - self._header_at >= 0.25:
                    self._show_header(now)
                elif not self._header_pending:
                    self._header_pending = True
                    self.set_timer(0.25, self._header_due)
        if self.stream.task_id is None:
            self._settle_stream()
        if self.stream.pending or self.queue.repaint_pending:
            self._frame_soon()

    @property
    def _covered(self) -> bool:
        """A dialog or another screen is on top of the main screen (the panes)."""
        stack = self.screen_stack
        return bool(stack) and stack[-1] is not stack[0]

    def _frame_soon(self) -> None:
        """The next live frame, a frame's time from now (one at a time)."""
        if not self._frame_pending:
            self._frame_pending = True
            self._frame_timer = self.set_timer(FRAME_SECONDS, self._frame)

    def _key_first(self) -> bool:
        """A key arrived (from the terminal's driver) whose change is not drawn yet, within
        ``KEY_FIRST_S``: live work due now waits for it. A key's handling runs across a few turns
        of the loop (the app, the focused widget, the key coming back), and a live frame's
        timer firing between two of them ran the frame first: under 32 agents at 200 events/s,
        1-2 ms of the slowest cursor moves (the stream's new lines), and the once-a-second
        snapshot's panes 1.3-1.6 ms."""
        came = self._key_came
        return bool(came) and time.monotonic() - came < KEY_FIRST_S

    def key_drawn(self) -> None:
        """The main screen drew a key's change (``MainScreen._draw_now``): a live frame that
        waited for it comes now."""
        self._key_came = 0.0
        if self._frame_waited[1] and self._frame_timer is not None:
            self._frame_timer.stop()
            self._frame_timer = None
            self.call_later(self._frame)

    def _show_snapshot(self, now: float) -> None:
        self._snapshot_held = False
        self.queue.tick()  # elapsed times run
        self._retitle_queue()
        self._show_header(now)
        self.gauges.show(self.snap, now)

    def _frame(self) -> None:
        if not self.screen_stack:  # the app is closing: its screens are gone before a timer set just before
            self._frame_pending = False
            return
        waited_for, since = self._frame_waited
        now = time.monotonic()
        since = since or now
        if self._key_first() and self._key_came != waited_for and now - since < FRAME_SECONDS:
            # a key in hand: its change is drawn first (``key_drawn`` runs the frame then), or
            # ``KEY_FIRST_S`` from now, whichever comes first (a key that came while it waited
            # for another is waited for too: ``escape`` then ``down``, typed fast)
            self._frame_waited = (self._key_came, since)
            self._frame_timer = self.set_timer(KEY_FIRST_S, self._frame)
            return
        self._frame_pending = False
        self._frame_waited = (0.0, 0.0)
        self._frame_timer = None
        if self._covered:
            # a dialog or the detail screen covers the panes: their live lines and cells wait
            # (drawn beneath a see-through dialog they cost a redraw of the whole cockpit a
            # frame), and are drawn in a frame after the one that uncovers them, so closing the
            # dialog is on screen without waiting for them (``MainScreen._on_screen_resume``)
            self._frame_held = True
            return
        if self._snapshot_held:
            self._show_snapshot(self.clock())
        self.stream.flush()
        self.queue.repaint_changed()

    def uncovered(self) -> None:
        """The main screen is on top again: the live frame held while it was covered, if any,
        a frame's time later (``call_after_refresh`` ran it before the uncovering frame was
        drawn in a third of the closes under a loud fleet, which then drew the stream too).
        The uncovering draw shows the queue's lines as they were drawn last, and that frame
        brings them up to date (``QueueView.kept_lines_will_do``)."""
        self._frame_held = False
        self.queue.kept_lines_will_do()
        self._frame_soon()

    def _header_due(self) -> None:
        self._header_pending = False
        self._show_header(self.clock())

    def _show_header(self, now: float) -> None:
        """The header counts every task: recount only when tasks, questions or gauges changed
        (or the minute did: a rate-limit reset time goes stale)."""
        key = (
            self._tasks_version,
            len(self.questions),
            self.snap.gauges,
            int(now // 60),
            self.header.size.width,
        )
        if key == self._header_for:
            return
        self._header_for = key
        self._header_at = time.monotonic()
        self.header.show(self.fleet_title, self.state.now(), len(self.questions), now)

    def on_resize(self) -> None:
        self.call_after_refresh(lambda: self._show_header(self.clock()))

    def gauges_rows(self) -> list[Gauge]:
        """The gauges as the pane shows them now (for the palette and tests)."""
        return gauges(self.snap, self.clock())

    def _retitle_queue(self) -> None:
        model = self.queue.model
        total = len(self.tasks)
        flt = self.filter_input.value.strip()
        parts = [f"{self.queue.row_count} of {total}" if flt else str(total)]
        if model.order != SORTS[0]:
            parts.append(f"by {model.order}")
        if flt:
            parts.append(flt)
        folded = model.folded()
        if folded:
            parts.append(f"{folded} finished folded")
        title = f"Queue ({' · '.join(parts)})"
        if self.queue_pane.border_title != title:
            self.queue_pane.border_title = title

    async def _consume(self) -> None:
        """Follow ``engine.subscribe()``; if the stream breaks, say so and reconnect."""
        delay = 0.5
        while not self._quitting:
            try:
                async for batch in self.engine.subscribe():
                    self.apply(batch)
                    delay = 0.5
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.notify(f"event stream lost ({exc}); reconnecting", severity="warning")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    # ------------------------------------------------------------------ selection

    def on_queue_view_highlighted(self, event: QueueView.Highlighted) -> None:
        if event.task_id is not None:
            self._follow(event.task_id)

    def on_queue_view_selected(self, event: QueueView.Selected) -> None:
        self.action_detail()

    def _settle_stream(self) -> None:
        """A stream that follows no task yet follows the selected one, or says truly why there is
        none: no tasks, or every task finished and folded away (a cockpit opened after the work
        was done used to say "No tasks yet" above a queue of them)."""
        if self.stream.task_id is not None:
            return
        selected = self.queue.selected_id
        if selected is not None:
            self._follow(selected)
            return
        total, folded = len(self.tasks), self.queue.model.folded()
        if not total:
            hint = "No tasks yet: press n to add one, or run `fleet-tui load tasks.toml`."
        elif folded == total:
            things = "task is" if folded == 1 else f"{folded} tasks are"
            hint = f"The {things} finished and folded away: press f to show them, n to add one."
        else:
            hint = "Move the cursor to a task to follow its agent here."
        self.stream.show_hint(hint)

    def _follow(self, task_id: str | None) -> None:
        if task_id is None:
            self.stream.follow(None, None)
        else:
            self.stream.follow(task_id, lambda: self.engine.events(task_id, None, FILL_LIMIT))
        self._retitle_stream(task_id)
        self._shown_events()

    def _shown_events(self) -> None:
        """Tell the engine whose agent events the cockpit shows (the stream's task, an open detail
        screen's): an engine that can (``follow_events``) hands over only those, not the whole
        fleet's thousands a second for the cockpit to drop."""
        follow = getattr(self.engine, "follow_events", None)
        if follow is None:
            return
        ids = {s.fleet_task.id for s in self.screen_stack if isinstance(s, DetailScreen)}
        if self.stream.task_id is not None:
            ids.add(self.stream.task_id)
        follow(frozenset(ids))

    def _retitle_stream(self, task_id: str | None) -> None:
        task = self.tasks.get(task_id) if task_id else None
        if task is None:
            title, subtitle = "Stream", ""
        else:
            state = state_text(task, task.asking or task.id in self.asking)
            subtitle = state if state != task.status.value else ""
            model = task.model or task.spec.model
            coder = task.coder or task.spec.coder or "default"
            title = inert(
                f"Stream: {task.name} ({coder}{' ' + model if model else ''}, attempt {task.attempt})"
            )
        if (title, subtitle) == self._stream_titles:  # a task's tokens moved: the titles did not
            return
        self._stream_titles = (title, subtitle)
        # Text, not str: a str title is parsed as markup, and the state holds agent text
        self.stream.border_title = Text(title) if task is not None else title
        self.stream.border_subtitle = Text(subtitle) if subtitle else ""

    @property
    def selected(self) -> Task | None:
        tid = self.queue.selected_id
        return self.tasks.get(tid) if tid else None

    def _need_selected(self) -> Task | None:
        task = self.selected
        if task is None:
            self.notify("No task selected.", severity="warning")
        return task

    # ------------------------------------------------------------------ commands

    async def _command(self, call: Awaitable[CommandResult]) -> CommandResult | None:
        try:
            result = await call
        except Exception as exc:
            self.notify(f"engine error: {exc}", severity="error")
            return None
        self.notify(
            result.message or ("ok" if result.ok else "refused"),
            severity="information" if result.ok else "warning",
        )
        if result.task is not None:
            self.apply([TaskChanged(result.task)])
        return result

    def send(self, call: Callable[[], Awaitable[CommandResult]]) -> None:
        """Run an engine command in a worker so a slow engine never freezes the keys."""
        self.run_worker(self._command(call()), group="commands", exit_on_error=False)

    def _confirm_then(
        self, title: str, body: str, yes: str, call: Callable[[], Awaitable[CommandResult]]
    ) -> None:
        def done(ok: bool | None) -> None:
            if ok:
                self.send(call)

        self.push_screen(ConfirmScreen(title, body, yes=yes), done)

    def action_kill(self) -> None:
        if (task := self._need_selected()) is not None:
            self._confirm_then(
                f"Kill {task.name}? Its agent is stopped and the task parked.",
                "",
                "Kill",
                lambda: self.engine.kill(task.id),
            )

    def action_cancel_task(self) -> None:
        if (task := self._need_selected()) is not None:
            self._confirm_then(
                f"Cancel {task.name}? It will not run again unless retried.",
                "",
                "Cancel task",
                lambda: self.engine.cancel(task.id),
            )

    def action_merge(self) -> None:
        if (task := self._need_selected()) is not None:
            self.run_worker(self._merge(task), group="commands", exit_on_error=False)

    async def _merge(self, task: Task) -> None:
        try:
            diff = await self.engine.diff(task.id)
        except Exception as exc:
            diff = f"(could not read the diff: {exc})"
        self._confirm_then(
            f"Merge {task.name} into its base?", diffstat(diff), "Merge", lambda: self.engine.merge(task.id)
        )

    def action_pause_task(self) -> None:
        if (task := self._need_selected()) is None:
            return
        if task.status == TaskStatus.PAUSED:
            self.send(lambda: self.engine.resume(task.id))
        elif task.status in TERMINAL:
            self.notify(f"{task.name} is {task.status.value}; nothing to pause.", severity="warning")
        else:
            self.send(lambda: self.engine.pause(task.id))

    def action_pause_fleet(self) -> None:
        try:
            paused = self.engine.snapshot().gauges.paused
        except Exception:
            paused = self.snap.gauges.paused
        self.send(lambda: self.engine.resume(None) if paused else self.engine.pause(None))

    def action_retry(self) -> None:
        if (task := self._need_selected()) is not None:
            self.send(lambda: self.engine.retry(task.id))

    def on_inbox_answer(self, message: Inbox.Answer) -> None:
        self.send(lambda: self.engine.answer(message.question_id, message.text))

    def on_inbox_done(self, message: Inbox.Done) -> None:
        focus_now(self.queue)

    def action_answer(self) -> None:
        if not self.questions:
            self.notify("No pending questions.", severity="information")
            return
        question = None
        inbox_focused = self.focused is not None and self.inbox in self.focused.ancestors_with_self
        task = self.selected
        if not inbox_focused and task is not None:
            question = next((q for q in self.questions.values() if q.task_id == task.id), None)
        question = question or self.inbox.highlighted
        if question is not None:
            self.inbox.open_answer(question)

    # ------------------------------------------------------------------ screens

    def action_detail(self) -> None:
        if (task := self._need_selected()) is not None:
            tid = task.id
            screen = DetailScreen(self.engine, task, self.clock, lambda: self.tasks.get(tid))

            def closed(_: None) -> None:  # the screen leaves the stack after this callback
                self.call_after_refresh(self._shown_events)

            self.push_screen(screen, closed)
            self._shown_events()

    async def action_new_task(self) -> None:
        async def submit(spec: TaskSpec) -> CommandResult:
            result = await self._command(self.engine.add([spec]))
            return result or CommandResult(False, "the engine did not answer")

        names = {t.name for t in self.tasks.values()}
        form = NewTaskScreen(submit, names, self.base_dir)
        # wait for the form to mount and focus its first field before the next key is read, so
        # keys typed right after "n" (fast typing, a paste) land in the form, not on the cockpit
        await self.push_screen(form)
        form.focus_first()

    def help_sections(self) -> list[tuple[str, list[tuple[str, str]]]]:
        main = [(key, description) for key, _, description in self.action_table()]
        detail = [
            (b.key_display or b.key, b.description) for b in DetailScreen.BINDINGS if isinstance(b, Binding)
        ]
        dialogs = [
            ("y / escape", "confirm / decline a kill, cancel or merge"),
            ("l / x / escape", "on quit: leave agents running / stop them all / stay"),
            ("ctrl+s / escape", "new task form: add / cancel"),
        ]
        return [("Cockpit", main + self.OTHER_KEYS), ("Task detail", detail), ("Dialogs", dialogs)]

    def action_table(self) -> list[tuple[str, str, str]]:
        """(key, action, description) of every cockpit binding, for the help and the palette."""
        rows = []
        for b in self.BINDINGS:
            if isinstance(b, Binding) and not b.action.startswith(
                ("jump_close", "filter_close")
            ):  # OTHER_KEYS
                rows.append((b.key_display or b.key, b.action, self.ACTION_HELP.get(b.action, b.description)))
        return rows

    def action_help(self) -> None:
        # built once and kept (the keys never change): opening it again mounts nothing
        if not self.is_screen_installed("help"):
            self.install_screen(HelpScreen(self.help_sections()), "help")
        self.push_screen("help")

    def action_filter(self) -> None:
        flt = self.filter_input
        flt.display = True
        focus_now(flt)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "jump":
            self._jump_to(event.value)
            return
        if event.input.id != "filter":
            return
        parsed = parse_filter(event.value)
        event.input.border_subtitle = "; ".join(parsed.errors)
        self.queue.set_filter(parsed)
        self._retitle_queue()
        if self.queue.selected_id is not None:
            self._follow(self.queue.selected_id)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            event.input.display = bool(event.value.strip())
            focus_now(self.queue)

    def on_filter_input_cleared(self, event: FilterInput.Cleared) -> None:
        focus_now(self.queue)

    # ------------------------------------------------------------------ queue navigation

    def action_jump(self) -> None:
        self._jump_from = self.queue.cursor_ref
        self._jump_matches = []
        self.jump_input.value = ""
        self.jump_input.border_subtitle = ""
        self.jump_input.display = True
        focus_now(self.jump_input)

    def _jump_to(self, query: str) -> None:
        """Each key: the cursor on the best match (unfolding its group if needed)."""
        self._jump_matches = self.queue.model.jump(query) if query.strip() else []
        self._jump_at = 0
        n = len(self._jump_matches)
        self.jump_input.border_subtitle = f"{n} match{'es' if n != 1 else ''}" if query.strip() else ""
        if self._jump_matches:
            self.queue.select_id(self._jump_matches[0])

    def on_jump_input_step(self, event: JumpInput.Step) -> None:
        if self._jump_matches:
            self._jump_at = (self._jump_at + event.step) % len(self._jump_matches)
            self.queue.select_id(self._jump_matches[self._jump_at])

    def action_filter_close(self, keep: int) -> None:
        if keep:
            self.filter_input.display = bool(self.filter_input.value.strip())
            focus_now(self.queue)
        else:
            self.filter_input.action_clear_filter()
            focus_now(self.queue)

    def action_jump_close(self, stay: int) -> None:
        if stay:
            self.jump_input.action_accept()
        else:
            self.jump_input.action_cancel()

    def on_jump_input_cancelled(self, event: JumpInput.Cancelled) -> None:
        if self._jump_from is not None:
            self.queue.select_row(self._jump_from)

    def action_next_attention(self) -> None:
        if not self.queue.next_attention():
            self.notify("No task needs you right now.", severity="information")

    def action_cycle_sort(self) -> None:
        order = SORTS[(SORTS.index(self.queue.model.order) + 1) % len(SORTS)]
        self.queue.set_order(order)
        self._retitle_queue()
        self.notify(f"Sorted by {order} within each state (needs you, running, paused, queued, finished).")

    def action_toggle_finished(self) -> None:
        show = not self.queue.model.show_finished
        self.queue.set_show_finished(show)
        self._retitle_queue()
        self._settle_stream()

    def action_top(self) -> None:
        focused = self.focused
        if isinstance(focused, QueueView) or focused is None:
            self.queue.go_top()
        else:
            focused.scroll_home()

    def action_bottom(self) -> None:
        focused = self.focused
        if isinstance(focused, QueueView) or focused is None:
            self.queue.go_bottom()
        else:
            focused.scroll_end()

    def action_shell(self) -> None:
        if (task := self._need_selected()) is None:
            return
        workdir = task.workdir or task.worktree
        if not workdir or not os.path.isdir(workdir):
            self.notify(f"{task.name} has no working directory yet.", severity="warning")
            return
        shell = os.environ.get("SHELL") or "/bin/sh"
        try:
            with self.suspend():
                self.spawn_shell([shell], workdir)
        except SuspendNotSupported:
            self.notify("This terminal cannot suspend the cockpit for a shell.", severity="error")

    def spawn_shell(self, argv: list[str], cwd: str) -> int:
        """Run the shell in the foreground; returns its exit status (tests replace this)."""
        return subprocess.call(argv, cwd=cwd)

    # ------------------------------------------------------------------ quit

    async def action_quit(self) -> None:
        # the agents quitting stops or leaves: this engine's own (another engine on the store
        # runs its agents whatever the cockpit does); an engine without an owner: every agent
        owner = getattr(self.engine, "owner", None)
        running = sum(
            1
            for t in self.tasks.values()
            if (t.status in ACTIVE or t.paused_running) and (owner is None or t.owner == owner)
        )
        if running and self.on_quit == "ask":

            def chosen(choice: QuitChoice | None) -> None:
                if choice is not None:
                    self.run_worker(self._close(choice == "leave"), group="quit", exit_on_error=False)

            self.push_screen(QuitScreen(running), chosen)
            return
        self.run_worker(self._close(self.on_quit != "stop"), group="quit", exit_on_error=False)

    def _on_hangup(self, signum: int) -> None:
        """SIGHUP (the terminal or the ssh session went away) or SIGTERM (a ``kill``, the machine
        shutting down): nobody is there to answer the quit dialog. Unhandled, either ended the
        process at once: its agents ran on unsupervised until their leases ran out, then were
        killed, their work lost. Now the cockpit closes as ``q`` does, and where ``on_quit`` is
        ``ask`` it leaves them running (the choice that loses nothing): the next engine or
        cockpit on this home adopts them. On a home nothing will come back to (the demo's
        temporary one) it stops them: left running, they would wait out a lease of hours
        (``leave_running_h``) for an adopter that never comes."""
        leave = self.on_quit != "stop" and self.adoptable
        self.run_worker(self._close(leave, signum=signum), group="quit", exit_on_error=False)

    async def _close(self, leave_running: bool, signum: int | None = None) -> None:
        if self._quitting:
            return
        self._quitting = True
        if signum == signal.SIGHUP and self._driver is not None:
            # the terminal is gone: nothing drawn reaches it, and the frames drawn while the
            # engine stops its agents would queue up behind Textual's writer, which dies on the
            # first write to a hung-up terminal, until the app's loop blocked for ever
            self._driver.write = _nowhere  # type: ignore[method-assign]
        if not leave_running:
            self.notify("Stopping agents...")
        try:
            await self.engine.shutdown(leave_running)
        except Exception as exc:
            self.notify(f"shutdown: {exc}", severity="error")
        if signum is not None:
            # the engine has let go of its agents; restoring a terminal that hung up can block
            # for ever (Textual's writes to it queue up behind a writer that died on the first
            # one): the process ends after a grace, restored or not (``os._exit``, as
            # ``cli.entry`` ends every command)
            threading.Thread(target=_exit_after, args=(HANGUP_EXIT_S, 128 + signum), daemon=True).start()
        self.exit()
