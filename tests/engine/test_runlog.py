"""What a headless `run` prints (runlog.RunPrinter): the state before the run, and changes only."""

from __future__ import annotations

import io
import json
from dataclasses import replace

from fleet_tui.runlog import RunPrinter
from fleet_tui.scheduler.model import Task, TaskChanged, TaskSpec
from fleet_tui.scheduler.states import TaskStatus


def task(n: int, waiting: str | None, status: TaskStatus = TaskStatus.QUEUED) -> Task:
    return Task(
        id=f"t-{n:04d}",
        spec=TaskSpec(name=f"t{n}", prompt="x"),
        status=status,
        created_at=0.0,
        waiting=waiting,
    )


def test_prime_says_what_already_waits_at_most_ten_then_a_count() -> None:
    out = io.StringIO()
    printer = RunPrinter(out, as_json=True)
    disk = "disk: 0.0 GiB free < 1.0 GiB floor"
    printer.prime([task(n, disk) for n in range(12)] + [task(99, None), task(98, "x", TaskStatus.DONE)])
    lines = [json.loads(ln) for ln in out.getvalue().splitlines()]
    assert [(d["kind"], d.get("task")) for d in lines] == [("waiting", f"t{n}") for n in range(10)] + [
        ("notice", None)
    ]
    assert lines[0]["text"] == f"t0: waits: {disk}"
    assert lines[-1]["text"] == "notice: 2 more task(s) wait (`fleet-tui plan` says why for each)"
    # the same reason again is no change; a new one is
    out.truncate(0)
    out.seek(0)
    printer.feed([TaskChanged(task(0, disk)), TaskChanged(task(1, "after t0"))])
    assert [json.loads(ln)["text"] for ln in out.getvalue().splitlines()] == ["t1: after t0"]


def test_a_task_of_another_host_is_named_with_it() -> None:
    """A store shared between machines: each engine's log says where a task it did not run ran."""
    out = io.StringIO()
    printer = RunPrinter(out, host="alpha")
    printer.prime([task(1, None), task(2, None)])
    here = replace(task(1, None, TaskStatus.RUNNING), host="alpha", attempt=1)
    there = replace(task(2, None, TaskStatus.RUNNING), host="beta", attempt=1)
    printer.feed([TaskChanged(here), TaskChanged(there)])
    assert [ln.split(" ", 1)[1] for ln in out.getvalue().splitlines()] == [
        "t1: queued -> running (attempt 1)",
        "t2 (beta): queued -> running (attempt 1)",
    ]
    out = io.StringIO()
    printer = RunPrinter(out, as_json=True, host="alpha")
    printer.feed([TaskChanged(there)])
    assert json.loads(out.getvalue())["host"] == "beta"


def test_a_gate_reading_that_moves_is_the_same_wait() -> None:
    """Memory free moving by a tenth of a GiB rewrites every held task's reason: the log says
    the wait once, and again only when it is another wait."""
    out = io.StringIO()
    printer = RunPrinter(out)
    printer.prime([task(1, None)])
    for free in ("22.9", "22.8", "22.7"):
        printer.feed([TaskChanged(task(1, f"memory: {free} GiB free < 1000.0 GiB floor"))])
    printer.feed([TaskChanged(task(1, "disk: 0.4 GiB free < 1.0 GiB floor"))])
    assert [ln.split(" ", 1)[1] for ln in out.getvalue().splitlines()] == [
        "t1: waits: memory: 22.9 GiB free < 1000.0 GiB floor",
        "t1: waits: disk: 0.4 GiB free < 1.0 GiB floor",
    ]


def test_a_whole_queue_held_at_once_is_ten_lines_then_a_count() -> None:
    out = io.StringIO()
    printer = RunPrinter(out)
    printer.prime([task(n, None) for n in range(30)])
    printer.feed([TaskChanged(task(n, "memory: 1.0 GiB free < 2.0 GiB floor")) for n in range(30)])
    lines = [ln.split(" ", 1)[1] for ln in out.getvalue().splitlines()]
    assert lines[:10] == [f"t{n}: waits: memory: 1.0 GiB free < 2.0 GiB floor" for n in range(10)]
    assert lines[10:] == ["notice: 20 more task(s) wait (`fleet-tui plan` says why for each)"]
