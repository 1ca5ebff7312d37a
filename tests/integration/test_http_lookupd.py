"""nsqlookupd's HTTP API on the gateway (docs/protocols/nsq.md §13), and the sidecar probes."""

from __future__ import annotations

import httpx

from tests.helpers import RawBeanstalk, RawNSQ, be32, http_base, running_gateway

V1 = "nsq; version=1.0"
JSON = "application/json; charset=utf-8"
PRODUCER_KEYS = [
    "remote_address",
    "hostname",
    "broadcast_address",
    "tcp_port",
    "http_port",
    "version",
]


async def test_lookup_lists_the_gateway_as_the_producer_of_known_topics() -> None:
    async with running_gateway(http="127.0.0.1:0") as gw:
        nsq_port, http_port = gw.addresses["nsq"][1], gw.addresses["http"][1]
        async with httpx.AsyncClient(base_url=http_base(gw)) as client:
            # faithful to nsqlookupd: a topic nobody made yet is unknown
            reply = await client.get("/lookup?topic=orders")
            assert (reply.status_code, reply.content) == (404, b'{"message":"TOPIC_NOT_FOUND"}')
            assert reply.headers["x-nsq-content-type"] == V1
            reply = await client.get("/lookup")
            assert (reply.status_code, reply.json()) == (400, {"message": "MISSING_ARG_TOPIC"})

            pub = await RawNSQ.connect(gw)
            await pub.send(b"PUB orders\n" + be32(2) + b"hi")
            assert await pub.frame() == (0, b"OK")
            reply = await client.get("/lookup?topic=orders")
            assert reply.status_code == 200
            assert reply.headers["content-type"] == JSON
            assert reply.headers["x-nsq-content-type"] == V1
            found = reply.json()
            assert list(found) == ["channels", "producers"]  # a Go map: keys sorted
            assert found["channels"] == []  # never null
            (producer,) = found["producers"]
            assert list(producer) == PRODUCER_KEYS
            assert producer == {
                "remote_address": f"127.0.0.1:{nsq_port}",
                "hostname": gw.nsq.hostname,
                "broadcast_address": "127.0.0.1",
                "tcp_port": nsq_port,
                "http_port": http_port,
                "version": "1.3.0",
            }

            sub = await RawNSQ.connect(gw)
            await sub.send(b"SUB orders billing\n")
            assert await sub.frame() == (0, b"OK")
            sub2 = await RawNSQ.connect(gw)
            await sub2.send(b"SUB orders audit\n")
            assert await sub2.frame() == (0, b"OK")
            found = (await client.get("/lookup?topic=orders")).json()
            assert found["channels"] == ["audit", "billing"]
            for conn in (pub, sub, sub2):
                await conn.aclose()


async def test_topics_channels_and_nodes() -> None:
    async with (
        running_gateway(http="127.0.0.1:0", beanstalk="127.0.0.1:0") as gw,
        httpx.AsyncClient(base_url=http_base(gw)) as client,
    ):
        assert (await client.get("/topics")).json() == {"topics": ["default"]}
        for topic in ("b", "a"):
            await client.post(f"/topic/create?topic={topic}")
        await client.post("/channel/create?topic=a&channel=c2")
        await client.post("/channel/create?topic=a&channel=c1")
        # a beanstalkd tube whose name NSQ cannot use is not an NSQ topic
        tube = await RawBeanstalk.connect(gw)
        assert await tube.call(b"use odd$name\r\n") == b"USING odd$name\r\n"
        assert "odd$name" in gw.broker.topics
        reply = await client.get("/topics")
        assert reply.headers["x-nsq-content-type"] == V1
        assert reply.json() == {"topics": ["a", "b", "default"]}
        assert (await client.get("/channels?topic=a")).json() == {"channels": ["c1", "c2"]}
        assert (await client.get("/channels?topic=nope")).json() == {"channels": []}
        reply = await client.get("/channels")
        assert (reply.status_code, reply.json()) == (400, {"message": "MISSING_ARG_TOPIC"})
        lookup = await client.get("/lookup", params={"topic": "odd$name"})
        assert lookup.status_code == 404
        nodes = (await client.get("/nodes")).json()
        (node,) = nodes["producers"]
        assert list(node) == [*PRODUCER_KEYS, "tombstones", "topics"]
        assert node["topics"] == ["a", "b", "default"]
        assert node["tombstones"] == [False, False, False]
        assert node["tcp_port"] == gw.addresses["nsq"][1]
        # /info is nsqd's, which has nsqlookupd's only key
        assert (await client.get("/info")).json()["version"] == "1.3.0"
        reply = await client.post("/topic/tombstone?topic=a&node=x:1")
        assert (reply.status_code, reply.content) == (200, b"")
        reply = await client.post("/topic/tombstone?topic=a")
        assert (reply.status_code, reply.json()) == (400, {"message": "MISSING_ARG_NODE"})
        await tube.aclose()


async def test_without_an_nsq_listener_there_is_no_producer() -> None:
    async with running_gateway(http="127.0.0.1:0", nsq="off") as gw:
        gw.broker.topic("t")
        async with httpx.AsyncClient(base_url=http_base(gw)) as client:
            assert (await client.get("/lookup?topic=t")).json() == {
                "channels": [],
                "producers": [],
            }
            assert (await client.get("/nodes")).json() == {"producers": []}


async def test_health_and_ready_probes() -> None:
    async with (
        running_gateway(http="127.0.0.1:0", beanstalk="127.0.0.1:0") as gw,
        httpx.AsyncClient(base_url=http_base(gw)) as client,
    ):
        for path in ("/health", "/ready"):
            reply = await client.get(path)
            assert (reply.status_code, reply.text) == (200, "OK")
            assert reply.headers["content-type"] == "text/plain; charset=utf-8"
        gw.beanstalk.draining = True  # what SIGUSR1 does
        reply = await client.get("/ready")
        assert (reply.status_code, reply.text) == (503, "NOT READY - draining")
        assert (await client.get("/health")).status_code == 200
        gw.beanstalk.draining = False
        assert (await client.get("/ready")).status_code == 200
        gw.serving = False  # as while the listeners are being bound
        reply = await client.get("/ready")
        assert (reply.status_code, reply.text) == (503, "NOT READY - starting")
        reply = await client.get("/health")
        assert (reply.status_code, reply.text) == (200, "OK - starting")  # alive
        gw.serving = True
