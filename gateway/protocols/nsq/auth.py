"""NSQ AUTH: query the operator's auth HTTP server the way nsqd v1.3.0 does.

This mirrors nsqd's ``internal/auth/authorizations.go`` and ``internal/http_api/api_request.go``.
The NSQ session uses it like this (error strings as nsqd sends them, all fatal):

* ``AUTH`` command: ``state = await client.query(secret, remote_ip, tls, common_name)``.
  ``AuthFailed`` -> ``E_AUTH_FAILED AUTH failed`` (the reason is only logged: nsqd never tells an
  untrusted client why the auth server said no). A state with ``len(state.authorizations) == 0``
  is *not* an ``AuthFailed`` -> the session replies ``E_UNAUTHORIZED AUTH no authorizations
  found``. Otherwise the reply is the response frame ``state.response_json()``.
* ``PUB``/``MPUB``/``DPUB``/``SUB``: no state or an empty one -> ``E_AUTH_FIRST AUTH required
  before <CMD>``. If ``state.is_expired(trio.current_time())``, query again with the same
  arguments and replace the state (``AuthFailed`` -> ``E_AUTH_FAILED AUTH failed``). Then
  ``state.is_allowed(topic, channel, permission)`` (channel ``""`` and ``"publish"`` for the PUB
  family, ``"subscribe"`` for SUB); false -> ``E_UNAUTHORIZED AUTH failed for <CMD> on
  "<topic>" "<channel>"``.

What the session passes in, as nsqd does: ``secret`` is the AUTH body; decode it with
``errors="surrogateescape"`` so that any bytes reach the auth server exactly as sent.
``remote_ip`` is the bare client IP (no port, no brackets around IPv6) or ``""`` for a non-TCP
listener. ``common_name`` is the client certificate's subject CN, only when TLS is on.

Two Go behaviours are reproduced on purpose because an auth server can observe them:

* The reply is decoded like Go's ``encoding/json`` decodes into nsqd's ``State`` struct: keys
  match case-insensitively (``"TTL"`` works), ``null`` leaves a field at its zero value, a value
  of the wrong type fails the whole reply, and an ``"expires"`` key must be ``null`` or an
  RFC 3339 string (it lands in the untagged ``Expires time.Time`` field).
* Regexes are Go RE2 syntax, matched with Go's unanchored ``MatchString`` (``re.search`` here).
  Python-only constructs that RE2 rejects (lookaround, backreferences, possessive quantifiers,
  ``\\Z``...) fail the reply as they do in nsqd, rather than silently compiling. A few RE2-only
  forms that Python cannot express (``\\pL``, ``\\Q...\\E``, ``\\x{41}``, flags set mid-pattern)
  also fail the reply here although nsqd would accept them.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import ssl
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import trio

from gateway.protocols.nsq.go_regexp import GoRegexpError, compile_go_regexp

__all__ = ["AuthClient", "AuthFailed", "AuthState", "Authorization", "parse_auth_response"]

logger = logging.getLogger(__name__)

PERMISSIONS: Final = frozenset({"subscribe", "publish"})
_ACCEPT: Final = "application/vnd.nsq; version=1.0"
# Go's http.Client gives up when asked to follow a 10th redirect, so at most 9 are followed.
# httpx's max_redirects counts followed redirects, hence 9.
_MAX_REDIRECTS: Final = 9


class AuthFailed(Exception):
    """The auth server could not be used; the session replies ``E_AUTH_FAILED AUTH failed``.

    The message is for the operator's log only. It never contains the secret.
    """


@dataclass(frozen=True, slots=True)
class Authorization:
    """One entry of the reply's ``authorizations`` list, with its regexes compiled."""

    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[str]  # subset of {"subscribe", "publish"}

    def allows(self, topic: str, channel: str, permission: str) -> bool:
        return (
            permission in self.permissions
            and self.topic.search(topic) is not None
            and any(c.search(channel) is not None for c in self.channels)
        )


@dataclass(slots=True)
class AuthState:
    """A validated auth reply, cached by the session until ``expires_at``.

    An empty ``authorizations`` tuple is a valid state: nsqd accepts such a reply and only then
    rejects the client with ``E_UNAUTHORIZED AUTH no authorizations found`` (at AUTH) or
    ``E_AUTH_FIRST`` (at PUB/SUB), so that check belongs to the session.
    """

    identity: str
    identity_url: str
    authorizations: tuple[Authorization, ...]
    ttl: float  # seconds, as the auth server sent it
    expires_at: float  # trio.current_time() after which the session must query again

    def is_allowed(self, topic: str, channel: str, permission: str) -> bool:
        """Whether any authorization grants ``permission`` on ``topic``/``channel``.

        Publishing is checked with ``channel == ""``, exactly as nsqd does, so a publish grant
        needs a channel regex that matches the empty string (``.*``, ``""``, ...).
        """
        return any(a.allows(topic, channel, permission) for a in self.authorizations)

    def is_expired(self, now: float) -> bool:
        # Go: Expires.Before(time.Now()), strictly before.
        return self.expires_at < now

    def response_json(self) -> bytes:
        """The body of nsqd's reply frame to a successful AUTH, byte for byte."""
        return (
            f'{{"identity":{_go_json_string(self.identity)},'
            f'"identity_url":{_go_json_string(self.identity_url)},'
            f'"permission_count":{len(self.authorizations)}}}'
        ).encode()


