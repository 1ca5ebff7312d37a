"""One NATS cluster route: a real nats-server on the other end, whichever side dialed.

The handshake follows what nats-server 2.9 and 2.10+ actually do
(docs/protocols/nats-route.md §0, §2):

* We dialed: the server's INFO comes first; we answer CONNECT and then our INFO, in that
  order (2.10+ rejects anything before CONNECT).
* The server dialed: its CONNECT comes first; we answer our INFO at once, without waiting
  for its INFO (2.10+ holds its INFO back until it has ours). A 2.10+ server dials a
  second, `$SYS`-pinned connection beside the first; it rejects that one itself once it
  sees our INFO, so nothing is decided about duplicates before the server's INFO.

The route is registered with the cluster once the remote server_id is known (its INFO),
and then both sides dump their interest. Remote interest becomes broker taps: the route
itself is the tap for plain interest, a RouteQueueMember per queue group carries the
weight the server announced. Messages the broker hands to those taps go out as one RMSG
or HMSG per message, naming the queue groups this route was chosen for.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import trio

from gateway.broker.errors import StoreUnavailable
from gateway.clients import RouteInfo
from gateway.connection import Connection
from gateway.model import Message
from gateway.protocols.nats import route_codec as rc
from gateway.protocols.nats import route_events as ev
from gateway.protocols.nats.headers import encode_headers
from gateway.subjects import is_valid_subscription

if TYPE_CHECKING:
    from gateway.protocols.nats.cluster import Cluster

log = logging.getLogger("gateway.nats.route")

ACCOUNT = "$G"  # the account of every client without an account: all the gateway serves
_RECEIVE_SIZE = 65536
PROTOCOL = "nats-route"  # the metrics label


class RouteQueueMember:
    """A queue group behind a route, as one member of the broker's tap queue, weighted by
    the number of subscribers the server announced for it."""

    remote = True
    __slots__ = ("queue", "route", "weight")

    def __init__(self, route: RouteSession, queue: str, weight: int) -> None:
        self.route = route
        self.queue = queue
        self.weight = weight

    def tap(self, message: Message, publisher: object | None) -> RouteSession | None:
        return self.route.note(message, self.queue)


class RouteSession:
    remote = True  # a broker tap standing for interest held elsewhere (see taps.py)

    def __init__(
        self,
        cluster: Cluster,
        stream: trio.abc.Stream,
        peer: str,
        *,
        solicited: bool,
        gossip_mode: Any = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.peer = peer
        self.conn = Connection(stream, peer, PROTOCOL, cluster.metrics)
        self._owed = cluster.broker.owed
        self.solicited = solicited
        self.gossip_mode = gossip_mode
        self.user = user  # credentials for a route we dial
        self.password = password
        self.codec = rc.RouteCodec(cluster.max_control_line, cluster.max_payload)
        self.connected = solicited  # an inbound route is connected by its CONNECT
        self.remote_id: str | None = None
        self.remote_info: dict[str, Any] = {}
        self.registered = False
        self.duplicate = False  # closed because that server already has a route here
        self.headers = False  # the server takes HMSG (its INFO says so)
        self.plain: set[str] = set()
        self.queues: dict[tuple[str, str], RouteQueueMember] = {}
        self.origin = f"nats-route {peer}"
        self.established = trio.Event()
        self._noted: Message | None = None
        self._noted_queues: list[str] = []
        self._unanswered = 0
        self._metrics = cluster.metrics

    def __repr__(self) -> str:
        return f"<route {self.peer} {self.remote_id or '?'}>"

    def route_info(self) -> RouteInfo:
        """What the admin page shows of this route, as values."""
        return RouteInfo(
            server_id=self.remote_id,
            server_name=self.remote_info.get("server_name", ""),
            peer=self.peer,
            dialed=self.solicited,
            interest=len(self.plain) + len(self.queues),
        )

    # -- life cycle -------------------------------------------------------------

    async def run(self) -> None:
        await self.conn.run(self._reader, self._timers, on_close=self._closed)

    def _closed(self) -> None:
        self.cluster.unregister(self)
        broker = self.cluster.broker
        for subject in self.plain:
            broker.unsubscribe(subject, self)
        for (subject, queue), member in self.queues.items():
            broker.unsubscribe(subject, member, queue)
        self.plain.clear()
        self.queues.clear()

    async def _timers(self) -> None:
        cluster = self.cluster
        with trio.move_on_after(cluster.handshake_timeout):
            await self.established.wait()
        if not self.registered:
            log.info(
                "route %s: no handshake within %ss, closing", self.peer, cluster.handshake_timeout
            )
            self._metrics.protocol_error(PROTOCOL, "handshake_timeout")
            self.conn.cancel()
            return
        # Our own PINGs find a dead server; nats-server closes a route after ping_max
        # unanswered ones, and so do we.
        while True:
            await trio.sleep(cluster.ping_interval)
            if self._unanswered >= cluster.ping_max:
                log.warning(
                    "route %r is stale (%d PINGs unanswered), closing", self, self._unanswered
                )
                self._metrics.protocol_error(PROTOCOL, "stale")
                self.conn.cancel()
                return
            self._unanswered += 1
            self.send(rc.PING)

    async def _reader(self) -> None:
        conn = self.conn
        owed = self._owed
        while True:
            data = await conn.receive(_RECEIVE_SIZE)
            if not data:
                break
            self.codec.receive_data(data)
            before = owed.count
            ok = self._process()
            if owed.count != before:
                # At most once for NATS: nothing is answered, but the route reads on
                # once the messages it stored are committed, as a client waits for its
                # acknowledgements (a durable store commits them in groups).
                with contextlib.suppress(StoreUnavailable):
                    await self.cluster.broker.flush()
            if not ok:
                break
            if not conn.sending:
                await conn.flush()
            else:
                conn.wake.set()
        await conn.flush()

    # -- input --------------------------------------------------------------------

    def _process(self) -> bool:
        """Apply every complete op; False when the route must close."""
        cluster = self.cluster
        # Consecutive plain messages on one subject (no headers, no reply, same queue
        # names) are published together, as one MPUB is: one broker call for the run.
        run: list[ev.Msg] = []
        while (event := self.codec.next_event()) is not None:
            cls = event.__class__
            if not self.connected and cls is not ev.Connect:
                # 2.10+ takes nothing before CONNECT on a route it accepted
                self._error("Authorization Violation")
                return False
            if cls is ev.Msg:
                if not run or (
                    event.header is None  # type: ignore[union-attr]
                    and event.reply is None  # type: ignore[union-attr]
                    and run[0].header is None
                    and run[0].reply is None
                    and event.subject == run[0].subject  # type: ignore[union-attr]
                    and event.queues == run[0].queues  # type: ignore[union-attr]
                    and event.account == run[0].account  # type: ignore[union-attr]
                ):
                    run.append(event)  # type: ignore[arg-type]
                    continue
                cluster.receive(self, run)
                run = [event]  # type: ignore[list-item]
                continue
            if run:
                cluster.receive(self, run)
                run = []
            if cls is ev.RemoteSub:
                self._remote_sub(event)  # type: ignore[arg-type]
            elif cls is ev.RemoteUnsub:
                self._remote_unsub(event)  # type: ignore[arg-type]
            elif cls is ev.Ping:
                self.send(rc.PONG)
            elif cls is ev.Pong:
                self._unanswered = 0
            elif cls is ev.Info:
                if not self._on_info(event.doc):  # type: ignore[union-attr]
                    return False
            elif cls is ev.Connect:
                if not self._on_connect(event.doc):  # type: ignore[union-attr]
                    return False
            elif cls is ev.Err:
                # nats-server sends -ERR only when it is about to close
                log.info("route %r: server says -ERR '%s'", self, event.text)  # type: ignore[union-attr]
                return False
            elif cls is ev.ProtocolError:
                reply = event.reply  # type: ignore[union-attr]
                log.warning("route %r: protocol error (%s), closing", self, event.reason)  # type: ignore[union-attr]
                self._metrics.protocol_error(PROTOCOL, "parse")
                if reply is not None:
                    self.send(reply)
                return False
        if run:
            cluster.receive(self, run)
        return True

    def _error(self, text: str) -> None:
        log.warning("route %s: %s, closing", self.peer, text)
        self._metrics.protocol_error(PROTOCOL, text)
        self.send(rc.err(text))

    def _on_connect(self, doc: dict[str, Any]) -> bool:
        """An inbound route's CONNECT: the checks nats-server makes, then our INFO."""
        cluster = self.cluster
        if self.connected:
            return True  # a repeated CONNECT changes nothing
        if "lang" in doc:
            self._error("attempted to connect to route port")
            return False
        if cluster.user is not None and (
            doc.get("user") != cluster.user or doc.get("pass") != cluster.password
        ):
            self._error("Authorization Violation")
            return False
        name = doc.get("cluster")
        if not cluster.accept_cluster_name(name, doc.get("cluster_dynamic") is True):
            shown = name if isinstance(name, str) else ""
            self._error(
                f'Rejecting connection, cluster name "{shown}" does not match "{cluster.name}"'
            )
            return False
        if doc.get("name") == cluster.server_id:
            log.info("route %s: connected to ourselves, closing", self.peer)
            return False
        self.connected = True
        self.send(rc.info(cluster.info_doc(None)))
        return True

    def _on_info(self, doc: dict[str, Any]) -> bool:
        cluster = self.cluster
        server_id = doc.get("server_id")
        if self.remote_id is not None:
            if server_id != self.remote_id and "gateway" not in doc:
                cluster.gossip(doc)  # about another server: dial it (full mesh)
            return True
        if not isinstance(server_id, str) or not server_id:
            log.warning("route %s: INFO without server_id, closing", self.peer)
            return False
        if server_id == cluster.server_id:
            log.info("route %s: connected to ourselves, closing", self.peer)
            return False
        name = doc.get("cluster")
        if (name or not self.solicited) and not cluster.accept_cluster_name(
            name, doc.get("cluster_dynamic") is True
        ):
            log.warning(
                "route %s: cluster name %r does not match %r, closing",
                self.peer,
                name,
                cluster.name,
            )
            self._metrics.protocol_error(PROTOCOL, "cluster_name")
            return False
        if server_id in cluster.routes:
            # one route per server; nats-server also keeps the older one
            self.duplicate = True
            log.info("route %s: server %s already has a route here, closing", self.peer, server_id)
            return False
        self.remote_id = server_id
        self.remote_info = doc
        self.headers = doc.get("headers") is True
        if self.solicited:
            # CONNECT first: 2.10+ rejects a dialed route whose first op is anything else
            self.send(rc.connect(cluster.connect_doc(self.user, self.password)))
            self.send(rc.info(cluster.info_doc(self.gossip_mode)))
        cluster.register(self)
        self.registered = True
        self.established.set()
        for frame in cluster.interest_frames():
            self.send(frame)
        log.info(
            "route to %s (%s) established, %s",
            doc.get("server_name") or server_id,
            self.peer,
            "dialed" if self.solicited else "accepted",
        )
        return True

    def _remote_sub(self, event: ev.RemoteSub) -> None:
        subject = event.subject
        if event.account != ACCOUNT or not is_valid_subscription(subject):
            return  # other accounts are kept apart; the gateway serves $G only
        broker = self.cluster.broker
        queue = event.queue
        if queue is None:
            if subject not in self.plain:  # interest is a set, not a count
                self.plain.add(subject)
                broker.subscribe(subject, self)
            return
        weight = event.weight or 0
        member = self.queues.get((subject, queue))
        if member is None:
            member = self.queues[(subject, queue)] = RouteQueueMember(self, queue, weight)
            broker.subscribe(subject, member, queue)
        else:
            member.weight = weight  # a new weight comes as another RS+

    def _remote_unsub(self, event: ev.RemoteUnsub) -> None:
        if event.account != ACCOUNT:
            return
        broker = self.cluster.broker
        subject = event.subject
        if event.queue is None:
            if subject in self.plain:
                self.plain.discard(subject)
                broker.unsubscribe(subject, self)
            return
        member = self.queues.pop((subject, event.queue), None)
        if member is not None:
            broker.unsubscribe(subject, member, event.queue)

    # -- output: the broker's taps ------------------------------------------------------

    def tap(self, message: Message, publisher: object | None) -> RouteSession | None:
        """Plain interest matched (maybe under several patterns: noted once)."""
        return self.note(message, None)

    def note(self, message: Message, queue: str | None) -> RouteSession | None:
        """Note a match; the first of a message answers the broker with this route, so
        that `tapped` comes once every tap has seen it (one copy, naming every queue)."""
        if queue is not None:
            if self._noted is message:
                self._noted_queues.append(queue)
                return None
            self._noted = message
            self._noted_queues = [queue]
            return self
        if self._noted is message:
            return None
        self._noted = message
        self._noted_queues = []
        return self

    def tapped(self, message: Message) -> None:
        """Every tap has seen the message: one copy for this route, naming its queues."""
        queues = tuple(self._noted_queues) if self._noted_queues else None
        self._noted = None
        block = message.header_block
        if block is None and message.headers:
            block = encode_headers(message.headers)
        if block is not None and self.headers:
            frame = rc.hmsg(ACCOUNT, message.topic, message.reply_to, queues, block, message.body)
        else:
            # a server that declined headers gets the body only, as nats-server strips them
            frame = rc.rmsg(ACCOUNT, message.topic, message.reply_to, queues, message.body)
        self.send(frame)

    def send(self, frame: bytes) -> None:
        """Queue a frame. The writer task is woken when the queue stops being empty, not
        once per frame: while it is not empty, a wake-up or a flush is already coming."""
        conn = self.conn
        out = conn.out
        if not out:
            conn.wake.set()
        out.append(frame)
        conn.pending += len(frame)
        if conn.pending > self.cluster.max_pending:
            # the server cannot keep up: nats-server closes such a route (write deadline)
            log.warning("route %r: %d bytes unsent, closing as a slow route", self, conn.pending)
            self._metrics.protocol_error(PROTOCOL, "slow_route")
            conn.cancel()
