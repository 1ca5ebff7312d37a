"""Log set-up and the pieces that keep the log useful under load.

`configure` installs one stderr handler in the chosen format: `text` (human), `json` (one
object a line) or `logfmt` (key=value), so a log pipeline needs no regular expression.
`Throttle` bounds how often one source (a connection, an HTTP client) may write a line:
a client that sends nothing but garbage must not be able to flood the log or slow the
gateway down with it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

FORMATS = ("text", "json", "logfmt")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _iso(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


class JSONFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, msg, and exc when
    the record carries a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _iso(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _logfmt_value(value: str) -> str:
    if value and not any(c in value for c in ' ="\\\n\t'):
        return value
    return json.dumps(value, ensure_ascii=False)  # quoted, with \" \\ \n escaped


class LogfmtFormatter(logging.Formatter):
    """`time=... level=... logger=... msg="..."`, one record a line."""

    def format(self, record: logging.LogRecord) -> str:
        pairs = [
            ("time", _iso(record)),
            ("level", record.levelname.lower()),
            ("logger", record.name),
            ("msg", record.getMessage()),
        ]
        if record.exc_info:
            pairs.append(("exc", self.formatException(record.exc_info)))
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in pairs)


def formatter(name: str) -> logging.Formatter:
    if name == "json":
        return JSONFormatter()
    if name == "logfmt":
        return LogfmtFormatter()
    return logging.Formatter(_TEXT)


def configure(level: str, fmt: str = "text") -> None:
    """The root logger writes `level` and above to stderr in format `fmt`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


class Throttle:
    """At most `burst` lines at once, then one every `every` seconds, for one source.

    `allow()` answers None when this line is to be dropped, else the number dropped since
    the last line let through (said in that line, so nothing is silently lost).
    """

    __slots__ = ("burst", "clock", "dropped", "every", "next_at", "tokens")

    def __init__(
        self, burst: int = 5, every: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.every = every
        self.clock = clock
        self.tokens = burst
        self.next_at = 0.0
        self.dropped = 0

    def allow(self) -> int | None:
        if self.tokens <= 0:
            now = self.clock()
            if now < self.next_at:
                self.dropped += 1
                return None
            self.tokens = 1
        self.tokens -= 1
        if self.tokens == 0:
            self.next_at = self.clock() + self.every
        dropped, self.dropped = self.dropped, 0
        return dropped


class Throttles:
    """A Throttle per key (an HTTP client's address), the `size` most recent kept: memory
    stays bounded whatever the number of clients."""

    def __init__(self, size: int = 1024, **kw: Any) -> None:
        self.size = size
        self.kw = kw
        self.by_key: OrderedDict[str, Throttle] = OrderedDict()

    def allow(self, key: str) -> int | None:
        throttle = self.by_key.get(key)
        if throttle is None:
            throttle = self.by_key[key] = Throttle(**self.kw)
            if len(self.by_key) > self.size:
                self.by_key.popitem(last=False)
        else:
            self.by_key.move_to_end(key)
        return throttle.allow()


def dropped_note(dropped: int) -> str:
    return f" ({dropped} more not logged)" if dropped else ""


def shown(reply: bytes | str, limit: int = 160) -> str:
    """A reply as a log line shows it: text, control characters escaped, bounded."""
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
    text = text.strip()
    text = text[:limit] + ("…" if len(text) > limit else "")
    return text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