# -- decoding the reply like Go's encoding/json ---------------------------------------------------


class _JsonObject:
    """A JSON object as its ordered key/value pairs, duplicates kept (Go sees each of them)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


# An integer literal too long for int64. Kept as a marker instead of an int so that a huge
# number in a field nsqd ignores does not trip Python's int-parsing digit limit.
_BIG_INT: Final = object()
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def _parse_int_literal(text: str) -> int | object:
    return int(text) if len(text) <= 20 else _BIG_INT


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON literal {name}")  # NaN/Infinity are not JSON; Go rejects them


def _loads_go(body: bytes) -> Any:
    """``json.loads`` restricted to what Go's decoder accepts. Raises AuthFailed."""
    # Go accepts invalid UTF-8 inside strings (each bad byte becomes U+FFFD). surrogateescape
    # keeps every bad byte as one lone surrogate, which _go_string then replaces. It also
    # means a UTF-8 BOM stays U+FEFF, which json rejects like Go does.
    text = body.decode("utf-8", "surrogateescape")
    try:
        return json.loads(
            text,
            object_pairs_hook=_JsonObject,
            parse_int=_parse_int_literal,
            parse_constant=_reject_constant,
        )
    except (ValueError, RecursionError) as exc:
        raise AuthFailed(f"invalid JSON reply: {exc}") from None


# Go matches struct fields to keys with simple Unicode case folding: besides ASCII case, the
# long s and the Kelvin sign fold to 's' and 'k'.
_GO_FOLD: Final = str.maketrans(
    {"\u017f": "s", "\u212a": "k"} | {chr(c): chr(c + 32) for c in range(ord("A"), ord("Z") + 1)}
)


def _fields(value: Any, names: frozenset[str], what: str) -> Iterator[tuple[str, Any]]:
    """Yield (field name, value) for the keys of a JSON object that Go maps to a field."""
    if value is None:  # null into a struct: nothing happens
        return
    if not isinstance(value, _JsonObject):
        raise AuthFailed(f"{what} is not a JSON object")
    for key, item in value.pairs:
        name = key if key in names else key.translate(_GO_FOLD)
        if name in names:
            yield name, item


_SURROGATES: Final = re.compile("[\ud800-\udfff]")


def _go_string(value: Any, current: str, what: str) -> str:
    if value is None:
        return current
    if not isinstance(value, str):
        raise AuthFailed(f"{what} is not a string")
    # Lone surrogates come from invalid UTF-8 bytes or from unpaired \uD8xx escapes; Go turns
    # both into U+FFFD.
    return _SURROGATES.sub("\ufffd", value)


def _go_int(value: Any, current: int, what: str) -> int:
    if value is None:
        return current
    # bool is an int in Python but a type error in Go; so are 5.0 and 5e0.
    if type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX:
        raise AuthFailed(f"{what} is not a 64-bit integer")
    return value


def _go_string_list(value: Any, what: str) -> list[str]:
    if value is None:  # null into a slice: nil
        return []
    if not isinstance(value, list):
        raise AuthFailed(f"{what} is not an array")
    return [_go_string(item, "", what) for item in value]


_RFC3339: Final = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)T(\d\d?):(\d\d):(\d\d)(?:[.,]\d+)?(?:Z|[+-](\d\d):(\d\d))", re.ASCII
)


def _check_go_time(value: Any) -> None:
    """Validate an ``"expires"`` value as Go 1.19's time.Time.UnmarshalJSON would.

    nsqd overwrites the field afterwards, so only the failure matters.
    """
    if value is None:
        return
    m = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise AuthFailed('"expires" is not an RFC 3339 time')
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
    ok = 1 <= month <= 12 and 1 <= day <= days[month - 1] and hour < 24
    ok = ok and minute < 60 and second < 60
    if m.group(7) is not None:  # Go allows offsets up to 24:60 ("some people do write them")
        ok = ok and int(m.group(7)) <= 24 and int(m.group(8)) <= 60
    if not ok:
        raise AuthFailed('"expires" is not a valid time')


_STATE_FIELDS: Final = frozenset({"ttl", "authorizations", "identity", "identity_url", "expires"})
_AUTHORIZATION_FIELDS: Final = frozenset({"topic", "channels", "permissions"})


