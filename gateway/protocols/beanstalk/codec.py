"""beanstalkd text protocol, server side, sans-IO: what beanstalkd 1.13's prot.c accepts.

`BeanstalkCodec` turns the bytes of one connection into the events of events.py, with the
same line framing, command matching and argument checks as prot.c, so every malformed
input gets the reply a real beanstalkd sends (docs/protocols/beanstalkd.md §1-§5).
Replies for the client come from the pure functions and constants at the end of this
module. No sockets, no clock, no broker in here.

Reading is pull-style (h11): feed bytes with `receive_data`, then call `next_event` until
it returns None. beanstalkd handles one command at a time and reads nothing while a
reserve waits; the session gets the same effect by not pulling events meanwhile.

How prot.c frames lines, which this codec reproduces exactly (all verified against a real
server):

* The command buffer holds LINE_BUF_SIZE (224) bytes. `scan_line_end` looks for the
  *first* CR among the buffer's bytes except the last one, and the line ends there only
  if an LF follows. So a bare LF is part of the line, and a CR not followed by LF
  ("a\\rb\\r\\n") means no line can end in this buffer at all.
* When 224 bytes have arrived without a line end, beanstalkd throws them away and keeps
  discarding in 224-byte windows (the same scan each time) until a window holds a line
  end; that one line end gets a single BAD_FORMAT.
* The 225-byte quirk (docs/protocols/beanstalkd.md §1) follows from this and is
  implemented: a CR at byte 224 is the last byte of the window, which the scan skips, so
  its LF starts the next window and the *next* line's CRLF ends the discarding (one
  BAD_FORMAT for both lines).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Final

from gateway.protocols.beanstalk import events as ev
from gateway.protocols.beanstalk.names import MAX_NAME_LENGTH, NAME_CLASS, NAME_RE

# dat.h LINE_BUF_SIZE = 11 + MAX_TUBE_NAME_LEN (201) + 12: the longest command line,
# CRLF included, and the size of the discard windows.
LINE_BUF_SIZE: Final = 224
# dat.h JOB_DATA_SIZE_LIMIT_DEFAULT, (1 << 16) - 1: beanstalkd -z's default.
DEFAULT_MAX_JOB_SIZE: Final = 65535
# dat.h JOB_DATA_SIZE_LIMIT_MAX: the most -z accepts (util.c clamps larger values).
MAX_JOB_SIZE_LIMIT: Final = 1073741824

UINT32_MAX: Final = 0xFFFFFFFF  # pri, delay, ttr, bytes, pause delay: read_u32
UINT64_MAX: Final = 0xFFFFFFFFFFFFFFFF  # job ids: read_u64; also LP64 unsigned long (kick)
INT_MAX: Final = 0x7FFFFFFF  # 1.13 reserve-with-timeout: `utimeout > INT_MAX` -> BAD_FORMAT

# -- fixed replies (prot.c MSG_*) ---------------------------------------------------------

DELETED: Final = b"DELETED\r\n"
NOT_FOUND: Final = b"NOT_FOUND\r\n"
TIMED_OUT: Final = b"TIMED_OUT\r\n"
DEADLINE_SOON: Final = b"DEADLINE_SOON\r\n"
RELEASED: Final = b"RELEASED\r\n"
BURIED: Final = b"BURIED\r\n"  # bury, and a release that ran out of memory
TOUCHED: Final = b"TOUCHED\r\n"
KICKED: Final = b"KICKED\r\n"  # kick-job; kick answers kicked(n)
NOT_IGNORED: Final = b"NOT_IGNORED\r\n"
PAUSED: Final = b"PAUSED\r\n"
DRAINING: Final = b"DRAINING\r\n"
JOB_TOO_BIG: Final = b"JOB_TOO_BIG\r\n"
EXPECTED_CRLF: Final = b"EXPECTED_CRLF\r\n"
BAD_FORMAT: Final = b"BAD_FORMAT\r\n"
UNKNOWN_COMMAND: Final = b"UNKNOWN_COMMAND\r\n"
OUT_OF_MEMORY: Final = b"OUT_OF_MEMORY\r\n"
INTERNAL_ERROR: Final = b"INTERNAL_ERROR\r\n"

# -- argument parsers ------------------------------------------------------------------------
#
# prot.c's read_u32/read_u64 skip spaces (only ' '), demand a digit, then strtoumax: so a
# number is " *\d+", a sign is BAD_FORMAT, and two numbers need at least one space between
# them (the digits of the first run up to a non-digit, which must be a skippable space for
# the next read to find its digit). With a NULL end pointer the number must end the line.
# Range checks are done on the Python int: strtoumax's ERANGE above UINT64_MAX and the
# UINT32_MAX check give BAD_FORMAT alike.

_ONE_NUMBER = re.compile(rb" *(\d+)")  # fullmatch: last argument; match: leading number
_TWO_NUMBERS = re.compile(rb" *(\d+) +(\d+)")
_THREE_NUMBERS = re.compile(rb" *(\d+) +(\d+) +(\d+)")
_PUT = re.compile(rb" *(\d+) +(\d+) +(\d+) +(\d+)")  # match: trailing garbage checked later
_PUT_LINE = re.compile(rb"put +(\d+) +(\d+) +(\d+) +(\d+)\r\n")  # the usual case, whole
# kick uses strtoul: C isspace() skipped (\r cannot occur inside a line), an optional sign,
# then digits; whatever follows is ignored.
_KICK = re.compile(rb"[ \t\n\x0b\x0c\r]*([+-]?)(\d+)")
# pause-tube: read_tube_name skips spaces and takes the longest run of NAME_CHARS
# (strspn: possessive, it never gives digits back to the delay), read_duration needs
# spaces then digits up to the end of the line. Length and leading '-' are checked after.
_PAUSE = re.compile(rb" *([%b]++) +(\d+)" % NAME_CLASS)

_Parser = Callable[[bytearray, int, int], ev.Event]


def _bad() -> ev.Reply:
    return ev.Reply(BAD_FORMAT)


def _last_id(cls: Callable[[int], ev.Event]) -> _Parser:
    """`<cmd> <id>`: a uint64 that must end the line (delete, peek, touch, ...)."""

    def parse(buf: bytearray, start: int, end: int) -> ev.Event:
        m = _ONE_NUMBER.fullmatch(buf, start, end)
        if m is None:
            return _bad()
        job_id = int(m[1])
        if job_id > UINT64_MAX:
            return _bad()
        return cls(job_id)

    return parse


def _exact(cls: Callable[[], ev.Event]) -> _Parser:
    """Commands without arguments: prot.c compares cmd_len, so nothing may follow."""

    def parse(buf: bytearray, start: int, end: int) -> ev.Event:
        return cls() if start == end else _bad()

    return parse


def _tube(cls: Callable[[str], ev.Event]) -> _Parser:
    """`<cmd> <tube>`: everything after the prefix's single space is the name."""

    def parse(buf: bytearray, start: int, end: int) -> ev.Event:
        if NAME_RE.fullmatch(buf, start, end) is None:
            return _bad()
        return cls(buf[start:end].decode("ascii"))

    return parse


