"""The log's tail the index does not hold yet (the durable store's event-loop side): the
frames written since the index was last brought up to date, what they weigh, the
position the last one ends at, and when the oldest was written. The store's index task
takes the whole tail for one transaction (`take`), and gives it back, in order, if that
failed (`give_back`)."""

from __future__ import annotations

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

# frames taken for one transaction: the frames, the position the last ends at, their
# bytes and records
Taken = tuple[list[Written], Position, int, int]


class Tail:
    """The frames in the log and not yet in the index (see the module)."""

    def __init__(self) -> None:
        self.frames: list[Written] = []
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

    def wrote(self, ops: list[tuple[Any, ...]], frame: Frame, position: Position) -> bool:
        """`frame`, holding `ops`, was written ending at `position`; True once the tail
        is large enough for the index to take it now."""
        if not self.frames:
            self.since = trio.current_time()
        _, starts, size = frame
        if starts:  # where this frame's bodies are: the index points there
            at = position[1] - size
            starts = [at + s for s in starts]
        self.frames.append((ops, position[0], starts))
        self.size += size
        self.records += len(ops)
        self.position = position
        return self.size >= APPLY_BYTES or self.records >= APPLY_RECORDS

    def take(self) -> Taken:
        taken = (self.frames, self.position, self.size, self.records)
        self.frames = []
        self.size = self.records = 0
        return taken

    def give_back(self, taken: Taken) -> None:
        """Frames the index could not take: before those written since, as they were."""
        frames, _, size, records = taken
        if not self.frames:
            self.since = trio.current_time()
        self.frames[:0] = frames
        self.size += size
        self.records += records
