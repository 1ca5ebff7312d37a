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


def msg(subject: str | bytes, sid: str | bytes, reply: str | bytes | None, payload: bytes) -> bytes:
    """`MSG <subject> <sid> [reply] <size>\\r\\n<payload>\\r\\n`."""
    if reply:
        return b"MSG %s %s %s %d\r\n%s\r\n" % (
            _b(subject),
            _b(sid),
            _b(reply),
            len(payload),
            payload,
        )
    return b"MSG %s %s %d\r\n%s\r\n" % (_b(subject), _b(sid), len(payload), payload)


def hmsg(
    subject: str | bytes,
    sid: str | bytes,
    reply: str | bytes | None,
    headers: bytes,
    payload: bytes,
) -> bytes:
    """`HMSG <subject> <sid> [reply] <hdr_len> <total_len>\\r\\n<headers><payload>\\r\\n`."""
    hdr = len(headers)
    total = hdr + len(payload)
    if reply:
        return b"HMSG %s %s %s %d %d\r\n%s%s\r\n" % (
            _b(subject),
            _b(sid),
            _b(reply),
            hdr,
            total,
            headers,
            payload,
        )
    return b"HMSG %s %s %d %d\r\n%s%s\r\n" % (_b(subject), _b(sid), hdr, total, headers, payload)


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


# Op kinds.
_PUB, _HPUB, _SUB, _UNSUB, _CONNECT, _INFO, _ERR, _HMSG, _PING, _PONG, _OK = range(11)

# By first byte (lower-cased): (name, kind, needs a space or tab after it). HMSG passes
# the op check in nats-server and fails later; MSG, route and leaf ops fail at once.
_OPS: Final[dict[int, tuple[tuple[bytes, int, bool], ...]]] = {
    ord("p"): ((b"pub", _PUB, True), (b"ping", _PING, False), (b"pong", _PONG, False)),
    ord("h"): ((b"hpub", _HPUB, True), (b"hmsg", _HMSG, True)),
    ord("s"): ((b"sub", _SUB, True),),
    ord("u"): ((b"unsub", _UNSUB, True),),
    ord("c"): ((b"connect", _CONNECT, False),),
    ord("i"): ((b"info", _INFO, False),),
    ord("+"): ((b"+ok", _OK, False),),
    ord("-"): ((b"-err", _ERR, True),),
}
_LOWER: Final = bytes(range(256)).lower()
_INCOMPLETE: Final = -1
_BAD: Final = -2

_WS = re.compile(rb"[ \t]*")
# PUB/HPUB arguments split on spaces and tabs only (processPub); SUB/UNSUB use
# splitArg, which also splits on \r and \n.
_PUB_ARGS = re.compile(rb"[^ \t]+")
_SUB_ARGS = re.compile(rb"[^ \t\r\n]+")

