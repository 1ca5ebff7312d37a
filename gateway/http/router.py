"""A small ASGI application: requests, responses and a path -> method -> handler table.

The table behaves as the httprouter that nsqd and nsqlookupd use: an unknown path is 404
NOT_FOUND, a known path with another method is 405 METHOD_NOT_ALLOWED with an `Allow`
header, OPTIONS lists the methods, and a path that differs only by a trailing slash is
redirected. Errors are nsqd's V1 replies (`{"message":"..."}` with the X-NSQ header), and
each one is counted as a protocol error of "http".

Anyone can add routes (`router.add(path, handler, "GET")`): the admin page and /metrics
plug in the same way as the nsqd and nsqlookupd endpoints.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import trio

from gateway.broker.errors import StoreUnavailable
from gateway.http.gocompat import QueryError, go_json, parse_query
from gateway.logs import Throttles, dropped_note, shown
from gateway.metrics import Metrics

log = logging.getLogger("gateway.http")
access_log = logging.getLogger("gateway.http.access")
# methods that only read: every other one is a write action, logged at info
READS = frozenset({"GET", "HEAD", "OPTIONS"})
# nsqd's publishes: the data path, thousands a second, not an operator's action (the
# access log has them)
PUBLISHES = frozenset({"/pub", "/mpub"})

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

TEXT = "text/plain; charset=utf-8"  # what Go's content sniffing gives a plain-text body
JSON = "application/json; charset=utf-8"
# Every nsqd/nsqlookupd V1 reply carries it; go-nsq expects the legacy wrapper without it.
NSQ_V1 = ("x-nsq-content-type", "nsq; version=1.0")


class HTTPError(Exception):
    """Answer with nsqd's V1 error: `status` and `{"message": message}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    """The client disconnected before its request body was read: nothing to answer."""


@dataclass(slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    # what a write action did, for its log line ("1167 messages dropped"); never sent
    note: str = ""

    async def send(self, send: Send, *, head: bool = False) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]
        if self.content_type is not None:
            headers.append((b"content-type", self.content_type.encode("latin-1")))
        headers.append((b"content-length", b"%d" % len(self.body)))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else self.body})


def text(body: str | bytes, status: int = 200) -> Response:
    """nsqd's PlainText replies (/ping): no X-NSQ header."""
    data = body.encode() if isinstance(body, str) else body
    return Response(status, data, TEXT)


def v1(data: str | bytes | None = None) -> Response:
    """A V1 success without JSON: `OK`, the text /stats, or an empty 200 (no content type,
    as Go writes a handler that wrote nothing)."""
    body = data.encode() if isinstance(data, str) else (data or b"")
    return Response(200, body, TEXT if body else None, [NSQ_V1])


def v1_json(value: Any) -> Response:
    return Response(200, go_json(value), JSON, [NSQ_V1])


def v1_error(status: int, message: str) -> Response:
    return Response(status, go_json({"message": message}), JSON, [NSQ_V1])


class Request:
    """One HTTP request (HTTP/1.1 or HTTP/2 alike): method, path, query and a body that is
    read only as far as a handler asks."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.raw_query: bytes = scope.get("query_string", b"")
        self.headers: dict[str, str] = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
        }
        client = scope.get("client")
        host = client[0] if client else "unknown"
        port = client[1] if client else 0
        self.remote = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.http_version: str = scope.get("http_version", "1.1")
        self._receive = receive
        self._query: dict[str, list[str]] | None = None

    @property
    def content_length(self) -> int:
        """The declared length; -1 when unknown (chunked, or HTTP/2 without the header),
        as Go's Request.ContentLength."""
        try:
            return int(self.headers.get("content-length", "-1"))
        except ValueError:
            return -1

    def query(self) -> dict[str, list[str]]:
        """The query string as Go's url.ParseQuery reads it. POST bodies are never parsed
        as forms: nsqd takes every parameter from the URL."""
        if self._query is None:
            try:
                self._query = parse_query(self.raw_query)
            except QueryError:
                raise HTTPError(400, "INVALID_REQUEST") from None
        return self._query

    def arg(self, name: str) -> str | None:
        """The first value of a query parameter; None when it is absent (present and empty
        is "", which nsqd treats differently from missing)."""
        values = self.query().get(name)
        return values[0] if values else None

    async def body(self, limit: int) -> bytes:
        """At most `limit` bytes of the body. Reading stops there, so an oversize upload
        costs no more memory than the limit (Go's io.LimitReader)."""
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            event = await self._receive()
            if event["type"] == "http.disconnect":
                raise ClientGone
            chunk = event.get("body", b"")
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
            if not event.get("more_body", False):
                break
        data = b"".join(chunks)
        return data[:limit] if size > limit else data


Handler = Callable[[Request], Awaitable[Response]]


def committed(commit: Callable[[], Awaitable[None]], handler: Handler) -> Handler:
    """A write endpoint: its response leaves once `commit` (the broker's flush) has
    stored what the request changed, as a session's reply waits in its reply gate (nsqd
    answers a publish once it has it). A store that cannot write is answered 503 like a
    refused write, and a request refused before it changed anything commits nothing."""

    async def write(request: Request) -> Response:
        response = await handler(request)
        await commit()
        return response

    return write


