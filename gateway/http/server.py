"""The HTTP listener: hypercorn's Trio worker serving the gateway's ASGI router.

hypercorn speaks HTTP/1.1 (h11) and HTTP/2 (h2), the latter as h2c both with prior
knowledge and by `Upgrade: h2c`, so this module only binds, configures and reports.
"""

from __future__ import annotations

import logging
import socket
import ssl
from functools import partial
from typing import TYPE_CHECKING

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.trio.tcp_server import TCPServer

from gateway.http import admin, auth, lookupd, nsqd, probes, prometheus
from gateway.http.router import Router
from gateway.listeners import HTTPListener

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.tls import ListenerContexts

_BACKLOG = 128
log = logging.getLogger("gateway.http")


# hypercorn's Trio worker runs each connection in the listeners' nursery and lets any
# error of its protocol code out of it (it catches OSError only), and that ends the
# process: every listener of the gateway, not only HTTP. hypercorn 0.18 raises on valid
# input (DATA frames of an HTTP/2 stream it has answered and forgotten, RFC 9113 8.1)
# and on bad input (an h2c upgrade whose HTTP2-Settings is no base64). It has no hook to
# contain that, so its connection task is wrapped: an error ends that connection alone.
_hypercorn_connection = TCPServer.run


async def _one_connection(self: TCPServer) -> None:
    try:
        await _hypercorn_connection(self)
    except Exception as exc:  # an ExceptionGroup too; never Cancelled (a BaseException)
        log.warning("http: a connection ended on an error in the HTTP server: %r", exc)
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self.stream)


TCPServer.run = _one_connection  # type: ignore[method-assign]


def build_router(gateway: Gateway) -> Router:
    """Every endpoint of the listener. /ping and /info are shared by the nsqd and
    nsqlookupd APIs; where both define a path (/topic/create, ...), nsqd's wins, since
    this process is the nsqd that acts on it."""
    router = Router(gateway.metrics, access=gateway.access_log)
    lookupd.register(router, gateway)
    nsqd.register(router, gateway)
    probes.register(router, gateway)
    prometheus.register(router, gateway)
    admin.register(router, gateway)
    auth.protect(router, gateway.settings.http_settings)
    router.hold(lambda: gateway.opened, ("/health", "/ready", "/ping", "/metrics"))
    return router


def _bind(host: str, port: int) -> list[socket.socket]:
    """Bound, listening sockets for every address `host` resolves to (as
    trio.open_tcp_listeners does), so port 0 is known before hypercorn starts."""
    infos = socket.getaddrinfo(
        host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # port 0: the first socket picks the port, the host's other addresses share it
            sock.bind((address[0], port, *address[2:]))
            port = sock.getsockname()[1]
            sock.listen(_BACKLOG)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class _TLSConfig(Config):
    """hypercorn serving HTTPS with the gateway's own context (so a SIGHUP reload of the
    certificate reaches new connections), HTTP/2 offered by ALPN as RFC 7540 asks."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        context.set_alpn_protocols(self.alpn_protocols)  # h2, then http/1.1
        context.options |= ssl.OP_NO_COMPRESSION
        self._context = context

    @property
    def ssl_enabled(self) -> bool:
        return True

    def create_ssl_context(self) -> ssl.SSLContext:
        return self._context


def _config(sockets: list[socket.socket], context: ssl.SSLContext | None) -> Config:
    config = Config() if context is None else _TLSConfig(context)
    # hypercorn adopts the descriptors (fd://): the bound ports are ours to report
    config.bind = [f"fd://{sock.detach()}" for sock in sockets]
    config.include_server_header = False  # nsqd sends none
    config.accesslog = None
    # hypercorn logs "Running on ..." at INFO; the gateway prints its own listening line
    server_log = logging.getLogger("gateway.http.server")
    server_log.setLevel(max(logging.WARNING, logging.getLogger("gateway").getEffectiveLevel()))
    config.errorlog = server_log
    return config


async def serve(
    gateway: Gateway,
    context: ssl.SSLContext | None,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled, HTTPS when `context` is given (the HTTPS listener), else
    plain HTTP; reports the bound (host, port) of each socket."""
    sockets = _bind(host, port)
    bound = [sock.getsockname()[:2] for sock in sockets]
    router = build_router(gateway)
    config = _config(sockets, context)
    async with trio.open_nursery() as nursery:
        await nursery.start(hypercorn_serve, router, config)
        task_status.started(bound)


def listeners(gateway: Gateway, tls: ListenerContexts) -> list[HTTPListener]:
    """Plain HTTP on `http`, as nsqd's --http-address, and HTTPS on `https` when a
    certificate applies to it (nsqd too serves HTTPS only with one)."""
    settings = gateway.settings
    context = tls.context("https")
    protected = settings.http_settings.auth_token is not None
    https = settings.address("https") if context is not None else None
    return [
        HTTPListener("http", settings.address("http"), protected, partial(serve, gateway, None)),
        HTTPListener("https", https, True, partial(serve, gateway, context)),
    ]
