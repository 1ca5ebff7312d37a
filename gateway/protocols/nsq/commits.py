"""Publishes acknowledged in order while their store commits overlap.

With a store whose flush waits (Redis, the durable store), a batch of commands that
published may not answer before its commit. Waiting for that commit before reading the
next batch left the gateway idle for a round trip per batch while the store worked, and
the store idle while the gateway parsed the next batch. Instead the batch's frames stay
at the end of the outbox behind a ticket, its commit runs in a task of its own, and the
reader goes on with the next batch, whose commit can travel while the first is still on
the wire (the Redis store keeps several pipelines in flight).

What stays strict: the outbox leaves in order, so no OK leaves before its publish is
stored, nor before any earlier reply; tickets release their frames one after the other
(tcp.QueuedWriter's `_gate`); a failed commit turns its OKs, and every later ticket's,
into nsqd's fatal E_PUB_FAILED, as a failed inline commit does. The reader runs at most
`AHEAD` tickets ahead, and waits for all of them before anything that changes how bytes
are framed (IDENTIFY's compression or TLS, AUTH) or ends the connection.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import trio

from gateway.broker.errors import StoreUnavailable
from gateway.protocols.nsq.codec import DPUB_OK_FRAME, MPUB_OK_FRAME, OK_FRAME, error_frame

if TYPE_CHECKING:
    from gateway.protocols.nsq.session import NSQSession

# batches whose commits may be under way at once, per connection (the Redis store's
# pipelines in flight are four)
AHEAD = 4
# how long the frames before a failed commit's E_PUB_FAILED may take to leave
_LAST_WORDS = 5.0


_PUBLISHED_BY = {id(OK_FRAME): "PUB", id(MPUB_OK_FRAME): "MPUB", id(DPUB_OK_FRAME): "DPUB"}


def withdraw_oks(
    out: list[bytes], start: int, exc: StoreUnavailable, command: str = "PUB"
) -> bytes:
    """A commit failed: every OK queued in `out` from `start` on is taken back (their
    publishes may not be stored); returns nsqd's fatal error to send instead (nsqd
    closes the connection after it), named for the first publish taken back, else for
    `command`: E_PUB_FAILED, E_MPUB_FAILED or E_DPUB_FAILED."""
    first = None
    kept = []
    for frame in out[start:]:
        kind = _PUBLISHED_BY.get(id(frame))
        if kind is None:
            kept.append(frame)
        elif first is None:
            first = kind
    out[start:] = kept
    command = first or command
    return error_frame(f"E_{command}_FAILED {command} failed {exc}".encode())


class _Ticket:
    __slots__ = ("done", "error", "frames")

    def __init__(self, frames: int) -> None:
        self.frames = frames  # of the outbox, after the earlier tickets' frames
        self.done = False
        self.error: StoreUnavailable | None = None


class Commits:
    def __init__(self, session: NSQSession) -> None:
        self._session = session
        self._held: deque[_Ticket] = deque()
        self._released = trio.Event()
        self.failed = False

    @property
    def pending(self) -> int:
        return len(self._held)

    def hold(self, nursery: trio.Nursery, batch_frames: int) -> None:
        """The batch that just ended published: its last `batch_frames` frames of the
        outbox (and whatever follows them) wait for the store's commit, started now."""
        s = self._session
        if self.failed:
            return  # the connection is closing: this batch's replies never leave
        if s._gate is None:
            s._gate = max(len(s._out) - batch_frames, 0)
        frames = len(s._out) - s._gate - sum(t.frames for t in self._held)
        ticket = _Ticket(frames)
        self._held.append(ticket)
        nursery.start_soon(self._commit, ticket)

    async def _commit(self, ticket: _Ticket) -> None:
        try:
            await self._session.server.broker.flush()
        except StoreUnavailable as exc:
            ticket.error = exc
        ticket.done = True
        await self._release()

    async def _release(self) -> None:
        s = self._session
        held = self._held
        while held and held[0].done and not self.failed:
            ticket = held.popleft()
            if ticket.error is not None:
                self._fail(ticket.error)
                break
            s._gate = (s._gate or 0) + ticket.frames
        if not held and not self.failed:
            s._gate = None
        self._released.set()
        self._released = trio.Event()
        try:
            if self.failed:
                # what may still go out goes at once, then the connection ends
                with trio.move_on_after(_LAST_WORDS):
                    await s._flush_all()
                s._cancel.cancel()
            elif not s._holding and s._out:
                await s._flush()  # what was released; a batch under way writes at its end
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            s._cancel.cancel()  # the peer went away: the session ends quietly

    def _fail(self, exc: StoreUnavailable) -> None:
        """No OK of this ticket or a later one goes out; nsqd's E_PUB_FAILED does, and
        nothing after it (nsqd closes the connection too)."""
        s = self._session
        frame = withdraw_oks(s._out, s._gate or 0, exc)
        s._out.append(frame)
        s._metrics.protocol_error("nsq", frame[8:].split(b" ", 1)[0])
        s._gate = len(s._out)  # whatever the reader appends from now on stays
        self._held.clear()
        self.failed = True

    async def wait(self, most: int = 0) -> None:
        """Until at most `most` tickets are held."""
        while len(self._held) > most:
            await self._released.wait()
