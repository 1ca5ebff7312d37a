"""NATS client protocol, server side, sans-IO: what nats-server's parser.go accepts.

`NATSClientCodec` turns the bytes of one client connection into the events of
client_events.py, with the framing, argument splitting and limits of nats-server's client
parser, so bad input gets the reply (or the silent close) a real nats-server gives. Frames
for the client come from the pure functions at the end. No sockets, no clock, no broker.

Reading is pull-style (h11): feed bytes with `receive_data`, then call `next_event` until
it returns None.

How nats-server frames client input (parser.go; all verified live against 2.9.10 and
2.15.1, see tests/unit/test_nats_client_codec.py):

* Op names are case-insensitive (`pub`, `Ping`). PUB, HPUB, SUB, UNSUB and -ERR need a
  space or tab after the name; CONNECT and INFO don't (`CONNECT{}` works). Runs of spaces
  and tabs separate arguments; the run after the op name is not part of the argument.
* A line ends at `\\n`; a bare `\\n` works. The byte just before the `\\n` is dropped if a
  `\\r` occurred anywhere in the argument after its first byte (parser.go's `drop`): that
  is the `\\r` of `\\r\\n` in practice. The first argument byte is never taken as the line
  end: `SUB \\nfoo 1\\r\\n` is `SUB foo 1`.
* PING, PONG and +OK ignore everything up to the next `\\n` (`PINGX` is a PING), with no
  length limit.
* The argument (from its first byte to the line end, less the dropped byte) may be at
  most max_control_line (4096) bytes, else `-ERR 'maximum control line exceeded'` (sic,
  lower case) and close; also when that many bytes of an unfinished line have arrived.
* A payload must be followed by exactly `\\r\\n`, else `-ERR 'Unknown Protocol
  Operation'` and close, as soon as the wrong byte arrives.
* An unknown op (including MSG and the route ops RS+, RMSG, A+, LS+, an empty line, or a
  line starting with a space) gets `-ERR 'Unknown Protocol Operation'` and close, as soon
  as the offending byte arrives.
* Malformed PUB, HPUB, SUB or UNSUB arguments, bad CONNECT or INFO JSON, and any -ERR
  from the client close the connection without a reply.

Deliberate differences, all for input no client sends:

* nats-server treats `\\r` differently when a line is split across reads (it strips
  every `\\r` after the split). The codec always applies the unsplit rule, so the events
  never depend on how the bytes were chunked.
* HMSG from a client: nats-server answers `-ERR 'Unknown Protocol Operation'` when the
  line ends a read and silently swallows `HMSG ...\\r\\n\\r\\n` within one read; the codec
  always gives the error.
* INFO from a client: only its JSON syntax is checked (nats-server also closes on a
  value of the wrong type for its Info struct).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any, Final

from gateway.protocols.nats import client_events as ev
from gateway.subjects import is_valid_subscription

# const.go MAX_CONTROL_LINE_SIZE: the default of nats-server's max_control_line.
MAX_CONTROL_LINE_SIZE: Final = 4096
# const.go MAX_PAYLOAD_SIZE: the default of nats-server's max_payload (1 MiB).
MAX_PAYLOAD_SIZE: Final = 1048576
# util.go parseSize: at most 9 decimal digits ("999M"); `PUB foo 1234567890` is a
# "Bad or Missing Size" and closes silently (verified), not a payload violation.
MAX_SIZE_DIGITS: Final = 9
# Go encoding/json maxNestingDepth: deeper CONNECT JSON is a syntax error there.
JSON_MAX_DEPTH: Final = 10000
# Leftover bytes are dropped from the front of the buffer once this many are consumed
# (or all of them): one deletion per batch, not one per event.
_COMPACT_AT: Final = 65536

# -- frames for the client ----------------------------------------------------------------

PING: Final = b"PING\r\n"
PONG: Final = b"PONG\r\n"
OK: Final = b"+OK\r\n"


def err(text: str) -> bytes:
    """`-ERR '<text>'\\r\\n`, client.go errProto."""
    return b"-ERR '%s'\r\n" % text.encode("utf-8", "surrogateescape")


# The texts nats-server sends, verbatim (client.go / parser.go).
ERR_UNKNOWN_OP: Final = err("Unknown Protocol Operation")
ERR_MAX_PAYLOAD: Final = err("Maximum Payload Violation")
ERR_MAX_CONTROL_LINE: Final = err("maximum control line exceeded")  # ErrMaxControlLine
ERR_INVALID_SUBJECT: Final = err("Invalid Subject")  # SUB: sublist Insert failed
ERR_INVALID_PUBLISH_SUBJECT: Final = err("Invalid Publish Subject")  # PUB/HPUB if pedantic
ERR_AUTH_VIOLATION: Final = err("Authorization Violation")


def _go_json(doc: Any) -> str:
    # Go's json.Marshal: no spaces, UTF-8 as is, and <, >, &, U+2028, U+2029 escaped.
    # Those characters can only occur inside JSON strings, so replacing them is safe.
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def info(doc: dict[str, Any]) -> bytes:
    """`INFO {json} \\r\\n`: nats-server joins "INFO", the JSON and CRLF with spaces."""
    return b"INFO " + _go_json(doc).encode("utf-8", "surrogateescape") + b" \r\n"


def _b(value: str | bytes) -> bytes:
    return value.encode("utf-8", "surrogateescape") if value.__class__ is str else value  # type: ignore[return-value]


def msg_names(subject: str | bytes, sid: str | bytes) -> bytes:
    """`<subject> <sid>`: what every MSG or HMSG of one subscription for one subject
    starts with after the op (a subscription keeps it while the subject stays the same)."""
    return b"%s %s" % (_b(subject), _b(sid))


def msg_frame(names: bytes, reply: str | bytes | None, payload: bytes) -> bytes:
    """`MSG <names> [reply] <size>\r\n<payload>\r\n`, `names` from msg_names()."""
    if reply:
        return b"MSG %s %s %d\r\n%s\r\n" % (names, _b(reply), len(payload), payload)
    return b"MSG %s %d\r\n%s\r\n" % (names, len(payload), payload)


def hmsg_frame(names: bytes, reply: str | bytes | None, headers: bytes, payload: bytes) -> bytes:
    """`HMSG <names> [reply] <hdr_len> <total_len>\r\n<headers><payload>\r\n`."""
    hdr = len(headers)
    total = hdr + len(payload)
    if reply:
        return b"HMSG %s %s %d %d\r\n%s%s\r\n" % (names, _b(reply), hdr, total, headers, payload)
    return b"HMSG %s %d %d\r\n%s%s\r\n" % (names, hdr, total, headers, payload)


def msg(subject: str | bytes, sid: str | bytes, reply: str | bytes | None, payload: bytes) -> bytes:
    """`MSG <subject> <sid> [reply] <size>\r\n<payload>\r\n`."""
    return msg_frame(msg_names(subject, sid), reply, payload)


def hmsg(
    subject: str | bytes,
    sid: str | bytes,
    reply: str | bytes | None,
    headers: bytes,
    payload: bytes,
) -> bytes:
    """`HMSG <subject> <sid> [reply] <hdr_len> <total_len>\r\n<headers><payload>\r\n`."""
    return hmsg_frame(msg_names(subject, sid), reply, headers, payload)


# -- CONNECT options ------------------------------------------------------------------------


def _fold_equal(key: str, name: str) -> bool:
    # Go's encoding/json matches keys to struct fields with bytes.EqualFold: ASCII case,
    # plus the simple Unicode folds that reach ASCII (U+212A Kelvin sign ~ k, U+017F long
    # s ~ s). `name` is lower-case ASCII.
    if len(key) != len(name):
        return False
    for k, n in zip(key, name, strict=True):
        if k != n and k.lower() != n and not (k == "\u017f" and n == "s"):
            return False
    return True


def connect_option(options: dict[str, Any], name: str, default: Any = None) -> Any:
    """CONNECT field `name` (lower case, e.g. "headers") as nats-server reads it.

    Keys match case-insensitively and the last matching key wins; a JSON null leaves
    the field at its previous value, which is `default` here.
    """
    value = default
    for key, v in options.items():
        if v is not None and (key == name or _fold_equal(key, name)):
            value = v
    return value


# -- parsing --------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")  # NaN, Infinity: Go rejects them


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _json_depth(text: str) -> int:
    depth = deepest = 0
    for m in _JSON_TOKENS.finditer(text):
        c = m[0]
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _parse_json(raw: bytes) -> Any:
    """Go's json.Unmarshal syntax; raises ValueError. Invalid UTF-8 becomes U+FFFD, as in Go."""
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        pass
    # Python's C scanner recurses once per nesting level and hits the recursion limit
    # near 1000; Go allows 10000. Deep nesting only fits a raised max_control_line.
    if _json_depth(text) > JSON_MAX_DEPTH:
        raise ValueError("JSON nested too deeply")
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(old + JSON_MAX_DEPTH + 100)
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError as e:
        raise ValueError("JSON nested too deeply") from e
    finally:
        sys.setrecursionlimit(old)


