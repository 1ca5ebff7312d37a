"""The ops of the NATS cluster route protocol, one control line each, into events: the
argument rules of nats-server's processRoutedMsgArgs, processRemoteSub and the like
(see route_codec.py's docstring). Sans-IO, a part of RouteCodec kept apart from its
buffering and framing, which call these through HANDLERS."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from gateway.protocols.nats import route_events as ev
from gateway.protocols.nats.client_codec import _parse_json, _parse_size

_ARGS = re.compile(rb"[^ \t\r]+")


def _str(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _opt(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "surrogateescape")


_BAD_MARKER = (b"", None)  # `_reply_and_queues`: neither "+" nor "|" where one must be


def _reply_and_queues(args: list[bytes], sizes: int) -> tuple[bytes | None, list[bytes] | None]:
    """The reply subject and queue names of an RMSG or HMSG, whose arguments are account,
    subject, then [reply] or ["+" reply queue...] or ["|" queue...], then `sizes` size
    fields; `_BAD_MARKER` (test by identity) when the marker is neither."""
    n = len(args) - sizes
    if n == 3:
        return args[2], None
    if n > 3:
        marker = args[2]
        if marker == b"+":
            return args[3], args[4:-sizes]
        if marker == b"|":
            return None, args[3:-sizes]
        return _BAD_MARKER
    return None, None


def _queues(raw: list[bytes] | None) -> tuple[str, ...] | None:
    return None if raw is None else tuple(q.decode("utf-8", "surrogateescape") for q in raw)


class RouteOps:
    """Mixed into RouteCodec, whose `_fail` and `_expect` these call."""

    if TYPE_CHECKING:  # RouteCodec's (stubs at run time would shadow them in the MRO)
        _fail: Callable[[bytes | None, str], ev.ProtocolError]
        _expect: Callable[..., ev.Event | None]  # see RouteCodec._expect

    # -- ops: handler(self, line without its line end, index where the op name ends) --

    def _rmsg(self, line: bytes, at: int) -> ev.Event | None:
        args = _ARGS.findall(line, at)
        if len(args) < 3:
            return self._fail(None, "processRoutedMsgArgs Parse Error")
        found = _reply_and_queues(args, 1)
        if found is _BAD_MARKER:
            return self._fail(None, "processRoutedMsgArgs Bad or Missing Reply Indicator")
        reply, queues = found
        size = _parse_size(args[-1])
        if size < 0:
            return self._fail(None, "processRoutedMsgArgs Bad or Missing Size")
        return self._expect(None, args[0], args[1], reply, queues, None, -1, size)

    def _hmsg(self, line: bytes, at: int) -> ev.Event | None:
        args = _ARGS.findall(line, at)
        if len(args) < 4:
            return self._fail(None, "processRoutedHeaderMsgArgs Parse Error")
        return self._header_msg(args, None, "processRoutedHeaderMsgArgs")

    def _lmsg(self, line: bytes, at: int) -> ev.Event | None:
        args = _ARGS.findall(line, at)
        if len(args) < 5:
            return self._fail(None, "processRoutedOriginClusterMsgArgs Parse Error")
        return self._header_msg(args[1:], args[0], "processRoutedOriginClusterMsgArgs")

    def _header_msg(self, args: list[bytes], origin: bytes | None, where: str) -> ev.Event | None:
        """HMSG arguments, or LMSG's after the origin: 4 or more of them."""
        found = _reply_and_queues(args, 2)
        if found is _BAD_MARKER:
            return self._fail(None, f"{where} Bad or Missing Reply Indicator")
        reply, queues = found
        hdr = _parse_size(args[-2])
        size = _parse_size(args[-1])
        if hdr < 0:
            return self._fail(None, f"{where} Bad or Missing Header Size")
        if size < 0:
            return self._fail(None, f"{where} Bad or Missing Size")
        if hdr > size:
            return self._fail(None, f"{where} Header Size larger then TotalSize")
        if origin is not None and hdr == 0:
            hdr = -1  # LMSG always carries a header size; 0 means it has no header block
        return self._expect(None, args[0], args[1], reply, queues, origin, hdr, size)

    def _rs_plus(self, line: bytes, at: int) -> ev.Event:
        return self._remote_sub(_ARGS.findall(line, at), None)

    def _ls_plus(self, line: bytes, at: int) -> ev.Event:
        args = _ARGS.findall(line, at)
        if len(args) != 3 and len(args) != 5:
            return self._fail(None, "processRemoteSub Parse Error")
        return self._remote_sub(args[1:], args[0])

    def _remote_sub(self, args: list[bytes], origin: bytes | None) -> ev.Event:
        n = len(args)
        if n == 2:
            return ev.RemoteSub(_str(args[0]), _str(args[1]), None, None, _opt(origin))
        if n == 4:
            weight = _parse_size(args[3])
            if weight < 0:
                return self._fail(None, "processRemoteSub Bad Queue Weight")
            return ev.RemoteSub(_str(args[0]), _str(args[1]), _str(args[2]), weight, _opt(origin))
        return self._fail(None, "processRemoteSub Parse Error")

    def _rs_minus(self, line: bytes, at: int) -> ev.Event:
        return self._remote_unsub(_ARGS.findall(line, at), None)

    def _ls_minus(self, line: bytes, at: int) -> ev.Event:
        args = _ARGS.findall(line, at)
        # A second separator right after the op is 2.9.10's empty origin; two arguments
        # are what 2.10+ sends to a peer that did not ask for the origin (no lnocu).
        if len(args) == 2 or (at + 1 < len(line) and line[at + 1] in b" \t"):
            return self._remote_unsub(args, None)
        if len(args) != 3 and len(args) != 4:
            return self._fail(None, "processRemoteUnsub parse error")
        return self._remote_unsub(args[1:], args[0])

    def _remote_unsub(self, args: list[bytes], origin: bytes | None) -> ev.Event:
        n = len(args)
        if n == 2:
            return ev.RemoteUnsub(_str(args[0]), _str(args[1]), None, _opt(origin))
        if n == 3:
            return ev.RemoteUnsub(_str(args[0]), _str(args[1]), _str(args[2]), _opt(origin))
        return self._fail(None, "processRemoteUnsub parse error")

    def _json_object(self, line: bytes, at: int) -> dict[str, Any] | None:
        try:
            doc = _parse_json(line[at:].strip(b" \t\r"))
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def _info(self, line: bytes, at: int) -> ev.Event:
        doc = self._json_object(line, at)
        if doc is None:
            return self._fail(None, "INFO is not a JSON object")
        return ev.Info(doc)

    def _connect(self, line: bytes, at: int) -> ev.Event:
        doc = self._json_object(line, at)
        if doc is None:
            return self._fail(None, "CONNECT is not a JSON object")
        return ev.Connect(doc)

    def _err(self, line: bytes, at: int) -> ev.Event:
        text = line[at:].strip(b" \t\r")
        if len(text) >= 2 and text[0] == 39 and text[-1] == 39:  # '...'
            text = text[1:-1]
        # Only ever logged: replace bad UTF-8 rather than carry surrogates into the log.
        return ev.Err(text.decode("utf-8", "replace"))

    def _ping(self, line: bytes, at: int) -> ev.Event:
        return ev.Ping()  # nats-server ignores anything after PING/PONG/+OK as well

    def _pong(self, line: bytes, at: int) -> ev.Event:
        return ev.Pong()

    def _ok(self, line: bytes, at: int) -> ev.Event:
        return ev.Ok()

    def _sub(self, line: bytes, at: int) -> ev.Event:
        return ev.Ignored("SUB")

    def _a_plus(self, line: bytes, at: int) -> ev.Event:
        return ev.Ignored("A+")

    def _a_minus(self, line: bytes, at: int) -> ev.Event:
        return ev.Ignored("A-")

    def _pub(self, line: bytes, at: int) -> ev.Event | None:
        args = _ARGS.findall(line, at)
        if len(args) != 2 and len(args) != 3:
            return self._fail(None, "processPub Parse Error")
        size = _parse_size(args[-1])
        if size < 0:
            return self._fail(None, "processPub Bad or Missing Size")
        reply = args[1] if len(args) == 3 else None
        return self._expect("PUB", b"", args[0], reply, None, None, -1, size)


# The ops of a route, by lower-case name. Anything else is an unknown op.
HANDLERS: Final[dict[bytes, Callable[[Any, bytes, int], ev.Event | None]]] = {
    b"rmsg": RouteOps._rmsg,
    b"hmsg": RouteOps._hmsg,
    b"lmsg": RouteOps._lmsg,
    b"rs+": RouteOps._rs_plus,
    b"rs-": RouteOps._rs_minus,
    b"ls+": RouteOps._ls_plus,
    b"ls-": RouteOps._ls_minus,
    b"ping": RouteOps._ping,
    b"pong": RouteOps._pong,
    b"info": RouteOps._info,
    b"connect": RouteOps._connect,
    b"+ok": RouteOps._ok,
    b"-err": RouteOps._err,
    b"sub": RouteOps._sub,
    b"pub": RouteOps._pub,
    b"a+": RouteOps._a_plus,
    b"a-": RouteOps._a_minus,
}
