"""`[limits]`: connections per listener and per address, refused in each protocol's own
words and counted, with the connections already open untouched; and a NATS subscriber
that stops reading is cut off at `max_pending_bytes` while the others keep receiving."""

from __future__ import annotations

import resource
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

from gateway.app import Gateway
from tests.clients.nats import servers
from tests.helpers import read_to_close, read_until, running_gateway

Address = tuple[str, int]


def counted(gw: Gateway, name: str, **labels: str) -> float:
    """A counter of the gateway's registry (0 when never incremented)."""
    return gw.metrics.registry.get_sample_value(name, labels) or 0.0


async def nats_client(address: Address) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(*address)
    await read_until(stream, b"\r\n")
    await stream.send_all(b'CONNECT {"verbose":false}\r\nPING\r\n')
    assert await read_until(stream, b"PONG\r\n") == b"PONG\r\n"
    return stream


async def stalled_subscriber(address: Address) -> trio.SocketStream:
    """A client subscribed to `big` that will not read: its receive buffer is shrunk so
    that what the gateway sends it fills its socket at once."""
    stream = await nats_client(address)
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await stream.send_all(b"SUB big 1\r\nPING\r\n")
    assert await read_until(stream, b"PONG\r\n") == b"PONG\r\n"
    return stream


@pytest.fixture(params=["nats-server", "gateway"])
async def nats_with_three(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Address, Gateway | None]]:
    """A NATS server that takes three connections: a real nats-server
    (`max_connections: 3`), or the gateway with `[limits] max_connections = 3`."""
    if request.param == "nats-server":
        conf = tmp_path / "max.conf"
        conf.write_text("max_connections: 3\n")
        async with servers.real_nats_server("-c", str(conf)) as address:
            yield address, None
    else:
        async with running_gateway(nats="127.0.0.1:0", limits__max_connections=3) as gw:
            yield gw.addresses["nats"], gw


@pytest.mark.clients
async def test_nats_max_connections_as_nats_server(
    nats_with_three: tuple[Address, Gateway | None],
) -> None:
    address, gw = nats_with_three
    clients = [await nats_client(address) for _ in range(3)]
    extra = await trio.open_tcp_stream(*address)
    got = await read_to_close(extra)
    info, _, rest = got.partition(b"\r\n")
    assert info.startswith(b"INFO {")
    assert rest == b"-ERR 'maximum connections exceeded'\r\n"
    # the open ones are untouched
    await clients[0].send_all(b"SUB s 1\r\nPING\r\n")
    assert await read_until(clients[0], b"PONG\r\n") == b"PONG\r\n"
    await clients[1].send_all(b"PUB s 2\r\nhi\r\nPING\r\n")
    assert await read_until(clients[1], b"PONG\r\n") == b"PONG\r\n"
    assert await read_until(clients[0], b"hi\r\n") == b"MSG s 1 2\r\nhi\r\n"
    # one leaves: there is room again
    await clients[2].aclose()
    with trio.fail_after(10):
        while True:  # the server notices the close asynchronously
            try:
                clients[2] = await nats_client(address)
                break
            except AssertionError:
                await trio.sleep(0.01)
    if gw is not None:
        assert (
            counted(
                gw, "gateway_connections_refused_total", protocol="nats", reason="max_connections"
            )
            >= 1
        )


async def test_many_idle_connections_from_one_address_do_not_refuse_a_new_client() -> None:
    """The defaults refuse nobody below the tens of thousands: a sidecar sees every client
    from 127.0.0.1 (nsqd, beanstalkd and nats-server have no per-address limit). 1,100
    idle NSQ connections, then a fresh client is served."""
    idle_count = 1100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * idle_count + 200  # both ends live in this process
    if soft < need:
        assert hard >= need, f"RLIMIT_NOFILE hard limit {hard} is below {need}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        async with running_gateway(nsq="127.0.0.1:0") as gw:
            idle = []
            try:
                for _ in range(idle_count):
                    stream = await trio.open_tcp_stream(*gw.addresses["nsq"])
                    await stream.send_all(b"  V2")
                    idle.append(stream)
                fresh = await trio.open_tcp_stream(*gw.addresses["nsq"])
                await fresh.send_all(b"  V2NOP\nPUB t 1\n" + (1).to_bytes(4, "big") + b"x")
                ok = (6).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"OK"
                assert await read_until(fresh, ok) == ok
                await fresh.aclose()
                refused = gw.metrics.registry.get_sample_value(
                    "gateway_connections_refused_total",
                    {"protocol": "nsq", "reason": "max_connections_per_ip"},
                )
                assert not refused
            finally:
                for stream in idle:
                    await stream.aclose()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_nsq_and_beanstalk_refusals_per_ip() -> None:
    async with running_gateway(
        nsq="127.0.0.1:0", beanstalk="127.0.0.1:0", limits__max_connections_per_ip=2
    ) as gw:
        # beanstalkd: two work; the third's first command gets OUT_OF_MEMORY
        bs = [await trio.open_tcp_stream(*gw.addresses["beanstalk"]) for _ in range(2)]
        for s in bs:
            await s.send_all(b"use t\r\n")
            assert await read_until(s, b"\r\n") == b"USING t\r\n"
        third = await trio.open_tcp_stream(*gw.addresses["beanstalk"])
        await third.send_all(b"put 0 0 10 1\r\nx\r\n")
        assert await read_to_close(third) == b"OUT_OF_MEMORY\r\n"
        await bs[0].send_all(b"put 0 0 10 1\r\nx\r\n")
        assert (await read_until(bs[0], b"\r\n")).startswith(b"INSERTED ")
        # NSQ: an error frame, then the close
        nsq = [await trio.open_tcp_stream(*gw.addresses["nsq"]) for _ in range(2)]
        for s in nsq:
            await s.send_all(b"  V2NOP\n")
        third = await trio.open_tcp_stream(*gw.addresses["nsq"])
        await third.send_all(b"  V2")
        got = await read_to_close(third)
        body = b"E_TOO_MANY_CONNECTIONS too many connections"
        assert got == (len(body) + 4).to_bytes(4, "big") + (1).to_bytes(4, "big") + body
        assert (
            counted(
                gw,
                "gateway_connections_refused_total",
                protocol="beanstalk",
                reason="max_connections_per_ip",
            )
            == 1
        )
        assert (
            counted(
                gw,
                "gateway_connections_refused_total",
                protocol="nsq",
                reason="max_connections_per_ip",
            )
            == 1
        )


