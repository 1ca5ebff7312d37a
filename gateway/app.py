"""Assemble a gateway from Settings: store, broker, listeners; run until cancelled.

Each protocol package builds its own server and listeners from the settings
(`gateway/protocols/<name>/listener.py`, `gateway/http/server.py`); this module opens the
store, binds their listeners in order and reports where (gateway/listeners.py).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from gateway import __version__, node
from gateway.addresses import Address, format_address, is_loopback
from gateway.broker import Broker
from gateway.config import Settings
from gateway.http import stats as nsqd_stats
from gateway.http.history import History
from gateway.http.nsqd import broadcast_address, port_of
from gateway.http.server import listeners as http_listeners
from gateway.links import cluster_warnings
from gateway.links import configured as configured_links
from gateway.listeners import HTTPListener, Listener, Service
from gateway.metrics import Metrics
from gateway.protocols.beanstalk import listener as beanstalk_listener
from gateway.protocols.nats import listener as nats_listener
from gateway.protocols.nsq import listener as nsq_listener
from gateway.protocols.nsq.lookupd import Identity
from gateway.protocols.rocketmq import listener as rocketmq_listener
from gateway.stores import Store, open_store
from gateway.tcp import ConnectionLimits
from gateway.tcp import serve as serve_tcp
from gateway.tls import Certificates, ListenerContexts

if TYPE_CHECKING:
    from gateway.archive.writer import Archive

log = logging.getLogger("gateway")


@dataclass
class Gateway:
    settings: Settings
    store: Store | None = None
    metrics: Metrics = field(default_factory=Metrics)
    addresses: dict[str, Address] = field(default_factory=dict)
    # life cycle, for the readiness probes: set once every listener is bound, and when
    # the gateway starts to stop
    serving: bool = False
    stopping: bool = False
    opened: bool = False  # the store is open and the broker has its queues
    # for the start-up lines: the file the settings came from (None: flags and
    # environment only); and whether the HTTP listeners log every request
    config_file: str | None = None
    access_log: bool = False
    started: float = field(default_factory=time.time)

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

    @property
    def waiting_for(self) -> str | None:
        """While the store opens: why it has not yet (a Redis not reachable), if known."""
        if self.opened or self.store is None:
            return None
        return self.store.opening_problem()

    def __post_init__(self) -> None:
        s = self.settings
        if self.store is None:
            self.store = open_store(s.store, s.data_dir, fsync=s.storage.fsync, wait=s.store_wait)
        shared = Certificates(s.tls_cert, s.tls_key) if s.tls_cert and s.tls_key else None
        self.tls = ListenerContexts(s.tls_settings, shared)
        self.archive = self._archive()
        self.broker = Broker(
            self.store,
            max_attempts=s.broker.max_attempts,
            memory_window=s.storage.memory_window,
            archive=self.archive,
        )
        # the admin page's charts, sampled whether or not a page is open
        self.history = History(self.broker)
        if self.archive is not None:
            self.metrics.watch_archive(self.archive)
        self.metrics.watch_broker(self.broker, s.metrics.max_series)
        self.metrics.watch_store(self.broker)
        broker, metrics, tls = self.broker, self.metrics, self.tls
        nsq = nsq_listener.service(s, broker, metrics, tls)
        beanstalk = beanstalk_listener.service(s, broker, metrics, tls)
        nats = nats_listener.service(s, broker, metrics, tls)
        cluster = nats_listener.cluster_service(s, broker, metrics, tls, nats.server)
        rocketmq = rocketmq_listener.service(s, broker, metrics)
        lookupd = nsq_listener.lookupd_service(s, broker, metrics, self._nsqd_identity)
        # the cluster's hooks first: it counts interest from before any group is made
        # (beanstalkd's default tube), in the order the groups come
        self.services: list[Service[Any]] = [cluster, nsq, lookupd, beanstalk, nats, rocketmq]
        self.nsq = nsq.server
        self.lookupd = lookupd.server
        self.beanstalk = beanstalk.server
        self.nats = nats.server
        self.cluster = cluster.server
        self.rocketmq = rocketmq.server
        # moving traffic to and from live servers; started once the listeners are bound
        self.links = configured_links(s, broker, self._registered_as)
        if self.links.links:
            self.metrics.watch_links(self.links)
        # every listener in binding order, which the listening lines and the ready line
        # follow; HTTP's last: /info and /lookup report the others
        self.listeners: list[Listener | HTTPListener] = [
            *nsq.listeners,
            *beanstalk.listeners,
            *nats.listeners,
            *cluster.listeners,
            *rocketmq.listeners,
            *http_listeners(self, self.tls),
        ]

    def _registered_as(self) -> set[str]:
        """host:port the gateway's NSQ listener is known by to nsqlookupd (none if off)."""
        if "nsq" not in self.addresses:
            return set()
        identity = self._nsqd_identity()
        host = identity.broadcast_address
        return {f"[{host}]:{identity.tcp_port}" if ":" in host else f"{host}:{identity.tcp_port}"}

    def _nsqd_identity(self) -> Identity:
        """Who the gateway is to an nsqlookupd: what /info and /lookup say of it too."""
        return Identity(
            broadcast_address=broadcast_address(self),
            tcp_port=port_of(self, "nsq"),
            http_port=port_of(self, "http"),
            hostname=self.nsq.hostname,
            version=nsqd_stats.VERSION,
        )

    # the certificate pairs that SIGHUP reloads (gateway.cli)
    @property
    def certificates(self) -> Certificates | None:
        return self.tls.shared

    @property
    def listener_certificates(self) -> list[Certificates]:
        return self.tls.own

    def reload_certificates(self) -> None:
        """SIGHUP: every certificate pair read again into the contexts that show it."""
        self.tls.reload()

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

    async def serve(
        self, *, task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the store, bind every listener, report where, then serve until
        cancelled. A store that must reach a server (Redis) opens after the HTTP
        listeners: /health and /ready answer meanwhile (a Redis not reachable yet keeps
        /ready at 503 with the reason), the other HTTP calls 503 until the broker has its
        queues."""
        self._log_start()
        assert self.store is not None
        early = (
            [listener for listener in self.listeners if isinstance(listener, HTTPListener)]
            if self.store.connects
            else []
        )
        try:
            async with trio.open_nursery() as nursery:
                for listener in early:
                    await self._listen(nursery, listener)
                await self.broker.open()
                self.opened = True
                self._log_recovered()
                if self.archive is not None:
                    self.archive.start()
                await nursery.start(self.broker.run)
                await nursery.start(self.history.run)
                for service in self.services:
                    if service.before is not None:
                        service.before()
                for listener in self.listeners:
                    if listener not in early:
                        await self._listen(nursery, listener)
                for service in self.services:
                    if service.after is not None:
                        await nursery.start(service.after)
                await nursery.start(self.links.run)
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
                    if self.opened:
                        await self.broker.close()
                finally:
                    if self.archive is not None and self.opened:
                        # after the broker: the last events are in the buffer
                        await trio.to_thread.run_sync(self.archive.close)

    def _log_start(self) -> None:
        """What an operator asks first about a running gateway: which version, read from
        which file, keeping its messages where, how durably, and archiving what."""
        log.info("gateway %s starting, config file: %s", __version__, self.config_file or "none")
        store = node.store_info(self)
        log.info("store: %s at %s, fsync: %s", store["kind"], store["where"] or "-", store["fsync"])
        a = self.settings.archive
        if self.archive is None:
            log.info("archive: off")
        else:
            log.info(
                "archive: %s, topics: %s, bodies: %s",
                self.archive.directory,
                ", ".join(a.topics) if a.topics else "all",
                a.body,
            )
        for warning in cluster_warnings(self.settings):
            log.warning("%s", warning)

    def _log_recovered(self) -> None:
        states, topics, groups = node.held(self.broker)
        log.info(
            "recovered %d messages (%s) in %d topics, %d groups",
            sum(states.values()),
            ", ".join(f"{k} {states[k]}" for k in ("ready", "deferred", "reserved", "buried")),
            topics,
            groups,
        )

    async def _listen(self, nursery: trio.Nursery, listener: Listener | HTTPListener) -> None:
        """Start a listener, announce where it is bound; a bind that fails names the
        listener and its address."""
        if listener.address is None:
            return
        try:
            if isinstance(listener, HTTPListener):
                bound = await nursery.start(listener.serve, *listener.address)
            else:
                limits = self._limits(listener)
                sockets = await nursery.start(
                    serve_tcp, listener.name, listener.handle, limits, *listener.address
                )
                bound = [sock.socket.getsockname()[:2] for sock in sockets]
        except OSError as exc:
            where = f"{listener.name} listener {format_address(*listener.address)}"
            raise OSError(f"{where}: {exc.strerror or exc}") from exc
        self._announce(listener.name, bound)
        if isinstance(listener, Listener) and listener.bound is not None:
            listener.bound(bound[0])

    def _limits(self, listener: Listener) -> ConnectionLimits:
        counter = self.metrics.connections_refused
        lim = self.settings.limits
        return ConnectionLimits(
            lim.max_connections,
            lim.max_connections_per_ip,
            listener.refuse,
            lambda reason: counter.labels(listener.name, reason).inc(),
        )

    def _announce(self, name: str, bound: list[Address]) -> None:
        self.addresses[name] = bound[0]
        for h, p in bound:
            # The contract scripts and tests rely on: one line per bound listener.
            print(
                f"listening protocol={name} address={format_address(h, p)}",
                file=sys.stderr,
                flush=True,
            )
        exposed = [addr for addr in bound if not is_loopback(addr[0])]
        if exposed and not any(lst.guarded for lst in self.listeners if lst.name == name):
            log.warning(
                "listener %s on %s is reachable from other hosts with neither TLS nor"
                " authentication: anyone who reaches it can publish, consume and delete",
                name,
                format_address(*exposed[0]),
            )
