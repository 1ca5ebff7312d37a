"""RocketMQ and the other protocols on one gateway, real clients on both sides, bodies
byte-exact: ali-ons (npm) with pynsq, greenstalk and nats-py (docs/semantics.md,
"RocketMQ").

A RocketMQ topic is the topic of the same name everywhere; a RocketMQ consumer group is a
group (an NSQ channel of that name). Messages published while a topic has no group wait
in its backlog and go to the first group made, whichever protocol makes it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.app import Gateway
from tests.clients import alions, corpus
from tests.clients import harness as h
from tests.clients.alions import message, unb64
from tests.clients.beanstalk import servers as beanstalk
from tests.clients.nats import servers as nats
from tests.helpers import running_gateway

pytestmark = pytest.mark.clients


def bridge_gateway(**overrides: Any):  # type: ignore[no-untyped-def]
    return running_gateway(
        rocketmq="127.0.0.1:0",
        beanstalk="127.0.0.1:0",
        nats="127.0.0.1:0",
        **overrides,
    )


def pynsq(gw: Gateway, mode: str, topic: str, *options: Any) -> list[str]:
    host, port = gw.addresses["nsq"]
    script = Path(h.CLIENTS_DIR) / "pynsq_client.py"
    args = [mode, "--host", host, "--port", str(port), "--topic", topic]
    return [sys.executable, str(script), *args, *(str(o) for o in options)]


def rocketmq_bodies() -> list[bytes]:
    # binary bodies, and one of 8 KB that ali-ons sends zlib-compressed
    return [*corpus.make_bodies(30, seed=5, max_size=2000), os.urandom(4096).hex().encode()]


async def test_alions_producer_to_pynsq_reader(tmp_path: Path) -> None:
    bodies = rocketmq_bodies()
    async with bridge_gateway() as gw:
        await alions.produce(gw, "r2n", [message(b, "TagA") for b in bodies])
        with trio.fail_after(60):
            result = await h.run(
                pynsq(gw, "sub", "r2n", "--channel", "nsq", "--count", len(bodies))
            )
    h.assert_same_bodies(h.received(result), h.digests(bodies))


async def test_alions_producer_to_greenstalk_worker() -> None:
    bodies = rocketmq_bodies()
    async with bridge_gateway() as gw:
        await alions.produce(gw, "r2b", [message(b) for b in bodies])
        with trio.fail_after(60):
            result = await h.run(
                beanstalk.greenstalk(
                    "reserve", gw.addresses["beanstalk"], "--tube", "r2b", "--count", len(bodies)
                )
            )
    got = [bytes.fromhex(body) for _id, body in result["jobs"]]
    assert got == bodies  # one producer, one queue order: the order it sent


async def test_pynsq_writer_to_alions_consumer(tmp_path: Path) -> None:
    bodies = corpus.make_bodies(40, seed=6, max_size=3000)
    path = h.write_corpus(tmp_path, bodies)
    async with bridge_gateway() as gw, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            result = await h.run(pynsq(gw, "pub", "n2r", "--bodies", path, "--pub", 10))
        h.assert_published(result, 10 + 1)  # 10 PUBs, then the other 30 in one MPUB
        consumer = await alions.start(
            nursery, "consume", alions.consumer_options(gw, "n2r", "GID_nsq", len(bodies))
        )
        assert await consumer.wait() == 0
    got = consumer.of("message")
    assert sorted(unb64(m["body"]) for m in got) == sorted(bodies)
    assert all(m.get("tags") is None and m["reconsumeTimes"] == 0 for m in got)


async def test_greenstalk_put_to_alions_consumer(tmp_path: Path) -> None:
    bodies = corpus.make_bodies(40, seed=7, max_size=3000)
    path = h.write_corpus(tmp_path, bodies)
    async with bridge_gateway() as gw, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            put = await h.run(
                beanstalk.greenstalk(
                    "put", gw.addresses["beanstalk"], "--tube", "b2r", "--bodies", path
                )
            )
        assert len(put["ids"]) == len(bodies)
        consumer = await alions.start(
            nursery, "consume", alions.consumer_options(gw, "b2r", "GID_bean", len(bodies))
        )
        assert await consumer.wait() == 0
        group = gw.broker.topics["b2r"].groups["GID_bean"]
        assert group.finish_count == len(bodies)  # committed at close: all acknowledged
    assert sorted(unb64(m["body"]) for m in consumer.of("message")) == sorted(bodies)


async def test_nats_headers_become_properties(tmp_path: Path) -> None:
    """A NATS publish with headers: the RocketMQ consumer sees them as properties (and a
    TAGS header as the tag its subscription filters on)."""
    bodies = [b"with headers", b"\x00\x01binary\xff"]
    path = h.write_corpus(tmp_path, bodies)
    headers = '{"color": "red", "TAGS": "TagA", "KEYS": "order-1"}'
    async with bridge_gateway() as gw, trio.open_nursery() as nursery:
        consumer = await alions.start(
            nursery,
            "consume",
            alions.consumer_options(gw, "n2rh", "GID_nats", len(bodies), subExpr="TagA"),
        )
        await consumer.until("ready")
        with trio.fail_after(60):
            await h.run(
                nats.natspy(
                    "pub",
                    gw.addresses["nats"],
                    "--subject",
                    "n2rh",
                    "--bodies",
                    path,
                    "--headers",
                    headers,
                )
            )
        assert await consumer.wait() == 0
    got = consumer.of("message")
    assert sorted(unb64(m["body"]) for m in got) == sorted(bodies)  # two queues: any order
    for m in got:
        assert m["properties"]["color"] == "red"
        assert m["tags"] == "TagA" and m["keys"] == "order-1"


async def test_alions_properties_become_nats_headers(tmp_path: Path) -> None:
    """The other way: a RocketMQ message's tag, keys and properties are NATS headers."""
    async with bridge_gateway() as gw, trio.open_nursery() as nursery:
        sub = await h.spawn(
            nursery,
            nats.natspy("sub", gw.addresses["nats"], "--subject", "r2nh", "--count", 1),
        )
        await h.wait_until(lambda: b'"ready"' in sub.stdout, "the NATS subscriber ready")
        await alions.produce(
            gw, "r2nh", [message(b"to nats", "TagA", keys=["k1", "k2"], props={"color": "red"})]
        )
        result = await sub.result()
    [[subject, _reply, _sha, size, headers]] = result["messages"]
    assert subject == "r2nh" and size == len(b"to nats")
    assert headers["TAGS"] == "TagA" and headers["KEYS"] == "k1 k2" and headers["color"] == "red"


async def test_pynsq_writer_to_alions_consumer_through_redis(
    tmp_path: Path, redis_url: str
) -> None:
    """The same bridge with the queues in Redis: a RocketMQ pull has no deadline, and its
    claim there lasts RocketMQ's consumeTimeout (an unbounded one stopped the gateway's
    claimer: "cannot convert float infinity to integer")."""
    bodies = corpus.make_bodies(40, seed=8, max_size=3000)
    path = h.write_corpus(tmp_path, bodies)
    async with bridge_gateway(store=redis_url) as gw, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            result = await h.run(pynsq(gw, "pub", "n2r", "--bodies", path, "--pub", 10))
        h.assert_published(result, 10 + 1)
        consumer = await alions.start(
            nursery, "consume", alions.consumer_options(gw, "n2r", "GID_nsq", len(bodies))
        )
        assert await consumer.wait() == 0
    got = consumer.of("message")
    assert sorted(unb64(m["body"]) for m in got) == sorted(bodies)
