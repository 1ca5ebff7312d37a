"""NATS users and permissions, byte for byte against a real nats-server 2.15.1 configured
the same way, and through nats-py.

alice may publish on `a.>` but not `a.secret`, and subscribe on `b.*` but not
`b.secret`; bob may do anything. Each transcript is sent to both servers and the replies
must be equal (the INFO line aside).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from tests.clients.nats import servers
from tests.helpers import read_to_close, read_until, running_gateway

pytestmark = pytest.mark.clients

Address = tuple[str, int]
HERE = Path(__file__).resolve().parent
NATSPY_AUTH = HERE.parent / "clients" / "nats" / "natspy_auth.py"

SERVER_CONF = """
authorization {
  users = [
    {user: alice, password: pw-a, permissions: {
      publish: {allow: ["a.>"], deny: ["a.secret"]},
      subscribe: {allow: ["b.*"], deny: ["b.secret"]}}}
    {user: bob, password: pw-b}
  ]
}
"""
USERS = [
    {
        "user": "alice",
        "password": "pw-a",
        "permissions": {
            "publish": {"allow": ["a.>"], "deny": ["a.secret"]},
            "subscribe": {"allow": ["b.*"], "deny": ["b.secret"]},
        },
    },
    {"user": "bob", "password": "pw-b"},
]


@pytest.fixture(params=["nats-server", "gateway"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Address]:
    if request.param == "nats-server":
        conf = tmp_path / "auth.conf"
        conf.write_text(SERVER_CONF)
        async with servers.real_nats_server("-c", str(conf)) as address:
            yield address
    else:
        async with running_gateway(nats="127.0.0.1:0", nats_server__users=USERS) as gw:
            yield gw.addresses["nats"]


async def connect(address: Address, user: str, password: str) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(*address)
    await read_until(stream, b"\r\n")  # INFO
    options = {"verbose": False, "pedantic": False, "user": user, "pass": password}
    await stream.send_all(b"CONNECT " + json.dumps(options).encode() + b"\r\nPING\r\n")
    assert await read_until(stream, b"PONG\r\n") == b"PONG\r\n"
    return stream


async def call(stream: trio.SocketStream, data: bytes) -> bytes:
    await stream.send_all(data + b"PING\r\n")
    return await read_until(stream, b"PONG\r\n")


async def test_wrong_password_is_an_authorization_violation(server: Address) -> None:
    stream = await trio.open_tcp_stream(*server)
    await read_until(stream, b"\r\n")
    await stream.send_all(b'CONNECT {"verbose":false,"user":"alice","pass":"nope"}\r\nPING\r\n')
    assert await read_to_close(stream) == b"-ERR 'Authorization Violation'\r\n"


async def test_publish_permissions(server: Address) -> None:
    alice = await connect(server, "alice", "pw-a")
    assert await call(alice, b"PUB x 1\r\n1\r\n") == (
        b"-ERR 'Permissions Violation for Publish to \"x\"'\r\nPONG\r\n"
    )
    assert await call(alice, b"PUB a.secret 1\r\n1\r\n") == (
        b"-ERR 'Permissions Violation for Publish to \"a.secret\"'\r\nPONG\r\n"
    )
    # the connection stays, and allowed subjects go through
    assert await call(alice, b"PUB a.ok 1\r\n1\r\n") == b"PONG\r\n"
    # verbose: a refused publish gets the error and no +OK
    assert await call(alice, b'CONNECT {"verbose":true,"user":"alice","pass":"pw-a"}\r\n') == (
        b"+OK\r\nPONG\r\n"
    )
    assert await call(alice, b"PUB y 1\r\n1\r\nPUB a.b 1\r\n1\r\n") == (
        b"-ERR 'Permissions Violation for Publish to \"y\"'\r\n+OK\r\nPONG\r\n"
    )


async def test_subscribe_permissions_and_delivery(server: Address) -> None:
    alice = await connect(server, "alice", "pw-a")
    bob = await connect(server, "bob", "pw-b")
    assert await call(alice, b"SUB c.1 1\r\n") == (
        b"-ERR 'Permissions Violation for Subscription to \"c.1\"'\r\nPONG\r\n"
    )
    assert await call(alice, b"SUB c.1 q 2\r\n") == (
        b'-ERR \'Permissions Violation for Subscription to "c.1" using queue "q"\'\r\nPONG\r\n'
    )
    # the subscription's own subject must match b.* (wildcards as plain tokens: `>` and
    # `*.x` do not), and b.secret is denied outright
    assert await call(alice, b"SUB > 3\r\nSUB *.x 3\r\nSUB b.secret 4\r\n") == (
        b"-ERR 'Permissions Violation for Subscription to \">\"'\r\n"
        b"-ERR 'Permissions Violation for Subscription to \"*.x\"'\r\n"
        b"-ERR 'Permissions Violation for Subscription to \"b.secret\"'\r\nPONG\r\n"
    )
    # b.* overlaps the denied b.secret: accepted, and b.secret is not delivered to it
    assert await call(alice, b"SUB b.* 5\r\n") == b"PONG\r\n"
    assert await call(bob, b"PUB b.secret 6\r\nhidden\r\nPUB b.open 5\r\nshown\r\n") == b"PONG\r\n"
    assert await call(alice, b"") == b"MSG b.open 5 5\r\nshown\r\nPONG\r\n"


@pytest.mark.parametrize("gateway_or_server", ["nats-server", "gateway"])
async def test_natspy_sees_the_refusals(gateway_or_server: str, tmp_path: Path) -> None:
    async def run(address: Address, *args: str) -> dict[str, object]:
        cmd = [sys.executable, str(NATSPY_AUTH), "--port", str(address[1]), *args]
        done = await trio.to_thread.run_sync(
            lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    async def check(address: Address) -> None:
        refused = await run(address, "--user", "alice", "--password", "wrong")
        assert "Authorization Violation" in str(refused["connect_error"])
        denied = await run(address, "--user", "alice", "--password", "pw-a", "--publish", "x")
        assert denied["connected"] is True
        assert denied["errors"] == ['nats: permissions violation for publish to "x"']

    if gateway_or_server == "nats-server":
        conf = tmp_path / "auth.conf"
        conf.write_text(SERVER_CONF)
        async with servers.real_nats_server("-c", str(conf)) as address:
            await check(address)
    else:
        async with running_gateway(nats="127.0.0.1:0", nats_server__users=USERS) as gw:
            await check(gw.addresses["nats"])


async def test_connect_must_come_within_auth_timeout(server: Address) -> None:
    """nats-server's auth_timeout (2 s): a client that says nothing is told and closed."""
    stream = await trio.open_tcp_stream(*server)
    await read_until(stream, b"\r\n")  # INFO
    with trio.fail_after(10):
        assert await read_to_close(stream, timeout=10) == b"-ERR 'Authentication Timeout'\r\n"
