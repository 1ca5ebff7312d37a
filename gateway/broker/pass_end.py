"""The end of a pass: the commits of many connections settled by one write of the store's
records, made as a pass of Trio's scheduler ends, just before it waits for I/O
(docs/storage.md, "The write path").

Redis writes its append-only file at the same point ("before sleep": every command of the
event-loop iteration has run, and no client has its reply yet). While two connections or
more publish, every commit of a pass is handed over (`defer`); when the pass ends, one
`os.write()` carries all their records, and each connection then writes its released
replies to its socket from here, without a task switch. Sixteen publishers sending one PUB
at a time each paid for a frame, its CRC and a write before; now one write serves them
all. (The pass's first commit writing at once, the others at the end, cost a second write
in most passes: 7-15% of greenstalk puts from 4 processes, 9% of PUBs on 16 connections.)

This runs inside Trio's run loop, between two passes, where no task runs, so two rules:
nothing may escape it (Trio would remove the instrument, and every later commit would
hang), and a task made runnable here would wait for the next I/O event or deadline,
because the wait's timeout is fixed already. So a settle says whether it may have woken a
task (a connection's writer for what its socket did not take, a task waiting for a
release, the last words of a connection whose commit failed), and after such a pass the
coming wait ends at once, through the run_sync_soon queue that Trio watches with the rest
of its I/O. The store's write wakes no task whose lateness matters: the fsync interval is
a timer of its own (stores/fsync.py), and the index, which a large write nudges, also
runs on its own timer. (Noting every task scheduled instead, with the instrument's
`task_scheduled`, would put a call on every task switch of the gateway, busy or not; the
one hook kept is a call per pass, about one per MPUB of 100 in a flood.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from gateway.broker.errors import StoreUnavailable

log = logging.getLogger("gateway")

# settles one connection's commit (None once the records are written, else why not); True
# when it may have made a task runnable
Settle = Callable[[StoreUnavailable | None], bool]


def _nothing() -> None:
    """Queued only to end the scheduler's wait for I/O at once."""


class PassEnd(trio.abc.Instrument):
    """The commits of a pass (`joins`, `defer`), settled with one write of the store's
    records as the pass ends. `write` is the journal's `flush_now` for a
    store that settles by writing to the operating system (Store.writes_on_loop).

    Between `start()` and `stop()` (the broker's run), and only while two connections or
    more have commits (`publishing`, `done_publishing`): with one, there is nothing to
    share, and the hook would cost a call on every pass (3% of PUBs one at a time on one
    connection)."""

    def __init__(self, write: Callable[[], bool]) -> None:
        self._write = write
        self._settles: list[Settle] = []
        self._token: trio.lowlevel.TrioToken | None = None  # set while started
        self._publishers = 0  # connections that have had commits, still open
        self._installed = False

    def start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._update()

    def stop(self) -> None:
        self._token = None
        self._update()

    def publishing(self) -> None:
        """A connection had its first commit (it calls `done_publishing` as it closes)."""
        self._publishers += 1
        if self._publishers == 2:
            self._update()

    def done_publishing(self) -> None:
        self._publishers -= 1
        if self._publishers == 1:
            self._update()

    def _update(self) -> None:
        """Install the hook while it can share a write, remove it otherwise (from a task:
        what was handed over is settled there)."""
        wanted = self._token is not None and self._publishers >= 2
        if wanted and not self._installed:
            trio.lowlevel.add_instrument(self)
            self._installed = True
        elif self._installed and not wanted:
            trio.lowlevel.remove_instrument(self)
            self._installed = False
            self._settle()

    def joins(self) -> bool:
        """Whether a commit now waits for the end of the pass (else it writes at once)."""
        return self._installed

    def defer(self, settle: Settle) -> None:
        """`settle` is called as this pass ends, with None once every record made so far
        is written, or with why it could not be."""
        self._settles.append(settle)

    # -- trio.abc.Instrument -------------------------------------------------------

    def before_io_wait(self, timeout: float) -> None:
        if not self._settles:
            return
        woke = True
        try:
            woke = self._settle()
        except BaseException:  # never out of an instrument (see the module)
            log.exception("settling the commits of a pass failed")
        if woke and timeout > 0 and self._token is not None:
            self._token.run_sync_soon(_nothing)

    def _settle(self) -> bool:
        """Write, then settle every commit handed over; True if a task may have woken."""
        settles, self._settles = self._settles, []
        if not settles:
            return False
        error: StoreUnavailable | None = None
        try:
            if not self._write():
                # only a store whose flush waits says so, and none of those is here
                error = StoreUnavailable("the store did not take the records")
        except StoreUnavailable as exc:
            error = exc
        except Exception as exc:  # a bug: the clients get a failure, not a hang
            log.exception("writing the records of a pass failed")
            error = StoreUnavailable(f"write failed: {exc!r}")
        woke = False
        for settle in settles:
            try:
                woke = settle(error) or woke
            except Exception:
                log.exception("settling a commit at the end of a pass failed")
                woke = True
        return woke
