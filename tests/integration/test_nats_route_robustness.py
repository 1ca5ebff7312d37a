"""Bad route input, credentials, TLS and liveness on the gateway's route listener.

The refusals are checked differentially: the same bytes go to a real nats-server 2.15.1 route
port and to the gateway's, and the replies must match (INFO, PING and interest lines aside,
which differ by nature). A misbehaving route is closed while a good route and client
connections carry on. Timers (stale routes, handshake timeouts) run on Trio's MockClock.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.clients import harness as h
from tests.clients.nats.cluster import CLUSTER, NatsServer, eventually, nats_server
from tests.helpers import read_until, running_gateway
from tests.integration.test_nats_route import route_url, routed, routes, server_id, wait_routed

CONNECT = b'CONNECT {"verbose":false,"headers":true,"name":"%s","cluster":"C"}\r\n'
INFO = b'INFO {"server_id":"%s","server_name":"%s","cluster":"C","headers":true}\r\n'

# (name, bytes after the handshake or instead of it); the reply must match nats-server's
CASES: list[tuple[str, bytes, bool]] = [
    # (name, bytes, whether to send CONNECT + INFO first)
    ("anything before CONNECT", b"PING\r\n", False),
    ("wrong cluster", b'CONNECT {"name":"X","cluster":"OTHER"}\r\n', False),
    ("no cluster", b'CONNECT {"name":"X"}\r\n', False),
    ("a client on the route port", b'CONNECT {"lang":"python","cluster":"C"}\r\n', False),
    ("unknown op", b"FOO bar\r\n", True),
    ("payload longer than its size", b"RMSG $G foo 2\r\nabcd\r\n", True),
    ("RS+ without a subject", b"RS+ $G\r\n", True),
    ("queue RS+ without a weight", b"RS+ $G foo q\r\n", True),
    ("RS- with a weight", b"RS- $G foo q 1\r\n", True),
    ("RMSG without an account", b"RMSG foo 2\r\nab\r\n", True),
    ("bad reply indicator", b"RMSG $G foo x y 2\r\nab\r\n", True),
    ("header larger than total", b"HMSG $G foo 10 5\r\nabcde\r\n", True),
    ("-ERR from the peer", b"-ERR 'bye'\r\n", True),
]

_NOISE = (b"INFO ", b"PING", b"PONG", b"RS+ ", b"RS- ")


async def _replies(address: tuple[str, int], case: bytes, handshake: bool) -> list[bytes]:
    """What a route listener sends back until it closes: -ERR lines, INFO/PING/interest
    dropped. The connection must close within 10 s."""
    stream = await trio.open_tcp_stream(*address)
    ident = b"NTEST" + secrets.token_hex(8).upper().encode()
    if handshake:
        await stream.send_all(CONNECT % ident + INFO % (ident, ident))
    await stream.send_all(case)
    buf = b""
    with trio.fail_after(10):
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            buf += chunk
    await stream.aclose()
    return [line for line in buf.split(b"\r\n") if line and not line.startswith(_NOISE)]


@pytest.mark.parametrize(("name", "case", "handshake"), CASES, ids=[c[0] for c in CASES])
async def test_refusals_match_nats_server(
    name: str, case: bytes, handshake: bool, tmp_path: Path
) -> None:
    async with (
        nats_server("2.15", "real", tmp_path) as srv,
        running_gateway(nats_route="127.0.0.1:0", nats_cluster=CLUSTER) as gw,
    ):
        want = await _replies(srv.cluster, case, handshake)
        got = await _replies(gw.addresses["nats-route"], case, handshake)
        assert got == want, name
        assert routes(gw) == []  # whatever registered on the way is gone again


async def test_misbehaving_route_leaves_others_alone(tmp_path: Path) -> None:
    """While a real 2.15 server is routed to the gateway, rogue routes send garbage and are
    closed; the real route stays the same connection, carries a message, and a NATS client of
    the gateway keeps its round trips."""
    async with routed("2.15", "gateway-dials", tmp_path, nats="127.0.0.1:0") as (srv, gw):
        [good] = routes(gw)
        client = await trio.open_tcp_stream(*gw.addresses["nats"])
        await client.send_all(b'CONNECT {"verbose":false}\r\nSUB from.srv 1\r\nPING\r\n')
        await read_until(client, b"PONG\r\n")
        remote = await trio.open_tcp_stream(*srv.client)
        await remote.send_all(b'CONNECT {"verbose":false}\r\nSUB to.srv 1\r\nPING\r\n')
        await read_until(remote, b"PONG\r\n")
        await eventually(lambda: "to.srv" in good.plain, "RS+ to.srv")
        for _name, case, handshake in CASES:
            await _replies(gw.addresses["nats-route"], case, handshake)
            await client.send_all(b"PUB to.srv 2\r\nok\r\nPING\r\n")
            assert await read_until(client, b"PONG\r\n") == b"PONG\r\n"
            assert await read_until(remote, b"ok\r\n") == b"MSG to.srv 1 2\r\nok\r\n"
        assert routes(gw) == [good]
        await remote.send_all(b"PUB from.srv 4\r\nback\r\n")
        assert await read_until(client, b"back\r\n") == b"MSG from.srv 1 4\r\nback\r\n"
        errors = {
            s.labels["code"]
            for s in gw.metrics.protocol_errors.collect()[0].samples
            if s.labels.get("protocol") == "nats-route" and s.name.endswith("_total")
        }
        assert {"parse", "Authorization"} <= errors, errors
        await client.aclose()
        await remote.aclose()


# -- timers on MockClock -----------------------------------------------------------------------


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)


async def test_a_stale_route_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    """A peer that completes the handshake and then never answers PING: the gateway PINGs
    every ping_interval and closes the route when ping_max PINGs are unanswered."""
    async with running_gateway(
        nats_route="127.0.0.1:0",
        nats_cluster=CLUSTER,
        nats_routing__ping_interval=10.0,
        nats_routing__ping_max=2,
    ) as gw:
        stream = await trio.open_tcp_stream(*gw.addresses["nats-route"])
        await stream.send_all(CONNECT % b"NSTALE" + INFO % (b"NSTALE", b"stale"))
        start = trio.current_time()
        buf = b""
        while chunk := await stream.receive_some(65536):
            buf += chunk
        elapsed = trio.current_time() - start
        assert buf.count(b"PING\r\n") == 2
        assert 30.0 <= elapsed < 31.0, elapsed
        assert routes(gw) == []


async def test_a_silent_connection_is_dropped(autojump_clock: trio.testing.MockClock) -> None:
    """A connection that never sends CONNECT is closed after handshake_timeout."""
    async with running_gateway(
        nats_route="127.0.0.1:0", nats_cluster=CLUSTER, nats_routing__handshake_timeout=4.0
    ) as gw:
        stream = await trio.open_tcp_stream(*gw.addresses["nats-route"])
        start = trio.current_time()
        assert await stream.receive_some(100) == b""
        assert 4.0 <= trio.current_time() - start < 4.5


async def test_a_pinging_peer_is_answered() -> None:
    """PING at any point after CONNECT gets PONG, before and after the INFO."""
    async with running_gateway(nats_route="127.0.0.1:0", nats_cluster=CLUSTER) as gw:
        stream = await trio.open_tcp_stream(*gw.addresses["nats-route"])
        await stream.send_all(CONNECT % b"NPING" + b"PING\r\n")
        got = await read_until(stream, b"PONG\r\n")
        assert got.startswith(b"INFO {") and got.endswith(b"PONG\r\n")
        info = json.loads(got[5 : got.index(b"\r\n")])
        assert info["cluster"] == CLUSTER and info["headers"] is True
        assert "route_pool_size" not in info and "compression" not in info
        await stream.send_all(INFO % (b"NPING", b"ping") + b"PING\r\n")
        assert (await read_until(stream, b"PONG\r\n")).endswith(b"PONG\r\n")
        await stream.aclose()


# -- credentials and TLS ----------------------------------------------------------------------

AUTH = "authorization { user: ruser, password: rpass }"


@pytest.mark.parametrize("version", ["2.9", "2.15"])
async def test_route_credentials_both_ways(version: str, tmp_path: Path) -> None:
    """A cluster with route credentials: the gateway dials it with nats_routing.user and
    password; a server dials the gateway with user:pass@ in its route URL; a server without
    them is refused with Authorization Violation."""
    creds = {"nats_routing__user": "ruser", "nats_routing__password": "rpass"}
    async with (
        nats_server(version, "s1", tmp_path, extra="", cluster_extra=AUTH) as srv,
        running_gateway(
            nats_route="127.0.0.1:0", nats_cluster=CLUSTER, nats_routes=[srv.cluster_url], **creds
        ) as gw,
    ):
        await wait_routed(srv, gw)
        host, port = gw.addresses["nats-route"]
        async with nats_server(
            version, "s2", tmp_path, routes=[f"nats://ruser:rpass@{host}:{port}"]
        ) as s2:
            await wait_routed(s2, gw)
        async with nats_server(
            version, "s3", tmp_path, routes=[f"nats://{host}:{port}"], log=True
        ) as s3:
            await eventually(
                lambda: "Authorization Violation" in s3.log_text(), "the refusal in s3's log"
            )
            assert await server_id(s3) not in gw.cluster.routes


@pytest.mark.parametrize("version", ["2.9", "2.15"])
async def test_route_tls_both_ways(version: str, tmp_path: Path) -> None:
    """Cluster TLS (mutual, as nats-server does it for routes) with one CA: the gateway dials a
    TLS server and a TLS server dials the gateway; messages cross."""
    cert, key, ca = h.tls_files(tmp_path)
    tls = f'tls {{ cert_file: "{cert}", key_file: "{key}", ca_file: "{ca}", timeout: 5 }}'
    settings = {
        "nats_route": "127.0.0.1:0",
        "nats_cluster": CLUSTER,
        "tls_cert": cert,
        "tls_key": key,
        "nats_routing__tls": True,
        "nats_routing__tls_ca": ca,
    }
    async with (
        nats_server(version, "t1", tmp_path, cluster_extra=tls) as srv,
        running_gateway(nats_routes=[srv.cluster_url], **settings) as gw,
    ):
        await wait_routed(srv, gw)
        host, port = gw.addresses["nats-route"]
        async with nats_server(
            version, "t2", tmp_path, routes=[f"nats://{host}:{port}"], cluster_extra=tls
        ) as t2:
            await wait_routed(t2, gw)
            assert len(routes(gw)) == 2
            assert all(isinstance(r.conn.stream, trio.SSLStream) for r in routes(gw))
            await _message_crosses(t2, gw)


async def _message_crosses(srv: NatsServer, gw: object) -> None:
    remote = await trio.open_tcp_stream(*srv.client)
    await remote.send_all(b'CONNECT {"verbose":false}\r\nSUB tls.x 1\r\nPING\r\n')
    await read_until(remote, b"PONG\r\n")
    await eventually(lambda: any("tls.x" in r.plain for r in routes(gw)), "RS+ tls.x")  # type: ignore[arg-type]
    gw.broker.publish("tls.x", [b"secret"], create=False)  # type: ignore[attr-defined]
    assert await read_until(remote, b"secret\r\n") == b"MSG tls.x 1 6\r\nsecret\r\n"
    await remote.aclose()


async def test_route_url_credentials_win(tmp_path: Path) -> None:
    """user:pass@ in a --nats-routes URL is what the gateway sends when it dials."""
    async with (
        nats_server("2.15", "s1", tmp_path, cluster_extra=AUTH) as srv,
        running_gateway(
            nats_route="127.0.0.1:0",
            nats_cluster=CLUSTER,
            nats_routes=[f"nats://ruser:rpass@{srv.cluster[0]}:{srv.cluster[1]}"],
        ) as gw,
    ):
        await wait_routed(srv, gw)
        assert route_url(gw)


async def test_a_mixed_burst_from_a_route_keeps_order_headers_and_replies() -> None:
    """One read full of routed messages: runs on one subject (published together), a
    header message and a reply in between, another subject. A NATS client of the gateway
    gets all of them in order, each with its own header and reply."""
    async with running_gateway(
        nats="127.0.0.1:0", nats_route="127.0.0.1:0", nats_cluster=CLUSTER
    ) as gw:
        client = await trio.open_tcp_stream(*gw.addresses["nats"])
        await client.send_all(
            b'CONNECT {"verbose":false,"headers":true}\r\nSUB mix.> 1\r\nPING\r\n'
        )
        await read_until(client, b"PONG\r\n")
        route = await trio.open_tcp_stream(*gw.addresses["nats-route"])
        await route.send_all(CONNECT % b"NMIX" + INFO % (b"NMIX", b"mix"))
        await read_until(route, b"RS+ $G mix.>\r\n")
        hdr = b"NATS/1.0\r\nX-A: 1\r\n\r\n"
        await route.send_all(
            b"RMSG $G mix.a 2\r\na1\r\n"
            b"RMSG $G mix.a 2\r\na2\r\n"
            b"HMSG $G mix.a %d %d\r\n%sa3\r\n"
            % (len(hdr), len(hdr) + 2, hdr)
            + b"RMSG $G mix.a 2\r\na4\r\n"
            b"RMSG $G mix.b 2\r\nb1\r\n"
            b"RMSG $G mix.a rep.1 2\r\na5\r\n"
            b"RMSG $G mix.a 2\r\na6\r\n"
        )
        got = await read_until(client, b"a6\r\n")
        assert got == (
            b"MSG mix.a 1 2\r\na1\r\n"
            b"MSG mix.a 1 2\r\na2\r\n"
            b"HMSG mix.a 1 %d %d\r\n%sa3\r\n"
            % (len(hdr), len(hdr) + 2, hdr)
            + b"MSG mix.a 1 2\r\na4\r\n"
            b"MSG mix.b 1 2\r\nb1\r\n"
            b"MSG mix.a 1 rep.1 2\r\na5\r\n"
            b"MSG mix.a 1 2\r\na6\r\n"
        )
        await client.aclose()
        await route.aclose()
