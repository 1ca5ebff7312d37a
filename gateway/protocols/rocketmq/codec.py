"""RocketMQ 4.x remoting, sans-IO: frames and the responses the gateway writes.

`RemotingCodec` turns the bytes of one connection into the events of events.py; the
`encode_*` functions make the frames the gateway sends; header.py (de)serializes the
headers inside. No sockets, no clock, no broker.
The references are docs/protocols/rocketmq-remoting.md (§1-§2, verified against
ali-ons 3.12.0 and the C++ client) and the Apache RocketMQ 4.9.8 remoting classes
(NettyDecoder, RemotingCommand, RocketMQSerializable).

Reading is pull-style (h11): feed bytes with `receive_data`, then call `next_event` until
it returns None (or take them all with `events()`). Every complete frame in the buffer
comes out; a partial one waits for more bytes.

Frame: int32 total length (not counting itself) = 4 + header + body; int32 word = serialize
type << 24 | header length; header; body. Which clients send which header:

* JSON (serialize type 0): every client by default. ali-ons and the C++ client send nothing
  else and cannot read anything else (ali-ons JSON-parses whatever the header word says,
  and throws on a binary header; notes 2.3).
* ROCKETMQ binary (type 1): only a Java client started with `-Drocketmq.serialize.type=
  ROCKETMQ` or `ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ`. The codec reads both and the encoders
  write both, so a session can answer in the serialization the request used.

Errors: a negative or oversize total length, a frame too short for its header word, a
header length beyond the frame or over the header limit, an unknown serialize type and an
undecodable header are all `ProtocolError`: the Java broker's NettyDecoder closes the
channel on each of them without answering (no opaque can be trusted once framing is
lost). Length errors are reported as soon as the 8 bytes that show them arrive, not after
the frame would have been read: a peer announcing 16 MiB it never sends is cut off at once.
Netty's LengthFieldBasedFrameDecoder fails fast the same way on an oversize length.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from enum import IntEnum
from typing import Final

from gateway.protocols.rocketmq.events import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    Event,
    ProtocolError,
    Request,
    Response,
    SerializeType,
)
from gateway.protocols.rocketmq.header import (
    INT32_MAX,
    INT32_MIN,
    HeaderError,
    decode_binary_header,
    decode_json_header,
    encode_binary_header,
    encode_json_header,
    ext_fields_text,
)

# NettyDecoder FRAME_MAX_LENGTH (system property com.rocketmq.remoting.frameMaxLength):
# 16 MiB. Netty compares it with the whole frame, the 4-byte length field included, so
# the largest total-length value accepted is this minus 4.
DEFAULT_MAX_FRAME_SIZE: Final = 16777216
# Not a Java limit (the broker bounds a header only by the frame and the 24-bit field).
# The largest real headers are sends whose extFields carry the properties, which a
# stored record caps at 32767 bytes (int16); 1 MiB leaves ample room and bounds what a
# peer can make the JSON parser chew on.
DEFAULT_MAX_HEADER_SIZE: Final = 1048576
# The header length is the low 24 bits of its word; the high byte is the serialize type.
HEADER_LENGTH_MASK: Final = 0xFFFFFF

# What the gateway says about itself in headers it writes (notes 2.4): Java reads
# `language` into its LanguageCode enum, and records the broker version from the
# HEART_BEAT answer (it refuses SQL92 pulls below 232). 409 = MQVersion V4_9_8.
SERVER_LANGUAGE: Final = "JAVA"
SERVER_VERSION: Final = 409
# Leftover bytes are dropped from the front of the buffer once this many are consumed
# (or all of them): one deletion per batch of frames, not one per frame.
_COMPACT_AT: Final = 65536

_FRAME_PREFIX = struct.Struct(">iI")  # total length, header word
_BE32 = struct.Struct(">i")


class ResponseCode(IntEnum):
    """The ResponseCode values docs/protocols/rocketmq-remoting.md names (§2.4, §4.3)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26


# -- the codec ------------------------------------------------------------------------------


