"""The NATS listeners: the client protocol's, and the cluster's route listener with the
routes it dials."""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING

import trio

from gateway.addresses import parse_address
from gateway.config_guard import NATSPermission, NATSPermissions
from gateway.connection import Buffered
from gateway.listeners import Listener, Service
from gateway.protocols.nats.client_session import NATSClientSession
from gateway.protocols.nats.cluster import Cluster
from gateway.protocols.nats.permissions import Permissions
from gateway.protocols.nats.server import NATSServer
from gateway.tls import server_ssl_context

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.config import Settings
    from gateway.metrics import Metrics
    from gateway.tls import ListenerContexts

log = logging.getLogger("gateway")


def service(
    settings: Settings, broker: Broker, metrics: Metrics, tls: ListenerContexts
) -> Service[NATSServer]:
    n = settings.nats_server
    lim = settings.limits
    context = tls.context("nats")
    server = NATSServer(
        broker,
        metrics,
        max_payload=n.max_payload,
        max_pending=min(n.max_pending, lim.max_pending_bytes),
        max_control_line=n.max_control_line,
        write_deadline=n.write_deadline,
        ping_interval=n.ping_interval,
        ping_max=n.ping_max,
        turn_budget=lim.turn_microseconds / 1e6,
        max_errors_in_a_row=lim.max_errors_in_a_row,
        buffered=Buffered(lim.max_buffered_bytes, lim.max_pending_bytes // 64),
        user=n.user,
        password=n.password,
        token=n.token,
        ssl_context=context,
        tls_verify=settings.tls_settings.for_listener("nats")[2] is not None,
        tls_timeout=n.tls_timeout,
        auth_timeout=n.auth_timeout,
        users={u.user: (u.password, _permissions(u.permissions)) for u in n.users},
        server_name=n.server_name,
    )

    async def connection(stream: trio.SocketStream, remote: str) -> None:
        await NATSClientSession(server, stream, remote).run()

    async def refuse(stream: trio.SocketStream, remote: str) -> None:
        # nats-server: its INFO, then this error, then the close
        info = server.info(server.take_client_id(), remote)
        await stream.send_all(info + b"-ERR 'maximum connections exceeded'\r\n")

    guarded = context is not None or bool(n.token or n.user or n.users)
    listener = Listener("nats", settings.address("nats"), connection, guarded, refuse)
    return Service(server, [listener])


def _permissions(p: NATSPermissions | None) -> Permissions | None:
    if p is None or (p.publish is None and p.subscribe is None):
        return None
    publish = p.publish or NATSPermission()
    subscribe = p.subscribe or NATSPermission()
    return Permissions.of(publish.allow, publish.deny, subscribe.allow, subscribe.deny)


def cluster_service(
    settings: Settings,
    broker: Broker,
    metrics: Metrics,
    tls: ListenerContexts,
    server: NATSServer,
) -> Service[Cluster]:
    """The route listener and the routes dialed out: the cluster counts interest from
    before any listener is bound (a client's first SUB must count), and dials once
    every listener is, so that its INFO names the route port."""
    s = settings
    r = s.nats_routing
    server_ssl = client_ssl = None
    if r.tls:
        server_ssl, client_ssl = _route_ssl(settings, tls)
    server_id = server.server_id
    cluster = Cluster(
        broker,
        metrics,
        server_id=server_id,
        server_name=r.server_name or f"{s.nats_server.server_name}-{server_id[1:9].lower()}",
        name=s.nats_cluster,
        urls=s.nats_routes,
        imports=r.imports,
        user=r.user,
        password=r.password,
        max_payload=s.nats_server.max_payload,
        advertise=parse_address(r.advertise) if r.advertise else None,
        ping_interval=r.ping_interval,
        ping_max=r.ping_max,
        reconnect_max_wait=r.reconnect_max_wait,
        handshake_timeout=r.handshake_timeout,
        max_pending=r.max_pending,
        max_control_line=r.max_control_line,
        route_max_payload=r.max_payload,
        server_ssl=server_ssl,
        client_ssl=client_ssl,
    )

    def bound(address: tuple[str, int]) -> None:
        cluster.listen_address = address

    address = s.address("nats_route")
    # a refusal: the close alone, and the dialing server logs it and redials
    listener = Listener(
        "nats-route",
        address,
        cluster.accept,
        guarded=bool(r.user or (r.tls and s.tls_cert)),
        bound=bound,
    )
    clustered = address is not None or bool(s.nats_routes)
    return Service(
        cluster,
        [listener],
        before=cluster.attach if clustered else None,
        after=cluster.run if clustered else None,
    )


def _route_ssl(
    settings: Settings, tls: ListenerContexts
) -> tuple[ssl.SSLContext | None, ssl.SSLContext]:
    """Route TLS is mutual, as nats-server's is: each side shows its certificate and
    checks the other's against the CA (tls_ca; the system store when unset)."""
    s = settings
    ca = s.nats_routing.tls_ca
    try:
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise OSError(f"nats_routing.tls_ca {ca}: not a usable CA file: {exc}") from None
    server = None
    if s.tls_cert and s.tls_key:
        client.load_cert_chain(s.tls_cert, s.tls_key)
        server = server_ssl_context(s.tls_cert, s.tls_key)
        if tls.shared is not None:  # a SIGHUP reloads these too
            tls.shared.adopt(client)
            tls.shared.adopt(server)
        server.verify_mode = ssl.CERT_REQUIRED
        if ca:
            server.load_verify_locations(ca)
        else:
            server.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    else:
        log.warning("nats_routing.tls is on but there is no tls_cert/tls_key to offer")
    return server, client
