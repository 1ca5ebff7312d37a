"""The ops of the NATS cluster route protocol, one control line each, into events: the
argument rules of nats-server's processRoutedMsgArgs, processRemoteSub and the like
(see route_codec.py's docstring). Sans-IO and stateless: plain functions that RouteCodec,
which keeps the buffering, framing and limits, calls through HANDLERS."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from gateway.protocols.nats import route_events as ev
from gateway.protocols.nats.client_codec import _parse_json, _parse_size

_ARGS = re.compile(rb"[^ \t\r]+")

# A message waiting for its payload: (the op if it is dropped, i.e. "PUB", else None;
# account, subject, reply, queues, origin; header size, -1 for "no header"; total size).
# A plain tuple, not a class: the codec keeps it until the payload is in and unpacks it.
Pending = tuple[str | None, str, str, str | None, tuple[str, ...] | None, str | None, int, int]


class OpError(Exception):
    """An op's arguments are wrong. nats-server only logs these and closes the route, so
    the codec makes it a ProtocolError without a reply; an exception so that the common,
    good lines pay nothing for the check."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _str(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _opt(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "surrogateescape")


def _queues(raw: list[bytes] | None) -> tuple[str, ...] | None:
    return None if raw is None else tuple(q.decode("utf-8", "surrogateescape") for q in raw)


def _reply_and_queues(
    args: list[bytes], sizes: int, where: str
) -> tuple[bytes | None, list[bytes] | None]:
    """The reply subject and queue names of an RMSG or HMSG, whose arguments are account,
    subject, then [reply] or ["+" reply queue...] or ["|" queue...], then `sizes` size
    fields; an OpError of op `where` when the marker is neither."""
    n = len(args) - sizes
    if n == 3:
        return args[2], None
    if n > 3:
        marker = args[2]
        if marker == b"+":
            return args[3], args[4:-sizes]
        if marker == b"|":
            return None, args[3:-sizes]
        raise OpError(f"{where} Bad or Missing Reply Indicator")
    return None, None


# -- ops: handler(line without its line end, index where the op name ends) -----------------
# Each returns the line's event, or the Pending message whose payload follows, or raises
# OpError.


def _rmsg(line: bytes, at: int) -> Pending:
    args = _ARGS.findall(line, at)
    if len(args) < 3:
        raise OpError("processRoutedMsgArgs Parse Error")
    reply, queues = _reply_and_queues(args, 1, "processRoutedMsgArgs")
    size = _parse_size(args[-1])
    if size < 0:
        raise OpError("processRoutedMsgArgs Bad or Missing Size")
    return (None, _str(args[0]), _str(args[1]), _opt(reply), _queues(queues), None, -1, size)


def _hmsg(line: bytes, at: int) -> Pending:
    args = _ARGS.findall(line, at)
    if len(args) < 4:
        raise OpError("processRoutedHeaderMsgArgs Parse Error")
    return _header_msg(args, None, "processRoutedHeaderMsgArgs")


def _lmsg(line: bytes, at: int) -> Pending:
    args = _ARGS.findall(line, at)
    if len(args) < 5:
        raise OpError("processRoutedOriginClusterMsgArgs Parse Error")
    return _header_msg(args[1:], args[0], "processRoutedOriginClusterMsgArgs")


def _header_msg(args: list[bytes], origin: bytes | None, where: str) -> Pending:
    """HMSG arguments, or LMSG's after the origin: 4 or more of them."""
    reply, queues = _reply_and_queues(args, 2, where)
    hdr = _parse_size(args[-2])
    size = _parse_size(args[-1])
    if hdr < 0:
        raise OpError(f"{where} Bad or Missing Header Size")
    if size < 0:
        raise OpError(f"{where} Bad or Missing Size")
    if hdr > size:
        raise OpError(f"{where} Header Size larger then TotalSize")
    if origin is not None and hdr == 0:
        hdr = -1  # LMSG always carries a header size; 0 means it has no header block
    return (
        None,
        _str(args[0]),
        _str(args[1]),
        _opt(reply),
        _queues(queues),
        _opt(origin),
        hdr,
        size,
    )


def _rs_plus(line: bytes, at: int) -> ev.Event:
    return _remote_sub(_ARGS.findall(line, at), None)


