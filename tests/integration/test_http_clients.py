"""Real clients on the HTTP listener: readers that know only nsqlookupd's address, gnsq
publishing over nsqd's HTTP API, and HTTP/2 clients (prior knowledge and h2c Upgrade)."""

from __future__ import annotations

from pathlib import Path

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
import trio

from gateway.app import Gateway
from tests.clients import corpus
from tests.clients import harness as h
from tests.helpers import RawNSQ, http_base, parse_message, running_gateway


def _http_port(gw: Gateway) -> int:
    return gw.addresses["http"][1]


@pytest.mark.clients
@pytest.mark.parametrize("client", ["pynsq", "gnsq"])
async def test_a_reader_with_only_lookupd_addresses_consumes_from_the_gateway(
    client: str, tmp_path: Path
) -> None:
    """An NSQ TCP producer publishes; a Reader given nothing but the gateway's HTTP address
    as its nsqlookupd asks /lookup, connects to the producer listed there (the gateway's
    NSQ listener) and consumes everything."""
    n = 500
    bodies = corpus.make_bodies(n, seed=5)
    path = h.write_corpus(tmp_path, bodies)
    async with running_gateway(http="127.0.0.1:0") as gw:
        sessions = h.record_sessions(gw)
        with trio.fail_after(60):
            pub = await h.run(
                h.command("pynsq", "pub", gw, "lk", "--bodies", path, "--pub", 100, "--batch", 50)
            )
            h.assert_published(pub, 100 + 8)
            sub = await h.run(
                h.command(
                    client,
                    "sub",
                    gw,
                    "lk",
                    "--lookupd-port",
                    _http_port(gw),
                    "--count",
                    n,
                    "--max-in-flight",
                    20,
                )
            )
            await h.wait_until(h.finished(gw, "lk", "ch", n), f"{n} FINs at the gateway")
        h.assert_clean(sub)
        h.assert_same_bodies(h.received(sub), h.digests(bodies))
        h.assert_drained(gw, "lk", "ch", n)
        consumers = [s for s in sessions if s.user_agent.startswith(h.USER_AGENTS[client])]
        assert consumers, [s.user_agent for s in sessions]


@pytest.mark.clients
async def test_gnsq_publishes_over_http(tmp_path: Path) -> None:
    """gnsq's NsqdHTTPClient: /pub for single bodies (one of exactly max-msg-size), binary
    /mpub for batches; every body arrives byte for byte at an NSQ TCP consumer."""
    n = 400
    bodies = corpus.make_bodies(n, seed=6, big=2)
    path = h.write_corpus(tmp_path, bodies)
    async with running_gateway(http="127.0.0.1:0") as gw:
        with trio.fail_after(60):
            pub = await h.run(
                h.command(
                    "gnsq",
                    "pub",
                    gw,
                    "hp",
                    "--bodies",
                    path,
                    "--pub",
                    50,
                    "--batch",
                    70,
                    "--http-port",
                    _http_port(gw),
                )
            )
            h.assert_published(pub, 50 + 5)
            assert gw.broker.topics["hp"].message_count == n
            sub = await h.run(
                h.command("pynsq", "sub", gw, "hp", "--count", n, "--max-in-flight", 20)
            )
            await h.wait_until(h.finished(gw, "hp", "ch", n), f"{n} FINs at the gateway")
        h.assert_clean(sub)
        h.assert_same_bodies(h.received(sub), h.digests(bodies))


@pytest.mark.clients
async def test_gnsq_deferred_publish_over_http(tmp_path: Path) -> None:
    bodies = corpus.make_bodies(5, seed=7)
    path = h.write_corpus(tmp_path, bodies)
    async with running_gateway(http="127.0.0.1:0") as gw:
        async with httpx.AsyncClient(base_url=http_base(gw)) as client:
            await client.post("/topic/create?topic=dp")
            await client.post("/channel/create?topic=dp&channel=ch")
        with trio.fail_after(60):
            pub = await h.run(
                h.command(
                    "gnsq",
                    "pub",
                    gw,
                    "dp",
                    "--bodies",
                    path,
                    "--pub",
                    5,
                    "--defer",
                    600000,
                    "--http-port",
                    _http_port(gw),
                )
            )
        h.assert_published(pub, 5)
        group = gw.broker.topics["dp"].groups["ch"]
        assert (len(group.deferred), group.depth) == (5, 0)