async def test_a_nats_subscriber_that_stops_reading_is_cut_off() -> None:
    """64 MB published to two subscribers of which one never reads: it is cut off at
    max_pending_bytes (1 MB here), the reader gets every message, the gateway's memory
    stays far below what it was sent."""
    limit = 1024 * 1024
    size, count = 65536, 1024  # 64 MiB
    async with running_gateway(nats="127.0.0.1:0", limits__max_pending_bytes=limit) as gw:
        address = gw.addresses["nats"]
        slow = await stalled_subscriber(address)
        reader = await nats_client(address)
        await reader.send_all(b"SUB big 1\r\nPING\r\n")
        assert await read_until(reader, b"PONG\r\n") == b"PONG\r\n"
        publisher = await nats_client(address)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        payload = b"p" * size
        frame = b"PUB big %d\r\n%s\r\n" % (size, payload)
        received = 0

        async def read_all() -> None:
            nonlocal received
            want = count * (len(b"MSG big 1 65536\r\n") + size + 2)
            while received < want:
                chunk = await reader.receive_some(1 << 20)
                assert chunk
                received += len(chunk)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_all)
                for i in range(0, count, 16):
                    await publisher.send_all(frame * 16)
                    if i % 256 == 0:
                        await publisher.send_all(b"PING\r\n")
                        await read_until(publisher, b"PONG\r\n")
        # the slow one was closed by the gateway: what it can still read ends in EOF
        with trio.fail_after(10):
            while await slow.receive_some(1 << 20):
                pass
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        assert grown_mb < 32, f"peak RSS grew {grown_mb:.0f} MB for 64 MB published"


async def test_what_a_blocked_send_holds_counts_against_max_pending_bytes() -> None:
    """A subscriber stops reading while the gateway's writer is in the middle of sending
    it a large batch: the bytes of that batch still count (as nats-server counts its
    pending bytes until written), so a second batch as large takes it past
    max_pending_bytes and it is cut off, instead of the gateway holding twice the bound
    for it."""
    limit = 1024 * 1024
    size = 16384
    burst = b"PUB big %d\r\n%s\r\n" % (size, b"b" * size) * 48  # 768 KiB: under the bound
    delivered = 48 * len(b"MSG big 1 %d\r\n%s\r\n" % (size, b"b" * size))
    async with running_gateway(nats="127.0.0.1:0", limits__max_pending_bytes=limit) as gw:
        address = gw.addresses["nats"]
        slow = await stalled_subscriber(address)
        publisher = await nats_client(address)
        with trio.fail_after(10):
            await publisher.send_all(burst + b"PING\r\n")
            await read_until(publisher, b"PONG\r\n")
            await trio.testing.wait_all_tasks_blocked()  # its writer is blocked in a send
            # The writer took the first frames as they came; the rest queued behind them.
            # Reading all that is not queued lets that send end, and the writer then
            # takes all the rest in one batch and blocks in its send.
            session = next(s for s in gw.nats.sessions if s.subs)
            received, queued = 0, sum(map(len, session.conn.out))
            while received < delivered - queued:
                received += len(await slow.receive_some(1 << 20))
            await trio.testing.wait_all_tasks_blocked()
        assert session.conn.sending and not session.conn.out  # all of it is in the blocked send
        assert gw.nats.buffered.total > limit // 2  # ... and still counted
        errors = {"protocol": "nats", "code": "SLOW_CONSUMER"}
        assert counted(gw, "gateway_protocol_errors_total", **errors) == 0
        with trio.fail_after(10):
            await publisher.send_all(burst + b"PING\r\n")
            await read_until(publisher, b"PONG\r\n")
            while await slow.receive_some(1 << 20):  # cut off: what it can still read ends
                pass
            await trio.testing.wait_all_tasks_blocked()  # its clean-up ran
        assert counted(gw, "gateway_protocol_errors_total", **errors) == 1
        assert gw.nats.buffered.total == 0  # counted down once, by the write or the close


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)


