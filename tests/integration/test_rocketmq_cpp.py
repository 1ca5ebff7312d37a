"""PyPI `rocketmq` 0.4.4 (the RocketMQ C++ client, rocketmq-client-cpp in a manylinux
x86_64 wheel) against the gateway: a second real client, with its own dialect (language
CPP, SEND_MESSAGE 10 with long field names, mixed-type extFields, numeric enums in
heartbeats, a bare CONSUMER_SEND_MSG_BACK)."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.app import Gateway
from gateway.protocols.rocketmq.codes import RequestCode
from tests.clients import alions
from tests.clients.harness import CLIENTS_DIR, wait_until
from tests.helpers import running_gateway
from tests.integration.rocketmq_raw import RawRemoting

pytestmark = [
    pytest.mark.clients,
    pytest.mark.skipif(
        platform.machine() != "x86_64" or sys.platform != "linux",
        reason="the rocketmq 0.4.4 wheel bundles an x86_64 Linux library only",
    ),
]

SCRIPT = CLIENTS_DIR / "rocketmq_cpp_client.py"


def rocketmq_gateway():  # type: ignore[no-untyped-def]
    return running_gateway(
        nsq="off", rocketmq="127.0.0.1:0", rocketmq_broker__delay_levels=[0.2] * 18
    )


async def cpp(
    mode: str, options: dict[str, Any], home: Path, timeout: float = 60
) -> list[dict[str, Any]]:
    """Run the C++ client script to completion; its JSON lines."""
    env = dict(os.environ, HOME=str(home))  # it writes its logs under ~/logs/rocketmq-cpp
    with trio.fail_after(timeout):
        done = await trio.run_process(
            [sys.executable, str(SCRIPT), mode, json.dumps(options)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
    lines = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    assert done.returncode == 0, (
        f"{mode} exited {done.returncode}: {lines}\n{done.stderr.decode()[-3000:]}"
    )
    return lines


def address(gw: Gateway) -> str:
    return alions.name_server(gw)


async def test_cpp_produce_consume_tags_keys_and_retry(tmp_path: Path) -> None:
    async with rocketmq_gateway() as gw:
        sent = await cpp(
            "produce",
            {
                "nameSrv": address(gw),
                "topic": "C1",
                "messages": [
                    {"body": b"one".hex(), "tag": "TagA", "keys": "k1 k2"},
                    {"body": b"filtered".hex(), "tag": "TagB"},
                    {"body": b"two".hex(), "tag": "TagA"},
                ],
            },
            tmp_path,
        )
        got = await cpp(
            "consume",
            {
                "nameSrv": address(gw),
                "topic": "C1",
                "group": "GID_cpp",
                "expression": "TagA",
                "count": 2,
                "retryFirst": True,
            },
            tmp_path,
        )
    sends = [e for e in sent if e["event"] == "sent"]
    assert [e["status"] for e in sends] == [0, 0, 0]  # SEND_OK
    messages = [e for e in got if e["event"] == "message"]
    firsts = sorted(bytes.fromhex(m["body"]) for m in messages if m["reconsumeTimes"] == 0)
    retries = sorted(bytes.fromhex(m["body"]) for m in messages if m["reconsumeTimes"] == 1)
    assert firsts == retries == [b"one", b"two"]
    one = next(m for m in messages if m["body"] == b"one".hex())
    assert (one["topic"], one["tags"], one["keys"]) == ("C1", "TagA", "k1 k2")


async def test_cpp_producer_to_alions_consumer_with_a_compressed_body(tmp_path: Path) -> None:
    """The C++ client compresses bodies of 4 KB and more as ali-ons does; either way the
    other client gets the bytes sent."""
    big = os.urandom(4096).hex().encode()
    async with rocketmq_gateway() as gw, trio.open_nursery() as nursery:
        await cpp(
            "produce",
            {
                "nameSrv": address(gw),
                "topic": "C2",
                "messages": [{"body": big.hex(), "tag": "Big"}, {"body": b"small".hex()}],
            },
            tmp_path,
        )
        consumer = await alions.start(
            nursery, "consume", alions.consumer_options(gw, "C2", "GID_mixed", 2)
        )
        assert await consumer.wait() == 0
    assert sorted(alions.unb64(m["body"]) for m in consumer.of("message")) == sorted(
        [big, b"small"]
    )


async def test_cpp_orderly_consumer_consumes_only_the_queues_it_holds(tmp_path: Path) -> None:
    """An orderly C++ consumer (MessageListenerOrderly) alone in its group is given all four
    queues by its rebalance, but another client holds queue 3's lock: it consumes queues
    0-2, each in order, and leaves queue 3 alone (it pulls only what it could lock)."""
    async with rocketmq_gateway() as gw:
        raw = await RawRemoting.connect(gw)
        other = {"consumerGroup": "GID_orderly", "clientId": "10.9.9.9@other"}
        mqs = [{"topic": "Ord", "brokerName": "broker-a", "queueId": 3}]
        held = await raw.call(
            RequestCode.LOCK_BATCH_MQ, body=json.dumps(other | {"mqSet": mqs}).encode()
        )
        assert json.loads(held.body)["lockOKMQSet"] == mqs
        for i in range(20):
            sent = await raw.produce("Ord", b"%d-%02d" % (i % 4, i), queue_id=i % 4)
            assert sent.code == 0
        got = await cpp(
            "consume",
            {
                "nameSrv": address(gw),
                "topic": "Ord",
                "group": "GID_orderly",
                "count": 15,
                "orderly": True,
            },
            tmp_path,
        )
        await raw.aclose()
        still = gw.rocketmq.locks.get(("GID_orderly", "Ord", 3))
    bodies = [bytes.fromhex(m["body"]).decode() for m in got if m["event"] == "message"]
    assert sorted(bodies) == sorted(f"{i % 4}-{i:02d}" for i in range(20) if i % 4 != 3)
    for queue in "012":
        mine = [b for b in bodies if b[0] == queue]
        assert mine == sorted(mine), f"queue {queue} out of order: {mine}"
    assert still is not None and still[0] == "10.9.9.9@other"


async def test_cpp_broadcasting_consumers_each_get_every_message(tmp_path: Path) -> None:
    """Two BROADCASTING C++ consumers of one group each get every message (a CLUSTERING
    group of the same topic, each message once); each reads through a group of its own,
    which its pulls acknowledge and which goes when it leaves."""
    bodies = [b"b%02d" % i for i in range(12)]
    got: dict[str, list[dict[str, Any]]] = {}

    async def consumer(name: str, options: dict[str, Any]) -> None:
        home = tmp_path / name  # each its own HOME: the library keeps offsets there
        home.mkdir()
        got[name] = await cpp("consume", options, home)

    async with rocketmq_gateway() as gw:
        common = {"nameSrv": address(gw), "topic": "Bc", "count": len(bodies), "timeout": 40}
        async with trio.open_nursery() as nursery:
            for name in ("one", "two"):
                options = common | {"group": "GID_bc", "broadcasting": True}
                nursery.start_soon(consumer, name, options)
            nursery.start_soon(consumer, "clustered", common | {"group": "GID_cl"})
            # both broadcast clients and the clustered one are waiting in a pull of each
            # queue: a broadcast client starts from the end, so only then is every one
            # of the messages after its start
            await wait_until(
                lambda: sum(s.consumer.held_pulls for s in gw.rocketmq.sessions) >= 12,
                "three consumers holding a pull of each of the four queues",
            )
            groups = sorted(g.name for g in gw.broker.topics["Bc"].groups.values())
            raw = await RawRemoting.connect(gw)
            for i, body in enumerate(bodies):
                assert (await raw.produce("Bc", body, queue_id=i % 4)).code == 0
            await raw.aclose()
        left = sorted(gw.broker.topics["Bc"].groups)
    for name in ("one", "two", "clustered"):
        received = [bytes.fromhex(m["body"]) for m in got[name] if m["event"] == "message"]
        assert sorted(received) == bodies, name
    assert len(groups) == 3 and "GID_cl" in groups, groups
    assert all(g.startswith("GID_bc@") for g in groups if g != "GID_cl")
    assert left == ["GID_cl"]  # the broadcast clients' groups went with them
