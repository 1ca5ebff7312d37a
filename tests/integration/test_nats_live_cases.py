"""NATS client protocol cases run against a real nats-server 2.15 and the gateway side by
side, raw bytes compared per connection. Each came from a review that found the gateway
answering differently: queue groups of one name over several subjects, a queue member
that declines a message, a duplicate sid, the defaults of a client that sends no CONNECT,
no-responders when the only subscriber is the requester itself, a deep `*` pattern.

After each step the test sends a PING on that connection and reads up to its PONG, so
the server has handled the step; a last PING on every connection collects what other
connections' steps delivered to it. INFO lines and those PONGs are left out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from tests.clients.nats.cluster import nats_server
from tests.helpers import running_gateway

QUIET = {"verbose": False, "pedantic": False}
Steps = list[tuple[str, bytes]]


def connect(**options: object) -> bytes:
    fields = {**QUIET, **options}
    body = ",".join(
        f'"{k}":{str(v).lower() if isinstance(v, bool) else v}' for k, v in fields.items()
    )
    return b"CONNECT {" + body.encode() + b"}\r\n"


CASES: dict[str, Steps] = {
    "one_queue_name_over_several_subjects": [
        ("c1", connect() + b"SUB job.> q 1\r\n"),
        ("c2", connect() + b"SUB job.* q 1\r\nSUB job.a q 2\r\n"),
        ("c3", connect() + b"PUB job.a 2\r\nm1\r\nPUB job.a 2\r\nm2\r\nPUB job.a 2\r\nm3\r\n"),
    ],
    "a_queue_member_that_declines_passes_the_message_on": [
        ("c1", connect(echo=False) + b"SUB foo q 1\r\n"),
        ("c2", connect() + b"SUB foo q 1\r\n"),
        ("c1", b"PUB foo 2\r\nm1\r\nPUB foo 2\r\nm2\r\nPUB foo 2\r\nm3\r\nPUB foo 2\r\nm4\r\n"),
    ],
    "a_duplicate_sid_keeps_the_first_subscription": [
        ("c1", connect(verbose=True) + b"SUB foo 1\r\nSUB bar 1\r\n"),
        ("c1", b"PUB foo 1\r\nf\r\nPUB bar 1\r\nb\r\n"),
    ],
    "no_connect_means_verbose_and_pedantic": [
        ("c1", b"SUB foo 1\r\n"),
        ("c1", b"PUB foo 2\r\nhi\r\n"),
        ("c1", b"PUB foo.* 2\r\nhi\r\n"),
        ("c1", b"UNSUB 1\r\n"),
    ],
    "no_responders_when_the_only_subscriber_is_the_requester": [
        ("c1", connect(headers=True, no_responders=True, echo=False) + b"SUB _INBOX.x.* 2\r\n"),
        ("c1", b"PUB nobody _INBOX.x.1 0\r\n\r\n"),
        ("c1", b"SUB svc 1\r\nPUB svc _INBOX.x.2 0\r\n\r\n"),
    ],
    "an_hpub_of_no_header_bytes_is_a_plain_message": [
        ("c1", connect(headers=True) + b"SUB foo 1\r\n"),
        ("c2", connect(headers=True) + b"HPUB foo 0 2\r\nhi\r\n"),
    ],
    "a_deep_wildcard_pattern": [
        ("c1", connect() + b"SUB " + b".".join([b"*"] * 1500) + b" 1\r\n"),
        ("c2", connect() + b"PUB " + b".".join([b"a"] * 1500) + b" 1\r\nx\r\n"),
    ],
}

_INFO = re.compile(rb"^INFO \{.*?\} ?\r\n", re.M)


async def run(address: tuple[str, int], steps: Steps) -> dict[str, bytes]:
    conns: dict[str, trio.SocketStream] = {}
    got: dict[str, bytes] = {}

    async def sync(name: str) -> None:
        """PING, and read up to its PONG (the PONG itself is left out)."""
        stream = conns[name]
        await stream.send_all(b"PING\r\n")
        buf = got[name]
        with trio.fail_after(10):
            while not _INFO.sub(b"", buf).endswith(b"PONG\r\n"):
                chunk = await stream.receive_some(65536)
                assert chunk, f"{name} closed: {buf!r}"
                buf += chunk
        got[name] = buf[: -len(b"PONG\r\n")]

    try:
        for name, data in steps:
            if name not in conns:
                conns[name] = await trio.open_tcp_stream(*address)
                got[name] = b""
            await conns[name].send_all(data)
            await sync(name)
        for name in conns:
            await sync(name)
    finally:
        for stream in conns.values():
            await stream.aclose()
    return {name: _INFO.sub(b"", data) for name, data in got.items()}


# nats-server picks a queue member at random: these compare what was delivered, once
# each, not who got it
ANY_MEMBER = {"one_queue_name_over_several_subjects"}
# 2.12 added a Nats-Subject header to the 503; the gateway answers as 2.10 does
VERSION = {"no_responders_when_the_only_subscriber_is_the_requester": "2.9"}
_PAYLOAD = re.compile(rb"^MSG \S+ \S+ \d+\r\n(.*?)\r\n", re.M)


@pytest.mark.parametrize("name", list(CASES))
async def test_the_gateway_answers_as_nats_server(name: str, tmp_path: Path) -> None:
    steps = CASES[name]
    async with (
        nats_server(VERSION.get(name, "2.15"), "ref", tmp_path) as server,
        running_gateway(nats="127.0.0.1:0") as gw,
    ):
        real = await run(server.client, steps)
        ours = await run(gw.addresses["nats"], steps)
    if name in ANY_MEMBER:
        real_bodies = sorted(_PAYLOAD.findall(b"".join(real.values())))
        assert sorted(_PAYLOAD.findall(b"".join(ours.values()))) == real_bodies, (ours, real)
        assert len(real_bodies) == len(set(real_bodies))  # each message to one member
    else:
        assert ours == real, (ours, real)
