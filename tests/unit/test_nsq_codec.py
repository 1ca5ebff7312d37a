"""The NSQ codec alone: transcripts byte for byte, split-anywhere parsing, garbage."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocols.nsq import events as ev
from gateway.protocols.nsq.codec import (
    NSQServerCodec,
    State,
    error_frame,
    message_frame,
    response_frame,
)
from tests.helpers import MAGIC, be32


def feed(data: bytes, state: State = State.INIT) -> list[ev.Event]:
    codec = NSQServerCodec()
    codec.state = state
    codec.receive_data(MAGIC + data)
    out = []
    while (event := codec.next_event()) is not None:
        out.append(event)
        if isinstance(event, ev.Identify):
            codec.resume()
    return out


def err(text: bytes) -> ev.ProtocolError:
    return ev.ProtocolError(error_frame(text))


# (bytes after the magic, state, the events nsqd 1.3.0's parser produces);
# docs/protocols/nsq.md §16
TRANSCRIPTS: list[tuple[bytes, State, list[ev.Event]]] = [
    (b"FOO\n", State.INIT, [err(b"E_INVALID invalid command FOO")]),
    (b"\n", State.INIT, [err(b"E_INVALID invalid command ")]),
    (b"NOP\nNOP\r\n", State.INIT, [ev.Nop(), ev.Nop()]),
    (b"PUB\n", State.INIT, [err(b"E_INVALID PUB insufficient number of parameters")]),
    (
        b"PUB bad!topic\n",
        State.INIT,
        [err(b'E_BAD_TOPIC PUB topic name "bad!topic" is not valid')],
    ),
    (
        b"PUB probe_t\n" + be32(0),
        State.INIT,
        [err(b"E_BAD_MESSAGE PUB invalid message body size 0")],
    ),
    (
        b"PUB probe_t\n" + be32(1048577),
        State.INIT,
        [err(b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576")],
    ),
    (b"PUB probe_t\n" + be32(5) + b"hello", State.INIT, [ev.Pub("probe_t", b"hello")]),
    (
        b"PUB " + b"a" * 65 + b"\n" + be32(1) + b"x",
        State.INIT,
        [err(b'E_BAD_TOPIC PUB topic name "' + b"a" * 65 + b'" is not valid')],
    ),
    (b"PUB probe#ephemeral\n" + be32(1) + b"x", State.INIT, [ev.Pub("probe#ephemeral", b"x")]),
    (
        b"MPUB bad!t\n" + be32(5),
        State.INIT,
        [err(b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad!t" is not valid')],
    ),
    (
        b"MPUB probe_t\n" + be32(14) + be32(2) + be32(1) + b"a" + be32(1) + b"b",
        State.INIT,
        [ev.MpubStart("probe_t"), ev.Mpub("probe_t", [b"a", b"b"])],
    ),
    (
        b"MPUB probe_t\n" + be32(4) + be32(0),
        State.INIT,
        [ev.MpubStart("probe_t"), err(b"E_BAD_BODY MPUB invalid message count 0")],
    ),
    (
        b"MPUB probe_t\n" + be32(8) + be32(1) + be32(0),
        State.INIT,
        [ev.MpubStart("probe_t"), err(b"E_BAD_MESSAGE MPUB invalid message(0) body size 0")],
    ),
    (
        b"MPUB p2\n" + be32(5242881) + be32(1),
        State.INIT,
        [ev.MpubStart("p2"), err(b"E_BAD_BODY MPUB body too big 5242881 > 5242880")],
    ),
    (
        b"DPUB probe_t 3600001\n" + be32(1) + b"x",
        State.INIT,
        [err(b"E_INVALID DPUB timeout 3600001 out of range 0-3600000")],
    ),
    (
        b"DPUB probe_t -5\n" + be32(1) + b"x",
        State.INIT,
        [err(b"E_INVALID DPUB could not parse timeout -5")],
    ),
    (
        b"DPUB probe_t\n" + be32(1) + b"x",
        State.INIT,
        [err(b"E_INVALID DPUB insufficient number of parameters")],
    ),
    (b"DPUB probe_t 3600000\n" + be32(1) + b"x", State.INIT, [ev.Dpub("probe_t", 3600000, b"x")]),
    (b"RDY 1\n", State.INIT, [err(b"E_INVALID cannot RDY in current state")]),
    (b"FIN 0123456789abcdef\n", State.INIT, [err(b"E_INVALID cannot FIN in current state")]),
    (b"CLS\n", State.INIT, [err(b"E_INVALID cannot CLS in current state")]),
    (b"AUTH x\n", State.INIT, [err(b"E_INVALID AUTH invalid number of parameters")]),
    (b"SUB probe_t\n", State.INIT, [err(b"E_INVALID SUB insufficient number of parameters")]),
    (
        b"SUB probe_t bad!c\n",
        State.INIT,
        [err(b'E_BAD_CHANNEL SUB channel name "bad!c" is not valid')],
    ),
    (
        b"SUB subt ch\nSUB subt ch\n",
        State.INIT,
        [
            ev.Sub("subt", "ch"),
            err(b"E_INVALID cannot SUB in current state"),
        ],
    ),
    (b"IDENTIFY\n" + be32(0), State.INIT, [err(b"E_BAD_BODY IDENTIFY invalid body size 0")]),
    (
        b"RDY 2501\n",
        State.SUBSCRIBED,
        [err(b"E_INVALID RDY count 2501 out of range 0-2500")],
    ),
    (b"RDY -1\n", State.SUBSCRIBED, [err(b"E_INVALID RDY could not parse count -1")]),
    (b"RDY\nRDY \nRDY 7\n", State.SUBSCRIBED, [ev.Rdy(1), ev.Rdy(0), ev.Rdy(7)]),
    (b"IDENTIFY\n", State.SUBSCRIBED, [err(b"E_INVALID cannot IDENTIFY in current state")]),
    (b"FIN abc\n", State.SUBSCRIBED, [err(b"E_INVALID invalid message ID")]),
    (b"FIN\n", State.SUBSCRIBED, [err(b"E_INVALID FIN insufficient number of params")]),
    (b"FIN 0000000000000000\n", State.SUBSCRIBED, [ev.FinBatch((0,))]),
    (
        b"FIN 0000000000000001\nFIN 0000000000000002\nFIN 00000000 0000002\n",
        State.SUBSCRIBED,
        [
            ev.FinBatch((1, 2)),
            err(b"E_INVALID invalid message ID"),
        ],
    ),
    (b"FIN 000000000000000\r\n", State.SUBSCRIBED, [err(b"E_INVALID invalid message ID")]),
    (
        # only well-formed ids (lowercase hex) join a batch, which the session reads as
        # numbers unchecked; another id of the right length is a FIN of its own
        b"FIN 0000000000000001\nFIN 00000000000000AB\nFIN 0000000000000002\n",
        State.SUBSCRIBED,
        [
            ev.FinBatch((1,)),
            ev.Fin(b"00000000000000AB"),
            ev.FinBatch((2,)),
        ],
    ),
    (
        b"REQ 0000000000000000\n",
        State.SUBSCRIBED,
        [err(b"E_INVALID REQ insufficient number of params")],
    ),
    (
        b"REQ 0000000000000000 -1\n",
        State.SUBSCRIBED,
        [err(b"E_INVALID REQ could not parse timeout -1")],
    ),
    (
        b"REQ 0000000000000000 99999999\n",
        State.SUBSCRIBED,
        [ev.Req(b"0000000000000000", 99999999)],
    ),
    (b"TOUCH\n", State.SUBSCRIBED, [err(b"E_INVALID TOUCH insufficient number of params")]),
    (
        b"CLS\nRDY 5\nCLS\n",
        State.SUBSCRIBED,
        [
            ev.Cls(),
            ev.Nop(),
            err(b"E_INVALID cannot CLS in current state"),
        ],
    ),
    (b"pub t\n", State.INIT, [err(b"E_INVALID invalid command pub")]),
]


def test_transcripts() -> None:
    for data, state, expected in TRANSCRIPTS:
        assert feed(data, state) == expected, data


def test_bad_magic() -> None:
    codec = NSQServerCodec()
    codec.receive_data(b"  V1")
    assert codec.next_event() == ev.ProtocolError(error_frame(b"E_BAD_PROTOCOL"))
    assert codec.state is State.CLOSED


def test_split_at_every_byte_boundary() -> None:
    stream = (
        b"IDENTIFY\n"
        + be32(2)
        + b"{}"
        + b"PUB t\n"
        + be32(5)
        + b"hello"
        + b"MPUB t\n"
        + be32(14)
        + be32(2)
        + be32(1)
        + b"a"
        + be32(1)
        + b"b"
        + b"DPUB t 10\n"
        + be32(3)
        + b"x\ny"
        + b"NOP\r\nSUB t c\nRDY 10\nFIN 0123456789abcdef\nTOUCH 0123456789abcdef\n"
        + b"REQ 0123456789abcdef 10\nCLS\n"
    )
    whole = feed(stream)
    assert len(whole) == 12
    for cut in range(len(MAGIC + stream) + 1):
        for step in (cut, 1) if cut else (1,):
            codec = NSQServerCodec()
            data = MAGIC + stream
            events: list[ev.Event] = []
            pieces = (
                [data[:cut], data[cut:]]
                if step == cut
                else [data[i : i + 1] for i in range(len(data))]
            )
            for piece in pieces:
                codec.receive_data(piece)
                while (event := codec.next_event()) is not None:
                    events.append(event)
                    if isinstance(event, ev.Identify):
                        codec.resume()
            assert events == whole, cut


def test_line_too_long_closes_silently() -> None:
    codec = NSQServerCodec()
    codec.receive_data(MAGIC + b"PUB " + b"a" * 17000)
    assert codec.next_event() == ev.ProtocolError(None)


def test_identify_pauses_until_resume() -> None:
    codec = NSQServerCodec()
    codec.receive_data(MAGIC + b"IDENTIFY\n" + be32(2) + b"{}NOP\n")
    assert codec.next_event() == ev.Identify(b"{}")
    assert codec.next_event() is None
    codec.resume()
    assert codec.next_event() == ev.Nop()


def test_frames() -> None:
    assert response_frame(b"OK") == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert error_frame(b"E_X y") == b"\x00\x00\x00\x09\x00\x00\x00\x01E_X y"
    frame = message_frame(0x18EA258DBC71F1F4, 1, b"18a372f65de69000", b"m1")
    assert frame == (
        struct.pack(">ii", 30 + 2, 2)
        + b"\x18\xea%\x8d\xbcq\xf1\xf4\x00\x01"
        + b"18a372f65de69000m1"
    )


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.sampled_from(list(State)[:3]))
def test_garbage_only_yields_events_or_protocol_errors(data: bytes, state: State) -> None:
    codec = NSQServerCodec()
    codec.state = state
    codec.receive_data(MAGIC + data)
    for _ in range(1000):
        event = codec.next_event()
        if event is None:
            break
        if isinstance(event, ev.Identify):
            codec.resume()
        if isinstance(event, ev.ProtocolError):
            assert codec.state is State.CLOSED
            assert codec.next_event() is None
            break


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                b"NOP\n",
                b"PUB t\n",
                b"SUB a b\n",
                b"RDY 3\n",
                b"\x00\x00\x00\x01z",
                b"MPUB t\n",
                b"\n",
                b"CLS\n",
            ]
        ),
        max_size=20,
    )
)
def test_command_shaped_garbage(parts: list[bytes]) -> None:
    codec = NSQServerCodec()
    codec.receive_data(MAGIC + b"".join(parts))
    while (event := codec.next_event()) is not None:
        if isinstance(event, ev.ProtocolError):
            assert event.frame is None or event.frame[8:].startswith(b"E_")
            break
