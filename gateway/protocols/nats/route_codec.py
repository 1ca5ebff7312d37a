"""NATS cluster route protocol, both directions, sans-IO: one route connection's framing.

`RouteCodec` turns the bytes a cluster peer (a nats-server, or another gateway) sends
on a route into the events of route_events.py: this module buffers and frames, route_ops.py
reads each op's arguments, route_frames.py builds the frames we send. No sockets, no
clock, no broker. Reading is pull-style (h11): feed bytes with `receive_data`, then call
`next_event` until it returns None. The same bytes give the same events however they are
chunked.

How the route protocol is framed (see docs/protocols/nats-route.md §1, §7-§9;
argument rules read from nats-server route.go and parser.go):

* Text lines end at `\\n`; a `\\r` just before it is dropped, so bare `\\n` works as it
  does in nats-server. Op names are case-insensitive and end at the first space or tab.
  Arguments are separated by runs of spaces, tabs (and `\\r`, which route.go also splits
  on), because servers are not tidy about it: 2.9.10 writes `LS-  $G leaf.sub` with an
  empty origin between two spaces, and every server ends its INFO line with `} \\r\\n`.
* RMSG, HMSG and LMSG put the sizes *last*, so a parser counts tokens from both ends:
  `RMSG <acc> <subj> [<reply>] <size>`; with more tokens the third is a queue marker,
  `+ <reply> <q>...` or `| <q>...`. HMSG and LMSG end with `<hdr_len> <total_len>` (the
  total includes the header block); LMSG starts with the origin cluster and always has a
  header size, 0 without headers. Exactly `<size>` payload bytes and then `\\r\\n` follow;
  anything else there is `-ERR 'Unknown Protocol Operation'`, decided as soon as the
  wrong byte arrives (the payload length is the only framing, so a mismatch means the
  stream is lost).
* `RS+ <acc> <subj> [<queue> <weight>]`, `RS- <acc> <subj> [<queue>]`, and LS+/LS- with
  an origin in front. A queue RS+ without a weight, or an RS- with one, is an error:
  mixing them up would corrupt the interest tables on both sides.
* Argument errors, bad INFO/CONNECT JSON: nats-server only logs them and closes, so the
  ProtocolError has no reply. Unknown ops get `-ERR 'Unknown Protocol Operation'` at the
  first byte that rules out every op, so garbage without a newline cannot pile up.
* Ops nats-server accepts on a route and drops: SUB (silently), PUB (a message for no
  account; its payload is consumed), A+ and A- (gateway interest).

Limits. A control line (the whole line, without its `\\r\\n`) may be max_control_line
bytes: 64 KiB by default, which is what nats-server 2.14+ allows on routes (16 x its
max_control_line of 4096; 2.9 has no limit). Longer, finished or not, is `-ERR 'maximum
control line exceeded'` (nats-server's text, lower case). nats-server does not enforce
max_payload on routes at all; we need a bound on what one message may buffer, so sizes
over max_payload (64 MiB by default) are `-ERR 'Maximum Payload Violation'`.

Deliberate differences from nats-server, for input no server sends: the limit counts the
op name too (nats-server counts the arguments only); `PINGX`, `INFO{...}` and
`CONNECT{...}` are unknown ops here; UNSUB and HPUB are unknown ops (nats-server treats
UNSUB as RS- and drops HPUB); a queue weight that is not a number is an error (nats-server
takes it as 1); INFO/CONNECT must be JSON objects (`null` too is an error).
"""

from __future__ import annotations

import re
from typing import Final

from gateway.protocols.nats import route_events as ev
from gateway.protocols.nats.client_codec import (
    ERR_MAX_CONTROL_LINE,
    ERR_MAX_PAYLOAD,
    ERR_UNKNOWN_OP,
    MAX_CONTROL_LINE_SIZE,
    PING,
    PONG,
    err,
    info,
)
from gateway.protocols.nats.route_frames import connect, hmsg, rmsg, rs_minus, rs_plus
from gateway.protocols.nats.route_ops import HANDLERS as _HANDLERS
from gateway.protocols.nats.route_ops import OpError, Pending

__all__ = [
    "ERR_MAX_CONTROL_LINE",
    "ERR_MAX_PAYLOAD",
    "ERR_UNKNOWN_OP",
    "MAX_ROUTE_CONTROL_LINE",
    "MAX_ROUTE_PAYLOAD",
    "PING",
    "PONG",
    "RouteCodec",
    "connect",
    "err",
    "hmsg",
    "info",
    "rmsg",
    "rs_minus",
    "rs_plus",
]

