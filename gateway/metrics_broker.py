"""The broker's queues as Prometheus metrics, read at scrape time.

The broker counts in plain integers (gateway/broker/stats.py); this collector turns them
into metric families when /metrics is scraped, so publishing and acknowledging never touch
prometheus_client. Label cardinality is bounded: past `max_series` (topic, group) pairs,
sorted by name, the rest are summed under topic and group `_other` (and past `max_series`
topics, the per-topic series under topic `_other`).

A topic's backlog (what it keeps before its first group takes it: an NSQ topic with no
channel yet) is `gateway_topic_backlog{topic}`, one series per topic, 0 once a group
exists: it belongs to no group, so it is not a `gateway_queue_depth` series, and
`sum(gateway_queue_depth)` is what the groups hold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.broker import Broker, query
from gateway.broker.stats import COUNTS

OVERFLOW = "_other"  # the label value that stands for every series past the cap
_NS = 1e-9


class BrokerCollector(Collector):
    def __init__(self, broker: Broker, max_series: int = 1000) -> None:
        self.broker = broker
        self.max_series = max_series

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        cap = self.max_series
        published = CounterMetricFamily(
            "gateway_messages_published",
            "Messages published, by publisher protocol and topic (_none: no topic kept them)",
            labels=["protocol", "topic"],
        )
        counted: dict[str, int] = defaultdict(int)
        pub: dict[tuple[str, str], int] = defaultdict(int)
        topics = query.topics(broker, by_name=True)
        kept = {topic.name for topic in topics[:cap]}
        backlog = GaugeMetricFamily(
            "gateway_topic_backlog",
            "Messages a topic keeps for its first group (none yet), per topic",
            labels=["topic"],
        )
        backlogs: dict[str, int] = defaultdict(int)
        for topic in topics:
            backlogs[topic.name if topic.name in kept else OVERFLOW] += topic.backlog
        for topic in topics:
            label = topic.name if topic.name in kept else OVERFLOW
            for protocol, n in topic.published_by.items():
                pub[(protocol, label)] += n
                counted[protocol] += n
        # deleted topics: their series stay, at their last value, while the process runs
        for name, by_protocol in query.retired_published(broker).items():
            live = name in kept or (name and len(kept) < cap)
            label = name if live else OVERFLOW
            if live:
                kept.add(name)
            for protocol, n in by_protocol.items():
                pub[(protocol, label)] += n
                counted[protocol] += n
        for protocol, total in broker.published_by.items():
            if total > counted[protocol]:
                # published to subjects no topic keeps (NATS traffic), or deleted topics
                pub[(protocol, "_none")] += total - counted[protocol]
        for (protocol, topic), n in sorted(pub.items()):
            published.add_metric([protocol, topic], n)
        yield published

        counters = {
            name: CounterMetricFamily(
                f"gateway_messages_{name}",
                f"Messages {name.replace('_', ' ')}, by consumer protocol, topic and group",
                labels=["protocol", "topic", "group"],
            )
            for name in COUNTS
        }
        gauges = {
            name: GaugeMetricFamily(f"gateway_queue_{name}", text, labels=["topic", "group"])
            for name, text in (
                ("depth", "Ready messages of a group"),
                ("in_flight", "Messages delivered and not yet acknowledged"),
                ("deferred", "Messages waiting for their delay or retry time"),
                ("buried", "Messages buried (dead letters), kept and kickable"),
                ("consumers", "Consumers attached"),
            )
        }
        sums: dict[tuple[str, str, str], list[int]] = {}
        levels: dict[tuple[str, str], list[int]] = {}
        series = 0
        for topic in topics:
            name = topic.name
            for group in query.groups(broker, name, by_name=True):
                key = (name, group.name) if series < cap else (OVERFLOW, OVERFLOW)
                series += key[0] != OVERFLOW
                level = levels.setdefault(key, [0, 0, 0, 0, 0])
                c = group.counts
                level[0] += c.ready
                level[1] += c.reserved
                level[2] += c.delayed
                level[3] += c.buried
                level[4] += len(group.consumers)
                for protocol, counts in group.by_protocol.items():
                    total = sums.setdefault((protocol, *key), [0] * len(COUNTS))
                    for i, n in enumerate(counts):
                        total[i] += n
        # deleted groups (a beanstalkd tube whose last worker left, a deleted channel):
        # their counters continue, where the group comes back too
        for (name, group_name), by_protocol in query.retired_counts(broker).items():
            key = (name, group_name)
            if not name or (key not in levels and series >= cap):
                key = (OVERFLOW, OVERFLOW)
            elif key not in levels:
                series += 1
            for protocol, counts in by_protocol.items():
                total = sums.setdefault((protocol, *key), [0] * len(COUNTS))
                for i, n in enumerate(counts):
                    total[i] += n
        for (protocol, topic_label, group_label), counts in sorted(sums.items()):
            for name, n in zip(COUNTS, counts, strict=True):
                counters[name].add_metric([protocol, topic_label, group_label], n)
        for (topic_label, group_label), values in sorted(levels.items()):
            for family, value in zip(gauges.values(), values, strict=True):
                family.add_metric([topic_label, group_label], value)
        yield from counters.values()
        yield from gauges.values()
        for name, n in sorted(backlogs.items()):
            backlog.add_metric([name], n)
        yield backlog

        latency = HistogramMetricFamily(
            "gateway_publish_to_ack_seconds",
            "Time from publish to acknowledgement (FIN, delete), by consumer protocol",
            labels=["protocol"],
        )
        for protocol, histogram in sorted(broker.ack_latency.items()):
            latency.add_metric([protocol], histogram.cumulative(), sum_value=histogram.sum_ns * _NS)
        yield latency
