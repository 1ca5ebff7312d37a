"""What a NATS client sends, as the client codec hands it to the session.

Small slotted dataclasses (the h11 habit): cheap to make, easy to compare in tests. Not
frozen: a frozen dataclass's __init__ goes through object.__setattr__, which costs more
than the rest of parsing a PUB. Treat them as immutable all the same.

Subjects, reply subjects, queue names and sids are decoded UTF-8 with surrogateescape, so
any byte a client sends survives the round trip back to the wire (client_codec.msg()
encodes the same way). Sizes are already checked the way nats-server's parser checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Connect:
    """CONNECT's JSON object (`CONNECT null` gives {}, as Go's json.Unmarshal ignores it).

    Only the JSON syntax is checked here. nats-server decodes the object into a Go struct:
    a value of the wrong type closes the connection, and keys match the struct fields
    case-insensitively (`{"HEADERS":true}` works). client_codec.connect_option() does the
    lookup the same way.
    """

    options: dict[str, Any]


@dataclass(slots=True)
class Pub:
    subject: str
    reply: str | None
    payload: bytes


@dataclass(slots=True)
class HPub:
    subject: str
    reply: str | None
    # the raw header block, `NATS/1.0...\r\n\r\n`; not validated, nats-server doesn't either
    headers: bytes
    payload: bytes


@dataclass(slots=True)
class Sub:
    subject: str  # already valid per subjects.is_valid_subscription; else ProtocolError
    queue: str | None
    sid: str


@dataclass(slots=True)
class Unsub:
    sid: str
    # None when absent or not a number nats-server's parseSize accepts (1-9 digits).
    # nats-server unsubscribes at once unless max_msgs > 0 and > messages delivered so far.
    max_msgs: int | None


@dataclass(slots=True)
class Ping:
    pass


@dataclass(slots=True)
class Pong:
    pass


@dataclass(slots=True)
class ProtocolError:
    """Bad input. Send `reply` (None: nothing), then close the connection if `close`.

    After an error with close=True the codec yields no more events.
    """

    reply: bytes | None
    close: bool


Event = Connect | Pub | HPub | Sub | Unsub | Ping | Pong | ProtocolError
