"""One thread that does a store's disk I/O, in the order it is asked, off the event loop.

Trio's `to_thread.run_sync` takes a thread from its cache for every call; a commit is a
round trip to that thread, and on this kind of machine the cache's hand-off alone took
about 130 µs against about 80 µs for a thread of our own waiting on a queue. A publish
waits for one such round trip before it is acknowledged, so the difference is most of its
latency. One thread also keeps the SQLite connection on one thread for its whole life.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

import outcome
import trio

_Job = tuple[Callable[..., Any], tuple[Any, ...], trio.lowlevel.TrioToken, list[Any], trio.Event]


class Worker:
    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, token, box, done = job
            box.append(outcome.capture(fn, *args))
            # the run may have ended while the job ran: then nobody waits for it
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the worker thread and return its result. Like Trio's
        to_thread without abandon_on_cancel: a job once handed over always completes,
        and a cancellation takes effect after it (the caller's next checkpoint)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        await trio.lowlevel.checkpoint_if_cancelled()
        box: list[Any] = []
        done = trio.Event()
        self._jobs.put((fn, args, trio.lowlevel.current_trio_token(), box, done))
        with trio.CancelScope(shield=True):
            await done.wait()
        return box[0].unwrap()

    def stop(self) -> None:
        """The thread ends after the jobs already handed over."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
