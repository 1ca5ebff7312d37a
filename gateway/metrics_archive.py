"""The message archive's figures as Prometheus metrics, read at scrape time: events
written, events dropped (buffer full or a failed write), segments finished."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.archive.writer import Archive


class ArchiveCollector(Collector):
    def __init__(self, archive: Archive) -> None:
        self.archive = archive

    def collect(self) -> Iterator[Metric]:
        a = self.archive
        yield CounterMetricFamily(
            "gateway_archive_events_written",
            "Lifecycle events written to archive segments",
            value=a.written,
        )
        yield CounterMetricFamily(
            "gateway_archive_events_dropped",
            "Lifecycle events not archived: the buffer was full, or writing them failed",
            value=a.dropped + a.failed,
        )
        yield CounterMetricFamily(
            "gateway_archive_segments_written",
            "Archive segments finished (closed and renamed to their final name)",
            value=a.segments,
        )
        yield CounterMetricFamily(
            "gateway_archive_write_errors",
            "Archive writes that failed (disk full, I/O error)",
            value=a.write_errors,
        )
        yield GaugeMetricFamily(
            "gateway_archive_buffered_events",
            "Lifecycle events waiting in the buffer for the archive writer",
            value=a.buffered,
        )
