"""`[[nsq_import]]`: the gateway as an NSQ consumer of a topic's channel on every upstream
nsqd, publishing what it receives into its own topic.

Each nsqd (configured, or named by the lookupds' `/lookup?topic=`, see nsq_upstream.py)
gets one connection: `  V2`, IDENTIFY, `SUB topic channel`, then `RDY n`, where the
link's max_in_flight is split evenly over the connections (at least 1 each, at most the
nsqd's max_rdy_count). An nsqd the lookupds stop naming gets `RDY 0`, and its connection
is closed once it holds nothing unsettled.

At-least-once: the messages every connection received since the last batch are
published into the gateway's topic together (one `broker.publish`, one `broker.flush`),
and FIN'd upstream only once the flush returned, i.e. the store has them. Whatever was
not FIN'd (the gateway killed, the store failing) nsqd redelivers after its msg_timeout;
a store failure sends the batch back at once with `REQ id <backoff>` instead, counts an
error, and waits the backoff before the next batch. The gateway gives each message its
own id and counts its own attempts from 0; the upstream id is not kept.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import httpx
import trio

from gateway.backoff import Backoff
from gateway.broker.errors import StoreUnavailable
from gateway.links import SETTLE_LIMIT, LinkStatus, settling
from gateway.links import nsq_client as nc
from gateway.links.nsq_upstream import (
    LOOKUPD_TIMEOUT,
    Connect,
    Ended,
    NSQConnection,
    Upstream,
    channel_depth,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    from gateway.broker.broker import Broker
    from gateway.config_links import NSQImportSettings
    from gateway.model import Message

log = logging.getLogger("gateway.links")

LAG_INTERVAL = 5.0  # s between reads of the upstream channel's depth (the status's lag)


class _Reader:
    """One upstream nsqd: its connection, kept up until the link stops or the lookupds no
    longer name it, and the ids received on the current one not yet settled."""

    def __init__(self, link: NSQImport, address: str) -> None:
        self.link = link
        self.address = address
        self.conn: NSQConnection | None = None
        self.unsettled: set[bytes] = set()  # ids received on `conn`, not FIN'd or REQ'd
        self.rdy = 0  # the RDY count sent on `conn`
        self.retiring = False
        self.backing_off = False
        self.scope = trio.CancelScope()

    async def run(self) -> None:
        link = self.link
        backoff = Backoff()
        with self.scope:
            while not self.retiring:
                started = trio.current_time()
                try:
                    await self._connection()
                except Ended as why:
                    link.failed(str(why))
                finally:
                    # a stop: the batch under way is FIN'd on this connection before it
                    # closes (its messages would otherwise come again, after msg_timeout)
                    await link.batch_settled()
                    conn, self.conn = self.conn, None
                    self.unsettled.clear()  # nsqd redelivers them after its msg_timeout
                    if conn is not None:
                        await conn.aclose()
                    link.refresh()
                if self.retiring:
                    break
                backoff.lasted(trio.current_time() - started)
                self.backing_off = True
                link.refresh()
                await trio.sleep(backoff.next())
                self.backing_off = False
        if link.readers.get(self.address) is self:  # not a successor named again since
            del link.readers[self.address]
        link.refresh()

    async def _connection(self) -> None:
        link = self.link
        settings = link.settings
        conn = await NSQConnection.open(self.address, link.connect)
        self.conn = conn
        self.rdy = 0
        await conn.send(nc.sub(settings.topic, settings.channel))
        answer = await conn.frame()
        if not isinstance(answer, nc.ResponseFrame) or answer.data != nc.OK:
            raise Ended(f"{self.address} refused SUB: {answer}")
        log.info(
            "nsq_import %s: subscribed to %s/%s on %s",
            link.status.name,
            settings.topic,
            settings.channel,
            self.address,
        )
        link.rebalance()
        await self.send_rdy()
        link.refresh()
        while True:
            for frame in await conn.frames():
                if isinstance(frame, nc.MessageFrame):
                    self.unsettled.add(frame.id)
                    link.received(self, conn, frame)
                elif isinstance(frame, nc.ErrorFrame):
                    # E_FIN_FAILED and the like: nsqd goes on; a fatal one closes next
                    link.failed(f"{self.address}: {frame}")
            link.refresh()

    async def send_rdy(self) -> None:
        """Tell nsqd this connection's share of max_in_flight, if it changed."""
        conn = self.conn
        if conn is None:
            return
        want = 0 if self.retiring else self.link.share
        most = conn.features.get("max_rdy_count")
        if isinstance(most, int) and most > 0:
            want = min(want, most)
        if want != self.rdy:
            self.rdy = want
            await conn.send(nc.rdy(want))

    async def settle(self, conn: NSQConnection, ids: list[bytes], requeue_ms: int | None) -> None:
        """FIN (or REQ) `ids`, received on `conn`: nothing if that connection is over,
        nsqd redelivers them anyway."""
        if conn is not self.conn or conn.closed:
            return
        for msg_id in ids:
            self.unsettled.discard(msg_id)
        if requeue_ms is None:
            data = b"".join(nc.fin(msg_id) for msg_id in ids)
        else:
            data = b"".join(nc.req(msg_id, requeue_ms) for msg_id in ids)
        try:
            await conn.send(data)
        except Ended:
            return  # the reading task sees the loss too
        if self.retiring and not self.unsettled:
            self.scope.cancel()

    async def retire(self) -> None:
        """The lookupds no longer name this nsqd: take nothing more, close once settled."""
        self.retiring = True
        if self.conn is None or not self.unsettled:
            self.scope.cancel()
            return
        try:
            await self.send_rdy()
        except Ended:
            self.scope.cancel()


