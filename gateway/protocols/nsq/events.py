"""Commands an NSQ client sends, as the codec hands them to the session.

Small slotted dataclasses (the h11 habit): cheap to make, easy to compare in tests. Not
frozen: a frozen dataclass's __init__ goes through object.__setattr__, which costs more
than the rest of parsing a FIN. Treat them as immutable all the same.
Names are already validated and decoded; numbers are already parsed and range-checked
where nsqd checks them in its parser.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Identify:
    body: bytes  # JSON; negotiation.py decodes it against the server's limits


@dataclass(slots=True)
class Auth:
    secret: bytes


@dataclass(slots=True)
class Sub:
    topic: str
    channel: str


@dataclass(slots=True)
class Rdy:
    count: int


@dataclass(slots=True)
class Fin:
    msg_id: bytes  # 16 bytes, as the client echoes them


@dataclass(slots=True)
class FinBatch:
    """Consecutive FINs of well-formed ids (16 lowercase hex digits), parsed in one go: a
    consumer sends one per message."""

    ids: tuple[int, ...]  # as the client sent them: b"%016x" % id


@dataclass(slots=True)
class Req:
    msg_id: bytes
    timeout_ms: int  # not clamped yet: nsqd clamps REQ to max-req-timeout silently


@dataclass(slots=True)
class Touch:
    msg_id: bytes


@dataclass(slots=True)
class Cls:
    pass


@dataclass(slots=True)
class Nop:
    pass


@dataclass(slots=True)
class Pub:
    topic: str
    body: bytes


@dataclass(slots=True)
class Mpub:
    topic: str
    bodies: list[bytes]


@dataclass(slots=True)
class Dpub:
    topic: str
    defer_ms: int
    body: bytes


@dataclass(slots=True)
class MpubStart:
    """MPUB's line was valid: nsqd checks authorization here, before reading the body."""

    topic: str


@dataclass(slots=True)
class ProtocolError:
    """Bad input: send `frame` (None: close silently) and close the connection."""

    frame: bytes | None


Event = (
    Identify
    | Auth
    | Sub
    | Rdy
    | Fin
    | FinBatch
    | Req
    | Touch
    | Cls
    | Nop
    | Pub
    | Mpub
    | Dpub
    | MpubStart
    | ProtocolError
)
