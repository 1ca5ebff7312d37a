"""The links' figures as Prometheus metrics, read from their statuses at scrape time, one
series per link (labelled with its kind and name): messages moved, in flight, errors, lag
and whether it is connected."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.links import Links

_LABELS = ["kind", "link"]


class LinksCollector(Collector):
    def __init__(self, links: Links) -> None:
        self.links = links

    def collect(self) -> Iterator[Metric]:
        moved = CounterMetricFamily(
            "gateway_link_messages_moved",
            "Messages a link moved: acknowledged by the destination, settled at the source",
            labels=_LABELS,
        )
        errors = CounterMetricFamily(
            "gateway_link_errors",
            "Connections a link lost or could not make, and messages it sent back",
            labels=_LABELS,
        )
        in_flight = GaugeMetricFamily(
            "gateway_link_in_flight",
            "Messages a link took from the source that the destination has not acknowledged",
            labels=_LABELS,
        )
        lag = GaugeMetricFamily(
            "gateway_link_lag",
            "Messages waiting at a link's source (links whose source tells)",
            labels=_LABELS,
        )
        up = GaugeMetricFamily(
            "gateway_link_connected",
            "1 while a link is connected to its server, else 0",
            labels=_LABELS,
        )
        for s in self.links.statuses:
            labels = [s.kind, s.name]
            moved.add_metric(labels, s.moved)
            errors.add_metric(labels, s.errors)
            in_flight.add_metric(labels, s.in_flight)
            if s.lag is not None:
                lag.add_metric(labels, s.lag)
            up.add_metric(labels, 1 if s.state == "connected" else 0)
        yield from (moved, errors, in_flight, lag, up)
