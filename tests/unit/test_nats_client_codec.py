"""The NATS client codec alone: transcripts byte for byte, split-anywhere parsing, garbage.

Every reply below was captured from a real nats-server (2.9.10 and 2.15.1 answered the
same) with a raw socket: CONNECT {"verbose":false,"pedantic":false,"headers":true,
"protocol":1}, then the input. "close" means the server closed the connection; None as
reply means it closed without sending anything.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocols.nats import client_events as ev
from gateway.protocols.nats.client_codec import (
    ERR_AUTH_VIOLATION,
    ERR_INVALID_PUBLISH_SUBJECT,
    ERR_MAX_CONTROL_LINE,
    ERR_MAX_PAYLOAD,
    ERR_UNKNOWN_OP,
    OK,
    PING,
    PONG,
    NATSClientCodec,
    connect_option,
    err,
    hmsg,
    hmsg_frame,
    info,
    msg,
    msg_frame,
    msg_names,
)

UPO = ev.ProtocolError(b"-ERR 'Unknown Protocol Operation'\r\n", True)
SILENT = ev.ProtocolError(None, True)
MAX_PAYLOAD = ev.ProtocolError(b"-ERR 'Maximum Payload Violation'\r\n", True)
MAX_LINE = ev.ProtocolError(b"-ERR 'maximum control line exceeded'\r\n", True)
INVALID_SUBJECT = ev.ProtocolError(b"-ERR 'Invalid Subject'\r\n", False)
AUTH = ev.ProtocolError(b"-ERR 'Authorization Violation'\r\n", True)


def new_codec(headers: bool = True) -> NATSClientCodec:
    codec = NATSClientCodec()
    codec.headers = headers  # as after the CONNECT with headers:true
    return codec


def drain(codec: NATSClientCodec) -> list[ev.Event]:
    out: list[ev.Event] = []
    while (event := codec.next_event()) is not None:
        out.append(event)
    return out


def feed(data: bytes, headers: bool = True) -> list[ev.Event]:
    codec = new_codec(headers)
    codec.receive_data(data)
    return drain(codec)


def feed_chunks(chunks: list[bytes], headers: bool = True) -> list[ev.Event]:
    codec = new_codec(headers)
    out: list[ev.Event] = []
    for chunk in chunks:
        codec.receive_data(chunk)
        out += drain(codec)
    return out


def pub_arg(n: int) -> bytes:
    """A PUB argument of exactly n bytes: a subject and size 1."""
    return b"s" * (n - 2) + b" 1"


# (input after CONNECT, the events matching what nats-server did)
TRANSCRIPTS: list[tuple[bytes, list[ev.Event]]] = [
    # PING/PONG: case-insensitive, bare \n, anything up to the \n ignored
    (b"PING\r\n", [ev.Ping()]),
    (b"ping\r\n", [ev.Ping()]),
    (b"Ping\r\n", [ev.Ping()]),
    (b"PING\n", [ev.Ping()]),
    (b"PING foo bar\r\n", [ev.Ping()]),
    (b"PINGX\r\n", [ev.Ping()]),
    (b"PINGPING\r\n", [ev.Ping()]),
    # a PING line's rest is skipped however the line is cut (PING|PING\r\n was two PINGs
    # once, and the SUB after them was lost)
    (b"PINGPING\r\nSUB foo 1\r\n", [ev.Ping(), ev.Sub("foo", None, "1")]),
    (b"PING PUB foo 1\r\nx\r\n", [ev.Ping(), UPO]),
    (b"PING " + b"x" * 10000 + b"\r\n", [ev.Ping()]),
    (b"PIN\r\n", [UPO]),
    (b"PONG\r\n", [ev.Pong()]),
    (b"pong xyz\r\n", [ev.Pong()]),
    # PUB
    (b"pub foo 2\r\nhi\r\nPING\r\n", [ev.Pub("foo", None, b"hi"), ev.Ping()]),
    (b"PUB\tfoo \t 2\r\nhi\r\nPING\r\n", [ev.Pub("foo", None, b"hi"), ev.Ping()]),
    (b"PUB foo 2\nhi\r\nPING\r\n", [ev.Pub("foo", None, b"hi"), ev.Ping()]),
    (b"PUB foo  bar\t2\r\nhi\r\n", [ev.Pub("foo", "bar", b"hi")]),
    (b"PUB foo  2\r\nhi\r\n", [ev.Pub("foo", None, b"hi")]),  # nats-py: no reply, 2 spaces
    (b"PUB foo 2   \r\nhi\r\n", [ev.Pub("foo", None, b"hi")]),
    (b"PUB foo 2 \nhi\r\n", [ev.Pub("foo", None, b"hi")]),
    (b"PUB foo 02\r\nhi\r\n", [ev.Pub("foo", None, b"hi")]),
    (b"PUB foo 0\r\n\r\nPING\r\n", [ev.Pub("foo", None, b""), ev.Ping()]),
    (b"PUB foo.* 2\r\nhi\r\n", [ev.Pub("foo.*", None, b"hi")]),  # no check unless pedantic
    (b"PUB \nfoo 1\r\nx\r\n", [ev.Pub("\nfoo", None, b"x")]),  # first arg byte: never EOL
    (b"PUB foo\r 2\r\nhi\r\n", [ev.Pub("foo\r", None, b"hi")]),
    (b"PUB foo 2\r\nhi\nPING\r\n", [UPO]),
    (b"PUB foo 2\r\nhix\r\n", [UPO]),
    (b"PUB foo 2\r\nh\r\n", [UPO]),
    (b"PUB foo 2\r\nhi\r\nXYZ\r\n", [ev.Pub("foo", None, b"hi"), UPO]),
    (b"PUB bad subject with spaces 1\r\nx\r\n", [SILENT]),
    (b"PUB foo bar 2 baz\r\nhi\r\n", [SILENT]),
    (b"PUB foo\r\n", [SILENT]),
    (b"PUB foo x\r\n", [SILENT]),
    (b"PUB foo -1\r\n", [SILENT]),
    (b"PUB foo +2\r\nhi\r\n", [SILENT]),
    (b"PUB foo 1234567890\r\n", [SILENT]),  # parseSize: 10 digits is "Bad or Missing Size"
    (b"PUB foo 123456789\r\n", [MAX_PAYLOAD]),
    (b"PUB foo 1048577\r\n", [MAX_PAYLOAD]),
    (b"PUB foo 1048576\r\n", []),  # allowed: waits for the payload
    (b"PUBfoo 1\r\nx\r\n", [UPO]),
    (b"PUX foo 1\r\n", [UPO]),
    (b"pubs foo 1\r\n", [UPO]),
    (b"PUB\r\n", [UPO]),
    (b"PUB \r\n", [SILENT]),
    (b"PUB \t \r\n", [SILENT]),
    # HPUB (headers on)
    (
        b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPING\r\n",
        [ev.HPub("foo", None, b"NATS/1.0\r\n\r\n", b"hi"), ev.Ping()],
    ),
    (
        b"hpub foo bar 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
        [ev.HPub("foo", "bar", b"NATS/1.0\r\n\r\n", b"hi")],
    ),
    (
        b"HPUB foo  12 14\r\nNATS/1.0\r\n\r\nhi\r\n",  # nats-py, no reply
        [ev.HPub("foo", None, b"NATS/1.0\r\n\r\n", b"hi")],
    ),
    (b"HPUB foo 0 2\r\nhi\r\n", [ev.HPub("foo", None, b"", b"hi")]),
    (b"HPUB foo 2 4\r\nabcd\r\n", [ev.HPub("foo", None, b"ab", b"cd")]),
    (b"HPUB foo 14 12\r\n", [SILENT]),
    (b"HPUB foo 2\r\n", [SILENT]),
    (b"HPUB foo x 2\r\n", [SILENT]),
    (b"HPUB foo 1 x\r\n", [SILENT]),
    (b"HPUB foo 1048577 1048577\r\n", [MAX_PAYLOAD]),
    # ops a client may not send
    (b"FOO\r\n", [UPO]),
    (b"MSG foo 1 2\r\nhi\r\n", [UPO]),
    (b"HMSG foo 1 2 3\r\n", [UPO]),
    (b"RS+ $G foo\r\n", [UPO]),
    (b"A+ foo\r\n", [UPO]),
    (b"LS+ foo\r\n", [UPO]),
    (b"\r\nPING\r\n", [UPO]),
    (b"\nPING\r\n", [UPO]),
    (b" PING\r\n", [UPO]),
    # SUB: a bad subject is an -ERR that keeps the connection
    (b"SUB foo 1\r\nPING\r\n", [ev.Sub("foo", None, "1"), ev.Ping()]),
    (b"SUB foo  q\t 1\r\n", [ev.Sub("foo", "q", "1")]),
    (b"SUB foo q.* 1\r\n", [ev.Sub("foo", "q.*", "1")]),
    (b"SUB foo* 1\r\n", [ev.Sub("foo*", None, "1")]),
    (b"SUB foo\r1\r\n", [ev.Sub("foo", None, "1")]),
    (b"SUB \nfoo 1\r\n", [ev.Sub("foo", None, "1")]),
    (b"SUB f\xc3\xa9 \xff\r\n", [ev.Sub("f\xe9", None, "\udcff")]),
    (b"SUB foo..bar 1\r\nPING\r\n", [INVALID_SUBJECT, ev.Ping()]),
    (b"SUB foo.>.bar 1\r\nPING\r\n", [INVALID_SUBJECT, ev.Ping()]),
    (b"SUB .foo 1\r\n", [INVALID_SUBJECT]),
    (b"SUB foo. 1\r\n", [INVALID_SUBJECT]),
    (
        b"SUB > 1\r\nSUB * 2\r\nSUB *.> 3\r\nSUB >.> 4\r\n",
        [ev.Sub(">", None, "1"), ev.Sub("*", None, "2"), ev.Sub("*.>", None, "3"), INVALID_SUBJECT],
    ),
    (b"SUB foo\r\nPING\r\n", [SILENT]),
    (b"SUB a b c d\r\n", [SILENT]),
    (b"SUB\r\n", [UPO]),
    (b"SUB \r\n", [SILENT]),
    # UNSUB
    (b"UNSUB 1\r\n", [ev.Unsub("1", None)]),
    (b"UNSUB 1 5\r\n", [ev.Unsub("1", 5)]),
    (b"UNSUB 1 0\r\n", [ev.Unsub("1", 0)]),
    (b"UNSUB 1 x\r\nPING\r\n", [ev.Unsub("1", None), ev.Ping()]),
    (b"UNSUB 1\t\t5 \r\n", [ev.Unsub("1", 5)]),
    (b"UNSUB 1\r5\r\n", [ev.Unsub("1", 5)]),
    (b"UNSUB\r\n", [UPO]),
    (b"UNSUB \r\n", [SILENT]),
    (b"UNSUB 1 2 3\r\n", [SILENT]),
    # +OK is ignored, -ERR closes silently
    (b"+OK\r\nPING\r\n", [ev.Ping()]),
    (b"+OK garbage\r\nPING\r\n", [ev.Ping()]),
    (b"+OK " + b"x" * 10000 + b"\r\nPING\r\n", [ev.Ping()]),
    (b"-ERR 'x'\r\nPING\r\n", [SILENT]),
    (b"-ERR\t\r\n", [SILENT]),
    (b"-ERR\r\n", [UPO]),
    # INFO from a client: ignored if it is JSON
    (b"INFO {}\r\nPING\r\n", [ev.Ping()]),
    (b"INFO{}\r\nPING\r\n", [ev.Ping()]),
    (b"INFO {bad\r\nPING\r\n", [SILENT]),
    (b"INFO\r\n", [SILENT]),
    # CONNECT
    (b"CONNECT {}\r\nPING\r\n", [ev.Connect({}), ev.Ping()]),
    (b"CONNECT{}\r\n", [ev.Connect({})]),
    (b"CONNECT\n{}\r\n", [ev.Connect({})]),
    (b"CONNECT {}\nPING\n", [ev.Connect({}), ev.Ping()]),
    (b"CONNECT {}  \t \r\n", [ev.Connect({})]),
    (b"CONNECT null\r\n", [ev.Connect({})]),
    (b'CONNECT {"verbose":"x"}\r\n', [ev.Connect({"verbose": "x"})]),  # type: the session's
    (b'CONNECT {"name":"\xff"}\r\n', [ev.Connect({"name": "\ufffd"})]),
    (b"CONNECT {bad\r\nPING\r\n", [SILENT]),
    (b"CONNECT []\r\n", [SILENT]),
    (b"CONNECT {} x\r\n", [SILENT]),
    (b'CONNECT {"x":NaN}\r\n', [SILENT]),
    (b'CONNECT {"name":"a\x01"}\r\n', [SILENT]),
    (b"CONNECT\r\n", [SILENT]),
    (b"CONNECT \r\n", [SILENT]),
    # max_control_line: the argument after the op and its spaces, up to 4096 bytes
    (b"PUB " + pub_arg(4096) + b"\r\nx\r\n", [ev.Pub("s" * 4094, None, b"x")]),
    (b"PUB " + pub_arg(4096) + b"\nx\r\n", [ev.Pub("s" * 4094, None, b"x")]),
    (b"PUB" + b" " * 5000 + pub_arg(4096) + b"\r\nx\r\n", [ev.Pub("s" * 4094, None, b"x")]),
    (b"PUB " + pub_arg(4097) + b"\r\nx\r\n", [MAX_LINE]),
    (b"PUB " + pub_arg(4097) + b"\nx\r\n", [MAX_LINE]),
    (b"PUB " + pub_arg(4096) + b" \r\nx\r\n", [MAX_LINE]),
    (b"SUB " + b"s" * 4095 + b" 1\r\n", [MAX_LINE]),
    (b"UNSUB " + b"1" * 4097 + b"\r\n", [MAX_LINE]),
    (b"-ERR " + b"x" * 4097 + b"\r\n", [MAX_LINE]),
    (b"HMSG " + b"x" * 4097 + b"\r\n\r\n", [MAX_LINE]),
    (b'CONNECT {"name":"' + b"x" * (4096 - 11) + b'"}\r\n', [ev.Connect({"name": "x" * 4085})]),
    (b'CONNECT {"name":"' + b"x" * (4097 - 11) + b'"}\r\n', [MAX_LINE]),
    (b'INFO {"name":"' + b"x" * (4097 - 11) + b'"}\r\n', [MAX_LINE]),
    (b"PUB " + b"s" * 5000, [MAX_LINE]),  # an unfinished line is checked too
]


def test_transcripts() -> None:
    for data, expected in TRANSCRIPTS:
        assert feed(data) == expected, data[:80]


def test_transcripts_split_anywhere() -> None:
    for data, expected in TRANSCRIPTS:
        steps = range(0, len(data) + 1, 97) if len(data) > 300 else range(len(data) + 1)
        for i in steps:
            assert feed_chunks([data[:i], data[i:]]) == expected, (data[:80], i)


def test_transcripts_byte_by_byte() -> None:
    for data, expected in TRANSCRIPTS:
        if len(data) < 300:
            assert feed_chunks([bytes([b]) for b in data]) == expected, data


def test_deep_connect_json() -> None:
    # verified: nats-server (Go's json, max depth 10000) accepts 1500 levels; Python's
    # json needs a raised recursion limit for that
    events = feed(b'CONNECT {"x":' + b"[" * 1500 + b"]" * 1500 + b"}\r\nPING\r\n")
    assert len(events) == 2 and events[1] == ev.Ping()
    assert isinstance(events[0], ev.Connect)
    value, depth = events[0].options["x"], 0
    while value:
        value, depth = value[0], depth + 1
    assert depth == 1499
    codec = NATSClientCodec(max_control_line=30000)
    codec.receive_data(b"CONNECT " + b"[" * 10001 + b"]" * 10001 + b"\r\n")
    assert codec.next_event() == SILENT


def test_no_events_after_close() -> None:
    codec = new_codec()
    codec.receive_data(b"FOO\r\nPING\r\n")
    assert codec.next_event() == UPO
    codec.receive_data(b"PING\r\n")
    assert codec.next_event() is None


def test_unfinished_line_limit() -> None:
    # verified: 4097 argument bytes in one read, CRLF in the next -> -ERR and close;
    # 4096 + CR in one read, LF in the next -> fine (the CR is the dropped byte)
    assert feed_chunks([b"PUB " + pub_arg(4097), b"\r\nx\r\n"]) == [MAX_LINE]
    assert feed_chunks([b"PUB " + pub_arg(4096), b"\r\nx\r\n"]) == [ev.Pub("s" * 4094, None, b"x")]
    assert feed_chunks([b"PUB " + pub_arg(4096) + b"\r", b"\nx\r\n"]) == [
        ev.Pub("s" * 4094, None, b"x")
    ]
    codec = new_codec()
    codec.receive_data(b"SUB " + b"s" * 4097)
    assert codec.next_event() == MAX_LINE


def test_skipped_bytes_are_not_kept() -> None:
    codec = new_codec()
    codec.receive_data(b"PING " + b"x" * 70000)
    assert codec.next_event() is None
    assert codec.buffered == 0
    codec.receive_data(b"x" * 70000 + b"\r\n")
    assert codec.next_event() == ev.Ping()
    codec.receive_data(b"PUB" + b" " * 100000)
    assert codec.next_event() is None
    assert codec.buffered <= 4
    codec.receive_data(b"foo 1\r\nx\r\n")
    assert codec.next_event() == ev.Pub("foo", None, b"x")


def test_hpub_needs_headers() -> None:
    # verified: HPUB without CONNECT, or after a CONNECT without headers:true, closes
    # silently, even an oversized one (the headers check comes first)
    hpub = b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
    assert feed(hpub, headers=False) == [SILENT]
    assert feed(b"HPUB foo 1048577 1048577\r\n", headers=False) == [SILENT]
    assert feed(b'CONNECT {"headers":true}\r\n' + hpub, headers=False) == [
        ev.Connect({"headers": True}),
        ev.HPub("foo", None, b"NATS/1.0\r\n\r\n", b"hi"),
    ]
    # verified: keys match case-insensitively
    assert feed(b'CONNECT {"HEADERS":true}\r\n' + hpub, headers=False)[1] == ev.HPub(
        "foo", None, b"NATS/1.0\r\n\r\n", b"hi"
    )
    # verified: a second CONNECT without the field keeps headers on
    assert feed(b'CONNECT {"headers":true}\r\nCONNECT {}\r\n' + hpub, headers=False)[2] == (
        ev.HPub("foo", None, b"NATS/1.0\r\n\r\n", b"hi")
    )
    assert feed(b'CONNECT {"headers":false}\r\n' + hpub)[1] == SILENT


def test_require_connect() -> None:
    # verified with --user/--pass: anything but CONNECT first -> Authorization Violation;
    # an op that starts with c but isn't CONNECT -> Unknown Protocol Operation
    for data, expected in [
        (b"PING\r\n", [AUTH]),
        (b"XYZ\r\n", [AUTH]),
        (b"P", [AUTH]),
        (b"PUB foo 2\r\nhi\r\n", [AUTH]),
        (b"cx\r\n", [UPO]),
        (
            b'CONNECT {"user":"u","pass":"p"}\r\nPING\r\n',
            [ev.Connect({"user": "u", "pass": "p"}), ev.Ping()],
        ),
        (b"CONNECT {bad\r\n", [SILENT]),
    ]:
        for i in range(len(data) + 1):
            codec = NATSClientCodec()
            codec.require_connect = True
            out = []
            for chunk in (data[:i], data[i:]):
                codec.receive_data(chunk)
                out += drain(codec)
            assert out == expected, (data, i)


def test_limits_are_settable() -> None:
    codec = NATSClientCodec(max_payload=10, max_control_line=16)
    codec.receive_data(b"PUB foo 10\r\n0123456789\r\nPUB foo 11\r\n")
    assert drain(codec) == [ev.Pub("foo", None, b"0123456789"), MAX_PAYLOAD]
    codec = NATSClientCodec(max_payload=10, max_control_line=16)
    codec.receive_data(b"PUB " + pub_arg(16) + b"\r\nx\r\nPUB " + pub_arg(17) + b"\r\n")
    assert drain(codec) == [ev.Pub("s" * 14, None, b"x"), MAX_LINE]


def test_many_ops_per_read() -> None:
    data = b"".join(b"PUB foo.%d r 3\r\nabc\r\n" % i for i in range(1000)) + b"PING\r\n"
    events = feed(data)
    assert len(events) == 1001
    assert events[999] == ev.Pub("foo.999", "r", b"abc")
    assert events[-1] == ev.Ping()
    assert feed_chunks([data[i : i + 1000] for i in range(0, len(data), 1000)]) == events


def test_large_payload_in_pieces() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    data = b"PUB big 1048576\r\n" + body + b"\r\nPING\r\n"
    codec = new_codec()
    out = []
    for i in range(0, len(data), 65536):
        codec.receive_data(data[i : i + 65536])
        out += drain(codec)
    assert out == [ev.Pub("big", None, body), ev.Ping()]
    assert codec.buffered == 0


def test_connect_option() -> None:
    assert connect_option({"headers": True}, "headers") is True
    assert connect_option({"Headers": True}, "headers") is True
    assert connect_option({"headers": True, "HEADERS": False}, "headers") is False
    assert connect_option({"headers": True, "HEADERS": None}, "headers") is True
    assert connect_option({"headers": None}, "headers", False) is False
    assert connect_option({"pa\u017f\u017f": "x"}, "pass") == "x"  # Go folds long s
    assert connect_option({"pa\xdf": "x"}, "pass") is None  # but not sharp s
    assert connect_option({}, "verbose", True) is True


# -- frames ---------------------------------------------------------------------------


def test_frames() -> None:
    assert PING == b"PING\r\n"
    assert PONG == b"PONG\r\n"
    assert OK == b"+OK\r\n"
    assert err("Stale Connection") == b"-ERR 'Stale Connection'\r\n"
    assert ERR_UNKNOWN_OP == b"-ERR 'Unknown Protocol Operation'\r\n"
    assert ERR_MAX_PAYLOAD == b"-ERR 'Maximum Payload Violation'\r\n"
    assert ERR_MAX_CONTROL_LINE == b"-ERR 'maximum control line exceeded'\r\n"
    assert ERR_AUTH_VIOLATION == b"-ERR 'Authorization Violation'\r\n"
    assert ERR_INVALID_PUBLISH_SUBJECT == b"-ERR 'Invalid Publish Subject'\r\n"
    # as captured from nats-server
    assert msg("foo.a", "1", None, b"hello") == b"MSG foo.a 1 5\r\nhello\r\n"
    assert msg("foo", "1", "bar", b"hi") == b"MSG foo 1 bar 2\r\nhi\r\n"
    assert msg(b"foo", b"1", b"", b"") == b"MSG foo 1 0\r\n\r\n"
    assert msg("f\udcff", "1", None, b"") == b"MSG f\xff 1 0\r\n\r\n"
    assert hmsg("_INBOX.x", "9", None, b"NATS/1.0 503\r\n\r\n", b"") == (
        b"HMSG _INBOX.x 9 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
    )
    assert hmsg("foo", "1", "r", b"ab", b"cd") == b"HMSG foo 1 r 2 4\r\nabcd\r\n"
    # the same frames from a subscription's `<subject> <sid>`, made once
    names = msg_names("foo.a", "1")
    assert names == b"foo.a 1"
    assert msg_frame(names, None, b"hello") == msg("foo.a", "1", None, b"hello")
    assert msg_frame(names, "bar", b"hi") == b"MSG foo.a 1 bar 2\r\nhi\r\n"
    assert hmsg_frame(names, "r", b"ab", b"cd") == b"HMSG foo.a 1 r 2 4\r\nabcd\r\n"
    assert hmsg_frame(names, None, b"ab", b"") == b"HMSG foo.a 1 2 2\r\nab\r\n"


def test_info_frame() -> None:
    # nats-server: "INFO " + Go JSON + " \r\n"
    frame = info({"server_id": "X", "proto": 1, "headers": True, "max_payload": 1048576})
    assert frame == (b'INFO {"server_id":"X","proto":1,"headers":true,"max_payload":1048576} \r\n')
    assert info({"n": "<&>\u2028é"}) == (b'INFO {"n":"\\u003c\\u0026\\u003e\\u2028\xc3\xa9"} \r\n')
    assert json.loads(info({"a": "<x>"})[5:-3]) == {"a": "<x>"}


def test_frames_round_trip_through_the_codec_shape() -> None:
    # what msg() builds parses like a PUB of the same fields (MSG has the sid in front)
    frame = msg("foo.bar", "7", "reply.to", b"payload")
    head, _, rest = frame.partition(b"\r\n")
    assert head.split(b" ") == [b"MSG", b"foo.bar", b"7", b"reply.to", b"7"]
    assert rest == b"payload\r\n"


# -- garbage ----------------------------------------------------------------------------

_PIECES = st.sampled_from(
    [
        b"PUB ",
        b"pub ",
        b"HPUB ",
        b"SUB ",
        b"UNSUB ",
        b"CONNECT ",
        b"INFO ",
        b"PING",
        b"PONG",
        b"+OK",
        b"-ERR ",
        b"HMSG ",
        b"foo",
        b"foo.*",
        b">",
        b"q",
        b" ",
        b"\t",
        b"\r",
        b"\n",
        b"\r\n",
        b"0",
        b"1",
        b"2",
        b"12",
        b"999999999",
        b"{}",
        b'{"headers":true}',
        b"NATS/1.0\r\n\r\n",
        b"x",
    ]
)
_GARBAGE = st.one_of(
    st.binary(max_size=200),
    st.lists(_PIECES, max_size=40).map(b"".join),
)


@settings(max_examples=400, deadline=None)
@given(_GARBAGE, st.lists(st.integers(min_value=0, max_value=250), max_size=6), st.booleans())
def test_garbage(data: bytes, cuts: list[int], headers: bool) -> None:
    whole = feed(data, headers)
    for i, event in enumerate(whole):
        assert isinstance(event, ev.Event)  # type: ignore[arg-type]
        if isinstance(event, ev.ProtocolError) and event.close:
            assert i == len(whole) - 1
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert feed_chunks(chunks, headers) == whole
