"""The NATS route codec alone: captured route traffic, the error tables, frames, garbage.

The message, interest and error lines below are the ones docs/protocols/nats-route.md records
from nats-server 2.9.10 and 2.15.1 (§7, §8, §9); the argument rules come from route.go. A
ProtocolError is compared by its reply only (SILENT: close without a reply); the reason
is a log text, checked separately.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocols.nats import route_events as ev
from gateway.protocols.nats.route_codec import (
    ERR_MAX_CONTROL_LINE,
    ERR_MAX_PAYLOAD,
    ERR_UNKNOWN_OP,
    MAX_ROUTE_CONTROL_LINE,
    MAX_ROUTE_PAYLOAD,
    PING,
    PONG,
    RouteCodec,
    connect,
    err,
    hmsg,
    info,
    rmsg,
    rs_minus,
    rs_plus,
)

UPO = ev.ProtocolError(b"-ERR 'Unknown Protocol Operation'\r\n", "")
SILENT = ev.ProtocolError(None, "")
MAX_PAYLOAD = ev.ProtocolError(b"-ERR 'Maximum Payload Violation'\r\n", "")
MAX_LINE = ev.ProtocolError(b"-ERR 'maximum control line exceeded'\r\n", "")

HDR18 = b"NATS/1.0\r\nX: 1\r\n\r\n"  # 18 bytes
HDR20 = b"NATS/1.0\r\nX-A: 1\r\n\r\n"  # 20 bytes


def _blank_reasons(events: list[ev.Event]) -> list[ev.Event]:
    return [ev.ProtocolError(e.reply, "") if isinstance(e, ev.ProtocolError) else e for e in events]


def drain(codec: RouteCodec) -> list[ev.Event]:
    out: list[ev.Event] = []
    while (event := codec.next_event()) is not None:
        out.append(event)
    return out


def feed_chunks(chunks: list[bytes], codec: RouteCodec | None = None) -> list[ev.Event]:
    codec = codec or RouteCodec()
    out: list[ev.Event] = []
    for chunk in chunks:
        codec.receive_data(chunk)
        out += drain(codec)
    return _blank_reasons(out)


def feed(data: bytes) -> list[ev.Event]:
    return feed_chunks([data])


def msg(
    subject: str,
    payload: bytes,
    reply: str | None = None,
    queues: tuple[str, ...] | None = None,
    header: bytes | None = None,
    origin: str | None = None,
    account: str = "$G",
) -> ev.Msg:
    return ev.Msg(account, subject, reply, queues, header, payload, origin)


def sub(
    subject: str,
    queue: str | None = None,
    weight: int | None = None,
    origin: str | None = None,
    account: str = "$G",
) -> ev.RemoteSub:
    return ev.RemoteSub(account, subject, queue, weight, origin)


def unsub(
    subject: str, queue: str | None = None, origin: str | None = None, account: str = "$G"
) -> ev.RemoteUnsub:
    return ev.RemoteUnsub(account, subject, queue, origin)


SERVER_INFO = (
    b'INFO {"server_id":"NB5GUVX","server_name":"NB5GUVX","version":"2.15.1","proto":3,'
    b'"headers":true,"max_payload":1048576,"cluster":"C","connect_urls":["127.0.0.1:57885"],'
    b'"compression":"accept","lnoc":true,"lnocu":true,"ln":true,"route_pool_size":3} \r\n'
)
SERVER_CONNECT = (
    b'CONNECT {"echo":true,"verbose":false,"pedantic":false,"tls_required":false,'
    b'"headers":true,"name":"NBD4BKBN","cluster":"C","lnoc":true,"ln":true}\r\n'
)
LONG = MAX_ROUTE_CONTROL_LINE

# (input, the events it must give)
TRANSCRIPTS: list[tuple[bytes, list[ev.Event]]] = [
    # INFO and CONNECT as the servers send them (§2), including INFO's `} \r\n`
    (SERVER_INFO, [ev.Info(json.loads(SERVER_INFO[5:-3]))]),
    (SERVER_CONNECT, [ev.Connect(json.loads(SERVER_CONNECT[8:-2]))]),
    (b'info {"server_id":"X"}\n', [ev.Info({"server_id": "X"})]),
    (b"INFO\t \t{} \t\r\nPING\r\n", [ev.Info({}), ev.Ping()]),
    (b'INFO {"a":"\xff"}\r\n', [ev.Info({"a": "\ufffd"})]),
    (b'CONNECT {"lang":"python"}\r\n', [ev.Connect({"lang": "python"})]),  # the session's call
    (b"INFO {bad\r\nPING\r\n", [SILENT]),
    (b"INFO []\r\n", [SILENT]),
    (b"INFO null\r\n", [SILENT]),
    (b'INFO "x"\r\n', [SILENT]),
    (b"INFO {} x\r\n", [SILENT]),
    (b'INFO {"x":NaN}\r\n', [SILENT]),
    (b"INFO\r\n", [SILENT]),
    (b"CONNECT {bad\r\n", [SILENT]),
    (b"CONNECT 1\r\n", [SILENT]),
    (b"CONNECT\r\n", [SILENT]),
    (b"INFO{}\r\n", [UPO]),
    (b"CONNECT{}\r\n", [UPO]),
    # PING, PONG, +OK, -ERR
    (b"PING\r\n", [ev.Ping()]),
    (b"ping\r\n", [ev.Ping()]),
    (b"PING\n", [ev.Ping()]),
    (b"Ping  extra\r\n", [ev.Ping()]),
    (b"PONG\r\npong\n", [ev.Pong(), ev.Pong()]),
    (b"+OK\r\n+ok\r\n", [ev.Ok(), ev.Ok()]),
    (b"-ERR 'Stale Connection'\r\n", [ev.Err("Stale Connection")]),
    (
        b'-ERR \'Not possible to have a dedicated route for account "$SYS" between those'
        b" servers'\r\n",
        [ev.Err('Not possible to have a dedicated route for account "$SYS" between those servers')],
    ),
    (
        b"-ERR 'Authorization Violation'\r\nPING\r\n",
        [ev.Err("Authorization Violation"), ev.Ping()],  # closing is the session's job
    ),
    (b"-err\t no quotes \r\n", [ev.Err("no quotes")]),
    (b"-ERR '\xff'\r\n", [ev.Err("\ufffd")]),
    (b"-ERR\r\n", [ev.Err("")]),
    # RS+ / RS- (§7)
    (b"RS+ $G foo\r\n", [sub("foo")]),
    (
        b"RS+ $SYS $SYS.REQ.ACCOUNT.*.SUBSZ\r\n",
        [sub("$SYS.REQ.ACCOUNT.*.SUBSZ", account="$SYS")],
    ),
    (b"RS+ $G gw.wild.*\r\nRS+ $G gw.fwc.>\r\n", [sub("gw.wild.*"), sub("gw.fwc.>")]),
    (
        b"RS+ $G to.q workers 1\r\nRS+ $G to.q workers 2\r\nRS+ $G to.q workers 1\r\n"
        b"RS- $G to.q workers\r\n",
        [
            sub("to.q", "workers", 1),
            sub("to.q", "workers", 2),
            sub("to.q", "workers", 1),
            unsub("to.q", "workers"),
        ],
    ),
    (b"RS+ $G to.q workers 0\r\n", [sub("to.q", "workers", 0)]),
    (b"RS+ $G to.q workers 007\r\n", [sub("to.q", "workers", 7)]),
    (b"rs+ $G foo\nrs- $G foo\n", [sub("foo"), unsub("foo")]),
    (b"RS+\t$G \t foo \t\r\n", [sub("foo")]),
    (b"RS+ $G f\xc3\xa9\xff\r\n", [sub("f\xe9\udcff")]),
    (b"RS- $G foo\r\n", [unsub("foo")]),
    (b"RS+ $G\r\n", [SILENT]),
    (b"RS+ $G foo q\r\n", [SILENT]),
    (b"RS+ $G foo q 1 extra\r\n", [SILENT]),
    (b"RS+ $G foo q x\r\n", [SILENT]),
    (b"RS+ $G foo q -1\r\n", [SILENT]),
    (b"RS+ $G foo q 1234567890\r\n", [SILENT]),
    (b"RS+\r\n", [SILENT]),
    (b"RS+ \r\n", [SILENT]),
    (b"RS- $G foo q 1\r\n", [SILENT]),
    (b"RS- $G\r\n", [SILENT]),
    # LS+ / LS- (§8, leafnode origin)
    (b"LS+ LEAFC $G leaf.sub\r\n", [sub("leaf.sub", origin="LEAFC")]),
    (b"LS+ LEAFC $G leaf.q lq 1\r\n", [sub("leaf.q", "lq", 1, "LEAFC")]),
    (b"LS- LEAFC $G leaf.sub\r\n", [unsub("leaf.sub", origin="LEAFC")]),  # 2.15, our lnocu
    (b"LS- LEAFC $G leaf.q lq\r\n", [unsub("leaf.q", "lq", "LEAFC")]),
    (b"LS-  $G leaf.sub\r\n", [unsub("leaf.sub")]),  # 2.9.10: empty origin
    (b"LS-  $G leaf.q lq\r\n", [unsub("leaf.q", "lq")]),  # 2.9.10, a queue
    (b"LS- $G leaf.sub\r\n", [unsub("leaf.sub")]),  # 2.10+ without our lnocu
    (b"ls-\t\t$G leaf.sub\n", [unsub("leaf.sub")]),
    (b"LS+ $G leaf.sub\r\n", [SILENT]),
    (b"LS+ LEAFC $G leaf.q lq\r\n", [SILENT]),
    (b"LS+ LEAFC $G leaf.q lq 1 x\r\n", [SILENT]),
    (b"LS+ LEAFC $G leaf.q lq x\r\n", [SILENT]),
    (b"LS+\r\n", [SILENT]),
    (b"LS- x\r\n", [SILENT]),
    (b"LS- a b c d e\r\n", [SILENT]),
    (b"LS-  a b c d\r\n", [SILENT]),
    # RMSG (§8): every captured form
    (b"RMSG $G gw.plain 5\r\nhello\r\n", [msg("gw.plain", b"hello")]),
    (b"RMSG $G gw.plain my.reply 6\r\nhello!\r\n", [msg("gw.plain", b"hello!", "my.reply")]),
    (b"RMSG $G gw.q | grp 2\r\nhi\r\n", [msg("gw.q", b"hi", None, ("grp",))]),
    (b"RMSG $G gw.q + rr.1 grp 2\r\nhi\r\n", [msg("gw.q", b"hi", "rr.1", ("grp",))]),
    (b"RMSG $G mq | g1 g2 1\r\nx\r\n", [msg("mq", b"x", None, ("g1", "g2"))]),
    (b"RMSG $G mq + rp g1 g2 1\r\nx\r\n", [msg("mq", b"x", "rp", ("g1", "g2"))]),
    (b"RMSG $G nh.x 4\r\nbody\r\n", [msg("nh.x", b"body")]),
    (
        b"RMSG $G svc.echo _INBOX.xxx.yyy 4\r\nping\r\n",
        [msg("svc.echo", b"ping", "_INBOX.xxx.yyy")],
    ),
    (b"RMSG $G foo 0\r\n\r\nPING\r\n", [msg("foo", b""), ev.Ping()]),
    (b"RMSG $G foo 4\r\n\r\n\r\n\r\n", [msg("foo", b"\r\n\r\n")]),
    (b"rmsg $G foo 2\nhi\r\n", [msg("foo", b"hi")]),
    (b"RMSG\t$G  foo\t 2 \r\nhi\r\n", [msg("foo", b"hi")]),
    (b"RMSG $G foo 02\r\nhi\r\n", [msg("foo", b"hi")]),
    (b"RMSG $SYS $SYS.x 1\r\nx\r\n", [msg("$SYS.x", b"x", account="$SYS")]),
    (b"RMSG $G foo + r 2\r\nhi\r\n", [msg("foo", b"hi", "r", ())]),  # a marker, no queues
    (b"RMSG $G foo | 2\r\nhi\r\n", [msg("foo", b"hi", "|")]),  # 4 tokens: `|` is the reply
    (b"RMSG $G foo\rbar 2\r\nhi\r\n", [msg("foo", b"hi", "bar")]),  # route.go splits on \r
    (b"RMSG $G f\xff 1\r\n\xff\r\n", [msg("f\udcff", b"\xff")]),
    (b"RMSG foo 2\r\nhi\r\n", [SILENT]),  # no account (§9)
    (b"RMSG $G foo xx\r\n", [SILENT]),  # Bad or Missing Size (§9)
    (b"RMSG $G foo x q 2\r\nhi\r\n", [SILENT]),  # Bad or Missing Reply Indicator (§8)
    (b"RMSG $G foo ++ r q 2\r\nhi\r\n", [SILENT]),
    (b"RMSG $G foo | q x\r\n", [SILENT]),
    (b"RMSG $G foo -1\r\n", [SILENT]),
    (b"RMSG $G foo +2\r\n", [SILENT]),
    (b"RMSG $G foo 1234567890\r\n", [SILENT]),
    (b"RMSG\r\n", [SILENT]),
    (b"RMSG $G foo 2\r\nhix\r\n", [UPO]),  # a payload longer than its size (§9)
    (b"RMSG $G foo 2\r\nh\r\n", [UPO]),
    (b"RMSG $G foo 2\r\nhi\nPING\r\n", [UPO]),
    (b"RMSG $G foo 2\r\nhi\r\rPING\r\n", [UPO]),
    (b"RMSG $G foo 2\r\nhi\r\nXYZ\r\n", [msg("foo", b"hi"), UPO]),
    # HMSG: total includes the header block
    (
        b"HMSG $G gw.plain r.1 20 22\r\n" + HDR20 + b"hb\r\n",
        [msg("gw.plain", b"hb", "r.1", header=HDR20)],
    ),
    (b"HMSG $G gw.plain 20 20\r\n" + HDR20 + b"\r\n", [msg("gw.plain", b"", header=HDR20)]),
    (
        b"HMSG $G gw.q + rr.2 grp 18 20\r\n" + HDR18 + b"hi\r\n",
        [msg("gw.q", b"hi", "rr.2", ("grp",), HDR18)],
    ),
    (
        b"HMSG $G gw.q | g1 g2 18 20\r\n" + HDR18 + b"hi\r\n",
        [msg("gw.q", b"hi", None, ("g1", "g2"), HDR18)],
    ),
    (b"hmsg $G foo 2 4\nabcd\r\n", [msg("foo", b"cd", header=b"ab")]),
    (b"HMSG $G foo 0 2\r\nhi\r\n", [msg("foo", b"hi", header=b"")]),
    (b"HMSG $G foo 14 12\r\n", [SILENT]),  # Header Size larger then TotalSize
    (b"HMSG $G foo 2\r\n", [SILENT]),
    (b"HMSG $G foo x 2\r\n", [SILENT]),
    (b"HMSG $G foo 1 x\r\n", [SILENT]),
    (b"HMSG $G foo x q 1 2\r\n", [SILENT]),
    (b"HMSG foo 0 2\r\n", [SILENT]),
    (b"HMSG $G foo 2 2\r\nab\n", [UPO]),
    # LMSG: origin first, header size always there
    (
        b"LMSG LEAFC $G gw.fromleaf 0 8\r\nfromleaf\r\n",
        [msg("gw.fromleaf", b"fromleaf", origin="LEAFC")],
    ),
    (
        b"LMSG LEAFC $G gw.fromleaf rep.x 18 21\r\n" + HDR18 + b"abc\r\n",
        [msg("gw.fromleaf", b"abc", "rep.x", None, HDR18, "LEAFC")],
    ),
    (
        b"LMSG LEAFC $G gw.q | lq 0 2\r\nhi\r\n",
        [msg("gw.q", b"hi", None, ("lq",), None, "LEAFC")],
    ),
    (
        b"LMSG LEAFC $G gw.q + r lq 18 18\r\n" + HDR18 + b"\r\n",
        [msg("gw.q", b"", "r", ("lq",), HDR18, "LEAFC")],
    ),
    (b"LMSG LEAFC $G foo 2\r\n", [SILENT]),
    (b"LMSG LEAFC $G foo 3 2\r\n", [SILENT]),
    (b"LMSG LEAFC $G foo x q 0 2\r\n", [SILENT]),
    (b"LMSG $G foo 0 2\r\nhi\r\n", [SILENT]),
    # ops nats-server drops on a route
    (b"SUB foo 1\r\nPING\r\n", [ev.Ignored("SUB"), ev.Ping()]),
    (b"sub foo q 1\r\n", [ev.Ignored("SUB")]),
    (b"PUB foo 2\r\nhi\r\nPING\r\n", [ev.Ignored("PUB"), ev.Ping()]),
    (b"pub foo bar 2\nhi\r\n", [ev.Ignored("PUB")]),
    (b"PUB foo 0\r\n\r\n", [ev.Ignored("PUB")]),
    (b"PUB foo 2\r\nhix\r\n", [UPO]),
    (b"PUB foo\r\n", [SILENT]),
    (b"PUB foo x\r\n", [SILENT]),
    (b"PUB a b c 1\r\n", [SILENT]),
    (b"A+ $G\r\nA- $G foo\r\na+ x\r\n", [ev.Ignored("A+"), ev.Ignored("A-"), ev.Ignored("A+")]),
    # unknown ops (§9): -ERR 'Unknown Protocol Operation'
    (b"FOO\r\n", [UPO]),
    (b"MSG foo 1 2\r\nhi\r\n", [UPO]),
    (b"UNSUB 1\r\n", [UPO]),
    (b"HPUB foo 0 2\r\nhi\r\n", [UPO]),
    (b"PINGX\r\n", [UPO]),
    (b"RMSGX $G foo 1\r\nx\r\n", [UPO]),
    (b"RS $G foo\r\n", [UPO]),
    (b"\r\nPING\r\n", [UPO]),
    (b"\nPING\r\n", [UPO]),
    (b" PING\r\n", [UPO]),
    (b"PING\r\r\n", [UPO]),
    (b"\x00\r\n", [UPO]),
    (b"X" * 100, [UPO]),  # unfinished: decided at the first byte
    (b"CONNECTED" + b"x" * 100, [UPO]),
    # control line limit: the whole line without \r\n, 64 KiB
    (b"RS+ $G " + b"s" * (LONG - 7) + b"\r\n", [sub("s" * (LONG - 7))]),
    (b"RS+ $G " + b"s" * (LONG - 7) + b"\n", [sub("s" * (LONG - 7))]),
    (b"RS+ $G " + b"s" * (LONG - 6) + b"\r\n", [MAX_LINE]),
    (b"RS+ $G " + b"s" * (LONG - 6) + b"\n", [MAX_LINE]),
    (b"RS+ $G " + b"s" * (LONG - 6), [MAX_LINE]),  # unfinished too
    (b"RS+ $G " + b"s" * (LONG - 7) + b"\r\r\n", [MAX_LINE]),
    (b"RMSG $G " + b"s" * (LONG - 10) + b" 1\r\nx\r\n", [msg("s" * (LONG - 10), b"x")]),
    (b"RMSG $G " + b"s" * (LONG - 9) + b" 1\r\nx\r\n", [MAX_LINE]),
    (b"PING " + b"x" * LONG + b"\r\n", [MAX_LINE]),
    (b"FOO " + b"x" * LONG + b"\r\n", [UPO]),  # the op is judged first
    # max_payload: 64 MiB
    (b"RMSG $G foo %d\r\n" % MAX_ROUTE_PAYLOAD, []),  # allowed: waits for the payload
    (b"RMSG $G foo %d\r\n" % (MAX_ROUTE_PAYLOAD + 1), [MAX_PAYLOAD]),
    (b"HMSG $G foo 0 %d\r\n" % (MAX_ROUTE_PAYLOAD + 1), [MAX_PAYLOAD]),
    (b"LMSG O $G foo 0 %d\r\n" % (MAX_ROUTE_PAYLOAD + 1), [MAX_PAYLOAD]),
    (b"PUB foo %d\r\n" % (MAX_ROUTE_PAYLOAD + 1), [MAX_PAYLOAD]),
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


def test_all_transcripts_in_one_stream() -> None:
    # everything that does not close, back to back, in chunks of every small size
    data = b"".join(
        d
        for d, events in TRANSCRIPTS
        if events and not any(isinstance(e, ev.ProtocolError) for e in events)
    )
    expected = [
        e
        for _, events in TRANSCRIPTS
        if events and not any(isinstance(e, ev.ProtocolError) for e in events)
        for e in events
    ]
    assert feed(data) == expected
    for size in (1, 2, 3, 7, 64, 1000):
        assert feed_chunks([data[i : i + size] for i in range(0, len(data), size)]) == expected


def test_reasons() -> None:
    def reason(data: bytes) -> str:
        codec = RouteCodec()
        codec.receive_data(data)
        event = drain(codec)[-1]
        assert isinstance(event, ev.ProtocolError)
        return event.reason

    assert "Parse Error" in reason(b"RMSG foo 2\r\n")
    assert "Bad or Missing Size" in reason(b"RMSG $G foo xx\r\n")
    assert "Bad or Missing Reply Indicator" in reason(b"RMSG $G foo x q 2\r\n")
    assert "Bad or Missing Reply Indicator" in reason(b"HMSG $G foo x q 1 2\r\n")
    assert "Header Size larger" in reason(b"HMSG $G foo 3 2\r\n")
    assert "processRoutedOriginClusterMsgArgs" in reason(b"LMSG O $G foo 3 2\r\n")
    assert "processRemoteSub" in reason(b"RS+ $G foo q\r\n")
    assert "processRemoteUnsub" in reason(b"RS- $G foo q 1\r\n")
    assert "INFO" in reason(b"INFO []\r\n")
    assert "CONNECT" in reason(b"CONNECT {\r\n")
    assert reason(b"FOO\r\n") == "Unknown Protocol Operation"


def test_constants() -> None:
    assert MAX_ROUTE_CONTROL_LINE == 65536
    assert MAX_ROUTE_PAYLOAD == 64 * 1024 * 1024
    assert UPO.reply == ERR_UNKNOWN_OP
    assert MAX_PAYLOAD.reply == ERR_MAX_PAYLOAD
    assert MAX_LINE.reply == ERR_MAX_CONTROL_LINE


# -- the reading machinery ----------------------------------------------------------------


def test_no_events_after_close() -> None:
    codec = RouteCodec()
    codec.receive_data(b"RMSG $G foo xx\r\nPING\r\n")
    assert _blank_reasons(drain(codec)) == [SILENT]
    codec.receive_data(b"PING\r\n")
    assert codec.next_event() is None
    assert codec.buffered == 0


def test_unknown_op_is_decided_at_the_first_impossible_byte() -> None:
    for prefix, decided in [
        (b"R", False),
        (b"RMSG", False),
        (b"rms", False),
        (b"PING\r", False),
        (b"CONNECT", False),
        (b"CONNECT\r", False),
        (b"\r", False),
        (b"RMSGX", True),
        (b"RMSG\rX", True),
        (b"CONNECTX", True),
        (b"Z", True),
        (b" ", True),
        (b"\r\r", True),
        (b"RMS ", True),
    ]:
        codec = RouteCodec()
        codec.receive_data(prefix)
        assert _blank_reasons(drain(codec)) == ([UPO] if decided else []), prefix


def test_unfinished_line_limit() -> None:
    # a final \r may be the one before the \n, so it does not count yet
    line = b"RS+ $G " + b"s" * (LONG - 7)
    assert feed_chunks([line + b"\r", b"\n"]) == [sub("s" * (LONG - 7))]
    assert feed_chunks([line, b"\r\n"]) == [sub("s" * (LONG - 7))]
    assert feed_chunks([line + b"s", b"\r\n"]) == [MAX_LINE]
    assert feed_chunks([line + b"\r\r", b"\n"]) == [MAX_LINE]
    # a peer cannot grow the buffer past the limit without a newline
    codec = RouteCodec()
    codec.receive_data(b"RS+ ")
    for _ in range(LONG // 1000 + 1):
        assert drain(codec) == []
        codec.receive_data(b"s" * 1000)
    assert _blank_reasons(drain(codec)) == [MAX_LINE]
    assert codec.buffered == 0


def test_limits_are_settable() -> None:
    codec = RouteCodec(max_control_line=16, max_payload=10)
    codec.receive_data(b"RMSG $G foo 10\r\n0123456789\r\nRMSG $G foo 11\r\n")
    assert _blank_reasons(drain(codec)) == [msg("foo", b"0123456789"), MAX_PAYLOAD]
    codec = RouteCodec(16, 10)
    codec.receive_data(b"RMSG $G fooooo 1\r\nx\r\nRMSG $G foooooo 1\r\nx\r\n")
    assert _blank_reasons(drain(codec)) == [msg("fooooo", b"x"), MAX_LINE]
    codec = RouteCodec(max_payload=4)
    codec.receive_data(b"HMSG $G foo 2 4\r\nabcd\r\nHMSG $G foo 2 5\r\n")
    assert _blank_reasons(drain(codec)) == [msg("foo", b"cd", header=b"ab"), MAX_PAYLOAD]


def test_many_messages_per_read() -> None:
    data = (
        b"".join(
            b"RMSG $G foo.%d r 3\r\nabc\r\nHMSG $G h.%d 2 5\r\nhhabc\r\nRS+ $G s.%d\r\n" % (i, i, i)
            for i in range(1000)
        )
        + b"PING\r\n"
    )
    events = feed(data)
    assert len(events) == 3001
    assert events[2997] == msg("foo.999", b"abc", "r")
    assert events[2998] == msg("h.999", b"abc", header=b"hh")
    assert events[2999] == sub("s.999")
    assert events[-1] == ev.Ping()
    assert feed_chunks([data[i : i + 1000] for i in range(0, len(data), 1000)]) == events


def test_large_payload_in_pieces() -> None:
    body = bytes(range(256)) * 4096 * 4  # 4 MiB
    data = b"RMSG $G big %d\r\n%s\r\nPING\r\n" % (len(body), body)
    codec = RouteCodec()
    out = []
    for i in range(0, len(data), 65536):
        codec.receive_data(data[i : i + 65536])
        out += drain(codec)
    assert out == [msg("big", body), ev.Ping()]
    assert codec.buffered == 0


def test_line_split_across_compaction() -> None:
    # over 64 KiB consumed and a line half read: the buffer is compacted under it
    head = b"RMSG $G foo 100\r\n" + b"x" * 100 + b"\r\n"
    codec = RouteCodec()
    codec.receive_data(head * 700 + b"RMSG $G fo")
    assert len(drain(codec)) == 700
    assert codec.buffered == 10
    codec.receive_data(b"o 1\r\n")
    assert codec.next_event() is None
    codec.receive_data(b"y\r\nRS+ $G a")
    assert codec.next_event() == msg("foo", b"y")
    assert codec.next_event() is None
    codec.receive_data(b"\r\n")
    assert codec.next_event() == sub("a")


def test_long_line_a_byte_at_a_time() -> None:
    # a line near the limit, fed one byte at a time (the codec must not rescan the line
    # for every byte: that took about a minute before; bench/ measures, tests do not time)
    subject = "s" * (LONG - 20)
    data = b"RMSG $G %s r 1\r\nx\r\nRS+ $G %s\r\n" % (subject.encode(), subject.encode())
    codec = RouteCodec()
    out: list[ev.Event] = []
    for i in range(len(data)):
        codec.receive_data(data[i : i + 1])
        out += drain(codec)
    assert out == [msg(subject, b"x", "r"), sub(subject)]


# -- frames ---------------------------------------------------------------------------


def test_frames() -> None:
    assert PING == b"PING\r\n"
    assert PONG == b"PONG\r\n"
    assert err("Stale Connection") == b"-ERR 'Stale Connection'\r\n"
    # the recommended CONNECT and INFO (§3, §4)
    assert connect(
        {
            "verbose": False,
            "pedantic": False,
            "tls_required": False,
            "headers": True,
            "name": "GW1",
            "cluster": "C",
        }
    ) == (
        b'CONNECT {"verbose":false,"pedantic":false,"tls_required":false,"headers":true,'
        b'"name":"GW1","cluster":"C"}\r\n'
    )
    assert connect({"name": "<&>"}) == b'CONNECT {"name":"\\u003c\\u0026\\u003e"}\r\n'
    assert info({"server_id": "GW1", "proto": 2}) == b'INFO {"server_id":"GW1","proto":2} \r\n'
    # interest (§7)
    assert rs_plus("$G", "foo") == b"RS+ $G foo\r\n"
    assert rs_plus("$G", "to.q", "workers", 2) == b"RS+ $G to.q workers 2\r\n"
    assert rs_plus("$G", "to.q", "workers", 0) == b"RS+ $G to.q workers 0\r\n"
    assert rs_plus("$G", "f\udcff") == b"RS+ $G f\xff\r\n"
    assert rs_minus("$G", "foo") == b"RS- $G foo\r\n"
    assert rs_minus("$G", "to.q", "workers") == b"RS- $G to.q workers\r\n"
    for args in [("q", None), (None, 1), ("q", -1), ("q", 10**9)]:
        try:
            rs_plus("$G", "foo", *args)
        except ValueError:
            pass
        else:
            raise AssertionError(args)
    # messages (§8), the captured forms
    assert rmsg("$G", "gw.plain", None, None, b"hello") == b"RMSG $G gw.plain 5\r\nhello\r\n"
    assert rmsg("$G", "gw.plain", "my.reply", None, b"hello!") == (
        b"RMSG $G gw.plain my.reply 6\r\nhello!\r\n"
    )
    assert rmsg("$G", "gw.q", None, ["grp"], b"hi") == b"RMSG $G gw.q | grp 2\r\nhi\r\n"
    assert rmsg("$G", "gw.q", "rr.1", ("grp",), b"hi") == b"RMSG $G gw.q + rr.1 grp 2\r\nhi\r\n"
    assert rmsg("$G", "mq", None, ("g1", "g2"), b"x") == b"RMSG $G mq | g1 g2 1\r\nx\r\n"
    assert rmsg("$G", "mq", "rp", ("g1", "g2"), b"x") == b"RMSG $G mq + rp g1 g2 1\r\nx\r\n"
    assert rmsg("$G", "foo", "", (), b"") == b"RMSG $G foo 0\r\n\r\n"  # empty = none
    assert hmsg("$G", "gw.plain", "r.1", None, HDR20, b"hb") == (
        b"HMSG $G gw.plain r.1 20 22\r\n" + HDR20 + b"hb\r\n"
    )
    assert hmsg("$G", "gw.plain", None, None, HDR20, b"") == (
        b"HMSG $G gw.plain 20 20\r\n" + HDR20 + b"\r\n"
    )
    assert hmsg("$G", "gw.q", "rr.2", ["grp"], HDR18, b"hi") == (
        b"HMSG $G gw.q + rr.2 grp 18 20\r\n" + HDR18 + b"hi\r\n"
    )
    assert hmsg("$G", "gw.q", None, ["grp"], HDR18, b"hi") == (
        b"HMSG $G gw.q | grp 18 20\r\n" + HDR18 + b"hi\r\n"
    )


def test_frames_round_trip() -> None:
    cases: list[tuple[bytes, ev.Event]] = [
        (connect({"name": "X", "cluster": "C"}), ev.Connect({"name": "X", "cluster": "C"})),
        (info({"server_id": "X", "headers": True}), ev.Info({"server_id": "X", "headers": True})),
        (PING, ev.Ping()),
        (PONG, ev.Pong()),
        (err("Stale Connection"), ev.Err("Stale Connection")),
        (rs_plus("$G", "a.*"), sub("a.*")),
        (rs_plus("$G", "a", "q", 3), sub("a", "q", 3)),
        (rs_minus("$G", "a"), unsub("a")),
        (rs_minus("$G", "a", "q"), unsub("a", "q")),
        (rmsg("$G", "s", None, None, b"p"), msg("s", b"p")),
        (rmsg("$G", "s", "r", None, b"p"), msg("s", b"p", "r")),
        (rmsg("$G", "s", None, ["a", "b"], b"p"), msg("s", b"p", None, ("a", "b"))),
        (rmsg("$G", "s", "r", ["a"], b""), msg("s", b"", "r", ("a",))),
        (hmsg("$G", "s", "r", ["a"], HDR18, b"p"), msg("s", b"p", "r", ("a",), HDR18)),
        (hmsg("$G", "s", None, None, b"", b"p"), msg("s", b"p", header=b"")),
    ]
    for frame, event in cases:
        assert feed(frame) == [event], frame
    stream = b"".join(frame for frame, _ in cases)
    assert feed_chunks([bytes([b]) for b in stream]) == [event for _, event in cases]


_TOKEN = (
    st.binary(min_size=1, max_size=12)
    .map(lambda b: b.translate(None, b" \t\r\n"))
    .filter(bool)
    .map(lambda b: b.decode("utf-8", "surrogateescape"))
)


@settings(max_examples=300, deadline=None)
@given(
    _TOKEN,
    _TOKEN,
    st.none() | _TOKEN,
    st.none() | st.lists(_TOKEN, max_size=4),
    st.none() | st.binary(max_size=40),
    st.binary(max_size=100),
)
def test_messages_round_trip(
    account: str,
    subject: str,
    reply: str | None,
    queues: list[str] | None,
    header: bytes | None,
    payload: bytes,
) -> None:
    if header is None:
        frame = rmsg(account, subject, reply, queues, payload)
    else:
        frame = hmsg(account, subject, reply, queues, header, payload)
    expected = ev.Msg(
        account, subject, reply, tuple(queues) if queues else None, header, payload, None
    )
    assert feed(frame) == [expected]
    assert feed_chunks([frame[:7], frame[7:]]) == [expected]


@settings(max_examples=200, deadline=None)
@given(_TOKEN, _TOKEN, st.none() | st.tuples(_TOKEN, st.integers(0, 999_999_999)))
def test_interest_round_trip(account: str, subject: str, queue: tuple[str, int] | None) -> None:
    if queue is None:
        assert feed(rs_plus(account, subject)) == [ev.RemoteSub(account, subject, None, None, None)]
        assert feed(rs_minus(account, subject)) == [ev.RemoteUnsub(account, subject, None, None)]
    else:
        name, weight = queue
        assert feed(rs_plus(account, subject, name, weight)) == [
            ev.RemoteSub(account, subject, name, weight, None)
        ]
        assert feed(rs_minus(account, subject, name)) == [
            ev.RemoteUnsub(account, subject, name, None)
        ]


# -- garbage ----------------------------------------------------------------------------

_PIECES = st.sampled_from(
    [
        b"RMSG ",
        b"rmsg ",
        b"HMSG ",
        b"LMSG ",
        b"RS+ ",
        b"RS- ",
        b"LS+ ",
        b"LS- ",
        b"INFO ",
        b"CONNECT ",
        b"PING",
        b"PONG",
        b"+OK",
        b"-ERR ",
        b"SUB ",
        b"PUB ",
        b"A+ ",
        b"$G ",
        b"foo",
        b"q",
        b"+ ",
        b"| ",
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
        b"NATS/1.0\r\n\r\n",
        b"x",
    ]
)
_GARBAGE = st.one_of(
    st.binary(max_size=200),
    st.lists(_PIECES, max_size=40).map(b"".join),
)
_EVENT_TYPES = (
    ev.Info,
    ev.Connect,
    ev.Ping,
    ev.Pong,
    ev.Ok,
    ev.Err,
    ev.RemoteSub,
    ev.RemoteUnsub,
    ev.Msg,
    ev.Ignored,
    ev.ProtocolError,
)


@settings(max_examples=500, deadline=None)
@given(_GARBAGE, st.lists(st.integers(min_value=0, max_value=250), max_size=6))
def test_garbage(data: bytes, cuts: list[int]) -> None:
    codec = RouteCodec()
    codec.receive_data(data)
    whole = drain(codec)
    for i, event in enumerate(whole):
        assert isinstance(event, _EVENT_TYPES)
        if isinstance(event, ev.ProtocolError):
            assert i == len(whole) - 1
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert feed_chunks(chunks) == _blank_reasons(whole)
