"""The gateway as a member of a NATS cluster: its routes, its interest, its dialing.

What the cluster sees of the gateway is one more nats-server. Its interest (RS+/RS-) is
the union of: topics that have a group (an NSQ channel, the beanstalkd group of a tube,
any consumer that keeps messages), the configured import patterns, and the subscriptions
of NATS clients connected to the gateway directly (queue subscriptions with their member
count as weight). Interest is counted here and announced as a set: RS+ when a subject's
count leaves 0, RS- when it returns to 0, a fresh RS+ when a queue weight changes.

Routes never relay (docs/protocols/nats-route.md §10), so the gateway keeps a route to every
server of the cluster: the configured URLs are dialed and redialed for ever with backoff, a server
another server tells us about (gossip INFO) is dialed too, and servers may dial the route
listener. One route per remote server_id; a second one is closed.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import trio

from gateway.addresses import parse_route_url
from gateway.broker import Broker, query
from gateway.broker.errors import StoreUnavailable
from gateway.metrics import Metrics
from gateway.protocols.nats import route_codec as rc
from gateway.protocols.nats import route_events as ev
from gateway.protocols.nats.headers import parse_headers
from gateway.protocols.nats.route_session import ACCOUNT, RouteSession
from gateway.protocols.nats.server import VERSION
from gateway.subjects import SubjectIndex, is_valid_subscription
from gateway.tcp import peer_name

log = logging.getLogger("gateway.nats.route")

# Backoff for redialing: from this up to reconnect_max_wait, doubling.
_FIRST_RETRY = 0.1
# A dialed route that lasted this long starts the next backoff from the beginning.
_STABLE_AFTER = 10.0
# Servers heard of by gossip are dialed this many times before giving up (the server
# itself, or the next gossip about it, brings the route back later).
_GOSSIP_ATTEMPTS = 5


def _interest_key_ok(subject: str) -> bool:
    # a topic name that is not a NATS subject (empty token, whitespace) is not announced
    return is_valid_subscription(subject) and not any(c.isspace() for c in subject)


class Cluster:
    def __init__(
        self,
        broker: Broker,
        metrics: Metrics,
        *,
        server_id: str,
        server_name: str,
        name: str | None,
        urls: list[str],
        imports: list[str],
        user: str | None = None,
        password: str | None = None,
        max_payload: int = 1048576,
        advertise: tuple[str, int] | None = None,
        ping_interval: float = 30.0,
        ping_max: int = 2,
        reconnect_max_wait: float = 2.0,
        handshake_timeout: float = 5.0,
        max_pending: int = 64 * 1024 * 1024,
        max_control_line: int = 65536,
        route_max_payload: int = 64 * 1024 * 1024,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
    ) -> None:
        self.broker = broker
        self.metrics = metrics
        self.server_id = server_id
        self.server_name = server_name
        self.name = name  # None: adopt the first peer's cluster name
        self.urls = urls
        self.user = user
        self.password = password
        self.max_payload = route_max_payload
        self.advertised_max_payload = max_payload
        self.advertise = advertise
        self.ping_interval = ping_interval
        self.ping_max = ping_max
        self.reconnect_max_wait = reconnect_max_wait
        self.handshake_timeout = handshake_timeout
        self.max_pending = max_pending
        self.max_control_line = max_control_line
        self.server_ssl = server_ssl
        self.client_ssl = client_ssl
        self.routes: dict[str, RouteSession] = {}
        self.interest: dict[tuple[str, str | None], int] = {}
        self.listen_address: tuple[str, int] | None = None
        self._imports = SubjectIndex()
        self._import_list = imports
        self._closed: dict[str, trio.Event] = {}  # server_id -> set when its route closes
        self._dialing: set[tuple[str, int]] = set()
        self._nursery: trio.Nursery | None = None

    # -- life cycle -------------------------------------------------------------

    def attach(self) -> None:
        """Start counting interest: imports, topics with groups, local subscriptions."""
        broker = self.broker
        for pattern in self._import_list:
            self._imports.add(pattern, pattern)
            self._change(pattern, None, 1)
        for topic in query.topic_names(broker):
            if query.has_groups(broker, topic):
                self._groups_changed(topic, True)
        broker.watch_interest(self._change, self._groups_changed)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for url in self.urls:
                host, port, user, password = parse_route_url(url)
                nursery.start_soon(self._dial_forever, host, port, user, password)
            task_status.started()
            await trio.sleep_forever()

    async def accept(self, stream: trio.SocketStream, peer: str) -> None:
        """A server dialed the route listener."""
        conn: trio.abc.Stream = stream
        if self.server_ssl is not None:
            conn = trio.SSLStream(stream, self.server_ssl, server_side=True)
            try:
                with trio.fail_after(self.handshake_timeout):
                    await conn.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError) as exc:
                log.info("route %s: TLS handshake failed: %s", peer, exc)
                await trio.aclose_forcefully(conn)
                return
        await RouteSession(self, conn, peer, solicited=False).run()

    # -- dialing ------------------------------------------------------------------

    async def _dial_forever(
        self, host: str, port: int, user: str | None, password: str | None
    ) -> None:
        """A configured route: kept up for as long as the gateway runs."""
        delay = _FIRST_RETRY
        while True:
            started = trio.current_time()
            route = await self._dial(host, port, user, password, None)
            if route is not None and route.duplicate and route.remote_id is not None:
                # that server dialed us first: dial again once its route has gone
                await self._route_closed(route.remote_id).wait()
                delay = _FIRST_RETRY
                continue
            if (
                route is not None
                and route.registered
                and trio.current_time() - started > _STABLE_AFTER
            ):
                delay = _FIRST_RETRY
            await trio.sleep(delay)
            delay = min(delay * 2, self.reconnect_max_wait)

    async def _dial_gossiped(self, host: str, port: int, server_id: str, gossip_mode: Any) -> None:
        key = (host, port)
        if key in self._dialing:
            return
        self._dialing.add(key)
        try:
            delay = _FIRST_RETRY
            for _ in range(_GOSSIP_ATTEMPTS):
                if server_id in self.routes:
                    return
                route = await self._dial(host, port, self.user, self.password, gossip_mode)
                if route is not None and (route.registered or route.duplicate):
                    return
                await trio.sleep(delay)
                delay = min(delay * 2, self.reconnect_max_wait)
        finally:
            self._dialing.discard(key)

    async def _dial(
        self, host: str, port: int, user: str | None, password: str | None, gossip_mode: Any
    ) -> RouteSession | None:
        """One connection to a server, run until it closes; None if it never connected."""
        try:
            with trio.fail_after(self.handshake_timeout):
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
                peer = peer_name(stream)  # type: ignore[arg-type]
                if self.client_ssl is not None:
                    stream = trio.SSLStream(stream, self.client_ssl, server_hostname=host)
                    await stream.do_handshake()
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            log.debug("route %s:%d: cannot connect: %s", host, port, exc)
            return None
        route = RouteSession(
            self,
            stream,
            peer,
            solicited=True,
            gossip_mode=gossip_mode,
            user=user if user is not None else self.user,
            password=password if user is not None else self.password,
        )
        await route.run()
        return route

    def gossip(self, doc: dict[str, Any]) -> None:
        """An INFO about another server of the cluster: dial it unless it has a route."""
        server_id = doc.get("server_id")
        url = doc.get("ip")
        if not isinstance(server_id, str) or not isinstance(url, str) or self._nursery is None:
            return
        if server_id == self.server_id or server_id in self.routes:
            return
        try:
            host, port, _, _ = parse_route_url(url)
        except ValueError:
            log.info("gossip about %s with an unusable address %r", server_id, url)
            return
        log.info("gossip: dialing server %s at %s:%d", server_id, host, port)
        self._nursery.start_soon(self._dial_gossiped, host, port, server_id, doc.get("gossip_mode"))

    # -- routes ---------------------------------------------------------------------

    def accept_cluster_name(self, name: object, dynamic: bool) -> bool:
        """Does a peer's cluster name fit ours? With none configured, adopt the first
        peer's; a peer whose name was generated adopts ours
        (docs/protocols/nats-route.md §6)."""
        if dynamic:
            if self.name is None and isinstance(name, str) and name:
                self.name = name
            return True
        if not isinstance(name, str) or not name:
            return False
        if self.name is None:
            self.name = name
            log.info("cluster name %r adopted from a route", name)
        return name == self.name

    def register(self, route: RouteSession) -> None:
        assert route.remote_id is not None
        self.routes[route.remote_id] = route
        self._closed.pop(route.remote_id, None)

    def unregister(self, route: RouteSession) -> None:
        server_id = route.remote_id
        if server_id is None or self.routes.get(server_id) is not route:
            return
        del self.routes[server_id]
        closed = self._closed.pop(server_id, None)
        if closed is not None:
            closed.set()
        log.info("route to %s (%s) closed", server_id, route.peer)

    def _route_closed(self, server_id: str) -> trio.Event:
        event = self._closed.get(server_id)
        if event is None:
            event = self._closed[server_id] = trio.Event()
            if server_id not in self.routes:
                event.set()
        return event

    def info_doc(self, gossip_mode: Any) -> dict[str, Any]:
        """Our route INFO (docs/protocols/nats-route.md §3): no pooling, no compression,
        headers on."""
        host, port = self.advertise or self.listen_address or ("127.0.0.1", 0)
        doc: dict[str, Any] = {
            "server_id": self.server_id,
            "server_name": self.server_name,
            "version": VERSION,
            "proto": 2,
            "host": host,
            "port": port,
            "headers": True,
            "max_payload": self.advertised_max_payload,
        }
        if self.name:
            doc["cluster"] = self.name
        if self.advertise is not None:
            doc["ip"] = f"nats-route://{host}:{port}/"
        if self.server_ssl is not None:
            doc["tls_required"] = True
        if self.user is not None:
            doc["auth_required"] = True
        if gossip_mode is not None:
            doc["gossip_mode"] = gossip_mode
        return doc

    def connect_doc(self, user: str | None, password: str | None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "verbose": False,
            "pedantic": False,
            "tls_required": self.client_ssl is not None,
            "headers": True,
            "name": self.server_id,
            "cluster": self.name or "",
        }
        if user is not None:
            doc["user"] = user
            doc["pass"] = password or ""
        return doc

    # -- interest -------------------------------------------------------------------

    def _groups_changed(self, topic: str, has_groups: bool) -> None:
        if _interest_key_ok(topic):
            self._change(topic, None, 1 if has_groups else -1)

    def _change(self, subject: str, queue: str | None, delta: int) -> None:
        key = (subject, queue)
        old = self.interest.get(key, 0)
        new = old + delta
        if new > 0:
            self.interest[key] = new
        else:
            self.interest.pop(key, None)
            new = 0
        if queue is None:
            if old == 0 and new > 0:
                frame = rc.rs_plus(ACCOUNT, subject)
            elif old > 0 and new == 0:
                frame = rc.rs_minus(ACCOUNT, subject)
            else:
                return
        elif new > 0:
            frame = rc.rs_plus(ACCOUNT, subject, queue, new)  # the weight changed
        elif old > 0:
            frame = rc.rs_minus(ACCOUNT, subject, queue)
        else:
            return
        for route in self.routes.values():
            route.send(frame)

    def interest_frames(self) -> list[bytes]:
        """Everything we want, for a route just established."""
        return [
            rc.rs_plus(ACCOUNT, subject)
            if queue is None
            else rc.rs_plus(ACCOUNT, subject, queue, count)
            for (subject, queue), count in self.interest.items()
        ]

    # -- messages -------------------------------------------------------------------

    def receive(self, route: RouteSession, msgs: list[ev.Msg]) -> None:
        """Messages from the cluster, into the topic (made only for imports) and to local
        NATS subscribers; never back out on a route. `msgs` share their subject, account,
        queue names, header and reply (the route batches runs of plain messages)."""
        first = msgs[0]
        if first.account != ACCOUNT:
            return
        try:
            self._publish_routed(route, msgs)
        except StoreUnavailable as exc:
            # at most once, as on any NATS path: dropped, counted, logged once per failure
            self.metrics.protocol_error("nats-route", "store_unavailable")
            log.debug("route %s: %d messages dropped: %s", route.origin, len(msgs), exc)

    def _publish_routed(self, route: RouteSession, msgs: list[ev.Msg]) -> None:
        first = msgs[0]
        subject = first.subject
        header = first.header
        self.broker.publish(
            subject,
            [m.payload for m in msgs],
            headers=parse_headers(header) if header else None,
            header_block=header,
            reply_to=first.reply,
            origin=route.origin,
            create=bool(self._imports) and bool(self._imports.match(subject)),
            publisher=route,
            routed=first.queues or (),
        )
