"""The NSQ links' client side of the protocol (gateway/links/nsq_client.py), sans-IO:
frames split anywhere, and the commands' bytes, against the server codec that parses
them (gateway/protocols/nsq/codec.py)."""

from __future__ import annotations

import json

import pytest

from gateway.links import nsq_client as nc
from gateway.protocols.nsq import events as ev
from gateway.protocols.nsq.codec import (
    HEARTBEAT_FRAME,
    OK_FRAME,
    NSQServerCodec,
    error_frame,
    message_frame,
    response_frame,
)


def test_frames_are_read_whole_however_the_bytes_arrive() -> None:
    stream = (
        response_frame(b'{"max_rdy_count":2500}')
        + OK_FRAME
        + HEARTBEAT_FRAME
        + message_frame(123, 2, b"0123456789abcdef", b"body")
        + error_frame(b"E_FIN_FAILED FIN x failed")
        + message_frame(124, 1, b"fedcba9876543210", b"")
    )
    for step in (1, 3, 7, len(stream)):
        reader = nc.FrameReader()
        frames = []
        for at in range(0, len(stream), step):
            frames.extend(reader.receive_data(stream[at : at + step]))
        assert frames == [
            nc.ResponseFrame(b'{"max_rdy_count":2500}'),
            nc.ResponseFrame(b"OK"),
            nc.ResponseFrame(b"_heartbeat_"),
            nc.MessageFrame(123, 2, b"0123456789abcdef", b"body"),
            nc.ErrorFrame(b"E_FIN_FAILED FIN x failed"),
            nc.MessageFrame(124, 1, b"fedcba9876543210", b""),
        ]
    assert frames[2].is_heartbeat and not frames[1].is_heartbeat  # type: ignore[union-attr]
    assert frames[4].code == "E_FIN_FAILED"  # type: ignore[union-attr]
    assert nc.negotiated(frames[0]) == {"max_rdy_count": 2500}  # type: ignore[arg-type]
    assert nc.negotiated(frames[1]) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x00\x00\x02\x00\x00\x00\x00",  # a size below the type's 4 bytes
        b"\x00\x00\x00\x04\x00\x00\x00\x07",  # no such frame type
        b"\x00\x00\x00\x08\x00\x00\x00\x02abcd",  # a message without its header
        b"HTTP/1.1 400 Bad Request\r\n",  # not nsqd at all
    ],
)
def test_what_is_not_nsq_is_refused(data: bytes) -> None:
    with pytest.raises(nc.NSQClientError):
        nc.FrameReader().receive_data(data)


def test_the_server_codec_reads_the_commands_as_sent() -> None:
    codec = NSQServerCodec()
    codec.receive_data(nc.MAGIC_V2 + nc.identify({"feature_negotiation": True}))
    (identify,) = codec.events()
    assert isinstance(identify, ev.Identify)
    assert json.loads(identify.body) == {"feature_negotiation": True}
    codec.resume()
    codec.receive_data(
        nc.sub("t", "c")
        + nc.rdy(30)
        + nc.fin(b"0123456789abcdef")
        + nc.req(b"0123456789abcdef", 1500)
        + nc.NOP
        + nc.mpub("t", [b"a", b"bc"])
        + nc.mpub("t", [b"one"])
        + nc.CLS
    )
    events = codec.events()
    assert events == [
        ev.Sub("t", "c"),
        ev.Rdy(30),
        ev.FinBatch((0x0123456789ABCDEF,)),
        ev.Req(b"0123456789abcdef", 1500),
        ev.Nop(),
        ev.MpubStart("t"),
        ev.Mpub("t", [b"a", b"bc"]),
        ev.Pub("t", b"one"),
        ev.Cls(),
    ]
