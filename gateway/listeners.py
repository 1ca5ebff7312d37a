"""What a protocol package hands the app: its server object, its listeners, and what
must happen around binding them.

Each protocol package builds its own (`gateway/protocols/<name>/listener.py`, the HTTP
API in `gateway/http/server.py`) from the settings, so the app binds a table of
listeners and knows no protocol's bytes, settings or TLS: a protocol's refusal, its
TLS wrapping and whether it is guarded change in its own package.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import trio

from gateway.addresses import Address
from gateway.tcp import Handle

Server = TypeVar("Server")


async def refuse_silently(stream: trio.SocketStream, remote: str) -> None:
    """A protocol with nothing to say before a request (a remoting reply answers one; a
    route's dialing server logs the close and redials): the close alone."""
    return None


@dataclass(frozen=True)
class Listener:
    """A port the TCP shell (gateway.tcp) serves: one `handle` call per connection."""

    name: str  # the `listening protocol=<name>` line's, the metrics label, /info's key
    address: Address | None  # where the settings bind it; None: off
    handle: Handle
    # TLS or authentication configured, else a warning when it is reachable from other
    # hosts (docs/security.md)
    guarded: bool
    # a connection past the listener's limits: answered in the protocol's own words
    refuse: Handle = refuse_silently
    # told the first bound address, for a protocol that names its own port to others
    bound: Callable[[Address], None] | None = None


@dataclass(frozen=True)
class HTTPListener:
    """A port whose server binds and serves itself (hypercorn): started with the host and
    port, it reports every bound (host, port)."""

    name: str
    address: Address | None
    guarded: bool
    serve: Callable[..., Awaitable[Any]]


@dataclass
class Service(Generic[Server]):
    """One protocol's part in the app."""

    server: Server  # what sessions share; the app keeps it for signals, /stats, metrics
    listeners: list[Listener]  # bound in this order
    # called once the store is open, before any listener of any protocol is bound
    before: Callable[[], None] | None = None
    # started once every listener, HTTP's too, is bound: what dials out naming their ports
    after: Callable[..., Awaitable[Any]] | None = None
