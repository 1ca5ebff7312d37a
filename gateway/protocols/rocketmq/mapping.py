"""RocketMQ messages <-> the gateway's model: properties, tags, bodies, records.

Sans-IO helpers the session and the group feeds share. A RocketMQ message's properties
become the internal message's headers (in order; a NATS subscriber sees them as NATS
headers), and a message from any protocol is written into a pull record with its headers
as properties (docs/semantics.md, "RocketMQ").
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from gateway.model import Message
from gateway.protocols.rocketmq.message import (
    MAX_PROPERTIES_BYTES,
    PROPERTY_NAME_SEPARATOR,
    PROPERTY_SEPARATOR,
    StoredMessage,
    decode_properties,
    encode_record,
    ipv4_for_record,
)

# TopicValidator (4.9.8): `^[%|a-zA-Z0-9_-]+$`, at most 127 characters (a v1 record's
# int8 topic length). Consumer groups follow the same character rule, at most 255.
_NAME = re.compile(r"[%|a-zA-Z0-9_-]+\Z")
MAX_TOPIC_LENGTH: Final = 127
MAX_GROUP_LENGTH: Final = 255

RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"

# Property names (MessageConst) the gateway reads or writes.
TAGS: Final = "TAGS"
KEYS: Final = "KEYS"
DELAY: Final = "DELAY"
WAIT: Final = "WAIT"
RETRY_TOPIC: Final = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME: Final = "RECONSUME_TIME"
MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
TRANSACTION_PREPARED: Final = "TRAN_MSG"  # "true" on a transactional producer's half message
# Set by the sending broker or by the consuming client, never meant to travel on: WAIT is
# an instruction to the broker, MIN/MAX_OFFSET are added by clients on pull.
_NOT_KEPT: Final = frozenset((WAIT, "MIN_OFFSET", "MAX_OFFSET"))

# MessageStoreConfig.messageDelayLevel, in seconds: level 1 is 1 s ... level 18 is 2 h.
DEFAULT_DELAY_LEVELS: Final = (
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    180.0,
    240.0,
    300.0,
    360.0,
    420.0,
    480.0,
    540.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
    7200.0,
)


def valid_topic(name: str) -> bool:
    return len(name) <= MAX_TOPIC_LENGTH and _NAME.match(name) is not None


def valid_group(name: str) -> bool:
    return len(name) <= MAX_GROUP_LENGTH and _NAME.match(name) is not None


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def queue_count_of(topic: str, configured: int) -> int:
    """Retry and dead-letter topics have one queue (the broker creates them so)."""
    return 1 if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)) else configured


# -- subscriptions ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscription:
    """A TAG subscription expression: `*` (or empty) for every message, else tags joined
    by `||`. A message without a tag matches only `*`, as on the Java broker."""

    expression: str
    tags: frozenset[str] | None  # None: everything
    version: int = 0

    def matches(self, tag: str | None) -> bool:
        return self.tags is None or (tag is not None and tag in self.tags)


EVERYTHING: Final = Subscription("*", None)


def parse_subscription(expression: str | None, version: int = 0) -> Subscription:
    text = (expression or "").strip()
    if not text or text == "*":
        return Subscription("*", None, version)
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    if not tags or "*" in tags:
        return Subscription("*", None, version)
    return Subscription(text, tags, version)


# -- properties and headers -------------------------------------------------------------------


def headers_from_properties(text: str) -> list[tuple[str, str]]:
    """A send's properties as the message's headers (WAIT and client-side ones left out)."""
    return [(k, v) for k, v in decode_properties(text).items() if k not in _NOT_KEPT]


def header(msg: Message, name: str) -> str | None:
    headers = msg.headers
    if not headers:
        return None
    value = None
    for key, val in headers:
        if key == name:
            value = val  # the last one wins, as a property map would have it
    return value


def tag_of(msg: Message) -> str | None:
    return header(msg, TAGS)


def _property_safe(text: str) -> bool:
    return bool(text) and PROPERTY_NAME_SEPARATOR not in text and PROPERTY_SEPARATOR not in text


def properties_text(headers: Iterable[tuple[str, str]] | None) -> str:
    """Headers as a record's properties. A header the format cannot carry (empty, or with
    a separator character) is left out, and so is whatever would pass the int16 length."""
    if not headers:
        return ""
    merged: dict[str, str] = {}
    for name, value in headers:
        if _property_safe(name) and _property_safe(value):
            merged[name] = value
    parts = []
    size = 0
    for name, value in merged.items():
        item = f"{name}\x01{value}\x02"
        try:
            size += len(item.encode("utf-8"))
        except UnicodeEncodeError:
            # a header of another protocol that is no text (NATS bytes, a lone surrogate):
            # "?" for what UTF-8 cannot carry, as Java writes such a String
            item = item.encode("utf-8", "replace").decode("utf-8")
            size += len(item.encode("utf-8"))
        if size > MAX_PROPERTIES_BYTES:
            break
        parts.append(item)
    return "".join(parts)


def int_header(msg: Message, name: str) -> int:
    value = header(msg, name)
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 9:
        return 0  # "²" is a digit to str.isdigit, not to int()
    return int(value)


# -- bodies -----------------------------------------------------------------------------------


class BodyTooLarge(ValueError):
    pass


def inflate(body: bytes, limit: int) -> bytes:
    """A zlib body (sysFlag bit 0) inflated, refusing more than `limit` bytes out (a small
    body must not inflate into gigabytes). ValueError when it is not a zlib stream."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"compressed body is not a zlib stream: {exc}") from None
    if len(out) > limit:
        raise BodyTooLarge(f"the message body inflates past {limit} bytes")
    if not inflater.eof:
        raise ValueError("compressed body is truncated")
    return out


# -- pull records -----------------------------------------------------------------------------


def born_host(msg: Message, fallback: tuple[str, int]) -> tuple[str, int]:
    """The publisher's address from the message's origin ("<protocol> <host:port>")."""
    _, _, peer = msg.origin.partition(" ")
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        return fallback
    return ipv4_for_record(host.strip("[]")), int(port) & 0x7FFFFFFF


def encode_pulled(
    msg: Message,
    topic: str,
    queue_id: int,
    queue_offset: int,
    store: tuple[str, int],
) -> bytes:
    """One message as a v1 record: uncompressed body (another protocol's consumer sees
    the same bytes), its headers as properties, the message id as the commit-log offset
    (the key CONSUMER_SEND_MSG_BACK names it by, and part of its msgId)."""
    ms = msg.timestamp // 1_000_000
    host, port = born_host(msg, store)
    return encode_record(
        StoredMessage(
            topic=topic,
            body=msg.body,
            queue_id=queue_id,
            queue_offset=queue_offset,
            physical_offset=msg.id,
            born_timestamp=ms,
            born_host=host,
            born_port=port,
            store_timestamp=ms,
            store_host=store[0],
            store_port=store[1],
            reconsume_times=int_header(msg, RECONSUME_TIME),
            properties=properties_text(msg.headers),
        )
    )
