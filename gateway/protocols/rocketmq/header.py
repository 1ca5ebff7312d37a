"""RocketMQ remoting headers, sans-IO: the JSON and the binary ROCKETMQ serialization.

Decoders take the header bytes of one frame (codec.py cuts them out) and raise
`HeaderError`, which the codec turns into a ProtocolError (close; NettyDecoder does the
same). Encoders take values already checked by the caller and give the header bytes.

JSON (serialize type 0) is what every client sends by default; ali-ons and the C++ client
send and read nothing else. The binary form (type 1, RocketMQSerializable) comes only from
a Java client started with `rocketmq.serialize.type=ROCKETMQ` (notes 2.3).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

# LanguageCode, by binary code (the index) as RocketMQSerializable writes it.
LANGUAGES: Final = (
    "JAVA",
    "CPP",
    "DOTNET",
    "PYTHON",
    "DELPHI",
    "ERLANG",
    "RUBY",
    "OTHER",
    "HTTP",
    "GO",
    "PHP",
    "OMS",
    "RUST",
    "NODE_JS",
)
_LANGUAGE_CODES: Final = {name: code for code, name in enumerate(LANGUAGES)}
_OTHER_LANGUAGE: Final = _LANGUAGE_CODES["OTHER"]

INT32_MIN: Final = -(1 << 31)
INT32_MAX: Final = (1 << 31) - 1
_INT16_MIN: Final = -(1 << 15)
_INT16_MAX: Final = (1 << 15) - 1

_BINARY_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_BE16 = struct.Struct(">h")
_BE32 = struct.Struct(">i")
# At most 10 digits: int32 anyway, and int() of a very long string raises (Python's
# int_max_str_digits), which must not escape the codec.
_DECIMAL = re.compile(r"-?[0-9]{1,10}\Z")


class HeaderFields(NamedTuple):
    code: int
    language: str
    version: int
    opaque: int
    flag: int
    remark: str | None
    ext_fields: dict[str, str]


class HeaderError(Exception):
    """A header that cannot be decoded; the codec turns it into a ProtocolError."""


# -- extFields typing ---------------------------------------------------------------------


_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def ext_text(value: object) -> str:
    """One extFields value as the text a Java broker sees (notes 2.2).

    Java declares HashMap<String,String>, but ali-ons sends JS numbers and booleans as they
    are and the C++ client mixes numbers and strings. Numbers become decimal text, JSON
    booleans `"true"`/`"false"` (Java's Boolean.parseBoolean spelling, not Python's
    `True`); objects and arrays their compact JSON, as fastjson's cast to String gives.
    """
    if value.__class__ is str:
        if _LONE_SURROGATE.search(value):  # type: ignore[arg-type]
            # a JS string cut inside a pair ("\ud83d"): Java's String reads it, and writes
            # it out as "?"; kept, it could not be encoded again (a pull would fail)
            return _LONE_SURROGATE.sub("?", value)  # type: ignore[arg-type]
        return value  # type: ignore[return-value]
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # JS writes integral numbers without a fraction; an integral float here came from
        # an exponent (1e3). Java would parseLong the text, so give it digits.
        if value.is_integer():
            return str(int(value))
        return repr(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def ext_bool(text: str | None, default: bool = False) -> bool:
    """Boolean.parseBoolean, plus the C++ client's `"1"`/`"0"` (notes 2.2)."""
    if text is None:
        return default
    return text.lower() == "true" or text == "1"


def ext_fields_text(fields: Mapping[str, object] | None) -> dict[str, str] | None:
    # Always send strings (notes 2.2); a None value is left out, as Java omits nulls.
    if fields is None:
        return None
    return {key: ext_text(value) for key, value in fields.items() if value is not None}


# -- header decoding ----------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")  # NaN, Infinity: not JSON


def _int_field(doc: dict[str, Any], name: str, low: int, high: int) -> int:
    value = doc.get(name)
    if value is None:
        return 0  # Java's int fields default to 0
    if value.__class__ is str and _DECIMAL.match(value):
        value = int(value)  # fastjson coerces a decimal string into an int field
    if value.__class__ is not int or not low <= value <= high:
        raise HeaderError(f"header field {name} is not an integer in range: {value!r:.40}")
    return value  # type: ignore[no-any-return]


def _language(value: object) -> str:
    if value is None:
        return "JAVA"  # RemotingCommand's default
    if value.__class__ is str:
        return value  # type: ignore[return-value]
    if value.__class__ is int and 0 <= value < len(LANGUAGES):  # type: ignore[operator]
        return LANGUAGES[value]  # type: ignore[index]  # fastjson reads an enum by ordinal
    raise HeaderError(f"header field language is not a name: {value!r:.40}")