# nats-server 2.14+ parser.go overMaxControlLineLimit: routes get 16 x max_control_line.
MAX_ROUTE_CONTROL_LINE: Final = 16 * MAX_CONTROL_LINE_SIZE
# Not a nats-server limit (routes have none): our bound on one buffered message.
MAX_ROUTE_PAYLOAD: Final = 64 * 1024 * 1024
# Consumed bytes are dropped from the front of the buffer once this many have piled up
# (or all of them): one deletion per batch of events, not one per event.
_COMPACT_AT: Final = 65536

_SEP = re.compile(rb"[ \t]")

# The usual message lines, whole: upper case, single spaces, CRLF, sizes of 1-9 digits.
# Whatever these match parses the same in the general path; anything else (a queue
# list, a short buffer, a limit exceeded) takes the general path.
_FAST_RMSG = re.compile(rb"RMSG ([^ \t\r\n]+) ([^ \t\r\n]+) (?:([^ \t\r\n]+) )?(\d{1,9})\r\n")
_FAST_HMSG = re.compile(
    rb"HMSG ([^ \t\r\n]+) ([^ \t\r\n]+) (?:([^ \t\r\n]+) )?(\d{1,9}) (\d{1,9})\r\n"
)


class RouteCodec:
    """One route connection's input.

    `max_control_line` and `max_payload` are the limits described in the module
    docstring; the session may change them between calls.
    """

    def __init__(
        self,
        max_control_line: int = MAX_ROUTE_CONTROL_LINE,
        max_payload: int = MAX_ROUTE_PAYLOAD,
    ) -> None:
        self.max_payload = max_payload
        self.max_control_line = max_control_line
        self._buf = bytearray()
        self._pos = 0
        # Where the search for the current line's \n resumes: a line arriving a byte at
        # a time is scanned once, not once per byte.
        self._scan = 0
        self._closed = False
        self._want: Pending | None = None  # the message whose payload is next

    # -- input ---------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        if self._closed:
            return
        pos = self._pos
        if pos:
            if pos >= len(self._buf):
                self._buf.clear()
                self._pos = self._scan = 0
            elif pos > _COMPACT_AT:
                del self._buf[:pos]
                self._pos = 0
                self._scan = max(self._scan - pos, 0)
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet turned into events."""
        return len(self._buf) - self._pos

    def next_event(self) -> ev.Event | None:
        """The next event, or None until more data arrives (or for ever after an error)."""
        if self._closed:
            return None
        if self._want is not None:
            return self._payload()
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):
            return None
        # A line already seen unfinished skips the fast paths: rematching its start
        # for every new chunk would make a line sent a byte at a time quadratic.
        first = buf[pos] if self._scan <= pos else 0
        if first == 82:  # R
            m = _FAST_RMSG.match(buf, pos)
            if m is not None:
                start = m.end()
                size = int(m[4])
                end = start + size
                if (
                    size <= self.max_payload
                    and start - 2 - pos <= self.max_control_line
                    and buf.startswith(b"\r\n", end)
                ):
                    self._pos = end + 2
                    reply = m[3]
                    return ev.Msg(
                        m[1].decode("utf-8", "surrogateescape"),
                        m[2].decode("utf-8", "surrogateescape"),
                        None if reply is None else reply.decode("utf-8", "surrogateescape"),
                        None,
                        None,
                        bytes(buf[start:end]),
                        None,
                    )
        elif first == 72:  # H
            m = _FAST_HMSG.match(buf, pos)
            if m is not None:
                start = m.end()
                hdr = int(m[4])
                size = int(m[5])
                end = start + size
                if (
                    hdr <= size <= self.max_payload
                    and start - 2 - pos <= self.max_control_line
                    and buf.startswith(b"\r\n", end)
                ):
                    self._pos = end + 2
                    reply = m[3]
                    split = start + hdr
                    return ev.Msg(
                        m[1].decode("utf-8", "surrogateescape"),
                        m[2].decode("utf-8", "surrogateescape"),
                        None if reply is None else reply.decode("utf-8", "surrogateescape"),
                        None,
                        bytes(buf[start:split]),
                        bytes(buf[split:end]),
                        None,
                    )
        elif first == 80:  # P
            if buf.startswith(b"PING\r\n", pos):
                self._pos = pos + 6
                return ev.Ping()
            if buf.startswith(b"PONG\r\n", pos):
                self._pos = pos + 6
                return ev.Pong()
        return self._general()

    def _general(self) -> ev.Event | None:
        buf = self._buf
        pos = self._pos
        end = len(buf)
        nl = buf.find(b"\n", max(self._scan, pos))
        if nl < 0:
            self._scan = end
            return self._unfinished(pos, end)
        stop = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
        line = bytes(buf[pos:stop])
        self._pos = nl + 1
        op_end = _op_end(line, 0, len(line))
        handler = _HANDLERS.get(line[:op_end].lower())
        if handler is None:
            return self._fail(ERR_UNKNOWN_OP, "Unknown Protocol Operation")
        if len(line) > self.max_control_line:
            return self._fail(ERR_MAX_CONTROL_LINE, "maximum control line exceeded")
        try:
            event = handler(line, op_end)
        except OpError as e:
            return self._fail(None, e.reason)
        # A Pending message, its payload next. Not isinstance: that costs twice as much here.
        if type(event) is tuple:
            if event[7] > self.max_payload:  # its total size
                return self._fail(ERR_MAX_PAYLOAD, "Maximum Payload Violation")
            self._want = event
            return self._payload()
        return event

    def _unfinished(self, pos: int, end: int) -> ev.Event | None:
        """Fail early on a line that can only end in an error, so it is not buffered.

        Decides only what the finished line would decide too: the op name once it can
        match no op, the length once it is over the limit whatever follows (a final `\\r`
        may be the one before the `\\n`, so it does not count yet).
        """
        buf = self._buf
        # The op name is looked for in its first bytes only: a longer name is no op.
        window = min(end, pos + _LONGEST_OP + 2)
        op_end = _op_end(buf, pos, window)
        if op_end == window:
            name = bytes(buf[pos:window])
            if name.endswith(b"\r"):
                name = name[:-1]
            if name.lower() not in _OP_PREFIXES:
                return self._fail(ERR_UNKNOWN_OP, "Unknown Protocol Operation")
            return None  # the name so far is shorter than the longest op name
        if bytes(buf[pos:op_end]).lower() not in _HANDLERS:
            return self._fail(ERR_UNKNOWN_OP, "Unknown Protocol Operation")
        length = end - pos - (buf[end - 1] == 13)
        if length > self.max_control_line:
            return self._fail(ERR_MAX_CONTROL_LINE, "maximum control line exceeded")
        return None

    def _fail(self, reply: bytes | None, reason: str) -> ev.ProtocolError:
        self._closed = True
        self._want = None
        self._buf.clear()  # up to max_payload of a message we will never finish
        self._pos = self._scan = 0
        return ev.ProtocolError(reply, reason)

    # -- payloads --------------------------------------------------------------------

    def _payload(self) -> ev.Event | None:
        assert self._want is not None
        dropped, account, subject, reply, queues, origin, hdr, size = self._want
        buf = self._buf
        start = self._pos
        end = start + size
        have = len(buf)
        if have <= end:
            return None
        if buf[end] != 13:
            return self._fail(ERR_UNKNOWN_OP, "payload not followed by CRLF")
        if have == end + 1:
            return None
        if buf[end + 1] != 10:
            return self._fail(ERR_UNKNOWN_OP, "payload not followed by CRLF")
        self._want = None
        self._pos = self._scan = end + 2
        if dropped is not None:
            return ev.Ignored(dropped)
        with memoryview(buf) as view:
            if hdr < 0:
                header = None
                payload = view[start:end].tobytes()
            else:
                split = start + hdr
                header = view[start:split].tobytes()
                payload = view[split:end].tobytes()
        return ev.Msg(account, subject, reply, queues, header, payload, origin)


# every prefix of an op name: how soon an unknown op is known to be one
_OP_PREFIXES: Final = frozenset(name[:i] for name in _HANDLERS for i in range(len(name) + 1))
_LONGEST_OP: Final = max(map(len, _HANDLERS))


def _op_end(data: bytes | bytearray, start: int, stop: int) -> int:
    """Where the op name starting at `start` ends: the first space or tab, else `stop`."""
    m = _SEP.search(data, start, stop)
    return stop if m is None else m.start()
