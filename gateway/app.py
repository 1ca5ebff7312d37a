"""Assemble a gateway from Settings: store, broker, listeners; run until cancelled."""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from gateway.broker import Broker
from gateway.config import Settings, parse_address
from gateway.config_guard import NATSPermission, NATSPermissions
from gateway.http import serve as serve_http
from gateway.metrics import Metrics
from gateway.protocols.beanstalk.server import BeanstalkServer
from gateway.protocols.beanstalk.session import BeanstalkSession
from gateway.protocols.nats.client_session import NATSClientSession
from gateway.protocols.nats.cluster import Cluster
from gateway.protocols.nats.permissions import Permissions
from gateway.protocols.nats.server import NATSServer
from gateway.protocols.nsq.auth import AuthClient
from gateway.protocols.nsq.codec import Limits
from gateway.protocols.nsq.codec import error_frame as nsq_error_frame
from gateway.protocols.nsq.negotiation import ServerFeatures
from gateway.protocols.nsq.server import NSQServer
from gateway.protocols.nsq.session import NSQSession
from gateway.protocols.rocketmq.server import RocketMQServer
from gateway.protocols.rocketmq.session import RocketMQSession
from gateway.stores import Store, open_store
from gateway.tcp import Buffered, ConnectionLimits
from gateway.tcp import serve as serve_tcp
from gateway.tls import Certificates, server_ssl_context

if TYPE_CHECKING:
    from gateway.archive.writer import Archive

log = logging.getLogger("gateway")


def _permissions(p: NATSPermissions | None) -> Permissions | None:
    if p is None or (p.publish is None and p.subscribe is None):
        return None
    publish = p.publish or NATSPermission()
    subscribe = p.subscribe or NATSPermission()
    return Permissions.of(publish.allow, publish.deny, subscribe.allow, subscribe.deny)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _bound_address(listener: trio.SocketListener) -> tuple[str, int]:
    host, port = listener.socket.getsockname()[:2]
    return host, port


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_TLS_HANDSHAKE_SECONDS = 5.0  # a beanstalkd TLS client's handshake, after which it is closed


