"""The HTTP listener's token: who may change queues, and (optionally) who may look.

With `[http] auth_token` set, every route that changes something (any method but GET and
HEAD: nsqd's /pub, /mpub, topic and channel actions, /config PUT, lookupd's tombstone, the
admin page's actions) answers 401 unless the request carries the token, as
`Authorization: Bearer <token>` or as the password of basic auth (so `curl -u :TOKEN`
works). `protect_reads` extends that to every read. /ping, /health and /ready never ask:
load balancers and Kubernetes probe them without credentials. The admin page's HTML is a
shell with no data in it, so it is served to anyone and asks for the token itself when
its data or actions answer 401.

The routes are wrapped once, when the listener starts, so a request pays one dict lookup
and one comparison, and the router stays unaware of any of this.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from gateway.config import HTTPSettings
from gateway.http.router import Handler, Request, Response, Router, v1_error

# Probes and the page shell (its HTML and script): never behind the token.
OPEN_READS = frozenset({"/ping", "/health", "/ready", "/", "/admin/page.js"})
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CHALLENGE = ("www-authenticate", 'Bearer realm="gateway"')


def protect(router: Router, settings: HTTPSettings) -> None:
    """Wrap every route that `settings` puts behind the token (nothing without one)."""
    if settings.auth_token is None:
        return
    token = settings.auth_token.encode()
    for tables in (router.routes, router.param_routes):
        for path, table in tables.items():
            for method, handler in table.items():
                if method in READ_METHODS and (path in OPEN_READS or not settings.protect_reads):
                    continue
                table[method] = _guarded(handler, token, router)


def authorized(request: Request, token: bytes) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        offered = credentials.strip().encode("latin-1")
    elif scheme == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        offered = decoded.partition(b":")[2]  # any user name; the token is the password
    else:
        return False
    return hmac.compare_digest(offered, token)


def _guarded(handler: Handler, token: bytes, router: Router) -> Handler:
    async def guarded(request: Request) -> Response:
        if authorized(request, token):
            return await handler(request)
        router.metrics.protocol_error("http", "UNAUTHORIZED")
        router.log_error(request, 401, "UNAUTHORIZED")
        response = v1_error(401, "UNAUTHORIZED")
        response.headers.append(CHALLENGE)
        return response

    return guarded
