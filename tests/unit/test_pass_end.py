"""broker/pass_end.py: the end of a pass settles the commits handed to it with one write,
every commit of a pass is handed over while two connections or more publish, and a task
a settle makes runnable runs at once even though the loop was about to sleep."""

from __future__ import annotations

from collections.abc import Callable

import trio

from gateway.broker.errors import StoreUnavailable
from gateway.broker.pass_end import PassEnd


def noted(outcomes: list[StoreUnavailable | None]) -> Callable[[StoreUnavailable | None], bool]:
    """A settle that notes its outcome and wakes no task."""

    def settle(error: StoreUnavailable | None) -> bool:
        outcomes.append(error)
        return False

    return settle


class Writes:
    def __init__(self) -> None:
        self.count = 0
        self.error: StoreUnavailable | None = None

    def __call__(self) -> bool:
        self.count += 1
        if self.error is not None:
            raise self.error
        return True


async def test_the_commits_of_a_pass_share_one_write() -> None:
    writes = Writes()
    pass_end = PassEnd(writes)
    pass_end.start()
    pass_end.publishing()
    assert not pass_end.joins()  # one connection with commits: nothing to share
    pass_end.publishing()
    try:
        outcomes: list[StoreUnavailable | None] = []
        for _ in range(5):
            assert pass_end.joins()  # the pass's first too: one write, not two
            pass_end.defer(noted(outcomes))
        assert writes.count == 0
        await trio.sleep(0)  # the pass ends
        assert writes.count == 1
        assert outcomes == [None] * 5
        await trio.sleep(0)  # a pass with nothing handed over writes nothing
        assert writes.count == 1

        writes.error = StoreUnavailable("disk full")
        assert pass_end.joins()
        pass_end.defer(noted(outcomes))
        await trio.sleep(0)
        assert outcomes[-1] is writes.error
    finally:
        pass_end.stop()


async def test_a_task_a_settle_wakes_runs_at_once() -> None:
    """The settle runs as the loop is about to sleep until the next deadline (10 s away):
    the task it wakes must not wait for that deadline."""
    pass_end = PassEnd(Writes())
    pass_end.start()
    pass_end.publishing()
    pass_end.publishing()
    released = trio.Event()
    woke_at: list[float] = []

    async def waiter() -> None:
        await released.wait()
        woke_at.append(trio.current_time())

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.sleep(0.05)  # the waiter is parked
                assert pass_end.joins()

                def release(_error: StoreUnavailable | None) -> bool:
                    released.set()
                    return True  # it woke the waiter

                pass_end.defer(release)
                began = trio.current_time()
        assert woke_at and woke_at[0] - began < 1.0
    finally:
        pass_end.stop()


async def test_a_settle_that_raises_does_not_stop_the_others() -> None:
    pass_end = PassEnd(Writes())
    pass_end.start()
    pass_end.publishing()
    pass_end.publishing()
    outcomes: list[StoreUnavailable | None] = []

    def broken(_error: StoreUnavailable | None) -> bool:
        raise RuntimeError("a bug in one connection")

    try:
        for settle in (noted(outcomes), broken, noted(outcomes)):
            assert pass_end.joins()
            pass_end.defer(settle)
        await trio.sleep(0)
        assert outcomes == [None, None]
        assert pass_end.joins()  # still installed, still ending passes
    finally:
        pass_end.stop()


async def test_the_hook_is_there_while_two_connections_or_more_have_commits() -> None:
    """With one, there is nothing to share: every commit writes at once, no hook is called;
    when the second goes, what was handed over is settled there and then."""
    writes = Writes()
    pass_end = PassEnd(writes)
    pass_end.start()
    outcomes: list[StoreUnavailable | None] = []
    try:
        pass_end.publishing()
        await trio.sleep(0)
        assert not pass_end.joins() and not pass_end.joins()
        pass_end.publishing()
        await trio.sleep(0)
        assert pass_end.joins()
        pass_end.defer(noted(outcomes))
        pass_end.done_publishing()  # the hook goes: the commit is settled now
        assert outcomes == [None] and writes.count == 1
        assert not pass_end.joins() and not pass_end.joins()
    finally:
        pass_end.stop()