_Received = tuple[_Reader, NSQConnection, bytes, bytes]


class NSQImport:
    def __init__(
        self,
        settings: NSQImportSettings,
        broker: Broker,
        connect: Connect = trio.open_tcp_stream,
        itself: Callable[[], Collection[str]] = tuple,
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.connect = connect
        self.to_topic = settings.to_topic or settings.topic
        name = settings.name or f"nsq_import:{settings.topic}/{settings.channel}"
        self.upstream = Upstream(settings, settings.topic, self._addresses_changed, itself=itself)
        self.status = LinkStatus("nsq_import", name, self.upstream.configured, state="connecting")
        self.readers: dict[str, _Reader] = {}
        # received, not yet published here: (reader, its connection, upstream id, body)
        self._pending: list[_Received] = []
        self._wake = trio.Event()
        self._settled = trio.Event()  # set while no batch is under way
        self._settled.set()
        self._store_failing = False
        self._origin = f"nsq_import {name}"  # of every message it publishes
        self._nursery: trio.Nursery | None = None

    @property
    def share(self) -> int:
        """Each connection's RDY: max_in_flight split over them, at least 1."""
        live = sum(1 for r in self.readers.values() if not r.retiring) or 1
        return max(1, self.settings.max_in_flight // live)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._mover)
            self._addresses_changed()
            nursery.start_soon(self.upstream.poll)
            if self.settings.lookupd_http_addresses:
                nursery.start_soon(self._lag)
            task_status.started()

    async def _lag(self) -> None:
        """The status's lag: the channel's depth on every nsqd whose HTTP API the lookupds
        named (their `/stats`), read every LAG_INTERVAL. nsqds given only by their TCP
        address have no known HTTP API: their depth is not counted."""
        settings = self.settings
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(LOOKUPD_TIMEOUT), trust_env=False
        ) as client:
            while True:
                https = [self.upstream.http.get(a) for a in self.upstream.addresses]
                depths = [
                    await channel_depth(client, http, settings.topic, settings.channel)
                    for http in https
                    if http is not None
                ]
                known = [d for d in depths if d is not None]
                self.status.lag = sum(known) if known else None
                await trio.sleep(LAG_INTERVAL)

    def _addresses_changed(self) -> None:
        nursery = self._nursery
        assert nursery is not None
        wanted = self.upstream.addresses
        for address in wanted:
            reader = self.readers.get(address)
            if reader is None or reader.retiring:
                reader = self.readers[address] = _Reader(self, address)
                nursery.start_soon(reader.run)
        for address, reader in list(self.readers.items()):
            if address not in wanted and not reader.retiring:
                nursery.start_soon(reader.retire)
        self.rebalance()

    def rebalance(self) -> None:
        """The number of connections changed: every connection's RDY follows."""
        nursery = self._nursery
        assert nursery is not None
        for reader in self.readers.values():
            if reader.conn is not None and not reader.retiring:
                nursery.start_soon(self._send_rdy, reader)

    @staticmethod
    async def _send_rdy(reader: _Reader) -> None:
        with contextlib.suppress(Ended):  # its own task sees the loss
            await reader.send_rdy()

    def received(self, reader: _Reader, conn: NSQConnection, frame: nc.MessageFrame) -> None:
        self._pending.append((reader, conn, frame.id, frame.body))
        self._wake.set()

    def failed(self, why: str) -> None:
        if self.status.failed(why):
            log.warning("nsq_import %s: %s", self.status.name, why)

    def refresh(self) -> None:
        """The status's state and in-flight count, from the connections."""
        status = self.status
        readers = list(self.readers.values())
        status.in_flight = len(self._pending) + sum(len(r.unsettled) for r in readers)
        if self._store_failing:
            status.state = "backing off"
        elif any(r.conn is not None and not r.retiring for r in readers):
            status.state = "connected"
        elif any(r.backing_off for r in readers):
            status.state = "backing off"
        else:
            status.state = "connecting"

    async def _mover(self) -> None:
        """Publish what arrived, flush, then FIN it upstream; on a store failure, REQ."""
        backoff = Backoff()
        while True:
            while not self._pending:
                await self._wake.wait()
                self._wake = trio.Event()
            batch, self._pending = self._pending, []
            self._settled = trio.Event()
            try:
                async with settling():  # a stop lets the batch under way finish, bounded
                    delay = await self._store(batch, backoff)
            finally:
                self._settled.set()
            self.refresh()
            if delay is not None:
                # still "backing off" after the wait: only a batch the store kept says
                # the store is back
                await trio.sleep(delay)

    async def _store(self, batch: list[_Received], backoff: Backoff) -> float | None:
        """Publish and flush the batch, then FIN it; if the store failed, REQ it instead
        and return the time to wait before the next batch."""
        published: Sequence[Message] = ()
        try:
            published, _ = self.broker.publish(
                self.to_topic, [entry[3] for entry in batch], origin=self._origin
            )
            await self.broker.flush()
        except StoreUnavailable as exc:
            # sent back upstream, so none may stay here for the store to write once it
            # recovers (it would then arrive twice)
            self.broker.withdraw(published)
            delay = backoff.next()
            self._store_failing = True
            self.failed(f"publishing into {self.to_topic}: {exc}")
            await self._settle(batch, int(delay * 1000))
            return delay
        backoff.reset()
        self._store_failing = False
        await self._settle(batch, None)
        self.status.moved += len(batch)
        return None

    async def batch_settled(self) -> None:
        """Until the batch under way is settled upstream (at most SETTLE_LIMIT), whatever
        cancellation is under way."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + SETTLE_LIMIT
            await self._settled.wait()

    async def _settle(self, batch: list[_Received], requeue_ms: int | None) -> None:
        by_conn: dict[NSQConnection, tuple[_Reader, list[bytes]]] = {}
        for reader, conn, msg_id, _ in batch:
            by_conn.setdefault(conn, (reader, []))[1].append(msg_id)
        for conn, (reader, ids) in by_conn.items():
            await reader.settle(conn, ids, requeue_ms)
