"""Validation errors in the gateway's own words (config.describe_errors).

One line per problem, led by where the value came from, as the user would look for it:

    gw.toml:nsqd.max_msg_sise: unknown setting; did you mean max_msg_size?
    GATEWAY_NSQD__MSG_TIMEOUT: expected an integer, got "abc"
    --tls-cert: given without --tls-key (a certificate needs its private key)

pydantic's own messages name its types ("Input should be a valid integer, unable to
parse string as an integer") and list a union's members one line each; a user wrote a
TOML value or a variable and wants to know what to write instead.
"""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

Loc = tuple[str | int, ...]

# Unions whose members alone do not say what a number means.
_EXPECTED = {
    "storage.fsync": '"always", "never" or milliseconds',
    "archive.body": '"full", "none" or a number of bytes',
}


def pair_error(given: str, partner: str, why: str) -> PydanticCustomError:
    """A setting given without the one it needs: the line names both as the user wrote
    the one given (--tls-cert and --tls-key, GATEWAY_TLS_CERT and GATEWAY_TLS_KEY, or the
    file's keys). `given` and `partner` are field names of the model that raises it."""
    return PydanticCustomError(
        "gateway_pair",
        "{given} given without {partner} ({why})",
        {"given": given, "partner": partner, "why": why},
    )


def setting_error(setting: str, message: str) -> PydanticCustomError:
    """A model-wide check about one setting: the line is attributed to that setting's
    source, not to the whole file. `setting` is a field of the model that raises it, or
    a dotted path under it (nsqd.lookupd_tcp_addresses)."""
    return PydanticCustomError("gateway_setting", message, {"setting": setting})


