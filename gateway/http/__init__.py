"""The HTTP listener: nsqd's and nsqlookupd's HTTP APIs and the sidecar probes, over
HTTP/1.1 and HTTP/2 (hypercorn on Trio). `router.Router` is the table of endpoints."""

from gateway.http.router import HTTPError, Request, Response, Router
from gateway.http.server import build_router, serve

__all__ = ["HTTPError", "Request", "Response", "Router", "build_router", "serve"]
