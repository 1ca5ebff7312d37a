"""NSQ TCP protocol V2, server side, sans-IO.

`NSQServerCodec` owns the connection's protocol state (init, subscribed, closing) and
turns bytes into the events of events.py, checking every command in the order nsqd 1.3.0
checks it, so a bad command gets the same error text nsqd sends. Frames for the client
come from the `*_frame` functions. No sockets, no clock, no broker in here.

Reading is pull-style (h11): feed bytes with `receive_data`, then call `next_event` until
it returns None. After an `Identify` the codec pauses: the session may switch the stream
to TLS, snappy or deflate before the next byte is read, and calls `resume()`.
"""

from __future__ import annotations

import re
import struct
from binascii import unhexlify
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from gateway.protocols.nsq import events as ev
from gateway.protocols.nsq.names import go_quote, valid_name

MAGIC_V2: Final = b"  V2"
FRAME_RESPONSE: Final = 0
FRAME_ERROR: Final = 1
FRAME_MESSAGE: Final = 2

_FRAME_HEADER = struct.Struct(">ii")
_MESSAGE_HEADER = struct.Struct(">iiqH")  # size, type, timestamp, attempts; then id + body
_BE32 = struct.Struct(">i")


class State(IntEnum):
    INIT = 0
    SUBSCRIBED = 1
    CLOSING = 2
    CLOSED = 3


# Module-level aliases: `State.X` is a class-attribute lookup through the enum's metaclass,
# measurably slow on the per-command path.
_INIT, _SUBSCRIBED, _CLOSING, _CLOSED = State.INIT, State.SUBSCRIBED, State.CLOSING, State.CLOSED

# A run of consecutive "FIN <16-byte id>\n" lines: what a busy consumer sends most. The id
# class excludes what would make nsqd split or strip differently (space, \r, \n); those lines
# take the general path. One regex match replaces a parse per line.
# A run of FINs whose ids are well formed (16 lowercase hex digits, as nsqd writes them):
# the session reads them as numbers with no further check. Any other FIN is a command of
# its own, answered E_FIN_FAILED if its id is not one of ours.
_FIN_RUN = re.compile(rb"(?:FIN [0-9a-f]{16}\n)+")


@dataclass(frozen=True, slots=True)
class Limits:
    max_msg_size: int = 1048576  # nsqd --max-msg-size
    max_body_size: int = 5242880  # nsqd --max-body-size: MPUB, IDENTIFY and AUTH bodies
    max_rdy_count: int = 2500  # nsqd --max-rdy-count
    max_req_timeout: int = 3600000  # ms; nsqd --max-req-timeout: DPUB's upper bound
    # nsqd reads lines through a 16 KiB bufio.Reader; a longer line drops the connection
    # without an error frame.
    max_line_length: int = 16384


def response_frame(data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, FRAME_RESPONSE) + data


def error_frame(data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, FRAME_ERROR) + data


