"""The NATS cluster route frames the gateway sends (CONNECT, RS+, RS-, RMSG, HMSG), as
nats-server writes them; route_codec.py parses what a peer sends and re-exports these."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from gateway.protocols.nats.client_codec import MAX_SIZE_DIGITS, _go_json

# util.go parseSize reads at most 9 digits, so a larger weight would not parse.
_MAX_WEIGHT: Final = 10**MAX_SIZE_DIGITS - 1


def _enc(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def connect(doc: dict[str, Any]) -> bytes:
    """`CONNECT {json}\\r\\n`, compact JSON as Go writes it."""
    return b"CONNECT " + _go_json(doc).encode("utf-8", "surrogateescape") + b"\r\n"


def rs_plus(
    account: str, subject: str, queue: str | None = None, weight: int | None = None
) -> bytes:
    """`RS+ <account> <subject> [<queue> <weight>]\\r\\n`.

    A queue needs its weight (the number of our members, sent again whenever it changes)
    and a plain subscription must not have one: nats-server closes the route otherwise.
    """
    if queue is None:
        if weight is not None:
            raise ValueError("a weight needs a queue")
        return b"RS+ %s %s\r\n" % (_enc(account), _enc(subject))
    if weight is None or not 0 <= weight <= _MAX_WEIGHT:
        raise ValueError(f"a queue RS+ needs a weight from 0 to {_MAX_WEIGHT}, got {weight}")
    return b"RS+ %s %s %s %d\r\n" % (_enc(account), _enc(subject), _enc(queue), weight)


def rs_minus(account: str, subject: str, queue: str | None = None) -> bytes:
    """`RS- <account> <subject> [<queue>]\\r\\n` (never a weight: that closes the route)."""
    if queue is None:
        return b"RS- %s %s\r\n" % (_enc(account), _enc(subject))
    return b"RS- %s %s %s\r\n" % (_enc(account), _enc(subject), _enc(queue))


def _head(account: str, subject: str, reply: str | None, queues: Iterable[str] | None) -> bytes:
    # An empty queue list is written as none: `RMSG $G s | 5` would be read as reply "|".
    names = b" ".join(_enc(q) for q in queues) if queues else b""
    if names:
        if reply:
            return b"%s %s + %s %s" % (_enc(account), _enc(subject), _enc(reply), names)
        return b"%s %s | %s" % (_enc(account), _enc(subject), names)
    if reply:
        return b"%s %s %s" % (_enc(account), _enc(subject), _enc(reply))
    return b"%s %s" % (_enc(account), _enc(subject))


def rmsg(
    account: str,
    subject: str,
    reply: str | None,
    queues: Iterable[str] | None,
    payload: bytes,
) -> bytes:
    """`RMSG <account> <subject> [<reply> | + <reply> <q>... | "|" <q>...] <size>\\r\\n...`.

    Without queues the message reaches only the peer's plain subscribers; name a queue
    group to have the peer deliver to one of its members.
    """
    return b"RMSG %s %d\r\n%s\r\n" % (_head(account, subject, reply, queues), len(payload), payload)


def hmsg(
    account: str,
    subject: str,
    reply: str | None,
    queues: Iterable[str] | None,
    header: bytes,
    payload: bytes,
) -> bytes:
    """Like rmsg, with `<hdr_len> <total_len>`; the total includes the header block."""
    hdr = len(header)
    return b"HMSG %s %d %d\r\n%s%s\r\n" % (
        _head(account, subject, reply, queues),
        hdr,
        hdr + len(payload),
        header,
        payload,
    )