class Router:
    def __init__(self, metrics: Metrics, *, access: bool = False) -> None:
        self.metrics = metrics
        self.access = access  # one access-log line per request (gateway.http.access)
        # error lines per client address: a client that only sends bad requests gets a
        # few lines, not one per request
        self._error_log = Throttles()
        # path -> method -> handler
        self.routes: dict[str, dict[str, Handler]] = {}
        # "/config/" -> the handlers of /config/<name> (httprouter's "/config/:opt")
        self.param_routes: dict[str, dict[str, Handler]] = {}
        # until `ready()` is true only these paths are served; the others answer 503
        self._ready: Callable[[], bool] = lambda: True
        self._early: frozenset[str] = frozenset()

    def hold(self, ready: Callable[[], bool], early: Iterable[str]) -> None:
        """Serve only the `early` paths (probes, metrics) until `ready()`: the HTTP
        listener is up while the store opens, the broker's queues are not."""
        self._ready = ready
        self._early = frozenset(early)

    def add(self, path: str, handler: Handler, *methods: str) -> None:
        table = self.routes.setdefault(path, {})
        for method in methods or ("GET",):
            table[method] = handler

    def add_param(self, prefix: str, handler: Handler, *methods: str) -> None:
        """Route `prefix<name>` for any one non-empty path segment `name`."""
        table = self.param_routes.setdefault(prefix, {})
        for method in methods or ("GET",):
            table[method] = handler

    def _lookup(self, path: str) -> dict[str, Handler] | None:
        table = self.routes.get(path)
        if table is None:
            prefix, _, name = path.rpartition("/")
            if name:
                table = self.param_routes.get(prefix + "/")
        return table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websocket: not served; the server closes it
        request = Request(scope, receive)
        try:
            response = await self._dispatch(request)
        except ClientGone:
            return
        if (
            request.method not in READS
            and 200 <= response.status < 300
            and request.path not in PUBLISHES
        ):
            log.info(
                "http write %s %s from %s, token %s: %d%s",
                request.method,
                path_of(request),
                request.remote,
                "used" if "authorization" in request.headers else "none",
                response.status,
                f", {response.note}" if response.note else "",
            )
        if self.access:
            access_log.info(
                '%s "%s %s HTTP/%s" %d %d',
                request.remote,
                request.method,
                path_of(request),
                request.http_version,
                response.status,
                len(response.body),
            )
        try:
            await response.send(send, head=request.method == "HEAD")
        except trio.BusyResourceError:
            # The client reset while we answered: hypercorn, closing the connection, is
            # in the socket's send_eof when our send reaches it. The client is gone.
            return

    async def _dispatch(self, request: Request) -> Response:
        method, path = request.method, request.path
        if path not in self._early and not self._ready():
            return self._error(503, "STARTING", request)
        table = self._lookup(path)
        if table is not None and method in table:
            return await self._call(table[method], request)
        if method != "CONNECT" and path != "/":
            other = path[:-1] if path.endswith("/") else path + "/"
            other_table = self._lookup(other)
            if other_table is not None and method in other_table:
                return _redirect(request, other)
        if table is not None:
            allow = ", ".join(sorted({*table, "OPTIONS"}))
            if method == "OPTIONS":
                return Response(200, headers=[("allow", allow)])
            response = self._error(405, "METHOD_NOT_ALLOWED", request)
            response.headers.insert(0, ("allow", allow))
            return response
        return self._error(404, "NOT_FOUND", request)

    async def _call(self, handler: Handler, request: Request) -> Response:
        try:
            return await handler(request)
        except HTTPError as exc:
            return self._error(exc.status, exc.message, request)
        except StoreUnavailable:
            # the store cannot write (disk full, I/O error): nothing was acknowledged, the
            # client may retry; 503 as nsqd answers a publish it cannot take
            return self._error(503, "E_PUB_FAILED", request)
        except ClientGone:
            raise
        except Exception:
            # nsqd's PanicHandler: the client gets 500, the process carries on
            log.exception(
                "HTTP %s %s from %s failed", request.method, path_of(request), request.remote
            )
            return self._error(500, "INTERNAL_ERROR", request)

    def _error(self, status: int, message: str, request: Request | None = None) -> Response:
        self.metrics.protocol_error("http", message)
        if request is not None:
            self.log_error(request, status, message)
        return v1_error(status, message)

    def log_error(self, request: Request, status: int, message: str) -> None:
        """A refused request, at info: who, what, and the reply sent (a few lines per
        client address at most)."""
        dropped = self._error_log.allow(request.remote.rpartition(":")[0])
        if dropped is not None:
            log.info(
                "http client %s: %s %s refused, replied %d %s%s",
                request.remote,
                request.method,
                shown(path_of(request)),
                status,
                message,
                dropped_note(dropped),
            )


def path_of(request: Request) -> str:
    query = request.raw_query.decode("latin-1")
    return f"{request.path}?{query}" if query else request.path


def _redirect(request: Request, path: str) -> Response:
    """httprouter's trailing-slash redirect: 301 for GET, 307 (same method) otherwise."""
    code = 301 if request.method == "GET" else 307
    query = request.raw_query.decode("latin-1")
    url = f"{path}?{query}" if query else path
    response = Response(code, headers=[("location", url)])
    if request.method in ("GET", "HEAD"):
        response.content_type = "text/html; charset=utf-8"
    if request.method == "GET":
        # Go's http.Redirect body
        status_text = "Moved Permanently" if code == 301 else "Temporary Redirect"
        response.body = f'<a href="{html.escape(url)}">{status_text}</a>.\n\n'.encode()
    return response


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to set up or tear down: the gateway owns the broker's life cycle."""
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
