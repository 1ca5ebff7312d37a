"""Pipelines on the wire: several at once, answered and accounted for in order.

The Redis store sends everything recorded so far as one pipeline whenever someone
flushes. Waiting for each pipeline's answer before sending the next left both processes
idle half the time (the gateway waits for Redis, then Redis for the gateway), so up to
`depth` pipelines travel at once on one connection; Redis applies them in the order they
were sent. What stays strict is the accounting: a pipeline counts as written only when it
and every pipeline before it were answered without error, so a publish is acknowledged
only after Redis answered the write holding it, and nothing after a failure is taken
for written.

A failure (a lost connection fails every pipeline still on the wire) stops new
pipelines until every one in flight has settled; then the failed one and all after it go
back, in their order, to the front of what is recorded, for the store's retry (every
step is idempotent). Every pipeline of the failure gets the error that began it as its
verdict, so that the store can tell a lost connection (its `flush()` callers see
StoreError) from slots that moved on a Cluster (sent again at once).
"""

from __future__ import annotations

from typing import Any

import trio

from gateway.stores.base import StoreError

# ops of one pipeline: (function, key, arguments)
Ops = list[tuple[str, str, list[Any]]]


class Flights:
    def __init__(self, depth: int) -> None:
        self.depth = depth  # pipelines at most on the wire at once (1: one at a time)
        self.written = 0  # the store's record count covered by answered pipelines
        self.submitted = 0  # ... and by pipelines sent (answered or not)
        self._seq = 0
        self._flying: dict[int, tuple[int, Ops]] = {}  # seq -> (record count, ops), in order
        self._answers: dict[int, StoreError | None] = {}  # answered, not yet accounted for
        # accounted for: None when written, else the error that began its failure
        self._verdicts: dict[int, StoreError | None] = {}
        self._failing: StoreError | None = None  # a pipeline failed: the rest come back
        self._returned: list[Ops] = []
        self._changed = trio.Event()

    @property
    def full(self) -> bool:
        """No pipeline may be sent now: `depth` are flying, or a failure is settling."""
        return self._failing is not None or len(self._flying) >= self.depth

    async def changed(self) -> None:
        """Wait until some pipeline is accounted for."""
        await self._changed.wait()

    def start(self, target: int, ops: Ops) -> int:
        """A pipeline carrying the records up to `target` is being sent: its number."""
        seq = self._seq
        self._seq += 1
        self._flying[seq] = (target, ops)
        self.submitted = target
        return seq

    def answered(self, seq: int, error: StoreError | None) -> Ops | None:
        """Pipeline `seq` was answered (`error`: None when without one). Returns the ops
        to put back, in order, in front of the records, once the last pipeline of a
        failure settled."""
        self._answers[seq] = error
        flying = self._flying
        while flying:
            first = next(iter(flying))
            if first not in self._answers:
                break
            target, ops = flying.pop(first)
            failed = self._answers.pop(first)
            if self._failing is None and failed is None:
                self._verdicts[first] = None
                self.written = target
            else:
                self._failing = self._failing or failed
                self._verdicts[first] = self._failing
                self._returned.append(ops)
        back: Ops | None = None
        if self._failing is not None and not flying:
            back = [op for ops in self._returned for op in ops]
            self._returned = []
            self._failing = None
            self.submitted = self.written
        self._changed.set()
        self._changed = trio.Event()
        return back

    async def verdict(self, seq: int) -> StoreError | None:
        """None when pipeline `seq` counts as written (it and everything before it were);
        else the error that began the failure it is part of."""
        while seq not in self._verdicts:
            await self.changed()
        return self._verdicts.pop(seq)
