"""How a message is kept in Redis: keys of a topic, the packed message, the flat replies
of the library's functions (gateway/stores/redis_lua.py)."""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate
from operator import attrgetter, countOf

from gateway.model import Message, Publish

PREFIX = "gw:"
IDS_KEY = PREFIX + "ids"  # the id counter every gateway takes blocks from (INCRBY)
TOPICS_KEY = PREFIX + "topics"  # topic -> paused (0/1): the shared registry
NOTIFY = PREFIX + "notify"  # pub/sub: "<topic>" published, so idle consumers claim

_LEN = struct.Struct(">I")
_COUNT = struct.Struct("<I")
_ID = attrgetter("id")
_BODY = attrgetter("body")
# what one batch stores once for all its messages, compared in one C-level pass (no
# hashing: a publish's messages share one headers list, equal at its identity)
_SHARED = attrgetter(
    "timestamp", "priority", "attempts", "ttr", "reply_to", "origin", "headers", "header_block"
)


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


def batches(messages: Sequence[Message]) -> list[Sequence[Message]]:
    """One publish's messages as the runs `pack_batch` can store as one batch each:
    consecutive ids sharing priority, attempts and every field packed once. A publish
    is one run; the check is a few C-level passes, not a loop per message."""
    n = len(messages)
    if n == 1 or type(messages) is Publish:  # one by definition, or by Broker.publish
        return [messages]
    m0 = messages[0]
    if (
        list(map(_ID, messages)) == list(range(m0.id, m0.id + n))
        and countOf(map(_SHARED, messages), _SHARED(m0)) == n
    ):
        return [messages]
    runs: list[Sequence[Message]] = []
    start = 0
    for i in range(1, n + 1):  # a caller's mixed list (the contract suite): split it
        if i == n or not _joins(messages[i - 1], messages[i]):
            runs.append(messages[start:i])
            start = i
    return runs


def _joins(a: Message, b: Message) -> bool:
    return b.id == a.id + 1 and _SHARED(a) == _SHARED(b)


def pack_batch(messages: Sequence[Message]) -> bytes:
    """One batch (a run from `batches`): the shared fields once (`meta`), the count, the
    count + 1 offsets of the bodies (little-endian u32, the library slices with them),
    then the bodies end to end. Joined in C; no per-message Python work beyond `len`."""
    bodies = messages.bodies if type(messages) is Publish else list(map(_BODY, messages))
    offsets = array("I", accumulate(map(len, bodies), initial=0))
    if sys.byteorder != "little":
        offsets.byteswap()
    return b"".join([meta(messages[0]), _COUNT.pack(len(bodies)), offsets.tobytes(), *bodies])


def _shared(raw: bytes, memo: dict[bytes, tuple[object, ...]] | None) -> tuple[object, ...]:
    """The decoded meta of a batch; `memo` caches it for the other messages of the batch."""
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
    return doc


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
    ts, ttr, reply_to, origin, headers, hb = _shared(packed[4 : 4 + n], memo)
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


def run_batches(flat: Sequence[bytes | int]) -> list[bytes]:
    """The batches (their keys in m) the runs of a claim cut from, each once."""
    return list(dict.fromkeys(flat[0::5]))  # type: ignore[arg-type]


def unpack_runs(
    topic: str, flat: Sequence[bytes | int], blobs: dict[bytes, bytes | None]
) -> list[Message]:
    """(batch first last attempts prio) x n, as `gw_claim` returns the runs it claimed:
    messages first..last of the batch `pack_batch` stored, their bodies cut out of its
    blob (`blobs`: batch -> blob, read by the gateway; a batch that went meanwhile, its
    topic deleted, has none and delivers nothing)."""
    out: list[Message] = []
    memo: dict[bytes, tuple[object, ...]] = {}
    for i in range(0, len(flat), 5):
        batch_hex, first, last, attempts, prio = flat[i : i + 5]
        blob = blobs.get(batch_hex)  # type: ignore[arg-type]
        if not blob:
            continue
        batch = int(batch_hex, 16)  # type: ignore[arg-type]
        first, last = int(first), int(last)  # type: ignore[arg-type]
        attempts, prio = int(attempts), int(prio)  # type: ignore[arg-type]
        (n,) = _LEN.unpack_from(blob)
        ts, ttr, reply_to, origin, headers, hb = _shared(blob[4 : 4 + n], memo)
        (count,) = _COUNT.unpack_from(blob, 4 + n)
        start = 8 + n
        base = start + 4 * (count + 1)
        offsets = array("I", blob[start:base])
        if sys.byteorder != "little":
            offsets.byteswap()
        out += Message.run(
            first,
            topic,
            blob,
            [o + base for o in offsets[first - batch : last - batch + 2]],
            ts,  # type: ignore[arg-type]
            headers,  # type: ignore[arg-type]
            attempts,
            prio,
            ttr,  # type: ignore[arg-type]
            reply_to,  # type: ignore[arg-type]
            origin,  # type: ignore[arg-type]
            hb,  # type: ignore[arg-type]
        )
    return out
