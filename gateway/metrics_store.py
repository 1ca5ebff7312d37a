"""The store's figures as Prometheus metrics, read at scrape time: commit latency, fsyncs,
write failures, bytes on disk, and messages on disk against messages in memory (what the
memory window keeps bounded)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.broker import Broker, query

# a commit of the durable store is one write to its log: microseconds into the page
# cache, milliseconds when the disk is busy, seconds on a struggling one
COMMIT_BUCKETS = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class StoreCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._buckets = [0] * (len(COMMIT_BUCKETS) + 1)
        self._count = 0
        self._sum = 0.0

    def collect(self) -> Iterator[Metric]:
        stats = self.broker.journal.stats()
        for seconds in stats.commit_seconds:  # the commits since the last scrape
            self._buckets[bisect_left(COMMIT_BUCKETS, seconds)] += 1
            self._count += 1
            self._sum += seconds
        histogram = HistogramMetricFamily(
            "gateway_store_commit_seconds",
            "Store commits (writes to the durable store's log): seconds each",
        )
        cumulative = []
        total = 0
        for bound, n in zip((*COMMIT_BUCKETS, None), self._buckets, strict=True):
            total += n
            cumulative.append(("+Inf" if bound is None else repr(bound), total))
        histogram.add_metric([], cumulative, self._sum)
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
            in_memory += topic.backlog
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
