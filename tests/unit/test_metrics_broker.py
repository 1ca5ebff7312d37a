"""The broker's queues as Prometheus metrics: counters per consumer protocol, gauges, the
publish-to-ack histogram, and the cap on label cardinality. Parsed back with
prometheus_client's own parser."""

from __future__ import annotations

import trio
import trio.testing
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.broker import Broker
from gateway.broker.group import Consumer
from gateway.metrics import Metrics
from gateway.model import Message
from gateway.stores import MemoryStore


class Sink:
    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.got: list[Message] = []

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        self.got.append(message)
        return True


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_counters_follow_the_traffic() -> None:
    broker = Broker(MemoryStore(), max_attempts=3)
    metrics = Metrics()
    metrics.watch_broker(broker, 100)
    group = broker.group("t", "ch")
    nsq, beanstalk = Sink("nsq"), Sink("beanstalk")
    a = group.attach(nsq, 30.0)
    b = group.attach(beanstalk, 30.0)
    broker.publish("t", [b"1", b"2", b"3", b"4"], origin="nsq 127.0.0.1:1")
    broker.publish("t", [b"5"], origin="beanstalk 127.0.0.1:2")
    broker.publish("elsewhere", [b"x"], origin="nats 127.0.0.1:3", create=False)
    a.set_ready(2)
    b.set_ready(2)
    assert len(nsq.got) == 2 and len(beanstalk.got) == 2
    group.finish(a, nsq.got[0].id)
    group.requeue(a, nsq.got[1].id, 0.0)
    group.bury(b, beanstalk.got[0].id)
    samples = scrape(metrics)
    assert value(samples, "gateway_messages_published_total", protocol="nsq", topic="t") == 4
    assert value(samples, "gateway_messages_published_total", protocol="beanstalk", topic="t") == 1
    assert value(samples, "gateway_messages_published_total", protocol="nats", topic="_none") == 1
    for name, protocol, n in (
        ("delivered", "nsq", len(nsq.got)),  # each freed slot was refilled
        ("acknowledged", "nsq", 1),
        ("requeued", "nsq", 1),
        ("buried", "beanstalk", 1),
        ("delivered", "beanstalk", len(beanstalk.got)),
    ):
        got = value(
            samples, f"gateway_messages_{name}_total", protocol=protocol, topic="t", group="ch"
        )
        assert got == n, (name, protocol, got)
    assert len(nsq.got) + len(beanstalk.got) == 6  # 5 messages, one of them requeued
    assert value(samples, "gateway_queue_in_flight", topic="t", group="ch") == len(group.in_flight)
    assert value(samples, "gateway_queue_buried", topic="t", group="ch") == 1
    assert value(samples, "gateway_queue_consumers", topic="t", group="ch") == 2
    assert value(samples, "gateway_publish_to_ack_seconds_count", protocol="nsq") == 1
    assert value(samples, "gateway_publish_to_ack_seconds_bucket", protocol="nsq", le="+Inf") == 1


async def test_timeouts_are_counted(autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker(MemoryStore())
    metrics = Metrics()
    metrics.watch_broker(broker, 100)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        group = broker.group("t", "ch")
        sink = Sink("nsq")
        group.attach(sink, 5.0).set_ready(1)
        broker.publish("t", [b"slow"], origin="nsq x")
        await trio.sleep(6)
        samples = scrape(metrics)
        assert (
            value(
                samples, "gateway_messages_timed_out_total", protocol="nsq", topic="t", group="ch"
            )
            == 1
        )
        nursery.cancel_scope.cancel()


async def test_cardinality_is_capped() -> None:
    broker = Broker(MemoryStore())
    metrics = Metrics()
    metrics.watch_broker(broker, 2)
    for i in range(5):
        broker.group(f"t{i}", "ch")
        broker.publish(f"t{i}", [b"m"], origin="nsq x")
    samples = scrape(metrics)
    depth = {k[1]: v for k, v in samples.items() if k[0] == "gateway_queue_depth"}
    assert depth == {
        (("group", "ch"), ("topic", "t0")): 1,
        (("group", "ch"), ("topic", "t1")): 1,
        (("group", "_other"), ("topic", "_other")): 3,
    }


async def test_counters_of_a_deleted_group_or_topic_never_go_back() -> None:
    """A beanstalkd tube is deleted when its last worker leaves; its series stay, and
    continue when the tube comes back (Prometheus counters must not reset or vanish)."""
    broker = Broker(MemoryStore())
    metrics = Metrics()
    metrics.watch_broker(broker, 100)
    labels = {"protocol": "beanstalk", "topic": "jobs", "group": "beanstalk"}
    for round_ in (1, 2):
        group = broker.group("jobs", "beanstalk")
        sink = Sink("beanstalk")
        consumer = group.attach(sink, 30.0)
        (msg,), _ = broker.publish("jobs", [b"x"], origin="beanstalk 127.0.0.1:1")
        assert group.take(consumer) is msg
        group.finish(consumer, msg.id)
        group.detach(consumer, requeue=True)
        assert broker.delete_topic("jobs")
        samples = scrape(metrics)
        assert value(samples, "gateway_messages_acknowledged_total", **labels) == round_
        assert value(samples, "gateway_messages_delivered_total", **labels) == round_
        published = {"protocol": "beanstalk", "topic": "jobs"}
        assert value(samples, "gateway_messages_published_total", **published) == round_
