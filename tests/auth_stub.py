"""A stub of an operator's NSQ auth HTTP server, for tests: one request per connection."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import trio


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


Responder = Callable[[Request], tuple[int, dict[str, str], bytes]]


@dataclass
class StubAuthServer:
    """A minimal HTTP/1.1 server: one request per connection, answered by ``respond``."""

    respond: Responder
    requests: list[Request] = field(default_factory=list)
    port: int = 0
    hang: bool = False  # accept and read the request, never answer

    async def handle(self, stream: trio.abc.Stream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some()
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _version = request_line.split(" ")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        while len(body) < int(headers.get("content-length", "0")):
            body += await stream.receive_some()
        request = Request(method, target, headers, body)
        self.requests.append(request)
        if self.hang:
            await trio.sleep_forever()
        status, extra_headers, content = self.respond(request)
        lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(content)}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in extra_headers.items()]
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + content)
        await stream.aclose()


async def start_stub(
    nursery: trio.Nursery, respond: Responder, ssl_context: ssl.SSLContext | None = None
) -> StubAuthServer:
    server = StubAuthServer(respond)
    if ssl_context is None:
        listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    else:
        serve = partial(trio.serve_ssl_over_tcp, server.handle, 0, ssl_context, host="127.0.0.1")
        listeners = await nursery.start(serve)
    listener = listeners[0] if ssl_context is None else listeners[0].transport_listener
    server.port = listener.socket.getsockname()[1]
    return server
