"""The durable store's fsyncs of its log (docs/storage.md, "The write path"): on a thread
of their own, never on the event loop. An interval policy fsyncs at least every N ms
while there are unsynced writes (`run_interval`); `"always"` waits for the fsync that
covers a write (`through`: group commit, every waiter at that moment shares one fsync).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from gateway.stores.base import StoreError
from gateway.stores.log import Log, Position
from gateway.stores.worker import Worker

log = logging.getLogger("gateway.store")


class Fsyncs:
    """What of the log is on disk: the position written (`wrote`) and the one fsynced
    (`synced`); the thread that fsyncs, and who waits for it. A failed fsync goes to
    `on_failure` (the store refuses publishes until a write succeeds again); `failed`
    tells a waiter to stop waiting."""

    def __init__(
        self,
        name: str,
        on_failure: Callable[[OSError], None],
        failed: Callable[[], StoreError | None],
    ) -> None:
        self.log: Log | None = None  # set once the store's log is open
        self.written: Position = (0, 0)  # the log's end after the last write
        self.synced: Position = (0, 0)  # the log is fsynced up to here
        self.count = 0  # fsyncs done
        self._on_failure = on_failure
        self._failed = failed
        self._running = False
        self._done = trio.Event()  # set when the fsync under way ends
        self._worker = Worker(name)

    def start_at(self, position: Position) -> None:
        self.written = self.synced = position

    def wrote(self, position: Position) -> None:
        """The log was written up to `position` (event loop). Wakes nobody: a write may be
        made where no task may be woken (broker/pass_end.py); the interval's timer looks."""
        self.written = position

    @property
    def all_synced(self) -> bool:
        return self.synced >= self.written

    async def through(self, position: Position) -> None:
        """Return once the log is fsynced up to `position` (group commit: a flush that
        comes while an fsync runs waits for the next one, which covers it and every other
        that came meanwhile)."""
        while self.synced < position:
            if (failed := self._failed()) is not None:
                raise failed
            if self._running:
                await self._done.wait()
            else:
                await self.sync()

    async def sync(self) -> None:
        assert self.log is not None
        self._running = True
        started = time.time()
        try:
            position = await self._worker.run(self.log.sync)
        except OSError as exc:
            self._on_failure(exc)
            return
        finally:
            self._running = False
            event, self._done = self._done, trio.Event()
            event.set()
        self.synced = max(self.synced, position)
        self.count += 1
        # before any acknowledgement it covers leaves: what survives a power cut, for an
        # operator (and the power-loss test) to read
        log.debug("store log fsynced: segment %d offset %d (started at %.6f)", *position, started)

    async def run_interval(self, interval: float) -> None:
        """fsync the log at least every `interval` seconds while it has unsynced writes.
        A timer every interval, busy or idle (20 a second at the default, as Redis's 10 a
        second): a write never wakes this task, so one made at the end of a scheduler
        pass, where no task may be woken, is synced in time all the same."""
        last = trio.current_time()
        while True:
            await trio.sleep_until(last + interval)
            last = trio.current_time()
            if not self.all_synced and not self._running:
                await self.sync()

    def stop(self) -> None:
        self._worker.stop()
