"""`[[nsq_export]]`: the gateway consumes its own topic as a group and publishes what it
gets to an upstream nsqd, as `MPUB` batches of up to `batch` messages (`PUB` for one).

The link is a member of the group like any session (`Group.attach`, a window of
max_in_flight deliveries); the broker knows nothing of NSQ. A message is finished here
only once nsqd answered its batch `OK`. Batches are pipelined: nsqd answers each command
in order, so the oldest batch sent is the one an answer settles. An error answer (nsqd
closes the connection after E_BAD_TOPIC, E_MPUB_FAILED ...) or a lost connection sends
every batch not yet answered back to the group (`Group.requeue`, to be retried after the
backoff; never deleted), and the link connects again after the backoff.

Several nsqds: failover. The link publishes to one nsqd, the first of the configured
addresses then those the lookupds name (producers of `to_topic`, else every node their
`/nodes` lists), for as long as it works; after a failure it tries the next one.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Final

import trio

from gateway.backoff import Backoff
from gateway.broker.errors import StoreUnavailable
from gateway.links import LinkStatus
from gateway.links import nsq_client as nc
from gateway.links.nsq_upstream import (
    Connect,
    Ended,
    NSQConnection,
    Upstream,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from gateway.broker import Consumer, Group
    from gateway.broker.broker import Broker
    from gateway.config_links import NSQExportSettings
    from gateway.model import Message

log = logging.getLogger("gateway.links")

# s a delivery to the link may stay unanswered before the group gives it to another
# member (or again to the link): far above an MPUB round trip, as nsqd's msg_timeout is
IN_FLIGHT_TIMEOUT: Final = 60.0
# nsqd's answers to a PUB or MPUB that refuse a message for what it is, not for the
# moment: `E_BAD_MESSAGE MPUB message too big 2000000 > 1048576`, `... invalid message
# body size 0`, and for a batch bigger than its --max-body-size `E_BAD_BODY MPUB body
# too big ...`
REFUSED_MESSAGE: Final = frozenset({"E_BAD_MESSAGE", "E_BAD_BODY"})


class NSQExport:
    protocol = "nsq_export"  # the metrics label of the link's deliveries

    def __init__(
        self,
        settings: NSQExportSettings,
        broker: Broker,
        connect: Connect = trio.open_tcp_stream,
        itself: Callable[[], Collection[str]] = tuple,
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.connect = connect
        self.to_topic = settings.to_topic or settings.topic
        self._changed = trio.Event()  # the upstream addresses changed
        self.upstream = Upstream(
            settings, self.to_topic, self._addresses_changed, any_node=True, itself=itself
        )
        self.status = LinkStatus(
            "nsq_export",
            settings.name or f"nsq_export:{settings.topic}",
            self.upstream.configured,
            state="connecting",
        )
        self.group: Group | None = None
        self.consumer: Consumer | None = None
        self._pending: deque[Message] = deque()  # delivered here, not yet sent
        self._sent: deque[list[Message]] = deque()  # sent, waiting for nsqd's answer
        self._storing = 0  # OK'd by nsqd and finished, the finishes not yet stored
        # ids of messages in a batch nsqd refused as a bad message (too big, empty): sent
        # alone from then on, so that the one nsqd refuses is found and buried, and the
        # others of its batch go through
        self._alone: set[int] = set()
        self._wake = trio.Event()
        self._backoff = Backoff()

    # -- the group's member (called by the broker, synchronously) --------------------

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        self._pending.append(message)
        self._wake.set()
        return True

    def group_closed(self) -> None:
        """The group was deleted (over HTTP): what it held is gone with it; join the
        group made again at the next connection."""
        self.consumer = None
        self.group = None
        self._pending.clear()
        self._sent.clear()
        self._wake.set()

    def _attach(self) -> Consumer:
        if self.consumer is None or self.group is None or self.group.deleted:
            self.group = self.broker.group(self.settings.topic, self.settings.group)
            self.consumer = self.group.attach(self, IN_FLIGHT_TIMEOUT)
        return self.consumer

    # -- running ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._attach()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.upstream.poll)
                task_status.started()
                await self._connections()
        finally:
            if self.consumer is not None and self.group is not None:
                self.group.detach(self.consumer, requeue=True)

    async def _connections(self) -> None:
        status = self.status
        index = 0
        while True:
            await self.upstream.polled.wait()
            self._changed = trio.Event()
            addresses = self.upstream.addresses
            if not addresses:
                status.state = "connecting"
                status.last_error = "no nsqd: the lookupds name none"
                await self._changed.wait()
                continue
            address = addresses[index % len(addresses)]
            started = trio.current_time()
            try:
                await self._connection(address)
            except Ended as why:
                self._failed(str(why))
                index += 1  # failover: the next nsqd
            finally:
                self._give_back()
            self._backoff.lasted(trio.current_time() - started)
            status.state = "backing off"
            await trio.sleep(self._backoff.next())

    def _addresses_changed(self) -> None:
        self._changed.set()

    async def _connection(self, address: str) -> None:
        """Publish over one connection until it ends (raises Ended)."""
        status = self.status
        status.state = "connecting"
        conn = await NSQConnection.open(address, self.connect)
        try:
            status.state = "connected"
            log.info("nsq_export %s: publishing to %s on %s", status.name, self.to_topic, address)
            consumer = self._attach()
            consumer.set_ready(self.settings.max_in_flight)
            ended: list[str] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._answers, conn, ended, nursery.cancel_scope)
                try:
                    await self._send(conn)
                except Ended as why:
                    ended.append(str(why))
                nursery.cancel_scope.cancel()
            raise Ended(ended[0] if ended else f"connection to {address} ended")
        finally:
            if self.consumer is not None:
                self.consumer.set_ready(0)  # nothing more until connected again
            await conn.aclose()

    async def _send(self, conn: NSQConnection) -> None:
        """Send what the group delivered, in batches, for as long as the connection is up."""
        batch_size = self.settings.batch
        pending = self._pending
        while True:
            while not pending:
                self._refresh()
                await self._wake.wait()
                self._wake = trio.Event()
            if pending[0].id in self._alone:
                batch = [pending.popleft()]
            else:
                batch = []
                while pending and len(batch) < batch_size and pending[0].id not in self._alone:
                    batch.append(pending.popleft())
            self._sent.append(batch)
            self._refresh()
            await conn.send(nc.mpub(self.to_topic, [m.body for m in batch]))

    async def _answers(
        self, conn: NSQConnection, ended: list[str], scope: trio.CancelScope
    ) -> None:
        """nsqd's answers, oldest batch first: OK finishes it here, an error ends it all."""
        try:
            while True:
                done: list[list[Message]] = []
                for frame in await conn.frames():
                    if not self._sent:
                        raise Ended(f"{conn.address} answered nothing sent: {frame}")
                    if isinstance(frame, nc.ResponseFrame) and frame.data == nc.OK:
                        done.append(self._sent.popleft())
                    elif isinstance(frame, nc.ErrorFrame):
                        if frame.code in REFUSED_MESSAGE:
                            self._refused(self._sent[0], frame)
                        raise Ended(f"{conn.address} refused a batch: {frame}")
                    else:
                        raise Ended(f"{conn.address} answered {frame!r:.100}")
                if done:
                    await self._finish(done)
        except Ended as why:
            # the sender may be waiting for deliveries: the connection ends from here
            ended.append(str(why))
            scope.cancel()

    async def _finish(self, batches: list[list[Message]]) -> None:
        """Finish what nsqd took, and wait until the store has the finishes before the
        window takes more: a kill then repeats at most a window's worth upstream."""
        group, consumer = self.group, self.consumer
        if group is None or consumer is None:
            return  # the group was deleted meanwhile
        n = 0
        for batch in batches:
            for message in batch:
                group.finish(consumer, message.id, pump=False)  # gone in flight: no matter
            n += len(batch)
        self._storing += n  # in flight still, until the store has the finishes
        try:
            await self.broker.flush()
        except StoreUnavailable as exc:
            # finished here all the same: nsqd has them; the store keeps trying
            self._failed(f"recording what {self.to_topic} took: {exc}")
        finally:
            self._storing -= n
        self.status.moved += n
        self._backoff.reset()
        if not group.deleted:
            group.pump()
        self._refresh()

    def _refused(self, batch: list[Message], frame: nc.ErrorFrame) -> None:
        """nsqd refused a message of `batch` for what it is (too big for its
        --max-msg-size, or empty): sent again, it would be refused again, forever, with
        the others of its batch. The messages of a bigger batch are sent alone from now on;
        a message refused alone is buried in the group, where the admin page shows it and a
        kick brings it back (after nsqd's limit is raised, say)."""
        if len(batch) > 1:
            self._alone.update(m.id for m in batch)
            return
        (message,) = batch
        self._sent.popleft()
        self._alone.discard(message.id)
        group, consumer = self.group, self.consumer
        if group is not None and consumer is not None:
            group.bury(consumer, message.id)
        log.error(
            "nsq_export %s: nsqd refused message %d of %s (%d bytes): %s; buried in %s/%s",
            self.status.name,
            message.id,
            self.settings.topic,
            len(message.body),
            frame,
            self.settings.topic,
            self.settings.group,
        )

    def _give_back(self) -> None:
        """Every message not answered OK back to the group, ready again after the
        backoff (a requeue counted as such, not a delete)."""
        group, consumer = self.group, self.consumer
        back = [m for batch in self._sent for m in batch]
        back.extend(self._pending)
        self._sent.clear()
        self._pending.clear()
        if group is not None and consumer is not None and back:
            consumer.set_ready(0)
            delay = self._backoff.delay
            for message in back:
                group.requeue(consumer, message.id, delay, pump=False)
        self._refresh()

    def _failed(self, why: str) -> None:
        if self.status.failed(why):
            log.warning("nsq_export %s: %s", self.status.name, why)

    def _refresh(self) -> None:
        status = self.status
        status.in_flight = len(self._pending) + sum(map(len, self._sent)) + self._storing
        status.lag = self.group.depth if self.group is not None else None
