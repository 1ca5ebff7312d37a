"""docs/protocols/nsq.md §16 against a running gateway over TCP, byte for byte."""

from __future__ import annotations

import json
import ssl
import zlib
from pathlib import Path

import pytest
import trio
import trio.testing

from gateway.protocols.nsq.compression import DeflateStream, SnappyStream
from tests.helpers import RawNSQ, be32, parse_message, running_gateway

NEGOTIATED = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
    b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
    b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,'
    b'"output_buffer_timeout":250}'
)

# (bytes sent after the magic, the frames nsqd sends, closed afterwards?)
SIMPLE = [
    (b"FOO\n", [(1, b"E_INVALID invalid command FOO")], True),
    (b"\n", [(1, b"E_INVALID invalid command ")], True),
    (b"PUB\n", [(1, b"E_INVALID PUB insufficient number of parameters")], True),
    (b"PUB bad!topic\n", [(1, b'E_BAD_TOPIC PUB topic name "bad!topic" is not valid')], True),
    (b"PUB probe_t\n" + be32(0), [(1, b"E_BAD_MESSAGE PUB invalid message body size 0")], True),
    (
        b"PUB probe_t\n" + be32(1048577),
        [(1, b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576")],
        True,
    ),
    (b"PUB probe_t\n" + be32(5) + b"hello", [(0, b"OK")], False),
    (b"PUB probe#ephemeral\n" + be32(1) + b"x", [(0, b"OK")], False),
    (
        b"MPUB bad!t\n" + be32(5),
        [(1, b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad!t" is not valid')],
        True,
    ),
    (
        b"MPUB probe_t\n" + be32(14) + be32(2) + be32(1) + b"a" + be32(1) + b"b",
        [(0, b"OK")],
        False,
    ),
    (
        b"MPUB probe_t\n" + be32(4) + be32(0),
        [(1, b"E_BAD_BODY MPUB invalid message count 0")],
        True,
    ),
    (
        b"MPUB probe_t\n" + be32(8) + be32(1) + be32(0),
        [(1, b"E_BAD_MESSAGE MPUB invalid message(0) body size 0")],
        True,
    ),
    (b"MPUB p2\n" + be32(5242881), [(1, b"E_BAD_BODY MPUB body too big 5242881 > 5242880")], True),
    (
        b"DPUB probe_t 3600001\n" + be32(1) + b"x",
        [(1, b"E_INVALID DPUB timeout 3600001 out of range 0-3600000")],
        True,
    ),
    (
        b"DPUB probe_t -5\n" + be32(1) + b"x",
        [(1, b"E_INVALID DPUB could not parse timeout -5")],
        True,
    ),
    (
        b"DPUB probe_t\n" + be32(1) + b"x",
        [(1, b"E_INVALID DPUB insufficient number of parameters")],
        True,
    ),
    (b"RDY 1\n", [(1, b"E_INVALID cannot RDY in current state")], True),
    (b"FIN 0123456789abcdef\n", [(1, b"E_INVALID cannot FIN in current state")], True),
    (b"CLS\n", [(1, b"E_INVALID cannot CLS in current state")], True),
    (b"AUTH\n" + be32(6) + b"secret", [(1, b"E_AUTH_DISABLED AUTH disabled")], True),
    (b"AUTH x\n", [(1, b"E_INVALID AUTH invalid number of parameters")], True),
    (b"SUB probe_t\n", [(1, b"E_INVALID SUB insufficient number of parameters")], True),
    (b"SUB probe_t bad!c\n", [(1, b'E_BAD_CHANNEL SUB channel name "bad!c" is not valid')], True),
    (b"IDENTIFY\n" + be32(0), [(1, b"E_BAD_BODY IDENTIFY invalid body size 0")], True),
    (
        b"SUB subt ch\nSUB subt ch\n",
        [(0, b"OK"), (1, b"E_INVALID cannot SUB in current state")],
        True,
    ),
    (
        b"SUB subt ch\nRDY 2501\n",
        [(0, b"OK"), (1, b"E_INVALID RDY count 2501 out of range 0-2500")],
        True,
    ),
    (b"SUB subt ch\nRDY -1\n", [(0, b"OK"), (1, b"E_INVALID RDY could not parse count -1")], True),
    (
        b"SUB subt ch\nIDENTIFY\n",
        [(0, b"OK"), (1, b"E_INVALID cannot IDENTIFY in current state")],
        True,
    ),
    (b"SUB subt ch\nFIN abc\n", [(0, b"OK"), (1, b"E_INVALID invalid message ID")], True),
    (
        b"SUB subt ch\nFIN 0000000000000000\nNOP\n",
        [(0, b"OK"), (1, b"E_FIN_FAILED FIN 0000000000000000 failed ID not in flight")],
        False,
    ),
    (
        # an id of the right length that is not lowercase hex: not one nsqd handed out
        b"SUB subt ch\nFIN 00000000000000AB\nNOP\n",
        [(0, b"OK"), (1, b"E_FIN_FAILED FIN 00000000000000AB failed ID not in flight")],
        False,
    ),
    (
        b"SUB subt ch\nREQ 0000000000000000 0\n",
        [(0, b"OK"), (1, b"E_REQ_FAILED REQ 0000000000000000 failed ID not in flight")],
        False,
    ),
    (
        b"SUB subt ch\nREQ 0000000000000000\n",
        [(0, b"OK"), (1, b"E_INVALID REQ insufficient number of params")],
        True,
    ),
    (
        b"SUB subt ch\nREQ 0000000000000000 -1\n",
        [(0, b"OK"), (1, b"E_INVALID REQ could not parse timeout -1")],
        True,
    ),
    (
        b"SUB subt ch\nCLS\nRDY 5\nCLS\n",
        [(0, b"OK"), (0, b"CLOSE_WAIT"), (1, b"E_INVALID cannot CLS in current state")],
        True,
    ),
]


def _identify(fields: dict[str, object]) -> bytes:
    body = json.dumps(fields).encode()
    return b"IDENTIFY\n" + be32(len(body)) + body


IDENTIFY_CASES = [
    ({"client_id": "x"}, [(0, b"OK")], False),
    ({"feature_negotiation": True}, [(0, NEGOTIATED)], False),
    (
        {"feature_negotiation": True, "heartbeat_interval": 500},
        [(1, b"E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid")],
        True,
    ),
    (
        {"feature_negotiation": True, "output_buffer_size": 63},
        [(1, b"E_BAD_BODY IDENTIFY output buffer size (63) is invalid")],
        True,
    ),
    (
        {"feature_negotiation": True, "output_buffer_size": 65537},
        [(1, b"E_BAD_BODY IDENTIFY output buffer size (65537) is invalid")],
        True,
    ),
    (
        {"feature_negotiation": True, "output_buffer_timeout": 24},
        [(1, b"E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid")],
        True,
    ),
    (
        {"feature_negotiation": True, "sample_rate": 100},
        [(1, b"E_BAD_BODY IDENTIFY sample rate (100) is invalid")],
        True,
    ),
    (
        {"feature_negotiation": True, "msg_timeout": 999},
        [(1, b"E_BAD_BODY IDENTIFY msg timeout (999) is invalid")],
        True,
    ),
    (
        {"feature_negotiation": True, "msg_timeout": 900001},
        [(1, b"E_BAD_BODY IDENTIFY msg timeout (900001) is invalid")],
        True,
    ),
    (
        {"heartbeat_interval": "30000"},
        [(1, b"E_BAD_BODY IDENTIFY failed to decode JSON body")],
        True,
    ),
    ({"heartbeat_interval": 3.5}, [(1, b"E_BAD_BODY IDENTIFY failed to decode JSON body")], True),
    (
        {"feature_negotiation": True, "snappy": True, "deflate": True},
        [(1, b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")],
        True,
    ),
]


async def _replay(conn: RawNSQ, frames: list[tuple[int, bytes]], closed: bool) -> None:
    for expected in frames:
        assert await conn.frame() == expected
    if closed:
        assert await conn.closed()
    else:
        # still open: a PUB answers
        await conn.send(b"PUB alive\n" + be32(1) + b"x")
        assert await conn.frame() == (0, b"OK")


async def test_simple_transcripts() -> None:
    async with running_gateway() as gw:
        for sent, frames, closed in SIMPLE:
            conn = await RawNSQ.connect(gw)
            await conn.send(sent)
            with trio.fail_after(6):
                try:
                    await _replay(conn, frames, closed)
                except BaseException as exc:
                    raise AssertionError(f"transcript {sent[:60]!r}") from exc
            await conn.aclose()


async def test_identify_transcripts() -> None:
    async with running_gateway() as gw:
        for fields, frames, closed in IDENTIFY_CASES:
            conn = await RawNSQ.connect(gw)
            await conn.send(_identify(fields))
            await _replay(conn, frames, closed)
            await conn.aclose()
        conn = await RawNSQ.connect(gw)
        await conn.send(b"IDENTIFY\n" + be32(3) + b"{x}")
        await _replay(conn, [(1, b"E_BAD_BODY IDENTIFY failed to decode JSON body")], True)
        # repeated IDENTIFY before SUB answers each time
        conn = await RawNSQ.connect(gw)
        await conn.send(_identify({"client_id": "x"}) + _identify({"client_id": "x"}))
        await _replay(conn, [(0, b"OK"), (0, b"OK")], False)


async def test_bad_magic_and_heartbeats_disabled_sub() -> None:
    async with running_gateway() as gw:
        conn = await RawNSQ.connect(gw, magic=b"  V1")
        await _replay(conn, [(1, b"E_BAD_PROTOCOL")], True)
        conn = await RawNSQ.connect(gw)
        await conn.send(_identify({"feature_negotiation": True, "heartbeat_interval": -1}))
        kind, _ = await conn.frame()
        assert kind == 0
        await conn.send(b"SUB t c\n")
        await _replay(conn, [(1, b"E_INVALID cannot SUB with heartbeats disabled")], True)


async def test_fin_and_touch_of_another_connections_message() -> None:
    async with running_gateway() as gw:
        pub = await RawNSQ.connect(gw)
        await pub.send(b"PUB own_t\n" + be32(2) + b"m1")
        assert await pub.frame() == (0, b"OK")
        a = await RawNSQ.connect(gw)
        await a.send(b"SUB own_t ch\nRDY 1\n")
        assert await a.frame() == (0, b"OK")
        kind, data = await a.frame()
        assert kind == 2
        _, attempts, msg_id, body = parse_message(data)
        assert (attempts, body) == (1, b"m1")
        b = await RawNSQ.connect(gw)
        await b.send(b"SUB own_t ch\n")
        assert await b.frame() == (0, b"OK")
        await b.send(b"FIN " + msg_id + b"\nTOUCH " + msg_id + b"\nREQ " + msg_id + b" 0\n")
        assert await b.frame() == (
            1,
            b"E_FIN_FAILED FIN %s failed client does not own message" % msg_id,
        )
        assert await b.frame() == (
            1,
            b"E_TOUCH_FAILED TOUCH %s failed client does not own message" % msg_id,
        )
        assert await b.frame() == (
            1,
            b"E_REQ_FAILED REQ %s failed client does not own message" % msg_id,
        )
        # the holder: TOUCH, then a REQ far past one hour is clamped, no reply to either
        await a.send(b"TOUCH " + msg_id + b"\nREQ " + msg_id + b" 99999999\nNOP\n")
        await a.send(b"PUB own_t2\n" + be32(1) + b"x")
        assert await a.frame() == (0, b"OK")


async def test_rdy_window_delivers_the_next_message_after_fin() -> None:
    async with running_gateway() as gw:
        pub = await RawNSQ.connect(gw)
        await pub.send(
            b"MPUB wint\n"
            + be32(19)
            + be32(3)
            + (be32(1) + b"1")
            + (be32(1) + b"2")
            + (be32(1) + b"3")
        )
        assert await pub.frame() == (0, b"OK")
        c = await RawNSQ.connect(gw)
        await c.send(b"SUB wint ch\nRDY 1\n")
        assert await c.frame() == (0, b"OK")
        bodies = []
        for _ in range(3):
            kind, data = await c.frame()
            assert kind == 2
            _, _, msg_id, body = parse_message(data)
            bodies.append(body)
            await c.send(b"FIN " + msg_id + b"\n")
        assert bodies == [b"1", b"2", b"3"]


async def test_snappy_upgrade_bytes() -> None:
    async with running_gateway() as gw:
        conn = await RawNSQ.connect(gw)
        body = json.dumps({"feature_negotiation": True, "snappy": True}).encode()
        await conn.send(b"IDENTIFY\n" + be32(len(body)) + body)
        kind, data = await conn.frame()
        assert kind == 0 and json.loads(data)["snappy"] is True
        expected = (
            b"\xff\x06\x00\x00sNaPpY\x01\x0e\x00\x00&\x98+\xcf\x00\x00\x00\x06\x00\x00\x00\x00OK"
        )
        got = bytes(conn.buf)  # what arrived with the JSON frame
        with trio.fail_after(5):
            while len(got) < len(expected):
                got += await conn.stream.receive_some(100)
        assert got == expected
        # pynsq style: every write starts with a fresh stream identifier
        cmd = b"PUB snappy_t\n" + be32(5) + b"hello"
        await conn.send(SnappyStream().encode(cmd))
        await conn.send(SnappyStream().encode(cmd))
        reader = SnappyStream()
        reader.decode(expected)  # the stream so far: identifier + OK
        decoded = b""
        with trio.fail_after(5):
            while len(decoded) < 20:
                decoded += reader.decode(await conn.stream.receive_some(100))
        assert decoded == b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 2


@pytest.mark.parametrize(
    ("fields", "level"),
    [
        ({"deflate": False, "deflate_level": 3}, 6),  # nsqd 1.3.0: its default, not 3
        ({"deflate_level": 9}, 6),
        ({"snappy": True, "deflate_level": 1}, 6),
    ],
)
async def test_deflate_level_when_deflate_is_off(fields: dict[str, object], level: int) -> None:
    """nsqd answers its own default level unless deflate is negotiated: the asked-for
    level is not echoed back (recorded against nsqd 1.3.0)."""
    async with running_gateway() as gw:
        conn = await RawNSQ.connect(gw)
        body = json.dumps({"feature_negotiation": True, **fields}).encode()
        await conn.send(b"IDENTIFY\n" + be32(len(body)) + body)
        _, data = await conn.frame()
        doc = json.loads(data)
        assert (doc["deflate"], doc["deflate_level"]) == (False, level)


async def test_deflate_upgrade() -> None:
    async with running_gateway() as gw:
        conn = await RawNSQ.connect(gw)
        body = json.dumps(
            {"feature_negotiation": True, "deflate": True, "deflate_level": 3}
        ).encode()
        await conn.send(b"IDENTIFY\n" + be32(len(body)) + body)
        _, data = await conn.frame()
        doc = json.loads(data)
        assert (doc["deflate"], doc["deflate_level"]) == (True, 3)
        inflate = zlib.decompressobj(-15)
        plain = inflate.decompress(bytes(conn.buf))  # what arrived with the JSON frame
        with trio.fail_after(5):
            while len(plain) < 10:
                plain += inflate.decompress(await conn.stream.receive_some(100))
        assert plain == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
        out = DeflateStream(6)
        await conn.send(out.encode(b"PUB deflate_t\n" + be32(5) + b"hello"))
        plain = b""
        with trio.fail_after(5):
            while len(plain) < 10:
                plain += inflate.decompress(await conn.stream.receive_some(100))
        assert plain == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)


async def test_heartbeat_then_close_after_two_intervals(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_gateway() as gw:
        conn = await RawNSQ.connect(gw)
        start = trio.current_time()
        await conn.send(_identify({"heartbeat_interval": 1000}))
        assert await conn.frame() == (0, b"OK")
        assert await conn.frame() == (0, b"_heartbeat_")
        assert trio.current_time() - start == pytest.approx(1.0, abs=0.2)
        assert await conn.closed(timeout=10)
        assert trio.current_time() - start == pytest.approx(2.0, abs=0.2)


async def test_tls_required_refuses_commands_before_the_upgrade(tmp_path: Path) -> None:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.cert_chain_pems[0].write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    async with running_gateway(
        tls_cert=str(cert_file), tls_key=str(key_file), nsqd__tls_required=True
    ) as gw:
        conn = await RawNSQ.connect(gw)
        await conn.send(b"PUB t\n" + be32(1) + b"x")
        assert await conn.frame() == (1, b"E_INVALID cannot PUB in current state (TLS required)")
        conn = await RawNSQ.connect(gw)
        _, data = await conn.identify(feature_negotiation=True, tls_v1=True)
        assert json.loads(data)["tls_v1"] is True
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        tls = trio.SSLStream(conn.stream, ctx, server_hostname="127.0.0.1")
        await tls.do_handshake()
        secure = RawNSQ(tls)  # type: ignore[arg-type]
        assert await secure.frame() == (0, b"OK")
        await secure.send(b"PUB t\n" + be32(1) + b"x")
        assert await secure.frame() == (0, b"OK")


async def test_sample_rate_drops_most_messages_for_that_client() -> None:
    async with running_gateway() as gw:
        conn = await RawNSQ.connect(gw)
        await conn.identify(sample_rate=1)
        await conn.send(b"SUB sampled ch\nRDY 2500\n")
        assert await conn.frame() == (0, b"OK")
        pub = await RawNSQ.connect(gw)
        n = 2000
        await pub.send(b"MPUB sampled\n" + be32(4 + n * 5) + be32(n) + (be32(1) + b"s") * n)
        assert await pub.frame() == (0, b"OK")
        group = gw.broker.topics["sampled"].groups["ch"]
        delivered = len(group.in_flight)
        # about 2 % get through (r <= 1 for r in 0..99); the rest count as finished
        assert 0 < delivered < 200
        assert group.finish_count == n - delivered