def _reserve_with_timeout(buf: bytearray, start: int, end: int) -> ev.Event:
    # read_u32 with an end pointer: trailing garbage is ignored (1.12 and 1.13 alike)
    m = _ONE_NUMBER.match(buf, start, end)
    if m is None:
        return _bad()
    timeout = int(m[1])
    if timeout > INT_MAX:
        return _bad()
    return ev.ReserveWithTimeout(timeout)


def _release(buf: bytearray, start: int, end: int) -> ev.Event:
    m = _THREE_NUMBERS.fullmatch(buf, start, end)
    if m is None:
        return _bad()
    job_id, pri, delay = int(m[1]), int(m[2]), int(m[3])
    if job_id > UINT64_MAX or pri > UINT32_MAX or delay > UINT32_MAX:
        return _bad()
    return ev.Release(job_id, pri, delay)


def _bury(buf: bytearray, start: int, end: int) -> ev.Event:
    m = _TWO_NUMBERS.fullmatch(buf, start, end)
    if m is None:
        return _bad()
    job_id, pri = int(m[1]), int(m[2])
    if job_id > UINT64_MAX or pri > UINT32_MAX:
        return _bad()
    return ev.Bury(job_id, pri)


def _kick(buf: bytearray, start: int, end: int) -> ev.Event:
    # `count = strtoul(...)` into a 32-bit uint: "-1" is ULONG_MAX, then truncated;
    # only a magnitude beyond ULONG_MAX (ERANGE) or no digits at all is BAD_FORMAT.
    m = _KICK.match(buf, start, end)
    if m is None:
        return _bad()
    value = int(m[2])
    if value > UINT64_MAX:
        return _bad()
    if m[1] == b"-":
        value = -value
    return ev.Kick(value & UINT32_MAX)