def _parse_size(raw: bytes) -> int:
    """util.go parseSize: 1-9 ASCII digits (leading zeros fine, no sign), else -1."""
    if 0 < len(raw) <= MAX_SIZE_DIGITS and raw.isdigit():
        return int(raw)
    return -1


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


# Op kinds, in the order of their groups in _OP.
_PUB, _HPUB, _SUB, _UNSUB, _CONNECT, _INFO, _ERR, _HMSG, _PING, _PONG, _OK = range(11)

# One match finds the op at the start of a line (case-insensitive, with the one space or
# tab it needs after its name) and skips the spaces and tabs after it: the group that
# matched is the kind (lastindex - 1), the match's end the first argument byte. HMSG
# passes the op check in nats-server and fails later; MSG, route and leaf ops fail at
# once. PING, PONG and +OK take no argument (whatever follows up to the \n is skipped).
_OP = re.compile(
    rb"(?i)(?:(pub)[ \t]|(hpub)[ \t]|(sub)[ \t]|(unsub)[ \t]|(connect)|(info)|(-err)[ \t]"
    rb"|(hmsg)[ \t]|(ping)|(pong)|(\+ok))[ \t]*"
)
# The same names, to tell an op cut short by the end of a read (wait for more) from a
# wrong one (close) when _OP does not match. The longest is 7 bytes.
_OP_NAMES: Final = (
    b"pub ", b"hpub ", b"sub ", b"unsub ", b"connect", b"info", b"-err ", b"hmsg ",
    b"ping", b"pong", b"+ok",
)  # fmt: skip

