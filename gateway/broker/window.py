"""The memory window of a group whose store pages (the durable store).

Past `window` ready messages, further ready ones stay on disk only (the store has them
already): `spilled` of them, every one at or after `spill_from` in (priority, id) order
and every one in memory before it, so the memory part is always the most urgent part.
The broker's pager task reads the next ones back, in order, when consumers drain the
window below half. A message more urgent than anything on disk stays in memory even past
the window.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.model import Message
from gateway.stores.base import Key, StoreError

if TYPE_CHECKING:
    from gateway.broker.journal import Journal
    from gateway.broker.members import InFlight
    from gateway.broker.ready import ReadyQueue
    from gateway.broker.topic import Topic

NO_KEY: Key = (-1, -1)
log = logging.getLogger("gateway.broker")


class MemoryWindow:
    """Mixed into Group: the window's bookkeeping and the page-in."""

    # the group's own attributes this part reads (set in Group.__init__)
    ready: ReadyQueue
    in_flight: dict[int, InFlight]
    topic: Topic
    name: str
    journal: Journal
    deleted: bool
    window: int
    spilled: int
    spill_from: Key
    _paging: bool
    _dropped_min: Key | None
    _generation: int

    def _dispatch(self) -> None:  # pragma: no cover - Group's
        raise NotImplementedError

    def _spill(self, messages: list[Message]) -> list[Message]:
        """Leave on disk (already recorded) the ready ones past the window; returns the
        ones to keep in memory. Deferred messages always stay in memory."""
        keep: list[Message] = []
        kept_top = NO_KEY  # the least urgent one kept so far (not in `ready` yet)
        for msg in messages:
            if msg.deliver_at == 0.0:
                key = (msg.priority, msg.id)
                if self._spills(key, len(keep), kept_top):
                    continue
                kept_top = max(kept_top, key)
            keep.append(msg)
        return keep

    def _spills(self, key: Key, adding: int, kept_top: Key = NO_KEY) -> bool:
        """Whether a ready message with `key` stays on disk only (and is counted there).
        `adding`, `kept_top`: how many are about to join the ready queue, and the least
        urgent of them."""
        if not self.spilled:
            if len(self.ready) + adding < self.window:
                return False
            # The window is full: spill from here, but never before a message in memory
            # (a page-in reads everything on disk from `spill_from` on, and would load a
            # second copy of it).
            top = max(self.ready.max_key() or NO_KEY, kept_top)
            self.spill_from = max(key, (top[0], top[1] + 1)) if top != NO_KEY else key
        if key < self.spill_from:
            return False  # more urgent than anything on disk: memory, past the window
        self.spilled += 1
        if self._paging and (self._dropped_min is None or key < self._dropped_min):
            self._dropped_min = key
        return True

    def _push_ready(self, msg: Message) -> None:
        """A message back to ready (requeue, timeout, kick, promotion): to memory, or to
        disk when it belongs past the window. Its state is recorded by the caller."""
        if self.spilled and self._spills((msg.priority, msg.id), 0):
            return
        self.ready.push(msg)

    def _want_page(self) -> None:
        if self.spilled and not self._paging and len(self.ready) <= self.window // 2:
            self.topic.broker.want_page(self)

    async def page_in(self) -> None:
        """Load the next ready messages kept on disk into the window (the broker's pager
        task calls this when the window runs low)."""
        if not self.spilled or self._paging or self.deleted:
            return
        self._paging = True
        self._dropped_min = None
        generation = self._generation
        start = self.spill_from
        # A message in flight is on disk as ready (its record counts the delivery), and
        # may sort after `spill_from` (delivered before spilling began, or less urgent
        # than what spilled): the read may find it, and must not load it again. Those
        # in flight now, and those finished during the read (their removal may not be
        # written yet).
        busy = set(self.in_flight)
        try:
            rows = await self.journal.load(self, start, max(self.window - len(self.ready), 1))
        except StoreError as exc:
            log.error("topic %s group %s: paging in failed: %s", self.topic.name, self.name, exc)
            return
        finally:
            self._paging = False
        if generation != self._generation or self.deleted:
            return
        dropped = self._dropped_min
        if dropped is not None:
            rows = [m for m in rows if (m.priority, m.id) < dropped]
        in_flight = self.in_flight
        msgs = [m for m in rows if m.id not in busy and m.id not in in_flight]
        if rows:
            last = rows[-1]
            after = (last.priority, last.id + 1)
            self.spill_from = after if dropped is None or after < dropped else dropped
        elif dropped is not None:
            self.spill_from = dropped
        else:
            # the store has none left where some were counted: trust the store
            log.warning(
                "topic %s group %s: %d messages counted on disk were not found",
                self.topic.name,
                self.name,
                self.spilled,
            )
            self.spilled = 0
        ready = self.ready
        for msg in msgs:
            ready.push(msg)
        self.spilled = max(self.spilled - len(msgs), 0)
        self._dispatch()
        self._want_page()
