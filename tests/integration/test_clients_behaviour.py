"""Unmodified NSQ client libraries against the gateway: the same scenarios for every client.

Each client library runs in a subprocess (tests/clients/*_client.py, node/nsqjs_client.js)
against a gateway started here on an ephemeral port. Bodies are compared byte for byte
(sha256) and the gateway's own counters are checked after every run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio

from tests.clients import corpus
from tests.clients import harness as h
from tests.helpers import running_gateway

pytestmark = pytest.mark.clients

CLIENTS = h.ALL_CLIENTS

# How many messages a consumer that never answers gets before it stops: gnsq keeps RDY 1 until
# its first FIN and ansq keeps RDY 1 for ever; pynsq and nsqjs open their window at once.
UNANSWERED = {"pynsq": 5, "gnsq": 1, "ansq": 1, "nsqjs": 5}


def attempts(result: dict) -> list[int]:
    return [a for a, _sha in result["deliveries"]]


@pytest.mark.parametrize("store", ["memory", "durable"])
@pytest.mark.parametrize("client", CLIENTS)
async def test_publish_then_consume(client: str, store: str, tmp_path: Path) -> None:
    """PUB and MPUB (pipelined) then a consumer with max_in_flight 10: 3000 bodies, among them
    newline/CRLF/NUL-laden ones and two of ~1 MiB, each delivered once, byte for byte. Also
    on the durable store (the default), whose commits overlap the next batch's reading
    (the reply gate of connection.Connection): every OK still comes in order, after its
    publish is stored."""
    n = 3000
    bodies = corpus.make_bodies(n, seed=1, big=2)
    path = h.write_corpus(tmp_path, bodies)
    durable = {"store": None, "data_dir": str(tmp_path / "data")} if store == "durable" else {}
    async with running_gateway(**durable) as gw:
        assert gw.broker.journal.durable == (store == "durable")
        sessions = h.record_sessions(gw)
        with trio.fail_after(90):
            pub = await h.run(
                h.command(client, "pub", gw, "rt", "--bodies", path, "--pub", 1000, "--batch", 50)
            )
            h.assert_published(pub, 1000 + 40)
            assert gw.broker.topics["rt"].message_count == n
            sub = await h.run(
                h.command(
                    client, "sub", gw, "rt", "--channel", "ch", "--count", n, "--max-in-flight", 10
                )
            )
            await h.wait_until(h.finished(gw, "rt", "ch", n), f"{n} FINs at the gateway")
        h.assert_clean(sub)
        h.assert_same_bodies(h.received(sub), h.digests(bodies))
        assert set(attempts(sub)) == {1}
        h.assert_drained(gw, "rt", "ch", n)
        h.assert_client_sessions(sessions, client, minimum=2)


@pytest.mark.parametrize("client", CLIENTS)
async def test_req_redelivers_with_attempts_2(client: str, tmp_path: Path) -> None:
    """REQ 0 on every first delivery: each body comes back once more with attempts 2."""
    n = 500
    bodies = corpus.make_bodies(n, seed=2)
    path = h.write_corpus(tmp_path, bodies)
    async with running_gateway() as gw:
        with trio.fail_after(90):
            pub = await h.run(h.command(client, "pub", gw, "req", "--bodies", path, "--pub", 50))
            h.assert_published(pub, 50 + 5)
            sub = await h.run(
                h.command(
                    client,
                    "sub",
                    gw,
                    "req",
                    "--channel",
                    "ch",
                    "--count",
                    n,
                    "--max-in-flight",
                    10,
                    "--req-first",
                )
            )
            await h.wait_until(h.finished(gw, "req", "ch", n), f"{n} FINs at the gateway")
        h.assert_clean(sub)
        assert sub["reqs"] == n and sub["fins"] == n
        want = h.digests(bodies)
        by_attempt = {1: Counter[str](), 2: Counter[str]()}
        for attempt, sha in sub["deliveries"]:
            by_attempt[attempt][sha] += 1  # KeyError: an attempts value other than 1 or 2
        h.assert_same_bodies(by_attempt[1], want)
        h.assert_same_bodies(by_attempt[2], want)
        g = h.group(gw, "req", "ch")
        assert g.requeue_count == n
        h.assert_drained(gw, "req", "ch", n)


@pytest.mark.parametrize("client", CLIENTS)
async def test_unanswered_messages_go_to_the_next_consumer_after_msg_timeout(
    client: str, tmp_path: Path
) -> None:
    """A consumer with msg_timeout 1000 ms takes messages and dies without FIN; a second
    consumer on the channel gets them after the timeout, with attempts 2, and the rest once."""
    n = 200
    bodies = corpus.make_bodies(n, seed=3)
    path = h.write_corpus(tmp_path, bodies)
    # gnsq cannot send IDENTIFY msg_timeout: give it the gateway-wide setting instead
    gnsq = client == "gnsq"
    overrides = {"nsqd__msg_timeout": 1000} if gnsq else {}
    timeout_option = [] if gnsq else ["--msg-timeout", 1000]
    async with running_gateway(**overrides) as gw:
        sessions = h.record_sessions(gw)
        with trio.fail_after(90):
            pub = await h.run(h.command(client, "pub", gw, "crash", "--bodies", path, "--pub", 10))
            h.assert_published(pub, 10 + 2)
            crashed = await h.run(
                h.command(
                    client,
                    "sub",
                    gw,
                    "crash",
                    "--channel",
                    "ch",
                    "--no-fin",
                    "--count",
                    UNANSWERED[client],
                    "--max-in-flight",
                    10,
                    *timeout_option,
                )
            )
            assert [s.msg_timeout for s in sessions[1:]] == [1.0]  # IDENTIFY (or gateway) 1000 ms
            survivor = await h.run(
                h.command(
                    client,
                    "sub",
                    gw,
                    "crash",
                    "--channel",
                    "ch",
                    "--count",
                    n,
                    "--max-in-flight",
                    10,
                )
            )
            await h.wait_until(h.finished(gw, "crash", "ch", n), f"{n} FINs at the gateway")
        assert len(crashed["deliveries"]) == UNANSWERED[client]
        assert set(attempts(crashed)) == {1}
        h.assert_clean(survivor)
        h.assert_same_bodies(h.received(survivor), h.digests(bodies))
        redelivered = {sha for a, sha in survivor["deliveries"] if a == 2}
        assert set(attempts(survivor)) <= {1, 2}
        # everything the dead consumer held comes back, and only through a timeout
        assert h.received(crashed).keys() <= redelivered
        g = h.group(gw, "crash", "ch")
        assert g.timeout_count == len(redelivered)
        h.assert_drained(gw, "crash", "ch", n)


@pytest.mark.parametrize("client", CLIENTS)
async def test_two_consumers_split_one_channel(client: str, tmp_path: Path) -> None:
    """Two consumers on one channel: every message goes to exactly one of them."""
    n = 2000
    bodies = corpus.make_bodies(n, seed=4)
    path = h.write_corpus(tmp_path, bodies)
    sub = ["--channel", "ch", "--count", 0, "--max-in-flight", 10]  # run until stdin closes
    async with running_gateway() as gw, trio.open_nursery() as nursery:
        with trio.fail_after(90):
            one = await h.spawn(nursery, h.command(client, "sub", gw, "split", *sub), "consumer 1")
            two = await h.spawn(nursery, h.command(client, "sub", gw, "split", *sub), "consumer 2")
            await h.wait_until(h.has_consumers(gw, "split", "ch", 2), "both consumers to SUB")
            pub = await h.run(h.command(client, "pub", gw, "split", "--bodies", path, "--pub", 500))
            h.assert_published(pub, 500 + 15)
            await h.wait_until(h.finished(gw, "split", "ch", n), f"{n} FINs at the gateway")
            await one.stop()
            await two.stop()
            first, second = await one.result(), await two.result()
        for result in (first, second):
            h.assert_clean(result)
            assert set(attempts(result)) <= {1}
        assert first["deliveries"] and second["deliveries"], "one consumer got nothing"
        h.assert_same_bodies(h.received(first) + h.received(second), h.digests(bodies))
        h.assert_drained(gw, "split", "ch", n)


@pytest.mark.parametrize("client", CLIENTS)
async def test_two_channels_each_get_every_message(client: str, tmp_path: Path) -> None:
    """Two channels on one topic: each channel gets its own copy of every message."""
    n = 1000
    bodies = corpus.make_bodies(n, seed=5)
    path = h.write_corpus(tmp_path, bodies)
    async with running_gateway() as gw, trio.open_nursery() as nursery:
        with trio.fail_after(90):
            consumers = [
                await h.spawn(
                    nursery,
                    h.command(
                        client,
                        "sub",
                        gw,
                        "fan",
                        "--channel",
                        channel,
                        "--count",
                        n,
                        "--max-in-flight",
                        10,
                    ),
                    channel,
                )
                for channel in ("ch1", "ch2")
            ]
            for channel in ("ch1", "ch2"):
                await h.wait_until(h.has_consumers(gw, "fan", channel), f"a consumer on {channel}")
            pub = await h.run(h.command(client, "pub", gw, "fan", "--bodies", path, "--pub", 200))
            h.assert_published(pub, 200 + 8)
            results = [await c.result() for c in consumers]
            for channel in ("ch1", "ch2"):
                await h.wait_until(h.finished(gw, "fan", channel, n), f"{n} FINs on {channel}")
        for channel, result in zip(("ch1", "ch2"), results, strict=True):
            h.assert_clean(result)
            assert set(attempts(result)) == {1}
            h.assert_same_bodies(h.received(result), h.digests(bodies))
            h.assert_drained(gw, "fan", channel, n)