# The usual PUB/HPUB line, whole: upper case, single spaces, CRLF, sizes of 1-9 digits.
# Whatever this matches parses exactly the same in the general path; anything else
# (including a short buffer) takes the general path.
_FAST_PUB = re.compile(rb"PUB ([^ \t\r\n]+) (?:([^ \t\r\n]+) )?(\d{1,9})\r\n")
_FAST_HPUB = re.compile(rb"HPUB ([^ \t\r\n]+) (?:([^ \t\r\n]+) )?(\d{1,9}) (\d{1,9})\r\n")


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
        if self._closed:
            return None
        if self._want is not None:
            return self._payload()
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):
            return None
        if not self.require_connect:
            first = buf[pos]
            if first == 80:  # P
                m = _FAST_PUB.match(buf, pos)
                if m is not None:
                    start = m.end()
                    subject, reply, size_b = m.groups()
                    size = int(size_b)
                    end = start + size
                    if (
                        size <= self.max_payload
                        and start - pos - 6 <= self.max_control_line
                        and buf.startswith(b"\r\n", end)
                    ):
                        self._pos = end + 2
                        return ev.Pub(
                            subject.decode("utf-8", "surrogateescape"),
                            None if reply is None else reply.decode("utf-8", "surrogateescape"),
                            bytes(buf[start:end]),
                        )
                elif buf.startswith(b"PING\r\n", pos):
                    self._pos = pos + 6
                    return ev.Ping()
                elif buf.startswith(b"PONG\r\n", pos):
                    self._pos = pos + 6
                    return ev.Pong()
            elif first == 72 and self.headers:  # H
                m = _FAST_HPUB.match(buf, pos)
                if m is not None:
                    start = m.end()
                    subject, reply, hdr_b, size_b = m.groups()
                    hdr = int(hdr_b)
                    size = int(size_b)
                    end = start + size
                    if (
                        hdr <= size <= self.max_payload
                        and start - pos - 7 <= self.max_control_line
                        and buf.startswith(b"\r\n", end)
                    ):
                        self._pos = end + 2
                        return ev.HPub(
                            subject.decode("utf-8", "surrogateescape"),
                            None if reply is None else reply.decode("utf-8", "surrogateescape"),
                            bytes(buf[start : start + hdr]),
                            bytes(buf[start + hdr : end]),
                        )
        return self._general()

    def _general(self) -> ev.Event | None:
        """Everything the fast paths leave: one op per loop; +OK and INFO yield no event."""
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
            first = buf[pos]
            if self.require_connect and first != 67 and first != 99:  # C, c
                return self._fail(ERR_AUTH_VIOLATION)
            kind, after = self._op(buf, pos, end)
            if kind == _INCOMPLETE:
                return None
            if kind == _BAD:
                return self._fail(ERR_UNKNOWN_OP)
            if kind >= _PING:
                self._skip = kind
                self._pos = after
                continue
            a = _WS.match(buf, after).end()
            if a >= end:
                # Only spaces and tabs so far: they are skipped anyway, so don't keep them.
                del buf[after:]
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
            arg = bytes(buf[a:stop])
            self._pos = nl + 1
            if len(arg) > self.max_control_line:
                return self._fail(ERR_MAX_CONTROL_LINE)
            event = self._dispatch(kind, arg)
            if event is not None or self._want is not None:
                return event  # None: a PUB/HPUB waiting for its payload

    @staticmethod
    def _op(buf: bytearray, pos: int, end: int) -> tuple[int, int]:
        """(kind, index after the op name and its one required separator)."""
        candidates = _OPS.get(_LOWER[buf[pos]])
        if candidates is None:
            return _BAD, 0
        for name, kind, sep in candidates:
            n = len(name)
            got = bytes(buf[pos : pos + n]).lower()
            if got != name[: len(got)]:
                continue
            if len(got) < n:
                return _INCOMPLETE, 0  # a prefix of this op (and maybe of others)
            if not sep:
                return kind, pos + n
            if pos + n >= end:
                return _INCOMPLETE, 0
            if buf[pos + n] not in b" \t":
                return _BAD, 0
            return kind, pos + n + 1
        return _BAD, 0

    def _dispatch(self, kind: int, arg: bytes) -> ev.Event | None:
        if kind == _PUB:
            return self._pub(arg)
        if kind == _HPUB:
            return self._hpub(arg)
        if kind == _SUB:
            return self._sub(arg)
        if kind == _UNSUB:
            return self._unsub(arg)
        if kind == _CONNECT:
            return self._connect(arg)
        if kind == _INFO:
            try:
                _parse_json(arg)
            except ValueError:
                return self._fail(None)
            return None  # nats-server ignores a client's INFO
        if kind == _ERR:
            return self._fail(None)  # "Client Error ...", closed without a reply
        return self._fail(ERR_UNKNOWN_OP)  # HMSG

    # -- ops ---------------------------------------------------------------------

    def _pub(self, arg: bytes) -> ev.Event | None:
        args = _PUB_ARGS.findall(arg)
        if len(args) == 2:
            subject, reply = args[0], None
        elif len(args) == 3:
            subject, reply = args[0], args[1]
        else:
            return self._fail(None)  # processPub Parse Error
        size = _parse_size(args[-1])
        if size < 0:
            return self._fail(None)  # processPub Bad or Missing Size
        if size > self.max_payload:
            return self._fail(ERR_MAX_PAYLOAD)
        self._want = (_text(subject), None if reply is None else _text(reply), -1, size)
        return self._payload()

    def _hpub(self, arg: bytes) -> ev.Event | None:
        if not self.headers:
            return self._fail(None)  # ErrMsgHeadersNotSupported, checked before the args
        args = _PUB_ARGS.findall(arg)
        if len(args) == 3:
            subject, reply = args[0], None
        elif len(args) == 4:
            subject, reply = args[0], args[1]
        else:
            return self._fail(None)  # processHeaderPub Parse Error
        hdr = _parse_size(args[-2])
        size = _parse_size(args[-1])
        if hdr < 0 or size < 0 or hdr > size:
            return self._fail(None)  # Bad or Missing Header/Total Size, Header Size larger
        if size > self.max_payload:
            return self._fail(ERR_MAX_PAYLOAD)
        self._want = (_text(subject), None if reply is None else _text(reply), hdr, size)
        return self._payload()

    def _payload(self) -> ev.Event | None:
        assert self._want is not None
        subject, reply, hdr, size = self._want
        buf = self._buf
        start = self._pos
        end = start + size
        have = len(buf)
        if have <= end:
            return None
        if buf[end] != 13:
            return self._fail(ERR_UNKNOWN_OP)
        if have == end + 1:
            return None
        if buf[end + 1] != 10:
            return self._fail(ERR_UNKNOWN_OP)
        self._want = None
        self._pos = end + 2
        with memoryview(buf) as view:
            if hdr < 0:
                return ev.Pub(subject, reply, view[start:end].tobytes())
            split = start + hdr
            return ev.HPub(subject, reply, view[start:split].tobytes(), view[split:end].tobytes())

    def _sub(self, arg: bytes) -> ev.Event:
        args = _SUB_ARGS.findall(arg)
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

    def _unsub(self, arg: bytes) -> ev.Event:
        args = _SUB_ARGS.findall(arg)
        if len(args) == 1:
            return ev.Unsub(_text(args[0]), None)
        if len(args) == 2:
            size = _parse_size(args[1])
            return ev.Unsub(_text(args[0]), None if size < 0 else size)
        return self._fail(None)  # processUnsub Parse Error

    def _connect(self, arg: bytes) -> ev.Event:
        try:
            options = _parse_json(arg)
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
