"""What every NATS client connection of one gateway shares."""

from __future__ import annotations

import hmac
import secrets
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.broker import Broker
from gateway.connection import Buffered
from gateway.metrics import Metrics
from gateway.protocols.nats import client_codec as cc
from gateway.protocols.nats.permissions import Permissions

if TYPE_CHECKING:
    from gateway.protocols.nats.client_session import NATSClientSession

VERSION = "2.10.0"  # what INFO reports; clients only check features, not the number


@dataclass
class NATSServer:
    broker: Broker
    metrics: Metrics
    max_payload: int = 1048576  # nats-server's default max_payload
    max_pending: int = 64 * 1024 * 1024  # nats-server's max_pending: past it, a slow consumer
    max_control_line: int = 4096  # nats-server's max_control_line
    write_deadline: float = 10.0  # nats-server's write_deadline (seconds)
    ping_interval: float = 120.0  # nats-server's ping_interval (2 min)
    ping_max: int = 2  # nats-server's ping_max
    # output queued for all clients together ([limits] max_buffered_bytes)
    buffered: Buffered = field(default_factory=lambda: Buffered(1 << 30, 1 << 20))
    turn_budget: float = 0.00002  # seconds of operations per connection between yields
    max_errors_in_a_row: int = 100  # -ERR replies that keep the connection, then closed
    user: str | None = None
    password: str | None = None
    token: str | None = None
    # TLS as nats-server with a `tls` block: required of every client, after INFO; with
    # tls_verify a client certificate is required too
    ssl_context: ssl.SSLContext | None = None
    tls_verify: bool = False
    tls_timeout: float = 2.0  # nats-server's tls timeout (seconds)
    auth_timeout: float = 2.0  # nats-server's: CONNECT must come within it when auth is on
    # user -> (password, permissions or None for all); `user` above is one more of them
    users: dict[str, tuple[str, Permissions | None]] = field(default_factory=dict)
    server_id: str = field(default_factory=lambda: "N" + secrets.token_hex(27).upper()[:55])
    server_name: str = "gateway"
    sessions: set[NATSClientSession] = field(default_factory=set)
    # True while a client's batch of operations is applied (synchronously): a session
    # that gets output then joins `dirty`, and the batch's end writes it (write_now)
    in_batch: bool = False
    dirty: list[NATSClientSession] = field(default_factory=list)
    next_client_id: int = 0

    @property
    def auth_required(self) -> bool:
        return self.user is not None or self.token is not None or bool(self.users)

    def take_client_id(self) -> int:
        """The next connection's id; a refused one spends one too, as in nats-server."""
        self.next_client_id += 1
        return self.next_client_id

    def info(self, client_id: int, remote: str) -> bytes:
        """The INFO a client gets first, on a connection from `remote` (host:port)."""
        host = remote.rpartition(":")[0]
        doc: dict[str, object] = {
            "server_id": self.server_id,
            "server_name": self.server_name,
            "version": VERSION,
            "proto": 1,
            "go": "python",
            "host": "0.0.0.0",
            "port": 0,
            "headers": True,
            "max_payload": self.max_payload,
            "client_id": client_id,
            "client_ip": host.strip("[]"),
        }
        if self.auth_required:
            doc["auth_required"] = True
        if self.ssl_context is not None:
            doc["tls_required"] = True
            if self.tls_verify:
                doc["tls_verify"] = True
        return cc.info(doc)

    def authenticate(
        self, user: object, password: object, token: object
    ) -> tuple[bool, Permissions | None]:
        """Whether CONNECT's credentials are accepted, and the user's permissions (None:
        everything), a copy of its own for the connection."""
        if self.token is not None:
            return hmac.compare_digest(_bytes(token), self.token.encode()), None
        if self.user is not None and user == self.user:
            return hmac.compare_digest(_bytes(password), _bytes(self.password)), None
        entry = self.users.get(user) if isinstance(user, str) else None
        if entry is not None:
            ok = hmac.compare_digest(_bytes(password), entry[0].encode())
            return ok, None if entry[1] is None else entry[1].fresh()
        return not self.auth_required, None


def _bytes(value: object) -> bytes:
    return value.encode() if isinstance(value, str) else b"\x00not a string"
