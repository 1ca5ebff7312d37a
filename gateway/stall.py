"""nats-server's fast-producer stall: a publisher waits, briefly, for the subscribers it
feeds faster than they read, instead of their being cut off for a burst."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from gateway.connection import Connection

# nats-server's fast-producer stall (stallTotalAllowed): the most a publisher's reading
# waits, per receive, for the subscribers it fed past their stall mark to drain.
STALL_BUDGET = 0.010


class Stall:
    """nats-server's answer to a fast producer, on the publisher's side.

    A connection fed past its stall mark (NATS: 3/4 of max_pending, as nats-server's
    `c.out.mp/4*3`) while its socket takes less than is published is added here by the
    delivery (NATSClientSession.send_message). When the publisher's batch is done,
    `wait()` holds its reading, before it reads more, until those sessions' output falls
    back under their mark or STALL_BUDGET per receive runs out (nats-server stalls its
    read loop the same way, 10 ms in all per read). A subscriber that reads thus paces
    the publisher instead of being cut off for a burst; one that does not read costs
    the publisher at most that and is cut off at its bound. `spent` is reset at each
    receive (nats-server's resetReadLoopStallTime).
    """

    __slots__ = ("sessions", "spent")

    def __init__(self) -> None:
        self.sessions: list[Connection] = []
        self.spent = 0.0

    def add(self, connection: Connection) -> None:
        if connection.drained is None:
            connection.drained = trio.Event()
        if connection not in self.sessions:  # a handful at most: the list is short
            self.sessions.append(connection)

    async def wait(self) -> None:
        sessions, self.sessions = self.sessions, []
        for connection in sessions:
            drained = connection.drained
            if drained is None:
                continue  # under its mark again already
            left = STALL_BUDGET - self.spent
            if left <= 0:
                return
            started = time.perf_counter()
            with trio.move_on_after(left):
                await drained.wait()
            self.spent += time.perf_counter() - started