def _pause_tube(buf: bytearray, start: int, end: int) -> ev.Event:
    m = _PAUSE.fullmatch(buf, start, end)
    if m is None:
        return _bad()
    name = m[1]
    delay = int(m[2])
    if delay > UINT32_MAX or len(name) > MAX_NAME_LENGTH or name[0] == 0x2D:  # '-'
        return _bad()
    return ev.PauseTube(name.decode("ascii"), delay)


def _quit(buf: bytearray, start: int, end: int) -> ev.Event:
    return ev.Quit()  # "quit" is a prefix: "quitx" quits too


# prot.c which_cmd tests these prefixes with strncmp, in this order, first match wins:
#   put, peek, peek-ready, peek-delayed, peek-buried, reserve-with-timeout, reserve-job,
#   reserve, delete, release, bury, kick, kick-job, touch, stats-job, stats-tube, stats,
#   use, watch, ignore, list-tubes-watched, list-tube-used, list-tubes, quit, pause-tube.
# Prefixes with different first bytes never match the same line, so grouping them by first
# byte and keeping that order inside each group decides exactly as which_cmd does, with a
# dict lookup and one or two startswith calls instead of up to 25. ("kick " is tested
# before "kick-job ", but "kick-job 1" does not start with "kick ", so it is kick-job.)
# "put " is not in the table: next_event tests it first, inline.
_COMMANDS: Final[dict[int, tuple[tuple[bytes, int, _Parser], ...]]] = {}


def _add(prefix: bytes, parse: _Parser) -> None:
    group = _COMMANDS.get(prefix[0], ())
    _COMMANDS[prefix[0]] = (*group, (prefix, len(prefix), parse))


for _prefix, _parse in (
    (b"peek ", _last_id(ev.Peek)),
    (b"peek-ready", _exact(ev.PeekReady)),
    (b"peek-delayed", _exact(ev.PeekDelayed)),
    (b"peek-buried", _exact(ev.PeekBuried)),
    (b"reserve-with-timeout ", _reserve_with_timeout),
    (b"reserve-job ", _last_id(ev.ReserveJob)),
    (b"reserve", _exact(ev.Reserve)),
    (b"delete ", _last_id(ev.Delete)),
    (b"release ", _release),
    (b"bury ", _bury),
    (b"kick ", _kick),
    (b"kick-job ", _last_id(ev.KickJob)),
    (b"touch ", _last_id(ev.Touch)),
    (b"stats-job ", _last_id(ev.StatsJob)),
    (b"stats-tube ", _tube(ev.StatsTube)),
    (b"stats", _exact(ev.Stats)),
    (b"use ", _tube(ev.Use)),
    (b"watch ", _tube(ev.Watch)),
    (b"ignore ", _tube(ev.Ignore)),
    (b"list-tubes-watched", _exact(ev.ListTubesWatched)),
    (b"list-tube-used", _exact(ev.ListTubeUsed)),
    (b"list-tubes", _exact(ev.ListTubes)),
    (b"quit", _quit),
    (b"pause-tube", _pause_tube),  # no space: "pause-tubedefault 1" pauses "default"
):
    _add(_prefix, _parse)
del _prefix, _parse


# What the codec is doing with the bytes that come next.
_LINE = 0  # reading a command line
_BODY = 1  # reading a put's body and its CRLF
_SKIP = 2  # throwing away a too big put's body (prot.c STATE_BITBUCKET)
_ENDLINE = 3  # discarding a too long line (prot.c STATE_WANT_ENDLINE)
_CLOSED = 4  # after quit: nothing more is read


