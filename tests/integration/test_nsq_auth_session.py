"""AUTH through a connection, against a stub auth server (docs/protocols/nsq.md §10, §16)."""

from __future__ import annotations

import json

import trio
import trio.testing

from tests.auth_stub import Request, start_stub
from tests.helpers import RawNSQ, be32, running_gateway

GRANTS = {
    "ttl": 60,
    "identity": "alice",
    "identity_url": "http://x/alice",
    "authorizations": [
        {"topic": "^allowed$", "channels": [".*"], "permissions": ["subscribe", "publish"]},
        {"topic": "pubonly_t", "channels": ["^c1$"], "permissions": ["publish"]},
    ],
}


def responder(replies: dict[str, tuple[int, dict[str, object]]]):  # type: ignore[no-untyped-def]
    def respond(request: Request) -> tuple[int, dict[str, str], bytes]:
        secret = request.target.split("secret=")[1].split("&")[0]
        status, doc = replies.get(secret, (403, {}))
        return status, {"Content-Type": "application/json"}, json.dumps(doc).encode()

    return respond


def auth(secret: bytes) -> bytes:
    return b"AUTH\n" + be32(len(secret)) + secret


async def test_auth_flow(nursery: trio.Nursery) -> None:
    stub = await start_stub(
        nursery,
        responder(
            {
                "good": (200, GRANTS),
                "none": (200, {**GRANTS, "authorizations": []}),
                "zero": (200, {**GRANTS, "ttl": 0}),
            }
        ),
    )
    async with running_gateway(nsqd__auth_http_addresses=[f"127.0.0.1:{stub.port}"]) as gw:
        conn = await RawNSQ.connect(gw)
        _, data = await conn.identify(feature_negotiation=True)
        assert json.loads(data)["auth_required"] is True

        conn = await RawNSQ.connect(gw)
        await conn.send(b"PUB allowed\n" + be32(1) + b"x")
        assert await conn.frame() == (1, b"E_AUTH_FIRST AUTH required before PUB")
        assert await conn.closed()

        conn = await RawNSQ.connect(gw)
        await conn.send(b"SUB allowed ch\n")
        assert await conn.frame() == (1, b"E_AUTH_FIRST AUTH required before SUB")

        conn = await RawNSQ.connect(gw)
        await conn.send(auth(b"good") + auth(b"good"))
        assert await conn.frame() == (
            0,
            b'{"identity":"alice","identity_url":"http://x/alice","permission_count":2}',
        )
        assert await conn.frame() == (1, b"E_INVALID AUTH already set")
        assert stub.requests[-1].target == (
            "/auth?common_name=&remote_ip=127.0.0.1&secret=good&tls=false"
        )

        conn = await RawNSQ.connect(gw)
        await conn.send(auth(b"good") + b"PUB allowed\n" + be32(1) + b"x")
        await conn.frame()
        assert await conn.frame() == (0, b"OK")
        await conn.send(b"PUB allowedx\n" + be32(1) + b"x")
        assert await conn.frame() == (1, b'E_UNAUTHORIZED AUTH failed for PUB on "allowedx" ""')

        # a publish grant whose channel regex does not match "" does not allow publishing
        conn = await RawNSQ.connect(gw)
        await conn.send(auth(b"good") + b"MPUB pubonly_t\n")
        await conn.frame()
        assert await conn.frame() == (
            1,
            b'E_UNAUTHORIZED AUTH failed for MPUB on "pubonly_t" ""',
        )

        conn = await RawNSQ.connect(gw)
        await conn.send(auth(b"good") + b"SUB pubonly_t c1\n")
        await conn.frame()
        assert await conn.frame() == (
            1,
            b'E_UNAUTHORIZED AUTH failed for SUB on "pubonly_t" "c1"',
        )

        for secret, expected in (
            (b"none", b"E_UNAUTHORIZED AUTH no authorizations found"),
            (b"zero", b"E_AUTH_FAILED AUTH failed"),
            (b"unknown", b"E_AUTH_FAILED AUTH failed"),
        ):
            conn = await RawNSQ.connect(gw)
            await conn.send(auth(secret))
            assert await conn.frame() == (1, expected)
            assert await conn.closed()


async def test_expired_authorization_is_queried_again(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    grants = {**GRANTS, "ttl": 10}
    replies = {"good": (200, grants)}
    stub = await start_stub(nursery, responder(replies))
    async with running_gateway(nsqd__auth_http_addresses=[f"127.0.0.1:{stub.port}"]) as gw:
        conn = await RawNSQ.connect(gw)
        await conn.send(auth(b"good") + b"PUB allowed\n" + be32(1) + b"x")
        await conn.frame()
        assert await conn.frame() == (0, b"OK")
        assert len(stub.requests) == 1
        mock_clock.jump(11)
        # the auth server now grants nothing for that topic
        replies["good"] = (200, {**grants, "authorizations": [GRANTS["authorizations"][1]]})
        await conn.send(b"PUB allowed\n" + be32(1) + b"x")
        assert await conn.frame() == (1, b'E_UNAUTHORIZED AUTH failed for PUB on "allowed" ""')
        assert len(stub.requests) == 2
