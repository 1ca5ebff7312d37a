"""Go RE2 regular expressions (nsqd's auth server replies) as Python `re` patterns.

The auth server's topic and channel patterns are Go RE2 syntax, matched with Go's
unanchored MatchString (`re.search` here). Python-only constructs that RE2 rejects
(lookaround, backreferences, possessive quantifiers, `\\Z`...) are refused as nsqd
refuses them, rather than silently compiling; a few RE2-only forms Python cannot express
(`\\pL`, `\\Q...\\E`, `\\x{41}`, flags set mid-pattern) are refused too.
"""

from __future__ import annotations

import re
import warnings
from typing import Final

# POSIX classes RE2 accepts inside brackets, as Python set contents (ASCII, like RE2's).
_POSIX_CLASSES: Final = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": r"\x00-\x7f",
    "blank": r"\t ",
    "cntrl": r"\x00-\x1f\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": r"!-/:-@\[-`{-~",
    "space": r"\t\n\v\f\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
# Escapes Python accepts but RE2 rejects: \Z (RE2 spells it \z), \uXXXX, \UXXXXXXXX, \N{...}.
_PYTHON_ONLY_ESCAPES: Final = frozenset("ZuUN")
_OCTAL: Final = frozenset("01234567")
_NONZERO_DIGITS: Final = frozenset("123456789")
_REPEAT: Final = re.compile(r"\{([0-9]+)(?:,([0-9]*))?\}")
_FLAG_GROUP: Final = re.compile(r"\(\?([A-Za-z]*)(?:-([A-Za-z]*))?([:)])")


class GoRegexpError(ValueError):
    """A pattern RE2 would reject (or that Python cannot express)."""


def _invalid_regexp(pattern: str, why: str) -> GoRegexpError:
    return GoRegexpError(f"unable to compile {pattern!r}: {why}")


def _translate_class(pattern: str, start: int) -> tuple[str, int]:
    """Translate the bracket expression at ``pattern[start] == "["``; return it and its end."""
    out = ["["]
    i = start + 1
    if pattern.startswith("^", i):
        out.append("^")
        i += 1
    if pattern.startswith("]", i):  # a leading ] is a literal in both syntaxes
        out.append(r"\]")
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        if pattern[i] == "\\":
            esc = pattern[i + 1 : i + 2]
            # Python reads [\b] as backspace and [\1] as \x01; RE2 rejects both.
            if esc in _PYTHON_ONLY_ESCAPES or esc == "b":
                raise _invalid_regexp(pattern, f"escape \\{esc} in a class")
            if esc in _NONZERO_DIGITS and pattern[i + 2 : i + 3] not in _OCTAL:
                raise _invalid_regexp(pattern, f"escape \\{esc} in a class")
            out.append(pattern[i : i + 2])
            i += 2
        elif pattern.startswith("[:", i) and (end := pattern.find(":]", i + 2)) >= 0:
            # RE2 treats any "[:...:]" as a named class and rejects unknown names.
            ranges = _POSIX_CLASSES.get(pattern[i + 2 : end])
            if ranges is None:  # includes negated [:^name:], which a Python set cannot hold
                raise _invalid_regexp(pattern, f"class {pattern[i : end + 2]}")
            out.append(ranges)
            i = end + 2
        elif pattern[i] == "[":
            out.append(r"\[")  # a literal in both; escaped so Python does not see a nested set
            i += 1
        else:
            out.append(pattern[i])
            i += 1
    if i < len(pattern):
        out.append("]")
        i += 1
    return "".join(out), i


def _translate_group_start(pattern: str, start: int) -> tuple[str, int]:
    """Translate the ``(?`` construct at ``start``; return it and where the scan continues."""
    for prefix in ("(?:", "(?P<"):
        if pattern.startswith(prefix, start):
            return prefix, start + len(prefix)
    m = _FLAG_GROUP.match(pattern, start)
    if m is None:  # lookaround, atomic, conditional, comment, (?P=name): all Python-only
        raise _invalid_regexp(pattern, "unsupported group syntax")
    on, off, end = m.group(1), m.group(2) or "", m.group(3)
    if not set(on + off) <= set("imsU"):
        raise _invalid_regexp(pattern, "unsupported flag")
    # U (ungreedy) cannot change whether a search matches, and Python has no such flag.
    on, off = on.replace("U", ""), off.replace("U", "")
    flags = on + ("-" + off if off else "")
    if not flags:
        return ("(?:" if end == ":" else "(?:)"), m.end()
    return f"(?{flags}{end}", m.end()


def _translate_go_regexp(pattern: str) -> str:
    """Rewrite RE2 syntax for Python's re, raising AuthFailed where the two disagree."""
    out: list[str] = []
    i = 0
    after_quantifier = False
    while i < len(pattern):
        c = pattern[i]
        quantifier = False
        if c == "\\":
            esc = pattern[i + 1 : i + 2]
            if esc in _PYTHON_ONLY_ESCAPES:
                raise _invalid_regexp(pattern, f"escape \\{esc}")
            digits = pattern[i + 2 : i + 4]
            octal = esc in _OCTAL and len(digits) == 2 and set(digits) <= _OCTAL
            if esc in _NONZERO_DIGITS and not octal:
                # Python takes \1 or \12 as a backreference; RE2 has none (\123 is octal in both).
                raise _invalid_regexp(pattern, "backreference")
            out.append(r"\Z" if esc == "z" else pattern[i : i + 2])  # RE2's \z is Python's \Z
            i += 2
        elif c == "[":
            text, i = _translate_class(pattern, i)
            out.append(text)
        elif c == "(" and pattern.startswith("(?", i):
            text, i = _translate_group_start(pattern, i)
            out.append(text)
        elif c in "*+?":
            if c == "+" and after_quantifier:
                raise _invalid_regexp(pattern, "possessive quantifier")
            quantifier = not after_quantifier  # a ? after a quantifier only makes it lazy
            out.append(c)
            i += 1
        elif c == "{":
            m = _REPEAT.match(pattern, i)
            numbers = [g for g in m.groups() if g] if m else []
            if m is None or any(len(n) > 1 and n[0] == "0" for n in numbers):
                # RE2 takes "{" literally unless a well-formed {n}, {n,} or {n,m} follows (no
                # leading zeros). Python also repeats {,m} and {01}, so escape it.
                out.append(r"\{")
                i += 1
            else:
                if any(int(n) > 1000 for n in numbers):
                    raise _invalid_regexp(pattern, "repeat count above 1000")
                out.append(m.group(0))
                i = m.end()
                quantifier = True
        else:
            out.append(c)
            i += 1
        after_quantifier = quantifier
    return "".join(out)


def compile_go_regexp(pattern: str) -> re.Pattern[str]:
    translated = _translate_go_regexp(pattern)
    try:
        # re.ASCII: RE2's \d, \w, \s and \b are ASCII-only.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "possible set operation" notes
            return re.compile(translated, re.ASCII)
    except (re.error, OverflowError, RecursionError) as exc:
        raise _invalid_regexp(pattern, str(exc)) from None
