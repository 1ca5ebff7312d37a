"""How Go writes and reads the things nsqd's HTTP API exchanges, so replies match nsqd 1.3.0
byte for byte: encoding/json's compact output, net/url's query parsing and time.Duration's
String form.
"""

from __future__ import annotations

import json
import re
from typing import Any

# encoding/json escapes these even inside strings (HTML safety); Python's json does not.
_HTML_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


_STRAY_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def go_json(value: Any) -> bytes:
    """json.Marshal's output: compact, UTF-8 (not \\u-escaped), HTML characters escaped.
    Dict keys keep their insertion order, which callers set to the Go struct's field order
    (or sorted, where Go marshals a map)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).translate(_HTML_ESCAPES)
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        # a surrogate that is no escaped byte: Go writes U+FFFD, and one odd name must
        # not make the whole reply fail
        return _STRAY_SURROGATE.sub("\ufffd", text).encode("utf-8", "surrogateescape")


class QueryError(ValueError):
    """The query string does not parse (Go's url.ParseQuery error): nsqd answers
    400 INVALID_REQUEST."""


def _unescape(raw: str) -> str:
    """url.QueryUnescape: '+' is a space, %XX must be two hex digits."""
    if "%" not in raw:
        return raw.replace("+", " ")
    out = bytearray()
    i = 0
    data = raw.encode("utf-8", "surrogateescape")
    while i < len(data):
        byte = data[i]
        if byte == 0x25:  # '%'
            digits = data[i + 1 : i + 3]
            if len(digits) != 2 or not all(chr(d) in "0123456789abcdefABCDEF" for d in digits):
                raise QueryError(f"invalid URL escape {data[i : i + 3]!r}")
            out.append(int(digits, 16))
            i += 3
            continue
        out.append(0x20 if byte == 0x2B else byte)
        i += 1
    # Go strings are bytes: keep any non-UTF-8 byte, so a name check sees it and fails
    return out.decode("utf-8", "surrogateescape")


def parse_query(raw: bytes) -> dict[str, list[str]]:
    """url.ParseQuery: every value per key, in order. Go goes on past a bad pair and
    returns the first error with what it parsed; nsqd then gives up, so we raise."""
    values: dict[str, list[str]] = {}
    error: QueryError | None = None
    for pair in raw.decode("utf-8", "surrogateescape").split("&"):
        if ";" in pair:
            error = error or QueryError("invalid semicolon separator in query")
            continue
        if not pair:
            continue
        key, _, value = pair.partition("=")
        try:
            key, value = _unescape(key), _unescape(value)
        except QueryError as exc:
            error = error or exc
            continue
        values.setdefault(key, []).append(value)
    if error is not None:
        raise error
    return values


def _fraction(value: int, digits: int) -> str:
    whole, frac = divmod(value, 10**digits)
    text = str(whole)
    if frac:
        text += "." + f"{frac:0{digits}d}".rstrip("0")
    return text


def go_duration(ns: int) -> str:
    """time.Duration.String: 1h2m3.5s, 1m0s, 1.5ms, 800ns, 0s."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_fraction(u, 3)}µs"
    if u < 1_000_000_000:
        return f"{sign}{_fraction(u, 6)}ms"
    seconds, frac = divmod(u, 10**9)
    text = _fraction(seconds % 60 * 10**9 + frac, 9) + "s"
    minutes = seconds // 60
    if minutes:
        text = f"{minutes % 60}m{text}"
        if minutes >= 60:
            text = f"{minutes // 60}h{text}"
    return sign + text
