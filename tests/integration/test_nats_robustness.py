"""Bad NATS client input gets nats-server's reply and never disturbs another connection."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests.clients.nats.cluster import nats_server
from tests.helpers import RawNSQ, be32, read_to_close, read_until, running_gateway


async def _connect(gw: object) -> trio.SocketStream:
    host, port = gw.addresses["nats"]  # type: ignore[attr-defined]
    stream = await trio.open_tcp_stream(host, port)
    assert (await read_until(stream, b"\r\n")).startswith(b"INFO {")
    return stream


async def test_bad_input_beside_a_healthy_client() -> None:
    async with running_gateway(nats="127.0.0.1:0", nats_server__max_payload=1024) as gw:
        healthy = await _connect(gw)
        await healthy.send_all(b'CONNECT {"verbose":false}\r\nSUB h 1\r\nPING\r\n')
        assert (await read_until(healthy, b"PONG\r\n")).endswith(b"PONG\r\n")

        cases = [
            (b"FOO bar\r\n", b"-ERR 'Unknown Protocol Operation'\r\n"),
            (b"PUB big 2000\r\n", b"-ERR 'Maximum Payload Violation'\r\n"),
            (b"PUB x 3\r\nabcdef\r\n", b"-ERR 'Unknown Protocol Operation'\r\n"),
            (b"SUB " + b"a" * 5000 + b" 1\r\n", b"-ERR 'maximum control line exceeded'\r\n"),
            (b"PUB bad subject with spaces 1\r\nx\r\n", b""),  # nats-server closes silently
        ]
        for sent, reply in cases:
            bad = await _connect(gw)
            await bad.send_all(sent)
            assert await read_to_close(bad) == reply, sent
            # the healthy client is untouched
            await healthy.send_all(b"PUB h 2\r\nok\r\nPING\r\n")
            got = await read_until(healthy, b"PONG\r\n")
            assert got == b"MSG h 1 2\r\nok\r\nPONG\r\n", got

        # an invalid SUB subject is answered and the connection stays open
        bad = await _connect(gw)
        await bad.send_all(b"SUB foo..bar 1\r\nPING\r\n")
        assert await read_until(bad, b"PONG\r\n") == b"-ERR 'Invalid Subject'\r\nPONG\r\n"
        total = sum(
            sample.value
            for metric in gw.metrics.registry.collect()
            if metric.name == "gateway_protocol_errors"
            for sample in metric.samples
            if sample.labels.get("protocol") == "nats" and sample.name.endswith("_total")
        )
        assert total >= 5


async def test_auth_is_required_when_configured() -> None:
    async with running_gateway(nats="127.0.0.1:0", nats_server__token="s3cret") as gw:
        stream = await _connect(gw)
        await stream.send_all(b"PUB x 1\r\na\r\n")
        assert await read_to_close(stream) == b"-ERR 'Authorization Violation'\r\n"
        stream = await _connect(gw)
        await stream.send_all(b'CONNECT {"auth_token":"wrong"}\r\n')
        assert await read_to_close(stream) == b"-ERR 'Authorization Violation'\r\n"
        stream = await _connect(gw)
        await stream.send_all(b'CONNECT {"auth_token":"s3cret"}\r\nPING\r\n')
        # verbose, as nats-server's CONNECT is when it does not say
        assert await read_until(stream, b"PONG\r\n") == b"+OK\r\nPONG\r\n"


async def _silent_client(address: tuple[str, int]) -> bytes:
    """CONNECT, then never a word: everything the server sends after its INFO until it
    closes the connection."""
    stream = await trio.open_tcp_stream(*address)
    await read_until(stream, b"\r\n")
    await stream.send_all(b'CONNECT {"verbose":false}\r\n')
    return await read_to_close(stream, timeout=20)


async def test_an_idle_client_is_pinged_then_closed_as_nats_server_does(tmp_path: Path) -> None:
    """ping_interval 1 s, ping_max 2, on a real nats-server 2.15 and on the gateway, side by
    side: a client that never answers gets the same PINGs and the same 'Stale Connection'."""
    got: dict[str, bytes] = {}
    async with (
        nats_server("2.15", "pinger", tmp_path, extra='ping_interval: "1s"\nping_max: 2') as srv,
        running_gateway(nats="127.0.0.1:0", nats_server__ping_interval=1.0) as gw,
    ):

        async def run(name: str, address: tuple[str, int]) -> None:
            got[name] = await _silent_client(address)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "nats-server", srv.client)
            nursery.start_soon(run, "gateway", gw.addresses["nats"])
    assert got["gateway"] == got["nats-server"] == (b"PING\r\nPING\r\n-ERR 'Stale Connection'\r\n")


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)


async def test_a_client_that_answers_stays(autojump_clock: trio.testing.MockClock) -> None:
    """With the default 2 minute interval: a client that answers each PING is still there
    after an hour. Its PONG is activity, and nats-server delays the PING after activity by
    one interval, so it was pinged every 4 minutes: 15 times."""
    async with running_gateway(nats="127.0.0.1:0") as gw:
        stream = await trio.open_tcp_stream(*gw.addresses["nats"])
        await read_until(stream, b"\r\n")
        await stream.send_all(b'CONNECT {"verbose":false}\r\n')
        pings = 0
        start = trio.current_time()
        while trio.current_time() - start < 3600:
            assert await read_until(stream, b"PING\r\n", timeout=300) == b"PING\r\n"
            pings += 1
            await stream.send_all(b"PONG\r\n")
        assert 14 <= pings <= 16
        await stream.send_all(b"PING\r\n")
        assert await read_until(stream, b"PONG\r\n") == b"PONG\r\n"


async def test_a_batch_publish_stops_at_max_and_survives_a_queue_emptied() -> None:
    """An NSQ MPUB (or a run of RMSGs) is one publish of several messages. A NATS
    subscription whose UNSUB max is reached within it gets no more of them, and a queue
    group whose last member leaves that way must not break the publish: the NSQ
    publisher got no OK (an exception ended its connection) though the messages were
    stored, and would publish them again."""
    async with running_gateway(nats="127.0.0.1:0", nsq="127.0.0.1:0") as gw:
        sub = await _connect(gw)
        await sub.send_all(
            b'CONNECT {"verbose":false}\r\nSUB t 1\r\nUNSUB 1 1\r\n'
            b"SUB t q 2\r\nUNSUB 2 1\r\nPING\r\n"
        )
        await read_until(sub, b"PONG\r\n")
        nsq = await RawNSQ.connect(gw)
        bodies = [b"b1", b"b2", b"b3"]
        payload = be32(len(bodies)) + b"".join(be32(len(b)) + b for b in bodies)
        await nsq.send(b"MPUB t\n" + be32(len(payload)) + payload)
        assert await nsq.frame() == (0, b"OK")
        await sub.send_all(b"PING\r\n")
        got = await read_until(sub, b"PONG\r\n")
        assert got.count(b"MSG t 1 ") == 1 and got.count(b"MSG t 2 ") == 1, got