class Describer:
    """Lines for one ValidationError of `model`, given where each value came from.

    `origin` maps a key path (as the model names it) to "--flag", "GATEWAY_VAR" or the
    file's path; `written` turns a key path into the file's spelling (http_settings ->
    http); `extra_keys` are keys a table accepts that the model keeps elsewhere ([http]
    address); `secret` says whether a key's value may not be shown."""

    def __init__(
        self,
        model: type[BaseModel],
        origin: Mapping[tuple[str, ...], str],
        file: str | None,
        written: Callable[[Sequence[str | int]], str],
        extra_keys: Mapping[tuple[str, ...], Sequence[str]],
        secret: Callable[[str], bool],
    ) -> None:
        self.model = model
        self.origin = origin
        self.file = file
        self.written = written
        self.extra_keys = extra_keys
        self.secret = secret

    def lines(self, error: ValidationError) -> list[str]:
        # a union's members fail one by one: gathered under the field, explained once
        groups: dict[tuple[Loc, int], list[ErrorDetails]] = {}
        for n, item in enumerate(error.errors()):
            path, rest, _ = self._walk(item["loc"])
            union = bool(rest) and item["type"] != "extra_forbidden"
            groups.setdefault((path, -1) if union else (tuple(item["loc"]), n), []).append(item)
        out = []
        for (key, _), items in groups.items():
            item = items[0]
            if item["type"] == "gateway_pair":
                out.append(self._pair(key, item))
                continue
            loc: Loc = key
            if item["type"] == "gateway_setting":
                loc = (*key, *item["ctx"]["setting"].split("."))
            message = (
                self._union(key, item["input"]) if len(items) > 1 else self._message(loc, item)
            )
            out.append(f"{self._where(loc)}: {message}")
        return out

    def _walk(self, loc: Sequence[str | int]) -> tuple[Loc, Loc, Any]:
        """(the longest prefix of `loc` that names settings, the rest, the type there)."""
        current: Any = self.model
        for i, part in enumerate(loc):
            current = _unwrap_optional(current)
            if isinstance(current, type) and issubclass(current, BaseModel):
                if part in current.model_fields:
                    current = current.model_fields[str(part)].annotation
                    continue
            elif isinstance(part, int) and get_origin(current) is list:
                current = get_args(current)[0]
                continue
            return tuple(loc[:i]), tuple(loc[i:]), current
        return tuple(loc), (), _unwrap_optional(current)

    def _source(self, loc: Sequence[str | int]) -> str | None:
        """The source of the longest key path `loc` starts with; for a table's own check
        (loc a table), the highest source that gave one of its keys."""
        for end in range(len(loc), 0, -1):
            found = self.origin.get(tuple(str(p) for p in loc[:end]))
            if found is not None:
                return found
        under = [src for key, src in self.origin.items() if loc and key[: len(loc)] == loc]
        return max(under, key=self._rank, default=None)

    def _rank(self, source: str) -> int:
        return 0 if source == self.file else 1 if source.startswith("GATEWAY_") else 2

    def _where(self, loc: Sequence[str | int]) -> str:
        source = self._source(loc)
        key = self.written(loc) or "(settings)"
        if source is None:
            return key
        if source == self.file:
            return f"{source}:{key}"
        return source  # a flag or a variable: the one thing the user typed

    def _pair(self, table: Loc, item: ErrorDetails) -> str:
        ctx = item["ctx"]
        given, partner = (*table, ctx["given"]), (*table, ctx["partner"])
        source = self._source(given)
        if source is not None and source.startswith("--"):
            partner_name = "--" + str(partner[-1]).replace("_", "-")
        elif source is not None and source.startswith("GATEWAY_"):
            partner_name = "GATEWAY_" + self.written(partner).upper().replace(".", "__")
        else:
            partner_name = self.written(partner)
        return f"{self._where(given)}: given without {partner_name} ({ctx['why']})"

    def _union(self, loc: Loc, value: Any) -> str:
        expected = _EXPECTED.get(self.written(loc))
        if expected is None:
            _, _, annotation = self._walk(loc)
            expected = _either([_kind(member) for member in _members(annotation)])
        return f"expected {expected}, got {self._got(loc, value)}"

    def _message(self, loc: Loc, item: ErrorDetails) -> str:
        kind, ctx = item["type"], item.get("ctx") or {}
        got = self._got(loc, item["input"])
        if kind == "extra_forbidden":
            return "unknown setting" + self._suggestion(loc)
        simple = {
            "int_parsing": "an integer",
            "int_type": "an integer",
            "int_from_float": "an integer",
            "float_parsing": "a number",
            "float_type": "a number",
            "bool_parsing": "true or false",
            "bool_type": "true or false",
            "string_type": "a string",
            "list_type": "a list",
            "model_type": "a table",
            "dict_type": "a table",
        }
        if kind in simple:
            return f"expected {simple[kind]}, got {got}"
        if kind == "literal_error":
            expected = str(ctx["expected"]).replace("'", '"')
            return f"expected {expected}, got {got}"
        bounds = {
            "greater_than_equal": ("at least", "ge"),
            "greater_than": ("more than", "gt"),
            "less_than_equal": ("at most", "le"),
            "less_than": ("less than", "lt"),
        }
        if kind in bounds:
            words, name = bounds[kind]
            return f"must be {words} {ctx[name]}, got {got}"
        if kind == "too_short":
            return f"needs at least {ctx['min_length']} item(s)"
        if kind == "string_too_short":
            return "must not be empty"
        if kind == "missing":
            return "missing: this setting is required"
        # the project's own checks (validators) already speak its words
        return item["msg"].removeprefix("Value error, ")

    def _suggestion(self, loc: Loc) -> str:
        table, rest, model = self._walk(loc)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return ""
        names = [self.written((*table, name)).rsplit(".", 1)[-1] for name in model.model_fields]
        names += list(self.extra_keys.get(tuple(str(p) for p in table), ()))
        close = difflib.get_close_matches(str(rest[0]), names, n=1)
        return f"; did you mean {close[0]}?" if close else ""

    def _got(self, loc: Sequence[str | int], value: Any) -> str:
        if any(self.secret(str(part)) for part in loc):
            return "(hidden)"
        if isinstance(value, bool):
            return "true" if value else "false"
        source = self._source(loc)
        if isinstance(value, str) and (source is None or source == self.file):
            return json.dumps(value)  # as TOML writes a string
        # a variable or a flag is text already: shown as typed
        return str(value)


def _unwrap_optional(annotation: Any) -> Any:
    args = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _members(annotation: Any) -> list[Any]:
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for a in get_args(annotation) if a is not type(None) for m in _members(a)]
    return [annotation]


def _kind(member: Any) -> str:
    if get_origin(member) is Literal:
        return _either([json.dumps(v) for v in get_args(member)])
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if member in names:
        return names[member]
    return "a list" if get_origin(member) is list else "a table"


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
