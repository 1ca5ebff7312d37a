"""Unmodified NATS client libraries (nats-py 2.16.0, nats.js 2.29.3), each in a subprocess, against
the gateway's NATS listener AND against real nats-servers 2.15.1 and 2.9.10.

Every test runs three times (the `server` fixture): against the venv's nats-server 2.15.1 and
Debian's 2.9.10, which prove the test and its expectations, and against the gateway. The scripts
(tests/clients/nats/) only drive the library and print what they observed; the assertions are
here. Subscribers print a ready line once the server has their subscriptions (a round trip after
SUB), and the test starts the publisher only then: no sleeps. The `raw` tests speak the protocol
byte for byte on a socket, so a failure shows the exact bytes. The bridge tests at the end
(gateway only) carry messages between NATS clients and NSQ clients of one gateway.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.app import Gateway
from tests.clients import corpus
from tests.clients.nats import servers
from tests.helpers import RawNSQ, be32, parse_message, running_gateway

pytestmark = pytest.mark.clients

Address = tuple[str, int]


@dataclass
class Server:
    kind: str  # "nats-server" or "gateway"
    address: Address
    gateway: Gateway | None = None


@pytest.fixture(params=["nats-server", "nats-server-2.9", "gateway"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    if request.param == "nats-server":
        async with servers.real_nats_server() as address:
            yield Server("nats-server", address)
    elif request.param == "nats-server-2.9":
        async with servers.real_nats_server(binary=servers.DEBIAN_NATS_SERVER) as address:
            yield Server("nats-server", address)
    else:
        async with running_gateway(nats="127.0.0.1:0") as gw:
            yield Server("gateway", gw.addresses["nats"], gw)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_bodies(tmp_path: Path, bodies: list[bytes], name: str = "bodies.bin") -> Path:
    path = tmp_path / name
    corpus.write_bodies(path, bodies)
    return path


def nats_bodies(n: int, seed: int) -> list[bytes]:
    """`n` distinct bodies: the awkward ones, an empty one (NATS allows it), random binary, and
    three large ones (64 KiB, 256 KiB, 1000000 bytes: under the default max_payload of 1 MiB)
    spread through the run."""
    bodies = corpus.make_bodies(n - 4, seed=seed, max_size=600)
    bodies.insert(3, b"")
    for at, size in ((n // 4, 65536), (n // 2, 262144), (3 * n // 4, 1_000_000)):
        big = bytearray(size)
        big[: len(b"big\r\n")] = b"big\r\n"
        big[-16:] = b"MSG x 1 3\r\nabc\r\n"
        big[100:200] = bytes(range(100))
        bodies.insert(at, bytes(big) + b"%d" % at)
    assert len(set(bodies)) == len(bodies) == n
    return bodies


def assert_clean(result: dict[str, Any]) -> None:
    assert result["async_errors"] == [], result["async_errors"]
    assert not result["timed_out"]
    assert "error" not in result, result["error"]


def first_difference(got: list[str], want: list[str]) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            where = want.index(a) if a in want else None
            return f"message #{i}: got the body sent as #{where}, expected #{i}"
    return f"got {len(got)} messages, expected {len(want)}"


PAIRS = [("natspy", "natspy"), ("natsjs", "natspy"), ("natspy", "natsjs")]


# -- pub/sub -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("publisher", "subscriber"), PAIRS)
async def test_pubsub_binary_bodies_in_order(
    server: Server, publisher: str, subscriber: str, tmp_path: Path
) -> None:
    """3000 distinct bodies (CRLFs, NULs, an empty one, protocol look-alikes, invalid UTF-8,
    64 KiB, 256 KiB and 1000000 bytes) published by one connection on `bin.data`: the one
    subscriber gets every body byte for byte, in publish order, with no reply subject and no
    headers, and nothing more (in_msgs after a round trip)."""
    n = 3000
    bodies = nats_bodies(n, seed=21)
    path = write_bodies(tmp_path, bodies)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            sub = await servers.spawn(
                nursery,
                servers.command(subscriber, "sub", server.address, "--subject", "bin.data",
                                "--count", n, "--timeout", 50),
            )  # fmt: skip
            await sub.wait_ready()
            pub = await servers.run(
                servers.command(publisher, "pub", server.address, "--subject", "bin.data",
                                "--bodies", path, "--timeout", 50),
            )  # fmt: skip
            got = await sub.result()
    assert_clean(pub)
    assert pub["published"] == n
    assert_clean(got)
    digests = [m[2] for m in got["messages"]]
    want = [sha(b) for b in bodies]
    assert digests == want, first_difference(digests, want)
    assert [m[3] for m in got["messages"]] == [len(b) for b in bodies]
    assert {m[0] for m in got["messages"]} == {"bin.data"}
    assert {m[1] for m in got["messages"]} <= {"", None}
    assert {json.dumps(m[4]) for m in got["messages"]} == {"null"}
    assert got["in_msgs"] == n


# -- wildcards -----------------------------------------------------------------------------------

WILDCARD_PUBLISH = [
    "foo",
    "foo.bar",
    "foo.baz",
    "foo.bar.baz",
    "foo.x.baz",
    "bar.bar",
    "foo.bar.baz.qux",
    "foox.bar",
    "fo.bar",
    "bar.foo.bar",
    "foo.bar.bar",
    "x.y.z.w",
]
WILDCARD_EXPECT = {
    "foo.*": ["foo.bar", "foo.baz"],
    "foo.>": ["foo.bar", "foo.baz", "foo.bar.baz", "foo.x.baz", "foo.bar.baz.qux", "foo.bar.bar"],
    "*.bar": ["foo.bar", "bar.bar", "foox.bar", "fo.bar"],
    "foo.*.baz": ["foo.bar.baz", "foo.x.baz"],
    "*.*.bar": ["bar.foo.bar", "foo.bar.bar"],
    "*.>": [s for s in WILDCARD_PUBLISH if "." in s],
    ">": WILDCARD_PUBLISH,
    "foo.bar": ["foo.bar"],
    "*.*.*.*": ["foo.bar.baz.qux", "x.y.z.w"],
}


async def test_wildcards(server: Server) -> None:
    """One nats-py connection subscribes to `foo.*`, `foo.>`, `*.bar`, `foo.*.baz`, `*.*.bar`,
    `*.>`, `>`, `foo.bar` and `*.*.*.*`; another publishes 12 subjects once each: every
    subscription gets exactly the subjects it matches (`*` one token, `>` one or more), in
    publish order; the connection gets one MSG per (subscription, match)."""
    spec = {
        "subs": {p: want[-1] for p, want in WILDCARD_EXPECT.items()},
        "publish": WILDCARD_PUBLISH,
    }
    with trio.fail_after(30):
        out = await servers.run(
            servers.natspy("wildcards", server.address, "--spec", json.dumps(spec), "--timeout", 20)
        )
    assert_clean(out)
    assert out["got"] == WILDCARD_EXPECT
    assert out["in_msgs"] == sum(map(len, WILDCARD_EXPECT.values()))


# -- queue groups --------------------------------------------------------------------------------


async def test_queue_group(server: Server, tmp_path: Path) -> None:
    """Three nats-py connections in queue group `workers` on `jobs.q` and one plain subscriber;
    2000 messages: the plain subscriber gets all, in order; each message goes to exactly one
    member of the group (no loss, no duplicate) and every member gets some."""
    n = 2000
    bodies = corpus.make_bodies(n, seed=22, max_size=200)
    path = write_bodies(tmp_path, bodies)
    with trio.fail_after(40):
        out = await servers.run(
            servers.natspy("queue", server.address, "--subject", "jobs.q", "--group", "workers",
                           "--members", 3, "--bodies", path, "--timeout", 30)
        )  # fmt: skip
    assert_clean(out)
    want = [sha(b) for b in bodies]
    assert out["plain"] == want, first_difference(out["plain"], want)
    assert out["plain_in_msgs"] == n
    members = out["members"]
    together = Counter(d for member in members for d in member)
    sizes = list(map(len, members))
    assert together == Counter(want), (
        f"{sum((Counter(want) - together).values())} lost, "
        f"{sum((together - Counter(want)).values())} duplicated; per member {sizes}"
    )
    assert out["in_msgs"] == [len(m) for m in members]
    assert all(members), f"a member got nothing: {sizes}"
    for member in members:  # each member sees its share in publish order
        positions = [want.index(d) for d in member]
        assert positions == sorted(positions)


# -- headers -------------------------------------------------------------------------------------

JS_HEADERS = {
    "X-Multi": ["one", "two", "three"],
    "x-lower-case": ["kept as written"],
    "X-Colon": ["a: b: c"],
    "Content-Type": ["application/octet-stream"],
}
PY_HEADERS = {"X-Trace": "abc-123", "x-lower": "v", "X-Spaces": "a b  c"}


@pytest.mark.parametrize("publisher", ["natsjs", "natspy"])
async def test_headers_round_trip(server: Server, publisher: str, tmp_path: Path) -> None:
    """HPUB/HMSG: 200 messages with headers (nats.js: a header with three values, a lower-case
    name, a value with colons; nats-py: single values) and binary bodies, one of them empty; a
    nats.js and a nats-py subscriber both get every body with exactly the headers sent (nats.js
    keeps every value of a multi-valued header in order; nats-py keeps the last)."""
    n = 200
    bodies = [*corpus.make_bodies(n - 1, seed=23, max_size=300), b""]
    path = write_bodies(tmp_path, bodies)
    if publisher == "natsjs":
        headers = json.dumps(JS_HEADERS)
        want_js = JS_HEADERS
        want_py = {k: v[-1] for k, v in JS_HEADERS.items()}
    else:
        headers = json.dumps(PY_HEADERS)
        want_js = {k: [v] for k, v in PY_HEADERS.items()}
        want_py = PY_HEADERS
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            subs = {}
            for client in ("natsjs", "natspy"):
                subs[client] = await servers.spawn(
                    nursery,
                    servers.command(client, "sub", server.address, "--subject", "hdr.t",
                                    "--count", n, "--timeout", 30),
                )  # fmt: skip
            for sub in subs.values():
                await sub.wait_ready()
            pub = await servers.run(
                servers.command(publisher, "pub", server.address, "--subject", "hdr.t",
                                "--bodies", path, "--headers", headers, "--timeout", 30)
            )  # fmt: skip
            got = {client: await sub.result() for client, sub in subs.items()}
    assert_clean(pub)
    want_digests = [sha(b) for b in bodies]
    for client, want in (("natsjs", want_js), ("natspy", want_py)):
        out = got[client]
        assert_clean(out)
        assert [m[2] for m in out["messages"]] == want_digests, client
        bad = [m[4] for m in out["messages"] if m[4] != want]
        assert not bad, f"{client}: {len(bad)} messages with other headers, first {bad[0]}"


# -- request/reply -------------------------------------------------------------------------------


@pytest.mark.parametrize(("responder", "requester"), PAIRS)
async def test_request_reply(
    server: Server, responder: str, requester: str, tmp_path: Path
) -> None:
    """One responder on `svc.echo`, 1000 requests from one connection with 50 in flight (each
    library's muxed `_INBOX.<id>.*` reply subscription): every reply is `re:` + its own request
    body, with the request's header echoed back; the responder saw 1000 distinct reply
    subjects."""
    n = 1000
    bodies = [*corpus.make_bodies(n - 1, seed=24, max_size=400), b""]
    path = write_bodies(tmp_path, bodies)
    headers = json.dumps({"X-Req": ["1"]} if requester == "natsjs" else {"X-Req": "1"})
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            rsp = await servers.spawn(
                nursery,
                servers.command(responder, "reply", server.address, "--subject", "svc.echo",
                                "--count", n, "--timeout", 30),
            )  # fmt: skip
            await rsp.wait_ready()
            req = await servers.run(
                servers.command(requester, "request", server.address, "--subject", "svc.echo",
                                "--bodies", path, "--concurrency", 50, "--headers", headers,
                                "--timeout", 30)
            )  # fmt: skip
            answered = await rsp.result()
    assert_clean(req)
    assert_clean(answered)
    want_headers = {"X-Req": ["1"]} if requester == "natsjs" else {"X-Req": "1"}
    want = [[sha(b"re:" + b), want_headers] for b in bodies]
    wrong = [(i, r) for i, (r, w) in enumerate(zip(req["replies"], want, strict=True)) if r != w]
    assert not wrong, f"{len(wrong)} wrong replies, first: request #{wrong[0][0]} got {wrong[0][1]}"
    assert answered["answered"] == ["svc.echo"] * n
    assert len(set(answered["reply_subjects"])) == n


# -- UNSUB with a maximum ------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["natspy", "natsjs"])
async def test_unsub_max(server: Server, client: str) -> None:
    """`UNSUB <sid> 5` right after the SUB (nats-py `unsubscribe(limit=5)`, nats.js
    `subscribe(s, {max: 5})`); 10 messages then a sentinel on another subscription, twice: the
    server sends exactly the first 5 (in_msgs counts every MSG the connection got, whether the
    library still wanted it or not), and none after."""
    with trio.fail_after(30):
        out = await servers.run(
            servers.command(client, "unsub-max", server.address, "--subject", "auto.u",
                            "--max", 5, "--publish", 10, "--timeout", 20)
        )  # fmt: skip
    assert_clean(out)
    assert out["delivered"] == ["1.0", "1.1", "1.2", "1.3", "1.4"]
    assert out["in_msgs_1"] == 5 + 1, "MSGs by the first sentinel (5 on auto.u, 1 sentinel)"
    assert out["in_msgs_2"] == 5 + 2, "MSGs by the second sentinel (the sub must be gone)"


# -- no responders -------------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["natspy", "natsjs"])
async def test_no_responders(server: Server, client: str) -> None:
    """A request to `nobody.home`, which nobody subscribes to, fails at once with the
    no-responders error (a 503 status HMSG to the reply inbox), not after the 5 s timeout; both
    for the muxed-inbox request and the old style (a SUB/UNSUB 1 inbox per request)."""
    with trio.fail_after(30):
        out = await servers.run(
            servers.command(client, "no-responders", server.address, "--subject", "nobody.home")
        )
    assert_clean(out)
    want = "NoRespondersError" if client == "natspy" else "503"
    assert [r[0] for r in out["requests"]] == [want, want]
    assert all(r[1] < 2.0 for r in out["requests"]), out["requests"]


# -- raw protocol: exact bytes -------------------------------------------------------------------

CONNECT = {"verbose": False, "pedantic": False, "protocol": 1, "lang": "raw", "version": "0"}


class RawNATS:
    """A byte-level NATS client: send bytes, read whole server operations (MSG/HMSG with their
    payload) as the exact bytes the server sent."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()
        self.info: dict[str, Any] = {}

    @classmethod
    async def connect(cls, address: Address, **connect: Any) -> RawNATS:
        conn = cls(await trio.open_tcp_stream(*address))
        info = await conn.op(skip_info=False)
        assert info.startswith(b"INFO "), info
        conn.info = json.loads(info[5:])
        await conn.send(b"CONNECT %s\r\n" % json.dumps({**CONNECT, **connect}).encode())
        await conn.ping()
        return conn

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> None:
        chunk = await self.stream.receive_some(65536)
        if not chunk:
            raise EOFError(f"closed by the server; unread: {bytes(self.buf)!r}")
        self.buf += chunk

    async def op(self, timeout: float = 5.0, skip_info: bool = True) -> bytes:
        """The next operation; a MSG/HMSG with its payload and trailing CRLF. An INFO the
        server sends later (nats-server 2.15 sends one right after CONNECT) is skipped."""
        with trio.fail_after(timeout):
            while True:
                while b"\r\n" not in self.buf:
                    await self._fill()
                end = self.buf.index(b"\r\n") + 2
                words = bytes(self.buf[: end - 2]).split()
                if words and words[0] in (b"MSG", b"HMSG"):
                    end += int(words[-1]) + 2
                    while len(self.buf) < end:
                        await self._fill()
                out = bytes(self.buf[:end])
                del self.buf[:end]
                if not (skip_info and out.startswith(b"INFO ")):
                    return out

    async def ping(self) -> None:
        """A round trip; every operation before the PONG is an error."""
        await self.send(b"PING\r\n")
        got = await self.op()
        assert got == b"PONG\r\n", f"expected PONG, got {got!r}"

    async def ops_until(self, last: bytes) -> list[bytes]:
        """Operations up to and including one that starts with `last` (answering PINGs)."""
        ops = []
        while True:
            op = await self.op()
            if op == b"PING\r\n":
                await self.send(b"PONG\r\n")
                continue
            ops.append(op)
            if op.startswith(last):
                return ops

    async def aclose(self) -> None:
        await self.stream.aclose()


def hpub(subject: bytes, reply: bytes, hdr: bytes, payload: bytes) -> bytes:
    args = b" ".join(x for x in (subject, reply) if x)
    return b"HPUB %s %d %d\r\n%s%s\r\n" % (args, len(hdr), len(hdr) + len(payload), hdr, payload)


def hmsg(subject: bytes, sid: int, reply: bytes, hdr: bytes, payload: bytes) -> bytes:
    args = b" ".join(x for x in (subject, b"%d" % sid, reply) if x)
    return b"HMSG %s %d %d\r\n%s%s\r\n" % (args, len(hdr), len(hdr) + len(payload), hdr, payload)


RAW_HDR = (
    b"NATS/1.0\r\nX-Multi: one\r\nX-Multi: two\r\nx-lower: v\r\nX-Colon: a: b\r\nX-Empty:\r\n\r\n"
)


async def test_raw_headers_exact_bytes(server: Server) -> None:
    """HPUB -> HMSG byte for byte: the header block (a repeated name, a lower-case name, a value
    with a colon, an empty value) is passed on verbatim, with and without a reply subject, with
    a binary and an empty payload; a subscriber that said `"headers": false` in CONNECT gets a
    plain MSG with the payload only; a PUB reaches a headers subscriber as MSG."""
    sub = await RawNATS.connect(server.address, headers=True)
    plain = await RawNATS.connect(server.address, headers=False)
    pub = await RawNATS.connect(server.address, headers=True)
    assert sub.info.get("headers") is True
    await sub.send(b"SUB hdr.raw 7\r\nSUB hdr.end 8\r\n")
    await sub.ping()
    await plain.send(b"SUB hdr.raw 3\r\nSUB hdr.end 4\r\n")
    await plain.ping()
    payload = b"\r\nMSG x 1 2\r\nhi\x00\xff\r\n"
    await pub.send(
        hpub(b"hdr.raw", b"reply.to", RAW_HDR, payload)
        + hpub(b"hdr.raw", b"", RAW_HDR, b"")
        + b"PUB hdr.raw 4\r\nab\r\n\r\n"
        + b"PUB hdr.raw 0\r\n\r\n"
        + b"PUB hdr.end 0\r\n\r\n"
    )
    await pub.ping()
    assert await sub.ops_until(b"MSG hdr.end") == [
        hmsg(b"hdr.raw", 7, b"reply.to", RAW_HDR, payload),
        hmsg(b"hdr.raw", 7, b"", RAW_HDR, b""),
        b"MSG hdr.raw 7 4\r\nab\r\n\r\n",
        b"MSG hdr.raw 7 0\r\n\r\n",
        b"MSG hdr.end 8 0\r\n\r\n",
    ]
    assert await plain.ops_until(b"MSG hdr.end") == [
        b"MSG hdr.raw 3 reply.to %d\r\n%s\r\n" % (len(payload), payload),
        b"MSG hdr.raw 3 0\r\n\r\n",
        b"MSG hdr.raw 3 4\r\nab\r\n\r\n",
        b"MSG hdr.raw 3 0\r\n\r\n",
        b"MSG hdr.end 4 0\r\n\r\n",
    ]
    for conn in (sub, plain, pub):
        await conn.aclose()


async def test_raw_unsub_max_exact(server: Server) -> None:
    """`SUB u.raw 1` + `UNSUB 1 3`: 5 PUBs give exactly 3 MSGs on sid 1; after that the sid is
    gone (a later `UNSUB 1` is silently accepted, further PUBs give nothing). `UNSUB 2 1` on a
    sid that already got 2 messages removes it at once. The sentinel `u.end` (sid 9) marks
    where each round ends."""
    sub = await RawNATS.connect(server.address)
    pub = await RawNATS.connect(server.address)
    await sub.send(b"SUB u.raw 1\r\nUNSUB 1 3\r\nSUB u.two 2\r\nSUB u.end 9\r\n")
    await sub.ping()
    five = b"".join(b"PUB u.raw %d\r\n%d\r\n" % (len(b"%d" % i), i) for i in range(5))
    await pub.send(five + b"PUB u.two 1\r\na\r\nPUB u.two 1\r\nb\r\nPUB u.end 1\r\n1\r\n")
    await pub.ping()
    assert await sub.ops_until(b"MSG u.end") == [
        b"MSG u.raw 1 1\r\n0\r\n",
        b"MSG u.raw 1 1\r\n1\r\n",
        b"MSG u.raw 1 1\r\n2\r\n",
        b"MSG u.two 2 1\r\na\r\n",
        b"MSG u.two 2 1\r\nb\r\n",
        b"MSG u.end 9 1\r\n1\r\n",
    ]
    await sub.send(b"UNSUB 1\r\nUNSUB 2 1\r\n")
    await sub.ping()
    await pub.send(five + b"PUB u.two 1\r\nc\r\nPUB u.end 1\r\n2\r\n")
    await pub.ping()
    assert await sub.ops_until(b"MSG u.end") == [b"MSG u.end 9 1\r\n2\r\n"]
    await sub.aclose()
    await pub.aclose()


# the 503 of nats-server 2.9.10, and of 2.15.1 (which names the request's subject)
NO_RESPONDERS = (
    b"HMSG _INBOX.raw.a 5 16 16\r\nNATS/1.0 503\r\n\r\n\r\n",
    b"HMSG _INBOX.raw.a 5 42 42\r\nNATS/1.0 503\r\nNats-Subject: nobody.raw\r\n\r\n\r\n",
)


async def test_raw_no_responders_exact(server: Server) -> None:
    """A PUB with a reply subject to a subject with no subscribers: a client that said
    `"headers": true, "no_responders": true` in CONNECT gets an HMSG with the status line
    `NATS/1.0 503` (and, as 2.15.1 does, optionally `Nats-Subject: <subject>`) and an empty
    payload on its reply subscription (a wildcard one here); a subject with a subscriber gets
    no 503; without no_responders nothing comes."""
    req = await RawNATS.connect(server.address, headers=True, no_responders=True)
    await req.send(b"SUB _INBOX.raw.* 5\r\nSUB end.req 6\r\nSUB someone.home 1\r\n")
    await req.ping()
    await req.send(
        b"PUB nobody.raw _INBOX.raw.a 2\r\nhi\r\n"
        b"PUB someone.home _INBOX.raw.b 0\r\n\r\n"
        b"PUB end.req 0\r\n\r\n"
    )
    ops = await req.ops_until(b"MSG end.req")
    assert ops[0] in NO_RESPONDERS, f"{ops[0]!r} is neither of {NO_RESPONDERS}"
    assert ops[1:] == [
        b"MSG someone.home 1 _INBOX.raw.b 0\r\n\r\n",
        b"MSG end.req 6 0\r\n\r\n",
    ]
    old = await RawNATS.connect(server.address, headers=True)
    await old.send(b"SUB _INBOX.old.* 5\r\nSUB end.old 6\r\n")
    await old.ping()
    await old.send(b"PUB nobody.raw _INBOX.old.a 2\r\nhi\r\nPUB end.old 0\r\n\r\n")
    assert await old.ops_until(b"MSG end.old") == [b"MSG end.old 6 0\r\n\r\n"]
    await req.aclose()
    await old.aclose()


async def test_raw_echo_and_split_writes(server: Server) -> None:
    """A connection subscribed to what it publishes gets its own messages back (echo is on by
    default); one that said `"echo": false` does not, while another subscriber does. Every
    operation is also written one byte per send, so the server must reassemble PUB, HPUB and
    their payloads from fragments."""
    echo = await RawNATS.connect(server.address, headers=True)
    quiet = await RawNATS.connect(server.address, headers=True, echo=False)
    for conn in (echo, quiet):
        await conn.send(b"SUB e.t 1\r\nSUB e.end 2\r\n")
        await conn.ping()
    hdr = b"NATS/1.0\r\nA: b\r\n\r\n"
    ops = b"PUB e.t 3\r\n\r\n\x00\r\n" + hpub(b"e.t", b"r.1", hdr, b"x\r\ny")
    for byte in ops:
        await quiet.send(bytes([byte]))
    await quiet.ping()
    await quiet.send(b"PUB e.t 3\r\nend\r\n")  # a sentinel for `echo`
    await quiet.ping()
    assert await echo.ops_until(b"MSG e.t 1 3\r\nend") == [
        b"MSG e.t 1 3\r\n\r\n\x00\r\n",
        hmsg(b"e.t", 1, b"r.1", hdr, b"x\r\ny"),
        b"MSG e.t 1 3\r\nend\r\n",
    ]
    await echo.send(b"PUB e.t 4\r\nself\r\nPUB e.end 0\r\n\r\n")
    assert await echo.ops_until(b"MSG e.t 1 4") == [b"MSG e.t 1 4\r\nself\r\n"]
    assert await quiet.ops_until(b"MSG e.end") == [
        b"MSG e.t 1 4\r\nself\r\n",
        b"MSG e.end 2 0\r\n\r\n",
    ], "quiet must get echo's message but none of its own"
    await echo.aclose()
    await quiet.aclose()


# -- across protocols (gateway only) -------------------------------------------------------------


async def test_nsq_publish_reaches_natspy_subscriber(tmp_path: Path) -> None:
    """A nats-py subscriber on `bridge.t`; a raw NSQ client PUBs 500 binary bodies to topic
    `bridge.t` (pipelined, each answered OK): the subscriber gets every body byte for byte, in
    publish order, with no headers."""
    n = 500
    bodies = corpus.make_bodies(n, seed=25, max_size=3000)
    async with running_gateway(nats="127.0.0.1:0") as gw:
        with trio.fail_after(40):
            async with trio.open_nursery() as nursery:
                sub = await servers.spawn(
                    nursery,
                    servers.natspy("sub", gw.addresses["nats"], "--subject", "bridge.t",
                                   "--count", n, "--timeout", 30),
                )  # fmt: skip
                await sub.wait_ready()
                nsq = await RawNSQ.connect(gw)
                await nsq.send(b"".join(b"PUB bridge.t\n" + be32(len(b)) + b for b in bodies))
                answers = [await nsq.frame() for _ in bodies]
                await nsq.aclose()
                got = await sub.result()
    assert answers == [(0, b"OK")] * n
    assert_clean(got)
    digests = [m[2] for m in got["messages"]]
    want = [sha(b) for b in bodies]
    assert digests == want, first_difference(digests, want)
    assert {m[0] for m in got["messages"]} == {"bridge.t"}
    assert {json.dumps(m[4]) for m in got["messages"]} == {"null"}


async def test_natspy_publish_reaches_nsq_consumer(tmp_path: Path) -> None:
    """A raw NSQ consumer SUBs topic `bridge.u` channel `c` (the channel now exists) with
    RDY 500; nats-py publishes 500 binary bodies on `bridge.u`: the consumer gets each body
    exactly once, byte for byte, attempts 1, and FINs it."""
    n = 500
    bodies = corpus.make_bodies(n, seed=26, max_size=3000)
    path = write_bodies(tmp_path, bodies)
    async with running_gateway(nats="127.0.0.1:0") as gw:
        with trio.fail_after(40):
            nsq = await RawNSQ.connect(gw)
            await nsq.send(b"SUB bridge.u c\n")
            assert await nsq.frame() == (0, b"OK")
            await nsq.send(b"RDY %d\n" % n)
            pub = await servers.run(
                servers.natspy("pub", gw.addresses["nats"], "--subject", "bridge.u",
                               "--bodies", path, "--timeout", 30)
            )  # fmt: skip
            got = []
            for _ in range(n):
                ftype, data = await nsq.frame(timeout=10)
                assert ftype == 2, (ftype, data)
                _ts, attempts, msg_id, body = parse_message(data)
                got.append((attempts, body))
                await nsq.send(b"FIN " + msg_id + b"\n")
            await nsq.aclose()
    assert_clean(pub)
    assert pub["published"] == n
    assert {a for a, _b in got} == {1}
    assert Counter(sha(b) for _a, b in got) == Counter(sha(b) for b in bodies)
