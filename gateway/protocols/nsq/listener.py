"""The NSQ TCP listener: one Trio server, one NSQSession task per connection."""

from __future__ import annotations

import logging

import trio

from gateway.protocols.nsq.server import NSQServer
from gateway.protocols.nsq.session import NSQSession

log = logging.getLogger("gateway.nsq")


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "unknown:0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def handle_connection(server: NSQServer, stream: trio.SocketStream) -> None:
    session = NSQSession(server, stream, _peer(stream))
    try:
        await session.run()
    except Exception:
        # A bug triggered by one client must not take the listener down with it.
        log.exception("nsq connection from %s failed", session.remote)


async def serve(
    server: NSQServer,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)

    async def handler(stream: trio.SocketStream) -> None:
        await handle_connection(server, stream)

    # serve_listeners backs off and logs on EMFILE-like accept errors instead of dying
    await trio.serve_listeners(handler, listeners, task_status=task_status)