def _parse_authorization(value: Any) -> Authorization:
    topic = ""
    channels: list[str] = []
    permissions: list[str] = []
    for name, item in _fields(value, _AUTHORIZATION_FIELDS, "authorization"):
        if name == "topic":
            topic = _go_string(item, topic, "topic")
        elif name == "channels":
            channels = _go_string_list(item, "channels")
        else:
            permissions = _go_string_list(item, "permissions")
    # Validation in nsqd's order: permissions, then the topic regex, then the channel regexes.
    for permission in permissions:
        if permission not in PERMISSIONS:
            raise AuthFailed(f"unknown permission {permission!r}")
    try:
        return Authorization(
            topic=compile_go_regexp(topic),
            channels=tuple(compile_go_regexp(c) for c in channels),
            permissions=frozenset(permissions),
        )
    except GoRegexpError as exc:
        raise AuthFailed(str(exc)) from None


def parse_auth_response(body: bytes, now: float) -> AuthState:
    """Decode and validate an auth server's 200 reply; ``now`` is ``trio.current_time()``.

    Raises AuthFailed for invalid JSON, a value of the wrong type, a missing or non-positive
    ``ttl``, an unknown permission or a regex that does not compile. Missing ``identity``,
    ``identity_url`` or ``authorizations`` are allowed (empty), as in nsqd; see ``AuthState``
    for what an empty ``authorizations`` means.
    """
    document = _loads_go(body)
    ttl = 0
    identity = identity_url = ""
    raw_authorizations: list[Any] = []
    for name, value in _fields(document, _STATE_FIELDS, "reply"):
        if name == "ttl":
            ttl = _go_int(value, ttl, "ttl")
        elif name == "identity":
            identity = _go_string(value, identity, "identity")
        elif name == "identity_url":
            identity_url = _go_string(value, identity_url, "identity_url")
        elif name == "expires":
            _check_go_time(value)
        elif value is None:
            raw_authorizations = []
        elif isinstance(value, list):
            raw_authorizations = value
        else:
            raise AuthFailed("authorizations is not an array")
    authorizations = tuple(_parse_authorization(a) for a in raw_authorizations)
    if ttl <= 0:
        raise AuthFailed(f"invalid TTL {ttl} (must be >0)")
    # nsqd computes time.Duration(ttl) * time.Second in int64 nanoseconds, which wraps for
    # ttl > ~292 years; the state then expires at once and every check re-queries.
    ttl_ns = (ttl * 1_000_000_000 - _INT64_MIN) % 2**64 + _INT64_MIN
    return AuthState(
        identity=identity,
        identity_url=identity_url,
        authorizations=authorizations,
        ttl=float(ttl),
        expires_at=now + ttl_ns / 1e9,
    )


# -- encoding like Go's encoding/json -------------------------------------------------------------

_GO_JSON_ESCAPE: Final = re.compile('[\x00-\x1f"\\\\<>&\u2028\u2029\ud800-\udfff]')
_GO_SHORT_ESCAPES: Final = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _go_json_escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _GO_SHORT_ESCAPES:
        return _GO_SHORT_ESCAPES[c]
    if "\ud800" <= c <= "\udfff":  # an invalid UTF-8 byte carried by surrogateescape
        return "\\ufffd"
    # Other control characters (\b and \f too: Go < 1.22), HTML-sensitive <, >, & and the
    # JavaScript line separators.
    return f"\\u{ord(c):04x}"


def _go_json_string(value: str) -> str:
    return '"' + _GO_JSON_ESCAPE.sub(_go_json_escape, value) + '"'


# -- the HTTP client ------------------------------------------------------------------------------


def _https_endpoint(endpoint: str, body: bytes) -> str:
    """nsqd's reaction to a 403 from a plain-http auth server: retry on the ``https_port`` it
    names, same host and path. Any problem with that reply is a failure, as in nsqd."""
    port = 0
    for _, value in _fields(_loads_go(body), frozenset({"https_port"}), "403 reply"):
        port = _go_int(value, port, "https_port")
    if not 0 < port < 65536:
        raise AuthFailed(f"403 reply names https_port {port}")
    parts = urllib.parse.urlsplit(endpoint)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    # Go's net.SplitHostPort: the address must carry a port.
    if hostport.startswith("["):
        host, sep, _ = hostport[1:].partition("]:")
    else:
        host, sep, _ = hostport.rpartition(":")
        if ":" in host:
            sep = ""
    if not sep:
        raise AuthFailed("cannot switch to https: the auth address has no port")
    host = f"[{host}]" if ":" in host else host
    return urllib.parse.urlunsplit(
        parts._replace(scheme="https", netloc=f"{userinfo}{at}{host}:{port}")
    )


