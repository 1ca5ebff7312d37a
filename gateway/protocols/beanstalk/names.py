"""beanstalkd tube names: which bytes make a valid one (prot.c NAME_CHARS, is_valid_tube)."""

from __future__ import annotations

import re
from typing import Final

# dat.h: "The name of a tube cannot be longer than MAX_TUBE_NAME_LEN-1" (MAX_TUBE_NAME_LEN 201)
MAX_NAME_LENGTH: Final = 200
# prot.c NAME_CHARS. Note what is missing: space, '*', '#', ':', quotes, anything non-ASCII.
NAME_CHARS: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-+/;.$_()"
DEFAULT_TUBE: Final = "default"

# The character class as a regex fragment; '-' last so it is literal, '$' is literal in a class.
NAME_CLASS: Final = rb"A-Za-z0-9+/;.$_()\-"
# is_valid_tube: 1..200 bytes, all from NAME_CHARS, the first not '-'.
NAME_RE: Final = re.compile(rb"[A-Za-z0-9+/;.$_()][%b]{0,%d}" % (NAME_CLASS, MAX_NAME_LENGTH - 1))


def is_valid_name(name: bytes | bytearray) -> bool:
    return NAME_RE.fullmatch(name) is not None