class BeanstalkCodec:
    __slots__ = ("_buf", "_job", "_mode", "_pos", "_skip", "max_job_size")

    def __init__(self, max_job_size: int = DEFAULT_MAX_JOB_SIZE) -> None:
        if not 0 <= max_job_size <= MAX_JOB_SIZE_LIMIT:
            raise ValueError(f"max_job_size must be within 0..{MAX_JOB_SIZE_LIMIT}")
        self.max_job_size = max_job_size  # beanstalkd -z
        self._buf = bytearray()
        self._pos = 0  # bytes of _buf already parsed
        self._mode = _LINE
        self._job: tuple[int, int, int, int] = (0, 0, 0, 0)  # _BODY: pri, delay, ttr, bytes
        self._skip = 0  # _SKIP: bytes still to throw away

    # -- input -------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        if self._mode != _LINE:
            if self._mode == _SKIP and self._pos == len(self._buf):
                # a JOB_TOO_BIG body is thrown away as it arrives, never buffered
                skip = self._skip
                if len(data) <= skip:
                    self._skip = skip - len(data)
                    return
                data = data[skip:]
                self._skip = 0
            elif self._mode == _CLOSED:
                return  # after quit beanstalkd closes; nothing more is parsed or kept
        buf = self._buf
        if self._pos:
            # one deletion per chunk, not per event; deleting a bytearray's head is cheap
            del buf[: self._pos]
            self._pos = 0
        buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not parsed yet (a put body still incomplete included)."""
        return len(self._buf) - self._pos

    @property
    def closed(self) -> bool:
        """True once a quit was parsed: beanstalkd reads nothing after it."""
        return self._mode == _CLOSED

    # -- output ------------------------------------------------------------------------

    def next_event(self) -> ev.Event | None:
        if self._mode != _LINE:
            mode = self._mode
            if mode == _BODY:
                return self._body()
            if mode == _SKIP:
                return self._drain()
            if mode == _ENDLINE:
                return self._endline()
            return None
        buf = self._buf
        pos = self._pos
        end = len(buf)
        if end > pos and buf[pos] == 0x70:  # "p": try a well-formed put line first
            m = _PUT_LINE.match(buf, pos)
            # a match is exactly a line the general path would accept: no NUL and no other
            # CR can be in it, so its CR is the first one; it must be inside the window
            if m is not None and m.end() - pos <= LINE_BUF_SIZE:
                self._pos = m.end()
                return self._put(*map(int, m.groups()), True)
        # scan_line_end: the first CR in the window, its last byte not included
        limit = end - 1 if end - pos < LINE_BUF_SIZE else pos + LINE_BUF_SIZE - 1
        cr = buf.find(b"\r", pos, limit)
        if cr < 0 or buf[cr + 1] != 10:
            if end - pos < LINE_BUF_SIZE:
                return None  # a line end may still come (or, after a stray CR, the window)
            self._pos = pos + LINE_BUF_SIZE
            self._mode = _ENDLINE
            return self._endline()
        self._pos = cr + 2
        if buf.find(0, pos, cr) >= 0:
            return _bad()  # prot.c: strlen(cmd) != cmd_len - 2, before which_cmd
        if pos == cr:
            return ev.Reply(UNKNOWN_COMMAND)
        first = buf[pos]
        if first == 0x70 and buf.startswith(b"put ", pos, cr):  # first in which_cmd's list
            m = _PUT.match(buf, pos + 4, cr)
            if m is None:
                return _bad()  # the body is not consumed: it will be read as command lines
            return self._put(*map(int, m.groups()), m.end() == cr)
        group = _COMMANDS.get(first)
        if group is not None:
            for prefix, length, parse in group:
                if buf.startswith(prefix, pos, cr):
                    event = parse(buf, pos + length, cr)
                    if event.__class__ is ev.Quit:
                        self._mode = _CLOSED
                        buf.clear()
                        self._pos = 0
                    return event
        return ev.Reply(UNKNOWN_COMMAND)

    def _put(self, pri: int, delay: int, ttr: int, size: int, line_ends: bool) -> ev.Event | None:
        """A put line whose four numbers parsed; `line_ends`: nothing follows the size."""
        if pri > UINT32_MAX or delay > UINT32_MAX or ttr > UINT32_MAX or size > UINT32_MAX:
            return _bad()
        # prot.c checks the size before the trailing garbage, and only answers once the
        # declared body and its CRLF have gone by.
        if size > self.max_job_size:
            self._skip = size + 2
            self._mode = _SKIP
            return self._drain()
        if not line_ends:
            return _bad()
        # ttr < 1 s becomes 1 s, silently
        self._job = (pri, delay, ttr or 1, size)
        self._mode = _BODY
        return self._body()

    def _body(self) -> ev.Event | None:
        pri, delay, ttr, size = self._job
        buf = self._buf
        pos = self._pos
        stop = pos + size
        if len(buf) - stop < 2:
            return None
        self._pos = stop + 2
        self._mode = _LINE
        if buf[stop] != 13 or buf[stop + 1] != 10:
            # all bytes + 2 are gone; what follows is read as commands
            return ev.PutRejected(EXPECTED_CRLF, True)
        if size < 4096:
            body = bytes(buf[pos:stop])
        else:  # one copy instead of two
            with memoryview(buf) as view:
                body = view[pos:stop].tobytes()
        return ev.Put(pri, delay, ttr, body)

    def _drain(self) -> ev.Event | None:
        buf = self._buf
        available = len(buf) - self._pos
        if available < self._skip:
            self._skip -= available
            buf.clear()
            self._pos = 0
            return None
        self._pos += self._skip
        self._skip = 0
        self._mode = _LINE
        return ev.PutRejected(JOB_TOO_BIG, False)

    def _endline(self) -> ev.Event | None:
        """prot.c STATE_WANT_ENDLINE: 224-byte windows go until one holds a line end."""
        buf = self._buf
        pos = self._pos
        end = len(buf)
        while True:
            cr = buf.find(b"\r", pos)
            if cr < 0:
                # no CR anywhere: every complete window goes, in one step
                pos += (end - pos) // LINE_BUF_SIZE * LINE_BUF_SIZE
                break
            # windows that end before the CR go whole
            pos += (cr - pos) // LINE_BUF_SIZE * LINE_BUF_SIZE
            if cr - pos == LINE_BUF_SIZE - 1:
                pos += LINE_BUF_SIZE  # the window's last byte is never scanned
                continue
            if cr + 1 == end:
                break  # is an LF next? wait and see
            if buf[cr + 1] == 10:
                self._pos = cr + 2
                self._mode = _LINE
                return _bad()
            # a stray CR: no line can end in this window, it goes once complete
            if end - pos < LINE_BUF_SIZE:
                break
            pos += LINE_BUF_SIZE
        self._pos = pos
        return None


# -- replies -------------------------------------------------------------------------------
#
# Each function returns the whole reply, header line and data, as one bytes object: pystalk
# reads some replies with a single recv(1024) and breaks when one arrives split.


def inserted(job_id: int) -> bytes:
    return b"INSERTED %d\r\n" % job_id


def buried_job(job_id: int) -> bytes:
    """A put whose job was made but could not be queued (out of memory): BURIED <id>."""
    return b"BURIED %d\r\n" % job_id


def reserved(job_id: int, body: bytes) -> bytes:
    return b"RESERVED %d %d\r\n%b\r\n" % (job_id, len(body), body)


def found(job_id: int, body: bytes) -> bytes:
    return b"FOUND %d %d\r\n%b\r\n" % (job_id, len(body), body)


def using(tube: str) -> bytes:
    return b"USING %b\r\n" % tube.encode("ascii")


def watching(count: int) -> bytes:
    return b"WATCHING %d\r\n" % count


def kicked(count: int) -> bytes:
    """kick's reply; kick-job answers the bare KICKED."""
    return b"KICKED %d\r\n" % count