async def test_a_write_that_waits_past_write_deadline_cuts_the_subscriber_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A subscriber stops reading with far less than max_pending waiting for it: once a
    write to it has waited write_deadline (10 s by default, as nats-server's), it is cut
    off as a slow consumer, with nothing said on the wire, as nats-server does; the
    publisher goes on. The time is the mock clock's."""
    size = 65536
    burst = b"PUB big %d\r\n%s\r\n" % (size, b"w" * size) * 128  # 8 MiB: more than sockets hold
    errors = {"protocol": "nats", "code": "SLOW_CONSUMER"}
    async with running_gateway(nats="127.0.0.1:0") as gw:
        address = gw.addresses["nats"]
        slow = await stalled_subscriber(address)
        publisher = await nats_client(address)
        await publisher.send_all(burst + b"PING\r\n")
        assert await read_until(publisher, b"PONG\r\n") == b"PONG\r\n"
        assert 0 < gw.nats.buffered.total < 64 * 1024 * 1024  # it waits, under max_pending
        await trio.sleep(9)
        assert counted(gw, "gateway_protocol_errors_total", **errors) == 0
        assert len(gw.nats.sessions) == 2
        await trio.sleep(2)
        assert counted(gw, "gateway_protocol_errors_total", **errors) == 1
        assert len(gw.nats.sessions) == 1 and gw.nats.buffered.total == 0
        await publisher.send_all(b"PING\r\n")
        assert await read_until(publisher, b"PONG\r\n") == b"PONG\r\n"
        tail = b""
        while chunk := await slow.receive_some(1 << 20):  # what the sockets held, then EOF
            tail = (tail + chunk)[-64:]
        assert b"-ERR" not in tail  # cut off silently


async def test_max_buffered_bytes_bounds_all_slow_readers_together() -> None:
    """Three NATS subscribers stop reading, each below max_pending_bytes, together above
    max_buffered_bytes (2 MB): past it, those holding more than max_pending_bytes / 64
    are cut off; a subscriber that reads gets everything; the count returns to zero."""
    size, count = 65536, 96  # 6 MiB to each subscriber
    async with running_gateway(
        nats="127.0.0.1:0",
        limits__max_pending_bytes=64 * 1024 * 1024,
        limits__max_buffered_bytes=2 * 1024 * 1024,
    ) as gw:
        address = gw.addresses["nats"]
        slow = []
        for _ in range(3):
            slow.append(await stalled_subscriber(address))
        reader = await nats_client(address)
        await reader.send_all(b"SUB big 1\r\nPING\r\n")
        assert await read_until(reader, b"PONG\r\n") == b"PONG\r\n"
        publisher = await nats_client(address)
        frame = b"PUB big %d\r\n%s\r\n" % (size, b"q" * size)
        want = count * (len(b"MSG big 1 65536\r\n") + size + 2)
        received = 0

        async def read_all() -> None:
            nonlocal received
            while received < want:
                chunk = await reader.receive_some(1 << 20)
                assert chunk
                received += len(chunk)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_all)
                for _ in range(count // 8):
                    await publisher.send_all(frame * 8 + b"PING\r\n")
                    await read_until(publisher, b"PONG\r\n")
        assert received == want
        # every slow one was cut: reading what it still has ends in EOF
        for s in slow:
            with trio.fail_after(10):
                while await s.receive_some(1 << 20):
                    pass
        with trio.fail_after(10):
            await trio.testing.wait_all_tasks_blocked()  # the cut sessions' clean-up ran
        assert gw.nats.buffered.total == 0


async def test_too_many_errors_in_a_row_closes_and_is_counted() -> None:
    """beanstalkd answers bad input for ever; the gateway closes after max_errors_in_a_row
    (here 5) such replies in a row, and counts it. A good command in between resets it."""
    async with running_gateway(beanstalk="127.0.0.1:0", limits__max_errors_in_a_row=5) as gw:
        s = await trio.open_tcp_stream(*gw.addresses["beanstalk"])
        await s.send_all(b"\r\n" * 4 + b"list-tube-used\r\n" + b"\r\n" * 4 + b"list-tube-used\r\n")
        batch = b"UNKNOWN_COMMAND\r\n" * 4 + b"USING default\r\n"
        got = b""
        with trio.fail_after(10):
            while len(got) < 2 * len(batch):
                got += await s.receive_some(65536)
        assert got == batch * 2  # 8 errors, never 5 in a row: still open
        await s.send_all(b"\r\n" * 10)
        rest = await read_to_close(s)
        assert rest == b"UNKNOWN_COMMAND\r\n" * 5  # the fifth in a row, then the close
        assert (
            counted(
                gw, "gateway_protocol_errors_total", protocol="beanstalk", code="TOO_MANY_ERRORS"
            )
            == 1
        )