def decode_json_header(raw: bytes) -> HeaderFields:
    # Java decodes the bytes as UTF-8 with replacement before fastjson sees them.
    text = raw.decode("utf-8", "replace")
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # RecursionError: deeply nested arrays
        raise HeaderError(f"header is not JSON: {exc}") from None
    if doc.__class__ is not dict:
        raise HeaderError("header is not a JSON object")
    ext = doc.get("extFields")
    remark = doc.get("remark")
    try:
        if ext is None:
            ext_fields: dict[str, str] = {}
        elif ext.__class__ is dict:
            ext_fields = {key: ext_text(value) for key, value in ext.items() if value is not None}
        else:
            raise HeaderError("header field extFields is not an object")
        remark = None if remark is None else ext_text(remark)
    except RecursionError:  # json.dumps of a nested value as deep as the parser allowed
        raise HeaderError("header value nested too deeply") from None
    return HeaderFields(
        code=_int_field(doc, "code", INT32_MIN, INT32_MAX),
        language=_language(doc.get("language")),
        version=_int_field(doc, "version", INT32_MIN, INT32_MAX),
        opaque=_int_field(doc, "opaque", INT32_MIN, INT32_MAX),
        flag=_int_field(doc, "flag", INT32_MIN, INT32_MAX),
        remark=remark,
        ext_fields=ext_fields,
    )


def _utf8(raw: bytes | bytearray | memoryview) -> str:
    return bytes(raw).decode("utf-8", "replace")  # Java's new String(bytes, UTF_8)


def decode_binary_header(raw: bytes) -> HeaderFields:
    """RocketMQSerializable.rocketMQProtocolDecode.

    Negative lengths are errors (the ByteBuf decoder of late 4.9 and 5.x throws on them;
    older ones skipped a negative remark or ext length). Bytes after the ext entries are
    ignored, as every Java version does.
    """
    end = len(raw)
    if end < _BINARY_FIXED.size + 8:
        raise HeaderError(f"binary header too short: {end} bytes")
    code, language, version, opaque, flag = _BINARY_FIXED.unpack_from(raw, 0)
    pos = _BINARY_FIXED.size
    remark_length = _BE32.unpack_from(raw, pos)[0]
    pos += 4
    if remark_length < 0 or remark_length > end - pos - 4:
        raise HeaderError(f"binary header remark length {remark_length} out of range")
    remark = _utf8(raw[pos : pos + remark_length]) if remark_length else None
    pos += remark_length
    ext_length = _BE32.unpack_from(raw, pos)[0]
    pos += 4
    if ext_length < 0 or ext_length > end - pos:
        raise HeaderError(f"binary header ext length {ext_length} out of range")
    ext_end = pos + ext_length
    ext_fields: dict[str, str] = {}
    while pos < ext_end:
        if ext_end - pos < 2:
            raise HeaderError("binary header ext entry truncated")
        key_length = _BE16.unpack_from(raw, pos)[0]
        pos += 2
        if key_length < 0 or key_length + 4 > ext_end - pos:
            raise HeaderError(f"binary header ext key length {key_length} out of range")
        key = _utf8(raw[pos : pos + key_length])
        pos += key_length
        value_length = _BE32.unpack_from(raw, pos)[0]
        pos += 4
        if value_length < 0 or value_length > ext_end - pos:
            raise HeaderError(f"binary header ext value length {value_length} out of range")
        ext_fields[key] = _utf8(raw[pos : pos + value_length])
        pos += value_length
    name = LANGUAGES[language] if 0 <= language < len(LANGUAGES) else f"LANGUAGE_{language}"
    return HeaderFields(code, name, version, opaque, flag, remark, ext_fields)


# -- header encoding ----------------------------------------------------------------------


def encode_json_header(
    code: int,
    opaque: int,
    flag: int,
    language: str,
    version: int,
    remark: str | None,
    ext_fields: dict[str, str] | None,
) -> bytes:
    # fastjson's order: keys sorted, nulls left out (serializeTypeCurrentRPC, which Java
    # also writes, is ignored by every reader and left out here).
    doc: dict[str, object] = {"code": code}
    if ext_fields is not None:
        doc["extFields"] = ext_fields
    doc["flag"] = flag
    doc["language"] = language
    doc["opaque"] = opaque
    if remark is not None:
        doc["remark"] = remark
    doc["version"] = version
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (a client may send "\\ud800" in JSON and see it echoed): the
        # ASCII-escaped form stays valid JSON and valid UTF-8.
        return json.dumps(doc, separators=(",", ":")).encode("ascii")


def encode_binary_header(
    code: int,
    opaque: int,
    flag: int,
    language: str,
    version: int,
    remark: str | None,
    ext_fields: dict[str, str] | None,
) -> bytes:
    if not (_INT16_MIN <= code <= _INT16_MAX and _INT16_MIN <= version <= _INT16_MAX):
        raise ValueError("the binary header holds code and version in 16 bits")
    parts = [
        _BINARY_FIXED.pack(
            code, _LANGUAGE_CODES.get(language, _OTHER_LANGUAGE), version, opaque, flag
        )
    ]
    remark_bytes = remark.encode("utf-8", "surrogatepass") if remark else b""
    parts.append(_BE32.pack(len(remark_bytes)))
    parts.append(remark_bytes)
    entries = []
    for key, value in (ext_fields or {}).items():
        key_bytes = key.encode("utf-8", "surrogatepass")
        value_bytes = value.encode("utf-8", "surrogatepass")
        if len(key_bytes) > _INT16_MAX:
            raise ValueError(f"ext key of {len(key_bytes)} bytes does not fit its int16 length")
        entries += (
            _BE16.pack(len(key_bytes)),
            key_bytes,
            _BE32.pack(len(value_bytes)),
            value_bytes,
        )
    ext = b"".join(entries)
    parts.append(_BE32.pack(len(ext)))
    parts.append(ext)
    return b"".join(parts)
