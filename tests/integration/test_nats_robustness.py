"""Bad NATS client input gets nats-server's reply and never disturbs another connection."""

from __future__ import annotations

import trio

from tests.helpers import running_gateway


async def _read_until(stream: trio.SocketStream, marker: bytes, timeout: float = 5) -> bytes:
    buf = b""
    with trio.fail_after(timeout):
        while marker not in buf:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            buf += chunk
    return buf


async def _closed(stream: trio.SocketStream, timeout: float = 5) -> bytes:
    """Everything the server sends until it closes the connection."""
    buf = b""
    with trio.fail_after(timeout):
        while chunk := await stream.receive_some(65536):
            buf += chunk
    return buf


async def _connect(gw: object) -> trio.SocketStream:
    host, port = gw.addresses["nats"]  # type: ignore[attr-defined]
    stream = await trio.open_tcp_stream(host, port)
    assert (await _read_until(stream, b"\r\n")).startswith(b"INFO {")
    return stream


async def test_bad_input_beside_a_healthy_client() -> None:
    async with running_gateway(nats="127.0.0.1:0", nats_server__max_payload=1024) as gw:
        healthy = await _connect(gw)
        await healthy.send_all(b'CONNECT {"verbose":false}\r\nSUB h 1\r\nPING\r\n')
        assert (await _read_until(healthy, b"PONG\r\n")).endswith(b"PONG\r\n")

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
            assert await _closed(bad) == reply, sent
            # the healthy client is untouched
            await healthy.send_all(b"PUB h 2\r\nok\r\nPING\r\n")
            got = await _read_until(healthy, b"PONG\r\n")
            assert got == b"MSG h 1 2\r\nok\r\nPONG\r\n", got

        # an invalid SUB subject is answered and the connection stays open
        bad = await _connect(gw)
        await bad.send_all(b"SUB foo..bar 1\r\nPING\r\n")
        assert await _read_until(bad, b"PONG\r\n") == b"-ERR 'Invalid Subject'\r\nPONG\r\n"
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
        assert await _closed(stream) == b"-ERR 'Authorization Violation'\r\n"
        stream = await _connect(gw)
        await stream.send_all(b'CONNECT {"auth_token":"wrong"}\r\n')
        assert await _closed(stream) == b"-ERR 'Authorization Violation'\r\n"
        stream = await _connect(gw)
        await stream.send_all(b'CONNECT {"auth_token":"s3cret"}\r\nPING\r\n')
        assert await _read_until(stream, b"PONG\r\n") == b"PONG\r\n"
