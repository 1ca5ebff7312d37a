"""Commands an NSQ client sends, as the codec hands them to the session.

Small frozen slotted dataclasses (the h11 habit): cheap to make, easy to compare in tests.
Names are already validated and decoded; numbers are already parsed and range-checked
where nsqd checks them in its parser.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identify:
    body: bytes  # JSON; negotiation.py decodes it against the server's limits


@dataclass(frozen=True, slots=True)
class Auth:
    secret: bytes


@dataclass(frozen=True, slots=True)
class Sub:
    topic: str
    channel: str


@dataclass(frozen=True, slots=True)
class Rdy:
    count: int


@dataclass(frozen=True, slots=True)
class Fin:
    msg_id: bytes  # 16 bytes, as the client echoes them


@dataclass(frozen=True, slots=True)
class Req:
    msg_id: bytes
    timeout_ms: int  # not clamped yet: nsqd clamps REQ to max-req-timeout silently


@dataclass(frozen=True, slots=True)
class Touch:
    msg_id: bytes


@dataclass(frozen=True, slots=True)
class Cls:
    pass


@dataclass(frozen=True, slots=True)
class Nop:
    pass


@dataclass(frozen=True, slots=True)
class Pub:
    topic: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Mpub:
    topic: str
    bodies: list[bytes]


@dataclass(frozen=True, slots=True)
class Dpub:
    topic: str
    defer_ms: int
    body: bytes


@dataclass(frozen=True, slots=True)
class MpubStart:
    """MPUB's line was valid: nsqd checks authorization here, before reading the body."""

    topic: str


@dataclass(frozen=True, slots=True)
class ProtocolError:
    """Bad input: send `frame` (None: close silently) and close the connection."""

    frame: bytes | None


Event = (
    Identify
    | Auth
    | Sub
    | Rdy
    | Fin
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
