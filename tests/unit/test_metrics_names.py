"""What /metrics exposes besides the queues: the process (prometheus_client's own
collectors), the build, names as the Prometheus naming guide has them, no `_created`
series, and a topic's backlog as a series of its own rather than a group named ""."""

from __future__ import annotations

import platform

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway import __version__
from gateway.broker import Broker
from gateway.metrics import Metrics
from gateway.stores import MemoryStore

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(metrics: Metrics) -> tuple[dict[str, tuple[str, set[str]]], Samples]:
    """(family name -> (type, its sample names), (sample name, labels) -> value)."""
    metrics.refresh()
    families: dict[str, tuple[str, set[str]]] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        names = families.setdefault(family.name, (family.type, set()))[1]
        for s in family.samples:
            names.add(s.name)
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return families, samples


async def test_process_and_build_series() -> None:
    _, samples = scrape(Metrics())
    names = {name for name, _ in samples}
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ):
        assert name in names, name
    build = frozenset({("version", __version__), ("python", platform.python_version())})
    assert samples[("gateway_build_info", build)] == 1
    assert any(name == "python_info" for name in names)


async def test_names_follow_the_naming_guide_and_no_counter_has_created() -> None:
    metrics = Metrics()
    metrics.bytes_in.labels("nsq").inc(5)
    metrics.bytes_out.labels("nsq").inc(7)
    metrics.connections_total.labels("nsq").inc()
    broker = Broker(MemoryStore())
    metrics.watch_broker(broker, 100)
    broker.publish("t", [b"x"], origin="nsq 127.0.0.1:1")
    families, samples = scrape(metrics)
    nsq = frozenset({("protocol", "nsq")})
    assert samples[("gateway_received_bytes_total", nsq)] == 5
    assert samples[("gateway_sent_bytes_total", nsq)] == 7
    assert not [name for name, _ in samples if name.startswith("gateway_bytes_")]
    assert not [name for name, _ in samples if name.endswith("_created")]
    counted = {n for kind, names in families.values() if kind == "counter" for n in names}
    assert {"gateway_connections_total", "gateway_messages_published_total"} <= counted
    assert all(name.endswith("_total") for name in counted), counted


async def test_a_topics_backlog_is_its_own_series() -> None:
    metrics = Metrics()
    broker = Broker(MemoryStore())
    metrics.watch_broker(broker, 100)
    broker.publish("orders", [b"1", b"2"], origin="nsq 127.0.0.1:1")  # no group yet
    broker.group("jobs", "workers")
    broker.publish("jobs", [b"3"], origin="beanstalk 127.0.0.1:2")
    _, samples = scrape(metrics)
    assert samples[("gateway_topic_backlog", frozenset({("topic", "orders")}))] == 2
    assert samples[("gateway_topic_backlog", frozenset({("topic", "jobs")}))] == 0
    depth = {labels: v for (name, labels), v in samples.items() if name == "gateway_queue_depth"}
    assert depth == {frozenset({("topic", "jobs"), ("group", "workers")}): 1}
