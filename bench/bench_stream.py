"""The stream pane following a live agent: the cockpit's screen-update time per frame.

A loud agent adds lines to the stream pane every frame, and the pane follows the end. This
measures what one frame costs the cockpit's thread: the time textual spends in its screen updates
(``Screen._compositor_refresh``: drawing what changed and compositing it) per frame, and how many
updates a frame takes, with L new lines a frame (1, 5 and 20 by default: a chatty agent, a loud
one, and one at 200 events/s with the cockpit's 10 frames a second).

Baseline, in the same run and harness: textual's own ``RichLog`` in the same place (same size,
border and lines), written with ``RichLog.write`` a frame at a time, as a plain Textual app would.
Both apps are the same otherwise: one pane of 60 x 33 cells (the stream's size in a 160 x 48
cockpit) that has filled past a screenful before the measured frames.

It prints the time per frame for each and the ratio; it asserts nothing.

Usage: python bench/bench_stream.py [--frames 200] [--lines 1,5,20]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

from rich.text import Text
from textual.app import App, ComposeResult
from textual.screen import Screen
from textual.widgets import RichLog

from fleet_tui.app.stream import StreamLog
from fleet_tui.scheduler.model import Event

CSS = """
#pane { width: 60; height: 33; border: round $primary 50%; scrollbar-size-vertical: 1; }
"""
WARM = 60  # frames before the measured ones: the log is past a screenful


class Timed:
    """The screen updates' time and count while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.seconds = 0.0
        self.updates = 0
        self._orig = Screen._compositor_refresh

    def install(self) -> None:
        orig, timed = self._orig, self

        def refresh(screen: Screen[object]) -> None:
            t = time.perf_counter()
            orig(screen)
            if timed.on:
                timed.seconds += time.perf_counter() - t
                timed.updates += 1

        Screen._compositor_refresh = refresh  # type: ignore[method-assign,assignment]

    def remove(self) -> None:
        Screen._compositor_refresh = self._orig  # type: ignore[method-assign]


class Pane(App[None]):
    CSS = CSS

    def __init__(self, make: Callable[[], RichLog]) -> None:
        super().__init__()
        self.make = make

    def compose(self) -> ComposeResult:
        pane = self.make()
        pane.id = "pane"
        yield pane


def text(seq: int) -> str:
    return f"line {seq} some agent output that is long enough to fill part of a line"


async def run(kind: str, per_frame: int, frames: int) -> tuple[float, float]:
    """(ms of screen updates per frame, screen updates per frame) for ``kind``."""
    app = Pane(StreamLog if kind == "stream" else lambda: RichLog(wrap=False, max_lines=2000))
    timed = Timed()
    timed.install()
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            pane = app.query_one("#pane", RichLog)
            if isinstance(pane, StreamLog):
                pane.task_id = "t-1"  # following a task, as after the cockpit's fill
            await pilot.pause()
            seq = 0
            for frame in range(WARM + frames):
                if frame == WARM:
                    timed.on = True
                batch = range(seq, seq + per_frame)
                seq += per_frame
                if isinstance(pane, StreamLog):
                    pane.offer(Event("t-1", 1, n, 0.0, "text", text=text(n)) for n in batch)
                    pane.flush()
                else:
                    for n in batch:
                        pane.write(Text(text(n)))
                await pilot.pause()
    finally:
        timed.remove()
    return timed.seconds / frames * 1e3, timed.updates / frames


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--lines", default="1,5,20", help="new lines a frame, comma-separated")
    args = ap.parse_args()
    print(f"{args.frames} frames after {WARM} warm-up frames, a 60 x 33 pane in a 160 x 48 screen")
    print("lines/frame   RichLog (baseline)            stream pane                   ratio")
    for per in (int(x) for x in args.lines.split(",")):
        base_ms, base_n = await run("richlog", per, args.frames)
        ms, n = await run("stream", per, args.frames)
        ratio = ms / base_ms if base_ms else float("nan")
        print(
            f"{per:>11}   {base_ms:6.2f} ms/frame ({base_n:.2f} updates)   "
            f"{ms:6.2f} ms/frame ({n:.2f} updates)   {ratio:.2f}x"
        )


if __name__ == "__main__":
    asyncio.run(main())
