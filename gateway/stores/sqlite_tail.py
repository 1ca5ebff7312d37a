"""The log's tail the index does not hold yet (the durable store's event-loop side): the
frames written since the index was last brought up to date, what they weigh, the
position the last one ends at, and when the oldest was written. The store's index task
takes the tail, or its fsynced part, for one transaction (`take`), and gives it back, in
order, if that failed (`give_back`)."""

from __future__ import annotations

from bisect import bisect_right
from operator import itemgetter
from typing import Any

import trio

from gateway.stores.log import Frame, Position
from gateway.stores.sqlite_open import Written

# The index is brought up to date when this much is waiting for it, or this long after
# the oldest record it lacks: long enough that most messages of a busy queue are published
# and finished before their records get there (and so are never written to it), short
# enough that the records held in memory stay bounded and a restart replays little.
APPLY_BYTES = 8 * 1024 * 1024
APPLY_RECORDS = 50_000
APPLY_AGE = 0.5

# a frame's end, size, record count and when it was written
_End = tuple[Position, int, int, float]
_END_POSITION = itemgetter(0)
# frames taken for one transaction, and each one's _End
Taken = tuple[list[Written], list[_End]]


class Tail:
    """The frames in the log and not yet in the index (see the module)."""

    def __init__(self) -> None:
        self.frames: list[Written] = []
        # where each frame ends, its size and record count, and when it was written
        self._ends: list[_End] = []
        self.size = 0
        self.records = 0
        self.position: Position = (0, 0)  # where the last frame ends
        self.since = 0.0  # Trio clock: when the oldest frame was written

    def __bool__(self) -> bool:
        return bool(self.frames)

    @property
    def due(self) -> float:
        """When (Trio clock) the index must take the tail, however little it holds."""
        return self.since + APPLY_AGE

    @property
    def full(self) -> bool:
        """Large enough for the index to take it now, however young."""
        return self.size >= APPLY_BYTES or self.records >= APPLY_RECORDS

    def wrote(self, ops: list[tuple[Any, ...]], frame: Frame, position: Position) -> bool:
        """`frame`, holding `ops`, was written ending at `position`. True when the index's
        task must look again: the tail was empty (it has a due time now) or is full."""
        now = trio.current_time()
        first = not self.frames
        if first:
            self.since = now
        _, starts, size = frame
        if starts:  # where this frame's bodies are: the index points there
            at = position[1] - size
            starts = [at + s for s in starts]
        self.frames.append((ops, position[0], starts))
        self._ends.append((position, size, len(ops), now))
        self.size += size
        self.records += len(ops)
        self.position = position
        return first or self.full

    def take(self, upto: Position | None = None) -> Taken:
        """Every frame, or those that end at `upto` or before (all of them if none does):
        the index's regular pass takes what is fsynced, so that the publishes it holds
        join into batches (sqlite_sql._coalesced joins only fsynced ones); the rest wait
        for the next pass, fsynced by then. Never empty: the tail must hold a frame."""
        ends = self._ends
        cut = len(ends)
        if upto is not None and self.position > upto:
            cut = bisect_right(ends, upto, key=_END_POSITION) or cut
        taken = (self.frames[:cut], ends[:cut])
        del self.frames[:cut]
        del ends[:cut]
        self.size -= sum(e[1] for e in taken[1])
        self.records -= sum(e[2] for e in taken[1])
        if ends:
            self.since = ends[0][3]
        return taken

    def give_back(self, taken: Taken) -> None:
        """Frames the index could not take: before those written since, as they were."""
        frames, ends = taken
        self.frames[:0] = frames
        self._ends[:0] = ends
        self.size += sum(e[1] for e in ends)
        self.records += sum(e[2] for e in ends)
        self.since = ends[0][3]


def taken_position(taken: Taken) -> Position:
    """Where the last frame taken ends."""
    return taken[1][-1][0]
