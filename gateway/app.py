"""Assemble a gateway from Settings: store, broker, listeners; run until cancelled."""

from __future__ import annotations

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
from gateway.http import serve as serve_http
from gateway.metrics import Metrics
from gateway.protocols.beanstalk.server import BeanstalkServer
from gateway.protocols.beanstalk.session import BeanstalkSession
from gateway.protocols.nats.client_session import NATSClientSession
from gateway.protocols.nats.cluster import Cluster
from gateway.protocols.nats.server import NATSServer
from gateway.protocols.nsq.auth import AuthClient
from gateway.protocols.nsq.codec import Limits
from gateway.protocols.nsq.negotiation import ServerFeatures
from gateway.protocols.nsq.server import NSQServer
from gateway.protocols.nsq.session import NSQSession
from gateway.protocols.rocketmq.server import RocketMQServer
from gateway.protocols.rocketmq.session import RocketMQSession
from gateway.stores import Store, open_store
from gateway.tcp import serve as serve_tcp

if TYPE_CHECKING:
    from gateway.archive.writer import Archive

log = logging.getLogger("gateway")


def _bound_address(listener: trio.SocketListener) -> tuple[str, int]:
    host, port = listener.socket.getsockname()[:2]
    return host, port


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def server_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    """The listeners' TLS context; an error names the file it is about."""
    for setting, path in (("tls_cert", cert), ("tls_key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise OSError(f"{setting} {path}: {exc.strerror or exc}") from exc
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise OSError(
            f"tls_cert {cert} / tls_key {key}: not a usable certificate and key: {exc}"
        ) from exc
    return ctx


@dataclass
class Gateway:
    settings: Settings
    store: Store | None = None
    metrics: Metrics = field(default_factory=Metrics)
    ssl_context: ssl.SSLContext | None = None
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
            self.store = open_store(s.store, s.data_dir, fsync=s.storage.fsync)
        if self.ssl_context is None and s.tls_cert and s.tls_key:
            self.ssl_context = server_ssl_context(s.tls_cert, s.tls_key)
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
        )
        self.metrics.before_scrape.append(self.beanstalk.report_bytes)
        n = s.nats_server
        self.nats = NATSServer(
            self.broker,
            self.metrics,
            max_payload=n.max_payload,
            max_pending=n.max_pending,
            max_control_line=n.max_control_line,
            ping_interval=n.ping_interval,
            ping_max=n.ping_max,
            user=n.user,
            password=n.password,
            token=n.token,
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
            max_output_bytes=r.max_output_bytes,
            delay_levels=tuple(r.delay_levels),
            broker_name=r.broker_name,
            cluster_name=r.cluster_name,
        )

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
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        server = None
        if s.tls_cert and s.tls_key:
            client.load_cert_chain(s.tls_cert, s.tls_key)
            server = server_ssl_context(s.tls_cert, s.tls_key)
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
                if self.settings.address("beanstalk") is not None:
                    self.beanstalk.start()
                for protocol, setting, handle in (
                    ("nsq", "nsq", self._nsq_connection),
                    ("beanstalk", "beanstalk", self._beanstalk_connection),
                    ("nats", "nats", self._nats_connection),
                    ("nats-route", "nats_route", self.cluster.accept),
                    ("rocketmq", "rocketmq", self._rocketmq_connection),
                ):
                    address = self.settings.address(setting)
                    if address is not None:
                        listeners = await self._bind(
                            nursery, protocol, address, serve_tcp, protocol, handle
                        )
                        self._announce(protocol, [_bound_address(lst) for lst in listeners])
                        if protocol == "rocketmq":
                            self.rocketmq.advertised = self._rocketmq_advertised()
                # after the others: /info and /lookup report their ports
                address = self.settings.address("http")
                if address is not None:
                    self._announce(
                        "http", await self._bind(nursery, "http", address, serve_http, self)
                    )
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

    async def _nsq_connection(self, stream: trio.SocketStream, remote: str) -> None:
        await NSQSession(self.nsq, stream, remote).run()

    async def _beanstalk_connection(self, stream: trio.SocketStream, remote: str) -> None:
        await BeanstalkSession(self.beanstalk, stream, remote).run()

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