def ok_yaml(data: bytes) -> bytes:
    """OK <n>: n counts the YAML's final newline but not the CRLF after the data."""
    return b"OK %d\r\n%b\r\n" % (len(data), data)


def quoted(text: str) -> str:
    """How 1.13 writes tube, name, version, hostname, os and platform: in plain double
    quotes, no escaping (prot.c's format strings are `"%s"`)."""
    return f'"{text}"'


def yaml_dict(pairs: Iterable[tuple[str, object]]) -> bytes:
    """`---\\n` then `key: value\\n` per pair, no blank line anywhere.

    ints are written in decimal, bools as true/false (draining), str as given: pass
    `quoted(...)` where 1.13 quotes and preformatted text such as `0.000847` for rusage.
    """
    out = [b"---\n"]
    for key, value in pairs:
        if value is True:
            text = b"true"
        elif value is False:
            text = b"false"
        elif isinstance(value, int):
            text = b"%d" % value
        elif isinstance(value, bytes):
            text = value
        else:
            text = str(value).encode("utf-8", "surrogateescape")
        out.append(b"%b: %b\n" % (key.encode("ascii"), text))
    return b"".join(out)


def yaml_list(names: Iterable[str]) -> bytes:
    """list-tubes and list-tubes-watched: `- name` lines, never quoted (1.12 and 1.13)."""
    return b"---\n" + b"".join(b"- %b\n" % name.encode("ascii") for name in names)