class AuthClient:
    """Queries the configured auth servers (nsqd's ``--auth-http-address``).

    ``addresses`` are ``host:port`` (queried at ``http://host:port/auth``) or full URLs (any
    address containing ``://``). ``method`` is ``"get"`` (nsqd v1.3.0's only behaviour) or
    ``"post"`` (``--auth-http-request-method=post``, added to nsqd after v1.3.0). Timeouts are
    nsqd's ``--http-client-connect-timeout`` and ``--http-client-request-timeout``; 0 means none,
    as in Go. ``ssl_context`` is used for https auth servers (nsqd's ``--tls-root-ca-file``);
    by default the system's CA store, like Go. ``rng`` picks the first address (tests fix it).

    Each query uses a fresh connection, like nsqd, so there is nothing to close.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        method: str = "get",
        connect_timeout: float = 2.0,
        request_timeout: float = 5.0,
        *,
        ssl_context: ssl.SSLContext | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("at least one auth address is required")
        if method not in ("get", "post"):
            raise ValueError("auth request method must be 'post' or 'get'")
        if connect_timeout < 0 or request_timeout < 0:
            raise ValueError("timeouts must not be negative")
        self._addresses = tuple(addresses)
        self._method = method
        self._connect_timeout = connect_timeout or None
        self._request_timeout = request_timeout or math.inf
        # Built once: httpx would otherwise load a CA bundle for every query, blocking the loop.
        self._ssl_context = ssl_context or ssl.create_default_context()
        self._rng = rng or random.Random()

    async def query(
        self, secret: str, remote_ip: str, tls: bool, common_name: str = ""
    ) -> AuthState:
        """Ask the auth servers about ``secret``; raise AuthFailed if none gives a valid reply.

        Like nsqd, start at a random address and go round the list once. An address fails on a
        connection error, a timeout, any status but 200, or a reply ``parse_auth_response``
        rejects.
        """
        values = {
            "common_name": common_name,
            "remote_ip": remote_ip,
            "secret": secret,
            "tls": "true" if tls else "false",
        }
        start = self._rng.randrange(len(self._addresses))
        reasons: list[str] = []
        async with self._http_client() as client:
            for i in range(len(self._addresses)):
                address = self._addresses[(start + i) % len(self._addresses)]
                try:
                    body = await self._request(client, address, values)
                    return parse_auth_response(body, trio.current_time())
                except (
                    httpx.HTTPError,
                    httpx.InvalidURL,
                    trio.TooSlowError,
                    AuthFailed,
                    OSError,
                    ValueError,
                ) as exc:
                    # httpx's messages name the failure, not the URL, which carries the secret;
                    # don't log the request itself.
                    reason = f"failed to auth against {address} - {type(exc).__name__}: {exc}"
                    logger.warning("%s", reason)
                    reasons.append(reason)
        raise AuthFailed("; ".join(reasons))

    def _http_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=self._connect_timeout),
            follow_redirects=True,  # Go's http.Client follows redirects
            max_redirects=_MAX_REDIRECTS,
            trust_env=False,  # nsqd's transport has no proxy and reads no environment
            verify=self._ssl_context,
        )

    async def _request(
        self, client: httpx.AsyncClient, address: str, values: dict[str, str]
    ) -> bytes:
        endpoint = address if "://" in address else f"http://{address}/auth"
        headers = {"Accept": _ACCEPT}
        content: bytes | None = None
        if self._method == "get":
            # Go's url.Values.Encode: sorted keys, QueryEscape (space -> "+"); surrogateescape
            # sends undecodable secret bytes as their own %XX.
            query = urllib.parse.urlencode(
                sorted(values.items()), quote_via=urllib.parse.quote_plus, errors="surrogateescape"
            )
            endpoint = f"{endpoint}?{query}"  # appended even if the URL has a query already
        else:
            # json.Marshal(url.Values): a map of one-element arrays, keys sorted.
            content = _go_json_object_of_lists(values)
            headers["Content-Type"] = "application/json"
        while True:
            # Go's http.Client.Timeout bounds the whole exchange, body and redirects included.
            with trio.fail_after(self._request_timeout):
                response = await client.request(
                    self._method.upper(), endpoint, headers=headers, content=content
                )
            if response.status_code == 200:
                return response.content
            if response.status_code == 403 and not endpoint.startswith("https"):
                endpoint = _https_endpoint(endpoint, response.content)
                continue
            raise AuthFailed(f"got response {response.status_code} {response.content[:200]!r}")


def _go_json_object_of_lists(values: dict[str, str]) -> bytes:
    members = (f"{_go_json_string(k)}:[{_go_json_string(values[k])}]" for k in sorted(values))
    return ("{" + ",".join(members) + "}").encode()
