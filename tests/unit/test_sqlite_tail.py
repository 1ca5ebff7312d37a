"""The durable store's tail of the log that the index lacks: the index's regular pass
takes only what is fsynced, so that the publishes it holds join into batches."""

from __future__ import annotations

import trio
import trio.testing

from gateway.stores.sqlite_tail import APPLY_AGE, Tail, Taken, taken_position


def _frame(size: int) -> tuple[list[object], list[int], int]:
    return ([b"x" * size], [], size)


def _parts(taken: Taken) -> tuple[list[object], tuple[int, int], int, int]:
    """The frames taken, the position the last ends at, their bytes and records."""
    frames, ends = taken
    return frames, taken_position(taken), sum(e[1] for e in ends), sum(e[2] for e in ends)


async def _three(tail: Tail) -> None:
    """Frames of 10, 20 and 30 bytes written at t = 0, 1 and 2, ending at 10, 30, 60."""
    for k, size in enumerate((10, 20, 30)):
        tail.wrote([("R", k)], _frame(size), (1, (10, 30, 60)[k]))
        await trio.sleep(1)


async def test_the_fsynced_part_is_taken_and_the_rest_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tail = Tail()
    await _three(tail)
    frames, position, size, records = _parts(tail.take((1, 30)))
    assert [f[0] for f in frames] == [[("R", 0)], [("R", 1)]]
    assert (position, size, records) == ((1, 30), 30, 2)
    # what is left: the third frame, due APPLY_AGE after it was written (t = 2)
    assert [f[0] for f in tail.frames] == [[("R", 2)]]
    assert (tail.size, tail.records, tail.position) == (30, 1, (1, 60))
    assert tail.due == 2 + APPLY_AGE
    frames, position, size, records = _parts(tail.take((1, 60)))
    assert [f[0] for f in frames] == [[("R", 2)]] and (position, size, records) == ((1, 60), 30, 1)
    assert not tail


async def test_everything_is_taken_without_a_limit_or_when_nothing_is_fsynced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    for upto in (None, (1, 5), (0, 100)):
        tail = Tail()
        await _three(tail)
        frames, position, size, records = _parts(tail.take(upto))
        assert (len(frames), position, size, records) == (3, (1, 60), 60, 3)
        assert not tail and tail.size == tail.records == 0


async def test_a_part_given_back_goes_before_what_is_left(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tail = Tail()
    await _three(tail)
    taken = tail.take((1, 30))
    tail.wrote([("R", 3)], _frame(5), (1, 65))
    tail.give_back(taken)
    assert [f[0][0][1] for f in tail.frames] == [0, 1, 2, 3]
    assert (tail.size, tail.records, tail.position) == (65, 4, (1, 65))
    assert tail.due == 0 + APPLY_AGE  # the oldest frame's time again
    frames, position, *_ = _parts(tail.take((1, 60)))
    assert len(frames) == 3 and position == (1, 60)