# The arguments of PUB and HPUB split on runs of spaces and tabs only (processPub); SUB
# and UNSUB use splitArg, which also splits on \r and \n. Matched from the first argument
# byte to the line end: PUB takes 2 or 3 arguments, HPUB 3 or 4, the sizes 1-9 ASCII
# digits (util.go parseSize); anything else closes silently, as every one of those
# parse errors does in nats-server.
_PUB_ARGS = re.compile(rb"([^ \t]+)[ \t]+(?:([^ \t]+)[ \t]+)?(\d{1,9})[ \t]*")
_HPUB_ARGS = re.compile(rb"([^ \t]+)[ \t]+(?:([^ \t]+)[ \t]+)?(\d{1,9})[ \t]+(\d{1,9})[ \t]*")
_SUB_ARGS = re.compile(rb"[^ \t\r\n]+")


def _op_cut_short(buf: bytearray, pos: int) -> bool:
    """Whether the bytes from pos to the end of buf are the start of an op name."""
    rest = bytes(buf[pos : pos + 8]).lower()
    return any(name.startswith(rest) for name in _OP_NAMES)


class NATSClientCodec:
    """One client connection's input. Attributes the session may set:

    * `max_payload`, `max_control_line`: the limits (nats-server max_payload,
      max_control_line).
    * `headers`: whether HPUB is allowed. nats-server closes silently on an HPUB unless
      the client's CONNECT said `headers: true` (and the server supports headers). The
      codec sets it from each CONNECT that has the field, as nats-server does; a server
      without header support sets it back to False after a Connect event.
    * `require_connect`: the server requires authentication. Until a CONNECT has been
      parsed, an op not starting with C/c gets `-ERR 'Authorization Violation'` and
      close, at its first byte. Cleared when a Connect event is returned.
    """

    def __init__(
        self, max_payload: int = MAX_PAYLOAD_SIZE, max_control_line: int = MAX_CONTROL_LINE_SIZE
    ) -> None:
        self.max_payload = max_payload
        self.max_control_line = max_control_line
        self.headers = False
        self.require_connect = False
        self._buf = bytearray()
        self._pos = 0
        self._closed = False
        # PING/PONG/+OK whose line end has not arrived: its kind (bytes are skipped)
        self._skip = -1
        # waiting for a payload: (subject, reply, header size or -1 for PUB, total size)
        self._want: tuple[str, str | None, int, int] | None = None

    # -- input -----------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        pos = self._pos
        if pos:
            if pos >= len(self._buf):
                self._buf.clear()
                self._pos = 0
            elif pos > _COMPACT_AT:
                del self._buf[:pos]
                self._pos = 0
        if not self._closed:
            self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def _fail(self, reply: bytes | None) -> ev.ProtocolError:
        self._closed = True
        self._want = None
        return ev.ProtocolError(reply, True)

    def next_event(self) -> ev.Event | None:
        """The next operation, or None until more bytes arrive. One op per loop, every op
        the same way (a PUB costs one match for its op, one for its arguments, two finds
        for its line end); +OK and INFO yield no event."""
        if self._closed:
            return None
        if self._want is not None:
            return self._payload(*self._want)
        buf = self._buf
        while True:
            pos = self._pos
            end = len(buf)
            if pos >= end:
                return None
            if self._skip >= 0:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    self._pos = end  # nothing before the \n matters
                    return None
                self._pos = nl + 1
                kind, self._skip = self._skip, -1
                if kind == _PING:
                    return ev.Ping()
                if kind == _PONG:
                    return ev.Pong()
                continue  # +OK
            if self.require_connect and buf[pos] != 67 and buf[pos] != 99:  # C, c
                return self._fail(ERR_AUTH_VIOLATION)
            op = _OP.match(buf, pos)
            if op is None:
                if _op_cut_short(buf, pos):
                    return None
                return self._fail(ERR_UNKNOWN_OP)
            kind = op.lastindex - 1  # type: ignore[operator]
            a = op.end()
            if kind >= _PING:
                self._skip = kind
                self._pos = a
                continue
            if a >= end:
                # Only spaces and tabs so far: they are skipped anyway, so don't keep
                # more than the op and the one it needs.
                del buf[op.end(kind + 1) + 1 :]
                return None
            nl = buf.find(b"\n", a + 1)
            if nl < 0:
                # parser.go checks an unfinished argument at the end of each read
                size = end - a
                if buf.find(b"\r", a + 1) >= 0:
                    size -= 1
                if size > self.max_control_line:
                    return self._fail(ERR_MAX_CONTROL_LINE)
                return None
            stop = nl - 1 if buf.find(b"\r", a + 1, nl) >= 0 else nl
            self._pos = nl + 1
            if stop - a > self.max_control_line:
                return self._fail(ERR_MAX_CONTROL_LINE)
            event = _OP_ARGUMENTS[kind](self, a, stop)
            if event is not None or self._want is not None:
                return event  # None: a PUB/HPUB waiting for its payload

    # -- ops, each with its argument buf[a:stop] ------------------------------------

    def _pub(self, a: int, stop: int) -> ev.Event | None:
        args = _PUB_ARGS.fullmatch(self._buf, a, stop)
        if args is None:
            return self._fail(None)  # processPub Parse Error, Bad or Missing Size
        size = int(args[3])
        if size > self.max_payload:
            return self._fail(ERR_MAX_PAYLOAD)
        reply = args[2]
        return self._payload(_text(args[1]), None if reply is None else _text(reply), -1, size)

    def _hpub(self, a: int, stop: int) -> ev.Event | None:
        if not self.headers:
            return self._fail(None)  # ErrMsgHeadersNotSupported, checked before the args
        args = _HPUB_ARGS.fullmatch(self._buf, a, stop)
        if args is None:
            return self._fail(None)  # processHeaderPub Parse Error, Bad or Missing Size
        hdr = int(args[3])
        size = int(args[4])
        if hdr > size:
            return self._fail(None)  # Header Size larger than TotalSize
        if size > self.max_payload:
            return self._fail(ERR_MAX_PAYLOAD)
        reply = args[2]
        return self._payload(_text(args[1]), None if reply is None else _text(reply), hdr, size)

    def _payload(self, subject: str, reply: str | None, hdr: int, size: int) -> ev.Event | None:
        """The payload after a PUB/HPUB line: its event when it is all there, else
        None (and `_want` says what is awaited)."""
        buf = self._buf
        start = self._pos
        end = start + size
        have = len(buf)
        if have > end + 1 and buf[end] == 13 and buf[end + 1] == 10:
            self._want = None
            self._pos = end + 2
            if hdr < 0:
                return ev.Pub(subject, reply, bytes(buf[start:end]))
            split = start + hdr
            return ev.HPub(subject, reply, bytes(buf[start:split]), bytes(buf[split:end]))
        if (have > end and buf[end] != 13) or (have > end + 1 and buf[end + 1] != 10):
            return self._fail(ERR_UNKNOWN_OP)  # as soon as the wrong byte arrives
        self._want = (subject, reply, hdr, size)
        return None

    def _sub(self, a: int, stop: int) -> ev.Event:
        args = _SUB_ARGS.findall(self._buf, a, stop)
        if len(args) == 2:
            queue = None
        elif len(args) == 3:
            queue = _text(args[1])
        else:
            return self._fail(None)  # processSub Parse Error
        subject = _text(args[0])
        if not is_valid_subscription(subject):
            return ev.ProtocolError(ERR_INVALID_SUBJECT, False)
        return ev.Sub(subject, queue, _text(args[-1]))

    def _unsub(self, a: int, stop: int) -> ev.Event:
        args = _SUB_ARGS.findall(self._buf, a, stop)
        if len(args) == 1:
            return ev.Unsub(_text(args[0]), None)
        if len(args) == 2:
            size = _parse_size(args[1])
            return ev.Unsub(_text(args[0]), None if size < 0 else size)
        return self._fail(None)  # processUnsub Parse Error

    def _connect(self, a: int, stop: int) -> ev.Event:
        try:
            options = _parse_json(bytes(self._buf[a:stop]))
        except ValueError:
            return self._fail(None)
        if options is None:
            options = {}
        elif not isinstance(options, dict):
            return self._fail(None)  # Go: cannot unmarshal into the options struct
        headers = connect_option(options, "headers")
        if headers is True or headers is False:
            self.headers = headers
        self.require_connect = False
        return ev.Connect(options)

    def _info(self, a: int, stop: int) -> ev.Event | None:
        try:
            _parse_json(bytes(self._buf[a:stop]))
        except ValueError:
            return self._fail(None)
        return None  # nats-server ignores a client's INFO

    def _err(self, a: int, stop: int) -> ev.Event:
        return self._fail(None)  # "Client Error ...", closed without a reply

    def _hmsg(self, a: int, stop: int) -> ev.Event:
        return self._fail(ERR_UNKNOWN_OP)


# What each op with an argument does with it, by kind.
_OP_ARGUMENTS: Final[tuple[Callable[[NATSClientCodec, int, int], ev.Event | None], ...]] = (
    NATSClientCodec._pub,
    NATSClientCodec._hpub,
    NATSClientCodec._sub,
    NATSClientCodec._unsub,
    NATSClientCodec._connect,
    NATSClientCodec._info,
    NATSClientCodec._err,
    NATSClientCodec._hmsg,
)