# -- HTTP/2 ----------------------------------------------------------------------------------------


async def test_http2_with_prior_knowledge() -> None:
    async with running_gateway(http="127.0.0.1:0") as gw:
        sub = await RawNSQ.connect(gw)
        await sub.send(b"SUB h2t ch\nRDY 1\n")
        assert await sub.frame() == (0, b"OK")
        async with httpx.AsyncClient(base_url=http_base(gw), http1=False, http2=True) as client:
            ping = await client.get("/ping")
            assert (ping.http_version, ping.status_code, ping.text) == ("HTTP/2", 200, "OK")
            published = await client.post("/pub?topic=h2t", content=b"over h2")
            assert (published.http_version, published.text) == ("HTTP/2", "OK")
            assert published.headers["x-nsq-content-type"] == "nsq; version=1.0"
            stats = await client.get("/stats", params={"format": "json"})
            assert stats.http_version == "HTTP/2"
            assert stats.headers["content-type"] == "application/json; charset=utf-8"
            (topic,) = stats.json()["topics"]
            assert (topic["topic_name"], topic["message_count"]) == ("h2t", 1)
            text = await client.get("/stats")
            assert "[h2t" in text.text
            missing = await client.get("/nope")
            assert (missing.status_code, missing.json()) == (404, {"message": "NOT_FOUND"})
        assert parse_message((await sub.frame())[1])[3] == b"over h2"
        await sub.aclose()


async def _h2_response(
    stream: trio.SocketStream, conn: h2.connection.H2Connection, stream_id: int, pending: bytes
) -> tuple[dict[bytes, bytes], bytes]:
    """Feed bytes to the client connection until `stream_id` ends: (headers, body)."""
    headers: dict[bytes, bytes] = {}
    body = b""
    data = pending
    with trio.fail_after(5):
        while True:
            for event in conn.receive_data(data) if data else ():
                if getattr(event, "stream_id", None) != stream_id:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    headers = dict(event.headers)  # type: ignore[arg-type]
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    await stream.send_all(conn.data_to_send())
                    return headers, body
            await stream.send_all(conn.data_to_send())
            data = await stream.receive_some(65536)
            assert data, "the server closed the connection"


async def test_h2c_by_upgrade() -> None:
    """HTTP/1.1 `Upgrade: h2c`: 101 Switching Protocols, the response to the upgraded
    request on stream 1, then more requests on the same HTTP/2 connection."""
    async with running_gateway(http="127.0.0.1:0") as gw:
        async with httpx.AsyncClient(base_url=http_base(gw)) as client:
            await client.post("/pub?topic=up", content=b"x")
        host, port = gw.addresses["http"]
        stream = await trio.open_tcp_stream(host, port)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        settings = conn.initiate_upgrade_connection()
        await stream.send_all(
            b"GET /stats?format=json HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
            b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: " + settings + b"\r\n\r\n"
        )
        head = b""
        with trio.fail_after(5):
            while b"\r\n\r\n" not in head:
                head += await stream.receive_some(65536)
        head, _, rest = head.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        assert b"upgrade: h2c" in head.lower()
        await stream.send_all(conn.data_to_send())  # the client preface
        headers, body = await _h2_response(stream, conn, 1, rest)
        assert headers[b":status"] == b"200"
        assert headers[b"content-type"] == b"application/json; charset=utf-8"
        assert b'"topic_name":"up"' in body
        conn.send_headers(
            3,
            [(":method", "GET"), (":path", "/ping"), (":scheme", "http"), (":authority", host)],
            end_stream=True,
        )
        await stream.send_all(conn.data_to_send())
        headers, body = await _h2_response(stream, conn, 3, b"")
        assert (headers[b":status"], body) == (b"200", b"OK")
        await stream.aclose()
