"""Prometheus collectors shared by every listener.

One registry per gateway process (tests build several gateways in one process, so the
collectors are not registered in prometheus_client's global default registry). Names
follow the Prometheus naming guide: the unit in the name, `_total` last on counters.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import Any

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from gateway import __version__

# No counter exposes a `_created` series. The broker's counters are read from plain
# integers at scrape time (metrics_broker.py) and have no creation time to give; with
# prometheus_client's default only the few Counter objects here had one, so a query could
# not rely on it anyway, and in the text format each `_created` is one more series per
# label set, read by Prometheus as a gauge of its own. One rule for every counter: none.
disable_created_metrics()


class _HandedOverCounter(Counter):
    """A labelled Counter whose counts may wait in a plain dict until it is collected:
    `labels(...).inc()` takes a lock and builds a tuple, a real share of a command that a
    flooding client can make the gateway answer hundreds of thousands of times a second."""

    _hand_over: Callable[[], None] | None = None

    def collect(self) -> Any:
        if self._hand_over is not None:
            self._hand_over()
        return super().collect()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.before_scrape: list[Callable[[], None]] = []
        # error replies not yet handed to `protocol_errors`, by (protocol, code as sent)
        self._errors: dict[tuple[str, bytes | str], int] = {}
        self.connections = Gauge(
            "gateway_open_connections",
            "Open client connections",
            ["protocol"],
            registry=self.registry,
        )
        self.connections_total = Counter(
            "gateway_connections_total",
            "Client connections accepted",
            ["protocol"],
            registry=self.registry,
        )
        # every task of the process (one per connection and a few per listener): what
        # grows here without traffic growing is a leak
        self.tasks = Gauge("gateway_tasks", "Trio tasks alive", registry=self.registry)
        self.connections_refused = Counter(
            "gateway_connections_refused_total",
            "Client connections refused by a [limits] setting",
            ["protocol", "reason"],
            registry=self.registry,
        )
        self.protocol_errors = _HandedOverCounter(
            "gateway_protocol_errors_total",
            "Bad input answered with the protocol's error reply",
            ["protocol", "code"],
            registry=self.registry,
        )
        self.protocol_errors._hand_over = self._hand_over_errors
        self.bytes_in = Counter(
            "gateway_received_bytes", "Bytes read", ["protocol"], registry=self.registry
        )
        self.bytes_out = Counter(
            "gateway_sent_bytes", "Bytes written", ["protocol"], registry=self.registry
        )
        # the gateway's registration with each nsqlookupd (--lookupd-tcp-address), by the
        # address as configured: whether it is registered now, and how often a connection
        # could not be made or was lost (a lookupd restarting counts one)
        self.lookupd_connected = Gauge(
            "gateway_nsqlookupd_connected",
            "1 while the gateway is registered with this nsqlookupd, else 0",
            ["lookupd"],
            registry=self.registry,
        )
        self.lookupd_errors = Counter(
            "gateway_nsqlookupd_connection_errors_total",
            "Connections to this nsqlookupd that failed, were refused or were lost",
            ["lookupd"],
            registry=self.registry,
        )
        # which build answers: gateway_build_info{version, python} 1
        Info("gateway_build", "The gateway's version and Python's", registry=self.registry).info(
            {"version": __version__, "python": platform.python_version()}
        )
        # process_* (resident memory, CPU seconds, open and maximum file descriptors, start
        # time) and python_info, from prometheus_client's own collectors
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def refresh(self) -> None:
        """Bring counters that sessions batch (to keep them off their hot paths) up to
        date: called before every scrape."""
        for hook in self.before_scrape:
            hook()
        self.tasks.set(_count_tasks())

    def watch_broker(self, broker: object, max_series: int) -> None:
        """Export the broker's queues (counted by the broker itself, read at scrape time)."""
        from gateway.metrics_broker import BrokerCollector

        self.registry.register(BrokerCollector(broker, max_series))  # type: ignore[arg-type]

    def watch_store(self, broker: object) -> None:
        """Export the store's figures (commit latency, fsyncs, bytes and messages on disk)."""
        from gateway.metrics_store import StoreCollector

        self.registry.register(StoreCollector(broker))  # type: ignore[arg-type]

    def watch_archive(self, archive: object) -> None:
        """Export the archive's counters (events written and dropped, segments)."""
        from gateway.metrics_archive import ArchiveCollector

        self.registry.register(ArchiveCollector(archive))  # type: ignore[arg-type]

    def watch_links(self, links: object) -> None:
        """Export every link's status (messages moved, in flight, errors, lag)."""
        from gateway.metrics_links import LinksCollector

        self.registry.register(LinksCollector(links))  # type: ignore[arg-type]

    def protocol_error(self, protocol: str, frame_text: bytes | str) -> None:
        """Count an error reply by its code (the first word: E_INVALID, BAD_FORMAT, ...).
        Counted here in a dict; the counter takes the counts when it is collected."""
        code = frame_text.split(b" " if isinstance(frame_text, bytes) else " ", 1)[0]
        key = (protocol, code[:40])  # as many keys as label values, no more
        errors = self._errors
        errors[key] = errors.get(key, 0) + 1

    def _hand_over_errors(self) -> None:
        errors, self._errors = self._errors, {}
        for (protocol, code), n in errors.items():
            text = code.decode("latin-1") if isinstance(code, bytes) else code
            self.protocol_errors.labels(protocol, text or "unknown").inc(n)


def _count_tasks() -> int:
    """The tasks of the running Trio run, walked from its root (0 outside a run)."""
    try:
        pending = [trio.lowlevel.current_root_task()]
    except RuntimeError:
        return 0
    count = 0
    while pending:
        task = pending.pop()
        count += 1
        for nursery in task.child_nurseries:
            pending.extend(nursery.child_tasks)
    return count
