"""What a NATS cluster peer sends on a route, as the route codec hands it to the session.

Small slotted dataclasses, as in client_events.py, and not frozen for the same reason: a
frozen dataclass's __init__ goes through object.__setattr__, which costs more than the
rest of parsing an RMSG. Treat them as immutable all the same.

Accounts, subjects, reply subjects, queue names and origins are decoded UTF-8 with
surrogateescape, so any byte a server sends survives the round trip back to the wire
(route_codec's frame builders encode the same way). Sizes and argument counts are
already checked the way nats-server's route.go checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Info:
    """The peer's INFO object. Only the JSON syntax is checked; unknown keys are normal."""

    doc: dict[str, Any]


@dataclass(slots=True)
class Connect:
    """The dialer's CONNECT object. Checking `cluster`, `lang` etc. is the session's job."""

    doc: dict[str, Any]


@dataclass(slots=True)
class Ping:
    pass


@dataclass(slots=True)
class Pong:
    pass


@dataclass(slots=True)
class Ok:
    """`+OK`: only sent when our CONNECT said verbose; nats-server ignores it on routes."""


@dataclass(slots=True)
class Err:
    """`-ERR '<text>'` from the peer, quotes removed. The peer closes right after it."""

    text: str


@dataclass(slots=True)
class RemoteSub:
    """`RS+ <account> <subject> [<queue> <weight>]` or `LS+ <origin> ...` (leafnode origin).

    Interest is a set on the server side: a repeated RS+ for a queue carries the new
    weight (it can go down), it does not add to the old one.
    """

    account: str
    subject: str
    queue: str | None
    weight: int | None  # members of `queue` behind the peer; None exactly when queue is None
    origin: str | None  # the leafnode cluster for LS+; None for RS+


@dataclass(slots=True)
class RemoteUnsub:
    """`RS- <account> <subject> [<queue>]` or `LS- [<origin>] <account> <subject> [<queue>]`.

    origin is None for RS-, and for an LS- without an origin: 2.9.10 writes an empty
    origin (`LS-  $G leaf.sub`, two spaces) and 2.10+ leaves it out unless our INFO said
    `lnocu`. A gateway that sets `lnoc` must also set `lnocu`: a single-space LS- with three
    arguments is read as origin, account, subject.
    """

    account: str
    subject: str
    queue: str | None
    origin: str | None


@dataclass(slots=True)
class Msg:
    """RMSG, HMSG or LMSG.

    `queues` is None without a queue marker (deliver to no local queue group: the peer
    already served them), otherwise the groups after `| ` or `+ <reply> ` (deliver to one
    member of each, possibly none listed). `header` is the header block of an HMSG, or of
    an LMSG whose header size is not 0; None for RMSG and an LMSG with header size 0.
    `payload` is the body only.
    """

    account: str
    subject: str
    reply: str | None
    queues: tuple[str, ...] | None
    header: bytes | None
    payload: bytes
    origin: str | None  # the leafnode cluster for LMSG; None for RMSG/HMSG


@dataclass(slots=True)
class Ignored:
    """An op nats-server accepts on a route and drops: `SUB`, `PUB` (payload consumed),
    `A+`, `A-`. `op` is the upper-case op name."""

    op: str


@dataclass(slots=True)
class ProtocolError:
    """Bad input: send `reply` (None: nothing, as nats-server does for argument errors,
    which it only logs), then close the connection. `reason` is for the log and names
    the nats-server check where there is one. The codec yields nothing after it."""

    reply: bytes | None
    reason: str


Event = (
    Info
    | Connect
    | Ping
    | Pong
    | Ok
    | Err
    | RemoteSub
    | RemoteUnsub
    | Msg
    | Ignored
    | ProtocolError
)
