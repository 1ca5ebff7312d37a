"""The store's figures as Prometheus metrics, read at scrape time: commit latency, fsyncs,
write failures, bytes on disk, and messages on disk against messages in memory (what the
memory window keeps bounded)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.broker import Broker, query
from gateway.stores.base import COMMIT_BUCKETS


class StoreCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        stats = self.broker.journal.stats()
        histogram = HistogramMetricFamily(
            "gateway_store_commit_seconds",
            "Store commits (writes to the durable store's log): seconds each",
        )
        cumulative = []
        total = 0
        for bound, n in zip((*COMMIT_BUCKETS, None), stats.commit_buckets, strict=True):
            total += n
            cumulative.append(("+Inf" if bound is None else repr(bound), total))
        histogram.add_metric([], cumulative, stats.commit_sum)
        yield histogram
        yield CounterMetricFamily(
            "gateway_store_fsyncs", "fsync calls made by the store", value=stats.fsyncs
        )
        yield CounterMetricFamily(
            "gateway_store_write_errors",
            "Store commits that failed (disk full, I/O error); retried until they succeed",
            value=stats.write_errors,
        )
        yield GaugeMetricFamily(
            "gateway_store_failing",
            "1 while the store cannot write (publishes are refused), else 0",
            value=int(self.broker.store_failed is not None),
        )
        yield GaugeMetricFamily(
            "gateway_store_disk_bytes",
            "Bytes the store's files take on disk",
            value=stats.disk_bytes,
        )
        in_memory = 0
        for topic in query.topics(self.broker):
            in_memory += topic.backlog - topic.spilled
            for group in query.groups(self.broker, topic.name):
                c = group.counts
                in_memory += c.ready - c.spilled + c.delayed + c.reserved + c.buried
        messages = GaugeMetricFamily(
            "gateway_store_messages",
            "Queued messages (one per group) kept on disk by the store, and held in memory",
            labels=["where"],
        )
        messages.add_metric(["disk"], stats.messages_on_disk)
        messages.add_metric(["memory"], in_memory)
        yield messages
