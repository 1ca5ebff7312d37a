"""How a message is kept in Redis: keys of a topic, the packed message, the flat replies
of the library's functions (gateway/stores/redis_lua.py)."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

from gateway.model import Message

PREFIX = "gw:"
IDS_KEY = PREFIX + "ids"  # the id counter every gateway takes blocks from (INCRBY)
TOPICS_KEY = PREFIX + "topics"  # topic -> paused (0/1): the shared registry
NOTIFY = PREFIX + "notify"  # pub/sub: "<topic>" published, so idle consumers claim

_LEN = struct.Struct(">I")


def topic_key(topic: str) -> str:
    """Every key of a topic starts with this: the hash tag keeps them in one slot."""
    return f"{PREFIX}{{{topic}}}:"


def hex_id(msg_id: int) -> str:
    return f"{msg_id:016x}"


def meta(msg: Message) -> bytes:
    """The fields that never change after a publish, packed before the body."""
    hb = msg.header_block
    doc = [
        msg.timestamp,
        msg.ttr,
        msg.reply_to,
        msg.origin,
        msg.headers,
        hb.decode("latin-1") if hb is not None else None,
    ]
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return _LEN.pack(len(raw)) + raw


def pack_all(messages: Sequence[Message]) -> list[bytes | str]:
    """Flat (id, packed) for gw_put; one publish's messages share their meta, so it is
    encoded once unless the messages differ."""
    out: list[bytes | str] = []
    last: Message | None = None
    head = b""
    for m in messages:
        if (
            last is None
            or m.timestamp != last.timestamp
            or m.headers is not last.headers
            or m.origin != last.origin
            or m.ttr != last.ttr
            or m.reply_to != last.reply_to
            or m.header_block is not last.header_block
        ):
            head = meta(m)
            last = m
        out.append(hex_id(m.id))
        out.append(head + m.body)
    return out


def unpack(
    topic: str,
    id_hex: bytes,
    attempts: bytes | int,
    prio: bytes | int,
    packed: bytes,
    memo: dict[bytes, tuple[object, ...]] | None = None,
) -> Message:
    """A message as `gw_put` stored it; `memo` caches the decoded meta, which the
    messages of one publish share."""
    (n,) = _LEN.unpack_from(packed)
    raw = packed[4 : 4 + n]
    doc = memo.get(raw) if memo is not None else None
    if doc is None:
        ts, ttr, reply_to, origin, headers, hb = json.loads(raw)
        doc = (
            ts,
            ttr,
            reply_to,
            origin,
            [tuple(h) for h in headers] if headers is not None else None,
            hb.encode("latin-1") if hb is not None else None,
        )
        if memo is not None:
            memo[raw] = doc
    ts, ttr, reply_to, origin, headers, hb = doc
    m = Message(
        int(id_hex, 16),
        topic,
        packed[4 + n :],
        ts,  # type: ignore[arg-type]
        list(headers) if headers is not None else None,  # type: ignore[call-overload]
        int(attempts),
        int(prio),
        0.0,
        ttr,  # type: ignore[arg-type]
        reply_to,  # type: ignore[arg-type]
        origin,  # type: ignore[arg-type]
    )
    if hb is not None:
        m.header_block = hb  # type: ignore[assignment]
    return m


def unpack_flat(topic: str, flat: Sequence[bytes], *, with_due: bool = False) -> list[Message]:
    """(id attempts prio packed [due]) x n, as the library returns them."""
    out = []
    step = 5 if with_due else 4
    memo: dict[bytes, tuple[object, ...]] = {}
    for i in range(0, len(flat), step):
        m = unpack(topic, flat[i], flat[i + 1], flat[i + 2], flat[i + 3], memo)
        if with_due:
            m.deliver_at = float(flat[i + 4]) / 1000.0
        out.append(m)
    return out
