"""What a session does with an event the fuzzers showed a codec may yield: inputs found
beyond the codec, in the session that reads its events, checked over a real socket."""

from __future__ import annotations

import logging

import pytest
import trio

from tests.helpers import read_until, running_gateway


async def test_a_nats_connect_whose_name_nests_deeply_is_taken_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 1500 levels fit nats-server's 4096-byte control line and the codec parses them
    # (Go allows 10,000); str() of the value once raised RecursionError in the session
    name = b"[" * 1500 + b"]" * 1500
    async with running_gateway(nats="127.0.0.1:0") as gw:
        stream = await trio.open_tcp_stream(*gw.addresses["nats"])
        await read_until(stream, b"\r\n")
        await stream.send_all(b'CONNECT {"name":' + name + b"}\r\nPING\r\n")
        assert (await read_until(stream, b"PONG\r\n")).endswith(b"PONG\r\n")
        await stream.aclose()
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
