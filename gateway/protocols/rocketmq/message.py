"""RocketMQ message formats inside remoting bodies and headers, sans-IO.

* the stored-message record a PULL_MESSAGE response body concatenates (notes 7.1),
* the offset message id derived from it (notes 7.4),
* the SEND_BATCH_MESSAGE body (notes 7.6, Java MessageDecoder.encodeMessages),
* properties, `name \\x01 value \\x02` repeated (notes 8).

Decoders raise `MalformedBody` (a ValueError) carrying the response code a session
answers with; the connection stays usable, since the frame around the body was sound.
Encoders raise plain ValueError for values the format cannot carry: a caller bug, or a
value from another protocol the session must map first.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gateway.protocols.rocketmq.codec import ResponseCode

# MessageDecoder.MESSAGE_MAGIC_CODE (v1) and MESSAGE_MAGIC_CODE_V2 (5.x: int16 topic
# length). Clients of 4.x and ali-ons read only v1, so the gateway writes only v1.
MAGIC_V1: Final = -626843481  # 0xDAA320A7
MAGIC_V2: Final = -626843477  # 0xDAA320AB
# TOTALSIZE .. PREPAREDTRANSACTIONOFFSET with 4-byte hosts (notes 7.1).
RECORD_FIXED_SIZE: Final = 84
MAX_TOPIC_BYTES: Final = 127  # int8 topic length in a v1 record
MAX_PROPERTIES_BYTES: Final = 32767  # int16 properties length

PROPERTY_NAME_SEPARATOR: Final = "\x01"  # MessageDecoder.NAME_VALUE_SEPARATOR
PROPERTY_SEPARATOR: Final = "\x02"  # MessageDecoder.PROPERTY_SEPARATOR

# MessageSysFlag bits (notes 7.3).
SYSFLAG_COMPRESSED: Final = 0x1
SYSFLAG_MULTI_TAGS: Final = 0x2
SYSFLAG_TRANSACTION_MASK: Final = 0xC
SYSFLAG_TRANSACTION_PREPARED: Final = 0x4  # a half message, under the mask
SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20

# An IPv4 stand-in for hosts a v1 record cannot carry (notes 7.1).
IPV4_PLACEHOLDER: Final = "127.0.0.1"

_RECORD_HEAD = struct.Struct(">iiiiiqqiq")  # size .. born timestamp
_IPV4_PORT = struct.Struct(">4si")
_RECORD_MIDDLE = struct.Struct(">q")  # store timestamp
_RECORD_TAIL = struct.Struct(">iq")  # reconsume times, prepared transaction offset
_BATCH_HEAD = struct.Struct(">iiiii")  # size, magic, body crc, flag, body length
_BE16 = struct.Struct(">h")
_BE32 = struct.Struct(">i")
_MSG_ID_V4 = struct.Struct(">4siq")
_MSG_ID_V6 = struct.Struct(">16siq")


class MalformedBody(ValueError):
    """A body that cannot be decoded; `code` is the response to send (h11's status hint)."""

    def __init__(self, reason: str, code: int = ResponseCode.MESSAGE_ILLEGAL) -> None:
        super().__init__(reason)
        self.code = code


# -- properties -----------------------------------------------------------------------------


def encode_properties(properties: Mapping[str, str]) -> str:
    """`K\\x01V\\x02` per entry, trailing separator included (messageProperties2String).

    Only what survives `decode_properties` is accepted: a name or value that is empty or
    contains a separator raises ValueError (the session maps such headers first).
    """
    parts = []
    for name, value in properties.items():
        if not name or not value:
            raise ValueError(f"property {name!r}: empty names and values do not survive")
        for text in (name, value):
            if PROPERTY_NAME_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise ValueError(f"property {name!r} contains a separator")
        parts.append(f"{name}\x01{value}\x02")
    return "".join(parts)


def decode_properties(text: str) -> dict[str, str]:
    """MessageDecoder.string2messageProperties (4.9.8), so the gateway reads what Java does.

    Items are split at \\x02; an item under 3 characters is skipped; the name ends at the
    first \\x01 and must be non-empty, and so must the value. ali-ons' parser also keeps an
    empty `"": ""` entry after the trailing separator (notes 7.5); Java's does not.
    """
    properties: dict[str, str] = {}
    length = len(text)
    index = 0
    while index < length:
        end = text.find(PROPERTY_SEPARATOR, index)
        if end < 0:
            end = length
        if end - index >= 3:
            split = text.find(PROPERTY_NAME_SEPARATOR, index, end)
            if index < split < end - 1:
                properties[text[index:split]] = text[split + 1 : end]
        index = end + 1
    return properties


# -- hosts and message ids ----------------------------------------------------------------


@functools.lru_cache(maxsize=4096)  # per record on the pull path; few distinct hosts
def ipv4_for_record(host: str) -> str:
    """The IPv4 address a v1 record can carry for `host` (notes 7.1).

    ali-ons always reads 4-byte hosts, so an IPv4-mapped IPv6 address gives its IPv4 and
    any other host (IPv6, a name) the placeholder 127.0.0.1.
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return IPV4_PLACEHOLDER
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        return str(mapped) if mapped is not None else IPV4_PLACEHOLDER
    return str(address)


@functools.lru_cache(maxsize=4096)
def _ipv4_packed(host: str) -> bytes:
    try:
        return ipaddress.IPv4Address(host).packed
    except ValueError:
        raise ValueError(f"a v1 record needs an IPv4 host, not {host!r}") from None


def offset_msg_id(store_host: str, store_port: int, physical_offset: int) -> str:
    """MessageDecoder.createMessageId: uppercase hex of store IP, port, commit-log offset.

    32 characters for an IPv4 store host, 56 for IPv6 (notes 7.4). The send response's
    `msgId` and the pulled record must agree: ali-ons computes it from the record.
    """
    address = ipaddress.ip_address(store_host)
    layout = _MSG_ID_V4 if address.version == 4 else _MSG_ID_V6
    return layout.pack(address.packed, store_port, physical_offset).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """(store host, port, commit-log offset) of an offset message id; ValueError if not one."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ValueError(f"not a message id: {msg_id!r:.60}") from None
    if len(raw) == _MSG_ID_V4.size:
        packed, port, offset = _MSG_ID_V4.unpack(raw)
    elif len(raw) == _MSG_ID_V6.size:
        packed, port, offset = _MSG_ID_V6.unpack(raw)
    else:
        raise ValueError(f"not a message id: {msg_id!r:.60}")
    return str(ipaddress.ip_address(packed)), port, offset


# -- stored-message records -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One record of a PULL_MESSAGE body, field for field (notes 7.1)."""

    topic: str
    body: bytes  # as stored: still compressed when sys_flag bit 0 is set
    queue_id: int
    queue_offset: int
    physical_offset: int  # any unique int64; CONSUMER_SEND_MSG_BACK names it as `offset`
    born_timestamp: int  # ms
    born_host: str
    born_port: int
    store_timestamp: int  # ms
    store_host: str
    store_port: int
    flag: int = 0
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: str = ""  # serialized, `K\x01V\x02...`

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.store_port, self.physical_offset)


