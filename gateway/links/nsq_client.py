"""NSQ TCP protocol V2, client side, sans-IO: the commands a link sends to nsqd, and the
frames nsqd sends back, parsed from bytes into values (no sockets, no clock, no broker).

The links need only part of a client: the magic, IDENTIFY with feature negotiation, SUB,
RDY, FIN, REQ, NOP, CLS, PUB and MPUB; and nsqd's three frame types (response, error,
message). No NSQ client library runs on Trio (pynsq is built on Tornado, gnsq on gevent),
so this is written here, next to the server codec it shares constants with
(gateway/protocols/nsq/codec.py).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gateway.protocols.nsq.codec import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, MAGIC_V2

__all__ = [
    "MAGIC_V2",
    "ErrorFrame",
    "FrameReader",
    "MessageFrame",
    "NSQClientError",
    "ResponseFrame",
]

HEARTBEAT: Final = b"_heartbeat_"
OK: Final = b"OK"
# far above anything nsqd sends (its --max-msg-size is 1 MiB by default): a bigger size
# means the bytes are not NSQ frames
MAX_FRAME: Final = 64 * 1024 * 1024

_SIZE_TYPE = struct.Struct(">ii")
_BE32 = struct.Struct(">I")
_MSG_HEAD = struct.Struct(">qH16s")  # timestamp (ns), attempts, id; then the body


class NSQClientError(Exception):
    """The server's bytes are not NSQ V2 frames: the connection is unusable."""


@dataclass(frozen=True, slots=True)
class ResponseFrame:
    data: bytes

    @property
    def is_heartbeat(self) -> bool:
        return self.data == HEARTBEAT


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    data: bytes

    @property
    def code(self) -> str:
        """The error's code, `E_BAD_TOPIC` of `E_BAD_TOPIC PUB topic name ...`."""
        return self.data.split(b" ", 1)[0].decode("ascii", "replace")

    def __str__(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class MessageFrame:
    timestamp: int  # ns since the epoch, as nsqd stamped it
    attempts: int
    id: bytes  # 16 bytes, answered as they are in FIN, REQ and TOUCH
    body: bytes


Frame = ResponseFrame | ErrorFrame | MessageFrame


class FrameReader:
    """Bytes from nsqd in, whole frames out (`receive_data` returns those completed)."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def receive_data(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            size, kind = _SIZE_TYPE.unpack_from(buf, pos)
            if size < 4 or size > self._max:
                raise NSQClientError(f"frame size {size}")
            if end - pos - 4 < size:
                break
            data_at = pos + 8
            pos += 4 + size
            if kind == FRAME_MESSAGE:
                if size < 4 + _MSG_HEAD.size:
                    raise NSQClientError(f"message frame of {size} bytes")
                timestamp, attempts, msg_id = _MSG_HEAD.unpack_from(buf, data_at)
                body = bytes(buf[data_at + _MSG_HEAD.size : pos])
                frames.append(MessageFrame(timestamp, attempts, msg_id, body))
            elif kind == FRAME_RESPONSE:
                frames.append(ResponseFrame(bytes(buf[data_at:pos])))
            elif kind == FRAME_ERROR:
                frames.append(ErrorFrame(bytes(buf[data_at:pos])))
            else:
                raise NSQClientError(f"frame type {kind}")
        del buf[:pos]
        return frames


# -- commands ------------------------------------------------------------------------------


def identify(fields: dict[str, object]) -> bytes:
    body = json.dumps(fields, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _BE32.pack(len(body)) + body


def sub(topic: str, channel: str) -> bytes:
    return f"SUB {topic} {channel}\n".encode()


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def req(msg_id: bytes, timeout_ms: int) -> bytes:
    return b"REQ %s %d\n" % (msg_id, timeout_ms)


NOP: Final = b"NOP\n"
CLS: Final = b"CLS\n"


def pub(topic: str, body: bytes) -> bytes:
    return b"PUB " + topic.encode() + b"\n" + _BE32.pack(len(body)) + body


def mpub(topic: str, bodies: Sequence[bytes]) -> bytes:
    """MPUB, or PUB for a single body (the same OK, nine bytes fewer)."""
    if len(bodies) == 1:
        return pub(topic, bodies[0])
    parts = [_BE32.pack(len(bodies))]
    for body in bodies:
        parts.append(_BE32.pack(len(body)))
        parts.append(body)
    payload = b"".join(parts)
    return b"MPUB " + topic.encode() + b"\n" + _BE32.pack(len(payload)) + payload


def negotiated(response: ResponseFrame) -> dict[str, object]:
    """IDENTIFY's answer: nsqd's JSON with feature negotiation, `OK` without (old nsqd)."""
    if response.data == OK:
        return {}
    try:
        value = json.loads(response.data)
    except ValueError as exc:
        raise NSQClientError(f"IDENTIFY answered {response.data[:100]!r}") from exc
    if not isinstance(value, dict):
        raise NSQClientError(f"IDENTIFY answered {response.data[:100]!r}")
    return value