def message_frame(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    if attempts > 0xFFFF:  # uint16 on the wire
        attempts = 0xFFFF
    return _MESSAGE_HEADER.pack(len(body) + 30, FRAME_MESSAGE, timestamp, attempts) + msg_id + body


_MESSAGE_HEADER_ID = struct.Struct(">iiqH16s")


def message_header(body_size: int, timestamp: int, attempts: int, msg_id: int) -> bytes:
    """A message frame up to its body, the id as nsqd shows it: 16 lowercase hex digits."""
    if attempts > 0xFFFF:
        attempts = 0xFFFF
    return _MESSAGE_HEADER_ID.pack(
        body_size + 30, FRAME_MESSAGE, timestamp, attempts, b"%016x" % msg_id
    )


OK_FRAME: Final = response_frame(b"OK")
# the same bytes as separate objects: the OK of an MPUB or a DPUB, told apart by identity
# when a failed commit takes its OKs back (nsqd names the command in its error)
MPUB_OK_FRAME: Final = response_frame(b"OK")
DPUB_OK_FRAME: Final = response_frame(b"OK")
HEARTBEAT_FRAME: Final = response_frame(b"_heartbeat_")
CLOSE_WAIT_FRAME: Final = response_frame(b"CLOSE_WAIT")


def _error(text: str) -> ev.ProtocolError:
    return ev.ProtocolError(error_frame(text.encode("utf-8", "surrogateescape")))


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


_UINT64 = 1 << 64
_INT_DIGITS = 4000  # under Python's int_max_str_digits (4300): int() refuses longer strings


def _base10(raw: bytes) -> int | None:
    """nsqd's ByteToBase10: digits only; the empty string is 0; uint64 arithmetic, so a
    longer number wraps around (a 16 KiB line holds thousands of digits)."""
    if not raw:
        return 0
    if not raw.isdigit():
        return None
    if len(raw) < 20:  # below 10**19 < 2**64: no wrap
        return int(raw)
    value = 0
    for start in range(0, len(raw), _INT_DIGITS):
        part = raw[start : start + _INT_DIGITS]
        value = (value * 10 ** len(part) + int(part)) % _UINT64
    return value


# What the codec is waiting for after a command line that has a body.
_PUB, _DPUB, _IDENTIFY, _AUTH, _MPUB = range(5)
_CMD_NAME = {_PUB: "PUB", _DPUB: "DPUB", _IDENTIFY: "IDENTIFY", _AUTH: "AUTH", _MPUB: "MPUB"}


class NSQServerCodec:
    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.state = _INIT
        # set by the session from what IDENTIFY negotiated / the server requires
        self.heartbeats_disabled = False
        self.tls_required = False
        self._buf = bytearray()
        self._pos = 0
        self._magic = False
        self._paused = False
        self._decode: Callable[[bytes], bytes] | None = None
        # body continuation: (kind, topic, defer_ms) while waiting for a body
        self._want: tuple[int, str, int] | None = None
        # MPUB progress: bodies read so far and how many are expected
        self._mpub_bodies: list[bytes] = []
        self._mpub_count = -2  # -2: outer size next, -1: count next, else messages expected
        self._mpub_bytes = 0
        self._handlers: dict[bytes, Callable[[list[bytes]], ev.Event | None]] = {
            b"FIN": self._fin,
            b"RDY": self._rdy,
            b"REQ": self._req,
            b"PUB": self._pub,
            b"MPUB": self._mpub,
            b"DPUB": self._dpub,
            b"NOP": self._nop,
            b"TOUCH": self._touch,
            b"SUB": self._sub,
            b"CLS": self._cls,
            b"AUTH": self._auth,
            b"IDENTIFY": self._identify,
        }

    # -- input -----------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Bytes from the socket (still compressed, if a compression upgrade is on)."""
        if self._decode is not None:
            data = self._decode(data)
        if self._pos:
            if self._pos == len(self._buf):
                self._buf.clear()
                self._pos = 0
            elif self._pos > 65536:
                # the session pulls with next_event: without this, a publisher whose reads
                # end mid-frame would keep every byte it ever sent
                del self._buf[: self._pos]
                self._pos = 0
        self._buf += data

    def set_decoder(self, decode: Callable[[bytes], bytes]) -> None:
        """Everything after the IDENTIFY is compressed: re-read what is already buffered."""
        rest = bytes(self._buf[self._pos :])
        self._buf.clear()
        self._pos = 0
        self._decode = decode
        if rest:
            self.receive_data(rest)

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def resume(self) -> None:
        self._paused = False

    def _compact(self) -> None:
        # One deletion per batch of events, not per event: del buf[:n] is O(len(buf)).
        if self._pos > 65536 or self._pos == len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0

    def events(self) -> list[ev.Event]:
        out: list[ev.Event] = []
        while (event := self.next_event()) is not None:
            out.append(event)
            if event.__class__ is ev.ProtocolError:
                break
        self._compact()
        return out

    def next_event(self) -> ev.Event | None:
        if self._paused or self.state is _CLOSED:
            return None
        if not self._magic:
            if len(self._buf) - self._pos < 4:
                return None
            magic = bytes(self._buf[self._pos : self._pos + 4])
            self._pos += 4
            if magic != MAGIC_V2:
                return self._fail(ev.ProtocolError(error_frame(b"E_BAD_PROTOCOL")))
            self._magic = True
        if self._want is not None:
            return self._body()
        buf = self._buf
        pos = self._pos
        nl = buf.find(b"\n", pos)
        if nl < 0:
            if len(buf) - pos >= self.limits.max_line_length:
                return self._fail(ev.ProtocolError(None))
            return None
        if nl - pos >= self.limits.max_line_length:
            return self._fail(ev.ProtocolError(None))
        if buf[pos] == 70 and self.state is not _INIT and not self.tls_required:
            run = _FIN_RUN.match(buf, pos)
            if run is not None:
                end = run.end()
                self._pos = end
                # the ids' digits end to end, then 8 bytes each: two replaces, one unhexlify
                # and one unpack in C for the whole run, not a slice and an int() per line
                digits = bytes(buf[pos:end]).replace(b"FIN ", b"").replace(b"\n", b"")
                return ev.FinBatch(struct.unpack(f">{len(digits) >> 4}Q", unhexlify(digits)))
        end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl  # one \r before \n is dropped
        parts = bytes(buf[pos:end]).split(b" ")
        self._pos = nl + 1
        name = parts[0]
        if self.tls_required and name != b"IDENTIFY":
            return self._fail(
                _error(f"E_INVALID cannot {_text(name)} in current state (TLS required)")
            )
        handler = self._handlers.get(name)
        if handler is None:
            return self._fail(_error(f"E_INVALID invalid command {_text(name)}"))
        event = handler(parts)
        if event.__class__ is ev.ProtocolError:
            self.state = _CLOSED
        return event

    def _fail(self, error: ev.ProtocolError) -> ev.ProtocolError:
        self.state = _CLOSED
        return error

    # -- commands without a body -------------------------------------------------

    def _nop(self, parts: list[bytes]) -> ev.Event:
        return ev.Nop()

    def _msg_id(self, cmd: str, parts: list[bytes], nparams: int) -> bytes | ev.ProtocolError:
        if self.state is not _SUBSCRIBED and self.state is not _CLOSING:
            return _error(f"E_INVALID cannot {cmd} in current state")
        if len(parts) < nparams:
            return _error(f"E_INVALID {cmd} insufficient number of params")
        if len(parts[1]) != 16:
            return _error("E_INVALID invalid message ID")
        return parts[1]

    def _fin(self, parts: list[bytes]) -> ev.Event:
        msg_id = self._msg_id("FIN", parts, 2)
        if msg_id.__class__ is ev.ProtocolError:
            return msg_id  # type: ignore[return-value]
        return ev.Fin(msg_id)  # type: ignore[arg-type]

    def _touch(self, parts: list[bytes]) -> ev.Event:
        msg_id = self._msg_id("TOUCH", parts, 2)
        if msg_id.__class__ is ev.ProtocolError:
            return msg_id  # type: ignore[return-value]
        return ev.Touch(msg_id)  # type: ignore[arg-type]

    def _req(self, parts: list[bytes]) -> ev.Event:
        msg_id = self._msg_id("REQ", parts, 3)
        if msg_id.__class__ is ev.ProtocolError:
            return msg_id  # type: ignore[return-value]
        timeout = _base10(parts[2])
        if timeout is None:
            return _error(f"E_INVALID REQ could not parse timeout {_text(parts[2])}")
        return ev.Req(msg_id, timeout)  # type: ignore[arg-type]

    def _rdy(self, parts: list[bytes]) -> ev.Event:
        if self.state is _CLOSING:
            return ev.Nop()  # nsqd ignores RDY once the client sent CLS
        if self.state is not _SUBSCRIBED:
            return _error("E_INVALID cannot RDY in current state")
        count = 1
        if len(parts) > 1:
            parsed = _base10(parts[1])
            if parsed is None:
                return _error(f"E_INVALID RDY could not parse count {_text(parts[1])}")
            count = parsed
        if count > self.limits.max_rdy_count:
            return _error(f"E_INVALID RDY count {count} out of range 0-{self.limits.max_rdy_count}")
        return ev.Rdy(count)

    def _cls(self, parts: list[bytes]) -> ev.Event:
        if self.state is not _SUBSCRIBED:
            return _error("E_INVALID cannot CLS in current state")
        self.state = _CLOSING
        return ev.Cls()

    def _sub(self, parts: list[bytes]) -> ev.Event:
        if self.state is not _INIT:
            return _error("E_INVALID cannot SUB in current state")
        if self.heartbeats_disabled:
            return _error("E_INVALID cannot SUB with heartbeats disabled")
        if len(parts) < 3:
            return _error("E_INVALID SUB insufficient number of parameters")
        topic = valid_name(parts[1])
        if topic is None:
            return _error(f"E_BAD_TOPIC SUB topic name {go_quote(parts[1])} is not valid")
        channel = valid_name(parts[2])
        if channel is None:
            return _error(f"E_BAD_CHANNEL SUB channel name {go_quote(parts[2])} is not valid")
        self.state = _SUBSCRIBED
        return ev.Sub(topic, channel)

    # -- commands with a body ----------------------------------------------------

    def _pub(self, parts: list[bytes]) -> ev.Event | None:
        if len(parts) < 2:
            return _error("E_INVALID PUB insufficient number of parameters")
        topic = valid_name(parts[1])
        if topic is None:
            return _error(f"E_BAD_TOPIC PUB topic name {go_quote(parts[1])} is not valid")
        self._want = (_PUB, topic, 0)
        return self._body()

    def _dpub(self, parts: list[bytes]) -> ev.Event | None:
        if len(parts) < 3:
            return _error("E_INVALID DPUB insufficient number of parameters")
        topic = valid_name(parts[1])
        if topic is None:
            return _error(f"E_BAD_TOPIC DPUB topic name {go_quote(parts[1])} is not valid")
        defer = _base10(parts[2])
        if defer is None:
            return _error(f"E_INVALID DPUB could not parse timeout {_text(parts[2])}")
        if defer > self.limits.max_req_timeout:
            return _error(
                f"E_INVALID DPUB timeout {defer} out of range 0-{self.limits.max_req_timeout}"
            )
        self._want = (_DPUB, topic, defer)
        return self._body()

    def _mpub(self, parts: list[bytes]) -> ev.Event | None:
        if len(parts) < 2:
            return _error("E_INVALID MPUB insufficient number of parameters")
        topic = valid_name(parts[1])
        if topic is None:
            # the code really appears twice in nsqd's text
            return _error(
                f"E_BAD_TOPIC E_BAD_TOPIC MPUB topic name {go_quote(parts[1])} is not valid"
            )
        self._want = (_MPUB, topic, 0)
        self._mpub_count = -2
        self._mpub_bodies = []
        return ev.MpubStart(topic)

    def _identify(self, parts: list[bytes]) -> ev.Event | None:
        if self.state is not _INIT:
            return _error("E_INVALID cannot IDENTIFY in current state")
        self._want = (_IDENTIFY, "", 0)
        return self._body()

    def _auth(self, parts: list[bytes]) -> ev.Event | None:
        if self.state is not _INIT:
            return _error("E_INVALID cannot AUTH in current state")
        if len(parts) != 1:
            return _error("E_INVALID AUTH invalid number of parameters")
        self._want = (_AUTH, "", 0)
        return self._body()

    def _body(self) -> ev.Event | None:
        assert self._want is not None
        kind, topic, defer = self._want
        if kind == _MPUB:
            return self._mpub_body(topic)
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 4:
            return None
        size = _BE32.unpack_from(buf, pos)[0]
        cmd = _CMD_NAME[kind]
        if kind in (_PUB, _DPUB):
            if size <= 0:
                return self._fail(_error(f"E_BAD_MESSAGE {cmd} invalid message body size {size}"))
            if size > self.limits.max_msg_size:
                return self._fail(
                    _error(
                        f"E_BAD_MESSAGE {cmd} message too big {size} > {self.limits.max_msg_size}"
                    )
                )
        else:
            if size <= 0:
                return self._fail(_error(f"E_BAD_BODY {cmd} invalid body size {size}"))
            if size > self.limits.max_body_size:
                return self._fail(
                    _error(f"E_BAD_BODY {cmd} body too big {size} > {self.limits.max_body_size}")
                )
        if len(buf) - pos - 4 < size:
            return None
        with memoryview(buf) as view:
            body = view[pos + 4 : pos + 4 + size].tobytes()
        self._pos = pos + 4 + size
        self._want = None
        if kind == _PUB:
            return ev.Pub(topic, body)
        if kind == _DPUB:
            return ev.Dpub(topic, defer, body)
        if kind == _AUTH:
            return ev.Auth(body)
        self._paused = True
        return ev.Identify(body)

    def _mpub_size_error(self, index: int, size: int) -> ev.ProtocolError:
        if size <= 0:
            return _error(f"E_BAD_MESSAGE MPUB invalid message({index}) body size {size}")
        return _error(f"E_BAD_MESSAGE MPUB message too big {size} > {self.limits.max_msg_size}")

    def _mpub_body(self, topic: str) -> ev.Event | None:
        """MPUB reads what the inner counts say, as nsqd does, resuming where it stopped."""
        buf = self._buf
        pos = self._pos
        limits = self.limits
        if self._mpub_count == -2:  # the outer body size
            if len(buf) - pos < 4:
                return None
            size = _BE32.unpack_from(buf, pos)[0]
            if size <= 0:
                return self._fail(_error(f"E_BAD_BODY MPUB invalid body size {size}"))
            if size > limits.max_body_size:
                return self._fail(
                    _error(f"E_BAD_BODY MPUB body too big {size} > {limits.max_body_size}")
                )
            pos += 4
            self._pos = pos
            self._mpub_count = -1
        if self._mpub_count == -1:  # the message count
            if len(buf) - pos < 4:
                return None
            count = _BE32.unpack_from(buf, pos)[0]
            if count <= 0 or count > (limits.max_body_size - 4) // 5:
                return self._fail(_error(f"E_BAD_BODY MPUB invalid message count {count}"))
            pos += 4
            self._pos = pos
            self._mpub_count = count
            self._mpub_bytes = 0
        bodies = self._mpub_bodies
        count = self._mpub_count
        end = len(buf)
        unpack = _BE32.unpack_from
        max_msg = limits.max_msg_size
        start = pos
        # memoryview: one copy per body instead of two (bytearray slice, then bytes)
        with memoryview(buf) as view:
            while len(bodies) < count:
                if end - pos < 4:
                    break
                size = unpack(buf, pos)[0]
                if size <= 0 or size > max_msg:
                    return self._fail(self._mpub_size_error(len(bodies), size))
                nxt = pos + 4 + size
                if nxt > end:
                    break
                bodies.append(view[pos + 4 : nxt].tobytes())
                pos = nxt
        self._mpub_bytes += pos - start
        if self._mpub_bytes > limits.max_body_size:
            # nsqd trusts the inner sizes over the outer one; past max-body-size we stop
            # trusting them rather than buffer without bound
            return self._fail(
                _error(f"E_BAD_BODY MPUB body too big {self._mpub_bytes} > {limits.max_body_size}")
            )
        if len(bodies) < count:
            self._pos = pos
            return None
        self._pos = pos
        self._want = None
        self._mpub_bodies = []
        self._mpub_count = -2
        return ev.Mpub(topic, bodies)
