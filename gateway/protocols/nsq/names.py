"""NSQ topic/channel names and Go-style quoting of names in error texts."""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 64  # counts the "#ephemeral" suffix (nsqd protocol.IsValidTopicName)
EPHEMERAL_SUFFIX = "#ephemeral"
_NAME = re.compile(rb"[.a-zA-Z0-9_-]+(#ephemeral)?")


# Names already checked, and their text: a publisher names the same topic on every PUB,
# and the regex was 3% of a PUB round trip. Bounded, so that a client inventing names
# cannot grow it; past the bound names are checked every time.
_checked: dict[bytes, str] = {}
_MAX_CHECKED = 4096


def valid_name(raw: bytes) -> str | None:
    """The name as text when it is a valid topic or channel name, else None."""
    name = _checked.get(raw)
    if name is not None:
        return name
    if not is_valid_name(raw):
        return None
    name = raw.decode("ascii")
    if len(_checked) < _MAX_CHECKED:
        _checked[raw] = name
    return name


def is_valid_name(name: bytes) -> bool:
    return 0 < len(name) <= MAX_NAME_LENGTH and _NAME.fullmatch(name) is not None


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL_SUFFIX)


_ESCAPES = {
    0x07: "\\a",
    0x08: "\\b",
    0x0C: "\\f",
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
    0x0B: "\\v",
    0x5C: "\\\\",
    0x22: '\\"',
}


def go_quote(raw: bytes) -> str:
    """Go's %q of a string: what nsqd writes around a bad name in E_BAD_TOPIC texts."""
    out = ['"']
    text = raw.decode("utf-8", errors="surrogateescape")
    for ch in text:
        cp = ord(ch)
        if 0xDC80 <= cp <= 0xDCFF:  # a byte that is not valid UTF-8
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif cp in _ESCAPES:
            out.append(_ESCAPES[cp])
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x80 or ch.isprintable():
            out.append(ch)
        elif cp <= 0xFFFF:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)
