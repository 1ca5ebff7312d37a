"""The Trio shell every TCP listener shares: bind, report, one task per connection."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("gateway")


def peer_name(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "unknown:0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve(
    protocol: str,
    handle: Callable[[trio.SocketStream, str], Awaitable[None]],
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)

    async def handler(stream: trio.SocketStream) -> None:
        remote = peer_name(stream)
        try:
            await handle(stream, remote)
        except Exception:
            # A bug triggered by one client must not take the listener down with it.
            log.exception("%s connection from %s failed", protocol, remote)

    # serve_listeners backs off and logs on EMFILE-like accept errors instead of dying
    await trio.serve_listeners(handler, listeners, task_status=task_status)
