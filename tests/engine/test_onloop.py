"""Publishing from worker threads without a round trip (scheduler/onloop.py): what a worker
posts runs on the loop, before the worker's result reaches the coroutine that awaits it; with no
loop bound, or once the loop is closed, it runs in place."""

from __future__ import annotations

import threading

import anyio
import pytest

from fleet_tui.scheduler.onloop import LoopPost

pytestmark = pytest.mark.timeout(60)


def test_a_post_from_a_worker_runs_on_the_loop_before_the_workers_result() -> None:
    post = LoopPost()
    seen: list[tuple[str, int]] = []

    async def main() -> None:
        post.bind()
        loop_thread = threading.get_ident()

        def work() -> str:
            post(lambda what: seen.append((what, threading.get_ident())), "posted")
            return "result"

        for _ in range(50):
            seen.clear()
            out = await anyio.to_thread.run_sync(work)
            # the posted call already ran, on the loop's own thread
            assert out == "result" and seen == [("posted", loop_thread)]

    anyio.run(main)


def test_on_the_loop_itself_a_post_runs_at_once() -> None:
    post = LoopPost()
    seen: list[str] = []

    async def main() -> None:
        post.bind()
        post(seen.append, "now")
        assert seen == ["now"]

    anyio.run(main)


def test_unbound_or_after_the_loop_closed_a_post_runs_in_place() -> None:
    post = LoopPost()
    seen: list[str] = []
    post(seen.append, "unbound")  # no loop anywhere: in place
    assert seen == ["unbound"]

    async def main() -> None:
        post.bind()

    anyio.run(main)  # the loop is closed when this returns
    post(seen.append, "closed")
    assert seen == ["unbound", "closed"]