@dataclass
class Gateway:
    settings: Settings
    store: Store | None = None
    metrics: Metrics = field(default_factory=Metrics)
    ssl_context: ssl.SSLContext | None = None  # NSQ's (the IDENTIFY upgrade)
    # the certificate files and every context showing them (SIGHUP reloads them)
    certificates: Certificates | None = field(default=None, init=False)
    listener_certificates: list[Certificates] = field(default_factory=list, init=False)
    nats_ssl_context: ssl.SSLContext | None = field(default=None, init=False)
    https_ssl_context: ssl.SSLContext | None = field(default=None, init=False)
    beanstalk_ssl_context: ssl.SSLContext | None = field(default=None, init=False)
    addresses: dict[str, tuple[str, int]] = field(default_factory=dict)
    # life cycle, for the readiness probes: set once every listener is bound, and when
    # the gateway starts to stop
    serving: bool = False
    stopping: bool = False

    @property
    def state(self) -> str:
        """starting, serving, draining (beanstalkd drain mode) or stopping."""
        if self.stopping:
            return "stopping"
        if not self.serving:
            return "starting"
        if self.broker.store_failed is not None:
            return "store-failing"
        return "draining" if self.beanstalk.draining else "serving"

    def __post_init__(self) -> None:
        s = self.settings
        if self.store is None:
            wait = s.store_wait if s.store_wait is not None else float("inf")
            self.store = open_store(s.store, s.data_dir, fsync=s.storage.fsync, wait=wait)
        self.certificates = (
            Certificates(s.tls_cert, s.tls_key) if s.tls_cert and s.tls_key else None
        )
        if self.ssl_context is None:
            self.ssl_context = self._listener_tls("nsq", verifies=False)
        self.nats_ssl_context = self._listener_tls("nats")
        self.https_ssl_context = self._listener_tls("https")
        if s.beanstalk_tls != "off":
            self.beanstalk_ssl_context = self._listener_tls("beanstalk")
        self.archive = self._archive()
        self.broker = Broker(
            self.store,
            max_attempts=s.broker.max_attempts,
            memory_window=s.storage.memory_window,
            archive=self.archive,
        )
        if self.archive is not None:
            self.metrics.watch_archive(self.archive)
        self.metrics.watch_broker(self.broker, s.metrics.max_series)
        self.metrics.watch_store(self.broker)
        self.nsq = self._nsq_server()
        self.beanstalk = BeanstalkServer(
            self.broker,
            self.metrics,
            group_name=s.beanstalkd.group,
            max_job_size=s.beanstalkd.max_job_size,
            default_ttr=s.beanstalkd.default_ttr,
            turn_budget=s.limits.turn_microseconds / 1e6,
            max_errors_in_a_row=s.limits.max_errors_in_a_row,
        )
        self.metrics.before_scrape.append(self.beanstalk.report_bytes)
        self.metrics.before_scrape.append(self.nsq.report_bytes)
        n = s.nats_server
        self.nats = NATSServer(
            self.broker,
            self.metrics,
            max_payload=n.max_payload,
            max_pending=min(n.max_pending, s.limits.max_pending_bytes),
            max_control_line=n.max_control_line,
            write_deadline=n.write_deadline,
            ping_interval=n.ping_interval,
            ping_max=n.ping_max,
            turn_budget=s.limits.turn_microseconds / 1e6,
            max_errors_in_a_row=s.limits.max_errors_in_a_row,
            buffered=Buffered(s.limits.max_buffered_bytes, s.limits.max_pending_bytes // 64),
            user=n.user,
            password=n.password,
            token=n.token,
            ssl_context=self.nats_ssl_context,
            tls_verify=s.tls_settings.for_listener("nats")[2] is not None,
            tls_timeout=n.tls_timeout,
            auth_timeout=n.auth_timeout,
            users={u.user: (u.password, _permissions(u.permissions)) for u in n.users},
            server_name=n.server_name,
        )
        self.cluster = self._cluster()
        r = s.rocketmq_broker
        self.rocketmq = RocketMQServer(
            self.broker,
            self.metrics,
            read_queues=r.read_queues,
            write_queues=r.write_queues,
            max_frame_size=r.max_frame_size,
            max_header_size=r.max_header_size,
            max_message_size=r.max_message_size,
            max_suspend=r.max_suspend,
            group_window=r.group_window,
            client_timeout=r.client_timeout,
            queue_lock_seconds=r.queue_lock_seconds,
            max_output_bytes=r.max_output_bytes,
            delay_levels=tuple(r.delay_levels),
            broker_name=r.broker_name,
            cluster_name=r.cluster_name,
        )

    def _listener_tls(self, name: str, *, verifies: bool = True) -> ssl.SSLContext | None:
        """A listener's server context: its [tls.<name>] pair if it has one, else the
        shared certificate when `tls.listeners` names it (beanstalkd TLS always)."""
        t = self.settings.tls_settings
        cert, key, ca = t.for_listener(name)
        ca = ca if verifies else None
        if cert is not None and key is not None:
            own = Certificates(cert, key)
            self.listener_certificates.append(own)
            return own.server_context(ca)
        if self.certificates is not None and (name in t.listeners or name == "beanstalk"):
            return self.certificates.server_context(ca)
        return None

    def reload_certificates(self) -> None:
        """SIGHUP: every certificate pair read again into the contexts that show it."""
        for certs in [self.certificates, *self.listener_certificates]:
            if certs is not None:
                certs.reload()

    def _archive(self) -> Archive | None:
        a = self.settings.archive
        if not a.enabled:
            return None
        # imported only when on: it loads pyarrow
        from gateway.archive.writer import Archive

        return Archive(
            a.dir or Path(self.settings.data_dir) / "archive",
            topics=a.topics,
            body=a.body,
            buffer=a.buffer,
            segment_bytes=a.segment_bytes,
            segment_seconds=a.segment_seconds,
            compression=a.compression,
        )

    def _cluster(self) -> Cluster:
        s = self.settings
        r = s.nats_routing
        server_ssl = client_ssl = None
        if r.tls:
            server_ssl, client_ssl = self._route_ssl()
        server_id = self.nats.server_id
        return Cluster(
            self.broker,
            self.metrics,
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

    def _route_ssl(self) -> tuple[ssl.SSLContext | None, ssl.SSLContext]:
        """Route TLS is mutual, as nats-server's is: each side shows its certificate and
        checks the other's against the CA (tls_ca; the system store when unset)."""
        s = self.settings
        ca = s.nats_routing.tls_ca
        try:
            client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise OSError(f"nats_routing.tls_ca {ca}: not a usable CA file: {exc}") from None
        server = None
        if s.tls_cert and s.tls_key:
            client.load_cert_chain(s.tls_cert, s.tls_key)
            server = server_ssl_context(s.tls_cert, s.tls_key)
            if self.certificates is not None:  # a SIGHUP reloads these too
                self.certificates.adopt(client)
                self.certificates.adopt(server)
            server.verify_mode = ssl.CERT_REQUIRED
            if ca:
                server.load_verify_locations(ca)
            else:
                server.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        else:
            log.warning("nats_routing.tls is on but there is no tls_cert/tls_key to offer")
        return server, client

    def _nsq_server(self) -> NSQServer:
        n = self.settings.nsqd
        auth = None
        if n.auth_http_addresses:
            auth = AuthClient(n.auth_http_addresses, n.auth_http_request_method)
        features = ServerFeatures(
            tls_available=self.ssl_context is not None,
            snappy_enabled=n.snappy,
            deflate_enabled=n.deflate,
            max_deflate_level=n.max_deflate_level,
            auth_required=auth is not None,
            max_rdy_count=n.max_rdy_count,
            msg_timeout=n.msg_timeout,
            max_msg_timeout=n.max_msg_timeout,
            heartbeat_interval=n.client_timeout // 2,
            max_heartbeat_interval=n.max_heartbeat_interval,
            max_output_buffer_size=n.max_output_buffer_size,
            min_output_buffer_timeout=n.min_output_buffer_timeout,
            max_output_buffer_timeout=n.max_output_buffer_timeout,
        )
        limits = Limits(
            max_msg_size=n.max_msg_size,
            max_body_size=n.max_body_size,
            max_rdy_count=n.max_rdy_count,
            max_req_timeout=n.max_req_timeout,
            max_line_length=n.max_line_length,
        )
        return NSQServer(
            broker=self.broker,
            metrics=self.metrics,
            limits=limits,
            features=features,
            ssl_context=self.ssl_context,
            tls_required=n.tls_required,
            auth=auth,
            max_req_timeout=n.max_req_timeout,
            max_msg_timeout=n.max_msg_timeout,
            max_output_bytes=n.max_output_bytes,
            turn_budget=self.settings.limits.turn_microseconds / 1e6,
            hostname=n.hostname if n.hostname != "localhost" else socket.gethostname(),
        )

    async def serve(
        self, *, task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the store, bind every listener, report where, then serve until cancelled."""
        await self.broker.open()
        try:
            if self.archive is not None:
                self.archive.start()
            async with trio.open_nursery() as nursery:
                await nursery.start(self.broker.run)
                clustered = self.settings.nats_route != "off" or bool(self.settings.nats_routes)
                if clustered:
                    # before any listener: a client's first SUB must count as interest
                    self.cluster.attach()
                if self.settings.address("beanstalk") or self.settings.address("beanstalk_tls"):
                    self.beanstalk.start()
                for protocol, setting, handle in (
                    ("nsq", "nsq", self._nsq_connection),
                    ("beanstalk", "beanstalk", self._beanstalk_connection),
                    ("beanstalk-tls", "beanstalk_tls", self._beanstalk_tls_connection),
                    ("nats", "nats", self._nats_connection),
                    ("nats-route", "nats_route", self.cluster.accept),
                    ("rocketmq", "rocketmq", self._rocketmq_connection),
                ):
                    address = self.settings.address(setting)
                    if address is not None:
                        limits = self._limits(protocol)
                        listeners = await self._bind(
                            nursery, protocol, address, serve_tcp, protocol, handle, limits
                        )
                        self._announce(protocol, [_bound_address(lst) for lst in listeners])
                        if protocol == "rocketmq":
                            self.rocketmq.advertised = self._rocketmq_advertised()
                # after the others: /info and /lookup report their ports
                for protocol, context in (("http", None), ("https", self.https_ssl_context)):
                    address = self.settings.address(protocol)
                    if address is None or (protocol == "https" and context is None):
                        continue  # nsqd too serves HTTPS only with a certificate
                    bound = await self._bind(nursery, protocol, address, serve_http, self, context)
                    self._announce(protocol, bound)
                if clustered:
                    self.cluster.listen_address = self.addresses.get("nats-route")
                    await nursery.start(self.cluster.run)
                listening = ", ".join(
                    f"{name}={format_address(*addr)}" for name, addr in self.addresses.items()
                )
                log.info("ready: %s", listening or "no listener")
                self.serving = True
                task_status.started(self)
        finally:
            self.stopping = True
            with trio.CancelScope(shield=True):
                try:
                    await self.broker.close()
                finally:
                    if self.archive is not None:
                        # after the broker: the last events are in the buffer
                        await trio.to_thread.run_sync(self.archive.close)

    async def _bind(
        self,
        nursery: trio.Nursery,
        protocol: str,
        address: tuple[str, int],
        serve: Any,
        *args: Any,
    ) -> Any:
        """Start a listener; a bind that fails names the listener and its address."""
        try:
            return await nursery.start(serve, *args, *address)
        except OSError as exc:
            where = f"{protocol} listener {format_address(*address)}"
            raise OSError(f"{where}: {exc.strerror or exc}") from exc

    def _limits(self, protocol: str) -> ConnectionLimits:
        refusals = {
            "nsq": self._refuse_nsq,
            "beanstalk": self._refuse_beanstalk,
            "nats": self._refuse_nats,
            "nats-route": self._refuse_silently,
            "beanstalk-tls": self._refuse_silently,  # no TLS session yet to answer in
            "rocketmq": self._refuse_silently,  # a remoting reply needs a request to answer
        }
        counter = self.metrics.connections_refused
        lim = self.settings.limits
        return ConnectionLimits(
            lim.max_connections,
            lim.max_connections_per_ip,
            refusals[protocol],
            lambda reason: counter.labels(protocol, reason).inc(),
        )

    async def _refuse_nats(self, stream: trio.SocketStream, remote: str) -> None:
        # nats-server: its INFO, then this error, then the close
        info = NATSClientSession(self.nats, stream, remote)._info()
        await stream.send_all(info + b"-ERR 'maximum connections exceeded'\r\n")

    async def _refuse_nsq(self, stream: trio.SocketStream, remote: str) -> None:
        # nsqd has no connection limit: an error frame, as for any refused command
        await stream.send_all(nsq_error_frame(b"E_TOO_MANY_CONNECTIONS too many connections"))

    async def _refuse_beanstalk(self, stream: trio.SocketStream, remote: str) -> None:
        # beanstalkd's reply when it lacks the resources for a command: the client's first
        # command gets it as its reply
        await stream.send_all(b"OUT_OF_MEMORY\r\n")

    async def _refuse_silently(self, stream: trio.SocketStream, remote: str) -> None:
        return None  # a route: the dialing server logs the close and redials

    async def _nsq_connection(self, stream: trio.SocketStream, remote: str) -> None:
        await NSQSession(self.nsq, stream, remote).run()

    async def _beanstalk_connection(self, stream: trio.SocketStream, remote: str) -> None:
        await BeanstalkSession(self.beanstalk, stream, remote).run()

    async def _beanstalk_tls_connection(self, stream: trio.SocketStream, remote: str) -> None:
        """beanstalkd inside TLS from the first byte (no client library here speaks it; a
        TLS tunnel such as stunnel in front of any client does)."""
        assert self.beanstalk_ssl_context is not None
        tls = trio.SSLStream(stream, self.beanstalk_ssl_context, server_side=True)
        with trio.move_on_after(_TLS_HANDSHAKE_SECONDS):
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError:
                self.metrics.protocol_error("beanstalk", "TLS_HANDSHAKE")
                await trio.aclose_forcefully(stream)
                return
            await BeanstalkSession(self.beanstalk, tls, remote).run()
            return
        self.metrics.protocol_error("beanstalk", "TLS_HANDSHAKE")
        await trio.aclose_forcefully(stream)

    async def _nats_connection(self, stream: trio.SocketStream, remote: str) -> None:
        await NATSClientSession(self.nats, stream, remote).run()

    async def _rocketmq_connection(self, stream: trio.SocketStream, remote: str) -> None:
        await RocketMQSession(self.rocketmq, stream, remote).run()

    def _rocketmq_advertised(self) -> tuple[str, int]:
        """What routes and message ids name: the setting, else the bound address (an
        unspecified or IPv6 bind address falls back to 127.0.0.1, with a warning)."""
        advertise = self.settings.rocketmq_broker.advertise
        if advertise:
            return parse_address(advertise)
        host, port = self.addresses["rocketmq"]
        if host in ("0.0.0.0", "::") or ":" in host:
            log.warning(
                "rocketmq listener %s: set rocketmq_broker.advertise to the IPv4 address "
                "clients dial; routes name 127.0.0.1:%d meanwhile",
                format_address(host, port),
                port,
            )
            return "127.0.0.1", port
        return host, port

    def _announce(self, protocol: str, bound: list[tuple[str, int]]) -> None:
        self.addresses[protocol] = bound[0]
        for h, p in bound:
            # The contract scripts and tests rely on: one line per bound listener.
            print(
                f"listening protocol={protocol} address={format_address(h, p)}",
                file=sys.stderr,
                flush=True,
            )
        exposed = [addr for addr in bound if not _loopback(addr[0])]
        if exposed and not self._guarded(protocol):
            log.warning(
                "listener %s on %s is reachable from other hosts with neither TLS nor"
                " authentication: anyone who reaches it can publish, consume and delete",
                protocol,
                format_address(*exposed[0]),
            )

    def _guarded(self, protocol: str) -> bool:
        """Whether a listener has TLS or authentication configured (docs/security)."""
        s = self.settings
        if protocol == "nsq":  # TLS: the listener's own context, not any certificate
            return self.ssl_context is not None or bool(s.nsqd.auth_http_addresses)
        if protocol == "http":
            return s.http_settings.auth_token is not None
        if protocol == "https":
            return True
        if protocol == "nats":
            n = s.nats_server
            return self.nats_ssl_context is not None or bool(n.token or n.user or n.users)
        if protocol == "nats-route":
            return bool(s.nats_routing.user or (s.nats_routing.tls and s.tls_cert))
        return protocol == "beanstalk-tls"  # the plain beanstalkd listener has neither