class RemotingCodec:
    """One connection's incoming frames. Symmetric: a client reads a server the same way."""

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_header_size: int = DEFAULT_MAX_HEADER_SIZE,
    ) -> None:
        if max_frame_size < 8:
            raise ValueError("max_frame_size must leave room for the 8-byte frame prefix")
        if not 0 <= max_header_size <= HEADER_LENGTH_MASK:
            raise ValueError("max_header_size must fit the 24-bit header length")
        self.max_frame_size = max_frame_size
        self.max_header_size = max_header_size
        self._buf = bytearray()
        self._pos = 0
        self._failed = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet framed: what a session bounds its reads by."""
        return len(self._buf) - self._pos

    @property
    def failed(self) -> bool:
        """A ProtocolError was returned; the codec yields nothing more."""
        return self._failed

    def receive_data(self, data: bytes) -> None:
        if self._failed:
            return  # the connection is closing; nothing more will be read
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def events(self) -> list[Event]:
        """Every event the buffered bytes make, up to and including a ProtocolError."""
        out: list[Event] = []
        while (event := self.next_event()) is not None:
            out.append(event)
        if self._pos > _COMPACT_AT or self._pos == len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        return out

    def next_event(self) -> Event | None:
        if self._failed:
            return None
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if available < 4:
            return None
        total = _BE32.unpack_from(buf, pos)[0]
        if total < 0:
            return self._fail(f"negative frame length {total}")
        if total > self.max_frame_size - 4:
            return self._fail(f"frame length {total} over the limit of {self.max_frame_size}")
        if total < 4:
            return self._fail(f"frame length {total} leaves no room for the header length")
        if available < 8:
            return None
        word = _FRAME_PREFIX.unpack_from(buf, pos)[1]
        kind = word >> 24
        header_length = word & HEADER_LENGTH_MASK
        if header_length > total - 4:
            return self._fail(f"header length {header_length} beyond the frame ({total})")
        if header_length > self.max_header_size:
            return self._fail(
                f"header length {header_length} over the limit of {self.max_header_size}"
            )
        if kind > SerializeType.ROCKETMQ:
            return self._fail(f"unknown serialize type {kind}")
        if available < 4 + total:
            return None
        start = pos + 8
        with memoryview(buf) as view:
            header = view[start : start + header_length].tobytes()
            body = view[start + header_length : pos + 4 + total].tobytes()
        self._pos = pos + 4 + total
        serialize_type = SerializeType(kind)
        try:
            if serialize_type is SerializeType.JSON:
                fields = decode_json_header(header)
            else:
                fields = decode_binary_header(header)
        except HeaderError as exc:
            return self._fail(str(exc))
        cls = Response if fields.flag & FLAG_RESPONSE else Request
        return cls(
            code=fields.code,
            opaque=fields.opaque,
            flag=fields.flag,
            language=fields.language,
            version=fields.version,
            remark=fields.remark,
            ext_fields=fields.ext_fields,
            body=body,
            serialize_type=serialize_type,
        )

    def _fail(self, reason: str) -> ProtocolError:
        self._failed = True
        self._buf.clear()
        self._pos = 0
        return ProtocolError(reason)


# -- encoding -------------------------------------------------------------------------------


def encode_command(
    code: int,
    opaque: int,
    *,
    flag: int = 0,
    language: str = SERVER_LANGUAGE,
    version: int = SERVER_VERSION,
    remark: str | None = None,
    ext_fields: Mapping[str, object] | None = None,
    body: bytes = b"",
    serialize_type: SerializeType = SerializeType.JSON,
) -> bytes:
    """One whole frame. ext values may be any scalars: they are sent as strings.

    `ext_fields=None` leaves the key out, as Java does for a command without a custom
    header; `{}` writes `"extFields":{}`, as ali-ons does.
    """
    if not (INT32_MIN <= opaque <= INT32_MAX and INT32_MIN <= flag <= INT32_MAX):
        raise ValueError("opaque and flag are int32")
    fields = ext_fields_text(ext_fields)
    if serialize_type is SerializeType.JSON:
        header = encode_json_header(code, opaque, flag, language, version, remark, fields)
    else:
        header = encode_binary_header(code, opaque, flag, language, version, remark, fields)
    if len(header) > HEADER_LENGTH_MASK:
        raise ValueError(f"header of {len(header)} bytes does not fit its 24-bit length")
    return (
        _FRAME_PREFIX.pack(4 + len(header) + len(body), serialize_type << 24 | len(header))
        + header
        + body
    )


def encode_response(
    opaque: int,
    code: int = ResponseCode.SUCCESS,
    *,
    remark: str | None = None,
    ext_fields: Mapping[str, object] | None = None,
    body: bytes = b"",
    serialize_type: SerializeType = SerializeType.JSON,
) -> bytes:
    """A response to the request with this opaque: flag bit 0 set, or ali-ons takes the
    frame for a server request and its caller times out (notes 2.4)."""
    return encode_command(
        int(code),
        opaque,
        flag=FLAG_RESPONSE,
        remark=remark,
        ext_fields=ext_fields,
        body=body,
        serialize_type=serialize_type,
    )


def encode_request(
    code: int,
    opaque: int,
    *,
    ext_fields: Mapping[str, object] | None = None,
    body: bytes = b"",
    oneway: bool = False,
    serialize_type: SerializeType = SerializeType.JSON,
) -> bytes:
    """A server-initiated request (notes 2.5), e.g. NOTIFY_CONSUMER_IDS_CHANGED, oneway."""
    return encode_command(
        code,
        opaque,
        flag=FLAG_ONEWAY if oneway else 0,
        ext_fields=ext_fields,
        body=body,
        serialize_type=serialize_type,
    )


def not_supported(request: Request) -> bytes:
    """REQUEST_CODE_NOT_SUPPORTED with the Java broker's remark (notes 2.4)."""
    return encode_response(
        request.opaque,
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        remark=f" request type {request.code} not supported",
        serialize_type=request.serialize_type,
    )


def ok(request: Request, ext: Mapping[str, object] | None = None, body: bytes = b"") -> bytes:
    """SUCCESS, in the serialization the request used."""
    return encode_response(
        request.opaque, ext_fields=ext, body=body, serialize_type=request.serialize_type
    )