def _ls_plus(line: bytes, at: int) -> ev.Event:
    args = _ARGS.findall(line, at)
    if len(args) != 3 and len(args) != 5:
        raise OpError("processRemoteSub Parse Error")
    return _remote_sub(args[1:], args[0])


def _remote_sub(args: list[bytes], origin: bytes | None) -> ev.Event:
    n = len(args)
    if n == 2:
        return ev.RemoteSub(_str(args[0]), _str(args[1]), None, None, _opt(origin))
    if n == 4:
        weight = _parse_size(args[3])
        if weight < 0:
            raise OpError("processRemoteSub Bad Queue Weight")
        return ev.RemoteSub(_str(args[0]), _str(args[1]), _str(args[2]), weight, _opt(origin))
    raise OpError("processRemoteSub Parse Error")


def _rs_minus(line: bytes, at: int) -> ev.Event:
    return _remote_unsub(_ARGS.findall(line, at), None)


def _ls_minus(line: bytes, at: int) -> ev.Event:
    args = _ARGS.findall(line, at)
    # A second separator right after the op is 2.9.10's empty origin; two arguments
    # are what 2.10+ sends to a peer that did not ask for the origin (no lnocu).
    if len(args) == 2 or (at + 1 < len(line) and line[at + 1] in b" \t"):
        return _remote_unsub(args, None)
    if len(args) != 3 and len(args) != 4:
        raise OpError("processRemoteUnsub parse error")
    return _remote_unsub(args[1:], args[0])


def _remote_unsub(args: list[bytes], origin: bytes | None) -> ev.Event:
    n = len(args)
    if n == 2:
        return ev.RemoteUnsub(_str(args[0]), _str(args[1]), None, _opt(origin))
    if n == 3:
        return ev.RemoteUnsub(_str(args[0]), _str(args[1]), _str(args[2]), _opt(origin))
    raise OpError("processRemoteUnsub parse error")


def _json_object(line: bytes, at: int, op: str) -> dict[str, Any]:
    try:
        doc = _parse_json(line[at:].strip(b" \t\r"))
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise OpError(f"{op} is not a JSON object")
    return doc


def _info(line: bytes, at: int) -> ev.Event:
    return ev.Info(_json_object(line, at, "INFO"))


def _connect(line: bytes, at: int) -> ev.Event:
    return ev.Connect(_json_object(line, at, "CONNECT"))


def _err(line: bytes, at: int) -> ev.Event:
    text = line[at:].strip(b" \t\r")
    if len(text) >= 2 and text[0] == 39 and text[-1] == 39:  # '...'
        text = text[1:-1]
    # Only ever logged: replace bad UTF-8 rather than carry surrogates into the log.
    return ev.Err(text.decode("utf-8", "replace"))


def _pub(line: bytes, at: int) -> Pending:
    args = _ARGS.findall(line, at)
    if len(args) != 2 and len(args) != 3:
        raise OpError("processPub Parse Error")
    size = _parse_size(args[-1])
    if size < 0:
        raise OpError("processPub Bad or Missing Size")
    reply = args[1] if len(args) == 3 else None
    return ("PUB", "", _str(args[0]), _opt(reply), None, None, -1, size)


# The ops of a route, by lower-case name. Anything else is an unknown op. nats-server
# ignores anything after PING/PONG/+OK as well.
HANDLERS: Final[dict[bytes, Callable[[bytes, int], ev.Event | Pending]]] = {
    b"rmsg": _rmsg,
    b"hmsg": _hmsg,
    b"lmsg": _lmsg,
    b"rs+": _rs_plus,
    b"rs-": _rs_minus,
    b"ls+": _ls_plus,
    b"ls-": _ls_minus,
    b"ping": lambda line, at: ev.Ping(),
    b"pong": lambda line, at: ev.Pong(),
    b"info": _info,
    b"connect": _connect,
    b"+ok": lambda line, at: ev.Ok(),
    b"-err": _err,
    b"sub": lambda line, at: ev.Ignored("SUB"),
    b"pub": _pub,
    b"a+": lambda line, at: ev.Ignored("A+"),
    b"a-": lambda line, at: ev.Ignored("A-"),
}