def body_crc(body: bytes) -> int:
    """UtilAll.crc32: CRC32 masked to a non-negative int32."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_record(message: StoredMessage) -> bytes:
    """A v1 record with IPv4 hosts, the only form ali-ons and 4.x clients read.

    Hosts must be IPv4 (see `ipv4_for_record`); sys_flag bits 4/5 (IPv6 hosts) are cleared,
    or a Java reader would take 16 bytes per host.
    """
    topic = message.topic.encode("utf-8")
    if len(topic) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic of {len(topic)} bytes does not fit a v1 record")
    properties = message.properties.encode("utf-8")
    if len(properties) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties of {len(properties)} bytes do not fit a record")
    body = message.body
    size = RECORD_FIXED_SIZE + 4 + len(body) + 1 + len(topic) + 2 + len(properties)
    return b"".join(
        (
            _RECORD_HEAD.pack(
                size,
                MAGIC_V1,
                body_crc(body),
                message.queue_id,
                message.flag,
                message.queue_offset,
                message.physical_offset,
                message.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6),
                message.born_timestamp,
            ),
            _IPV4_PORT.pack(_ipv4_packed(message.born_host), message.born_port),
            _RECORD_MIDDLE.pack(message.store_timestamp),
            _IPV4_PORT.pack(_ipv4_packed(message.store_host), message.store_port),
            _RECORD_TAIL.pack(message.reconsume_times, message.prepared_transaction_offset),
            _BE32.pack(len(body)),
            body,
            bytes((len(topic),)),
            topic,
            _BE16.pack(len(properties)),
            properties,
        )
    )


class _Reader:
    """Bounds-checked big-endian reads over one buffer; MalformedBody past its end."""

    __slots__ = ("data", "end", "pos", "what")

    def __init__(self, data: bytes, what: str, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end
        self.what = what

    def take(self, n: int) -> bytes:
        if n < 0 or n > self.end - self.pos:
            raise MalformedBody(f"{self.what} truncated at byte {self.pos} (wants {n})")
        start = self.pos
        self.pos += n
        return self.data[start : self.pos]

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        return layout.unpack(self.take(layout.size))

    def host(self, v6: bool) -> tuple[str, int]:
        packed = self.take(16 if v6 else 4)
        return str(ipaddress.ip_address(packed)), self.unpack(_BE32)[0]


def decode_records(data: bytes) -> list[StoredMessage]:
    """Every record of a pull body (the client's side; the gateway uses it in tests).

    Reads v1 and v2 magic and 16-byte hosts where sys_flag says so, as Java's decoder
    does; anything else is MalformedBody rather than the clients' silent stop.
    """
    records = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 4:
            raise MalformedBody(f"record at byte {pos} truncated")
        size = _BE32.unpack_from(data, pos)[0]
        if size < RECORD_FIXED_SIZE + 7 or size > len(data) - pos:
            raise MalformedBody(f"record at byte {pos} has size {size}")
        records.append(_decode_record(_Reader(data, "record", pos, pos + size)))
        pos += size
    return records


def _decode_record(r: _Reader) -> StoredMessage:
    _size, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born = r.unpack(
        _RECORD_HEAD
    )
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise MalformedBody(f"record magic {magic:#x} unknown")
    born_host, born_port = r.host(bool(sys_flag & SYSFLAG_BORNHOST_V6))
    (stored,) = r.unpack(_RECORD_MIDDLE)
    store_host, store_port = r.host(bool(sys_flag & SYSFLAG_STOREHOST_V6))
    reconsume_times, prepared = r.unpack(_RECORD_TAIL)
    body = r.take(r.unpack(_BE32)[0])
    if body_crc(body) != crc:
        raise MalformedBody("record body CRC mismatch")
    topic_length = r.unpack(_BE16)[0] if magic == MAGIC_V2 else r.take(1)[0]
    topic = r.take(topic_length).decode("utf-8", "replace")
    properties = r.take(r.unpack(_BE16)[0]).decode("utf-8", "replace")
    if r.pos != r.end:
        raise MalformedBody("record size does not match its fields")
    return StoredMessage(
        topic=topic,
        body=body,
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        born_timestamp=born,
        born_host=born_host,
        born_port=born_port,
        store_timestamp=stored,
        store_host=store_host,
        store_port=store_port,
        flag=flag,
        sys_flag=sys_flag,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared,
        properties=properties,
    )


# -- SEND_BATCH_MESSAGE ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One message of a batch body; topic, queue and sysFlag come from the request header."""

    flag: int
    body: bytes
    properties: str  # serialized, `K\x01V\x02...`


def encode_batch_body(entries: list[BatchEntry]) -> bytes:
    """MessageDecoder.encodeMessages, as a Java producer sends it (magic and CRC are 0)."""
    parts = []
    for entry in entries:
        properties = entry.properties.encode("utf-8")
        if len(properties) > MAX_PROPERTIES_BYTES:
            raise ValueError(f"properties of {len(properties)} bytes do not fit a batch entry")
        size = _BATCH_HEAD.size + len(entry.body) + 2 + len(properties)
        parts += (
            _BATCH_HEAD.pack(size, 0, 0, entry.flag, len(entry.body)),
            entry.body,
            _BE16.pack(len(properties)),
            properties,
        )
    return b"".join(parts)


def decode_batch_body(body: bytes) -> list[BatchEntry]:
    """The messages of a SEND_BATCH_MESSAGE body (notes 7.6).

    Read field by field as the broker's MessageExtBatchEncoder does; like it, the total
    size, magic and CRC fields are not checked. A length running past the body, or a
    negative one, is MalformedBody (Java fails inside its store with an exception).
    """
    r = _Reader(body, "batch body")
    entries = []
    while r.pos < r.end:
        _size, _magic, _crc, flag, body_length = r.unpack(_BATCH_HEAD)
        message_body = r.take(body_length)
        properties = r.take(r.unpack(_BE16)[0]).decode("utf-8", "replace")
        entries.append(BatchEntry(flag, message_body, properties))
    return entries
