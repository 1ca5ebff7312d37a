"""IDENTIFY: decode the client's JSON as strictly as Go's encoding/json does, validate it
in nsqd's order, and build the feature-negotiation reply with nsqd's keys in nsqd's order.
Pure functions; the session applies the result to the connection.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_VERSION = "1.3.0"  # what clients see as the nsqd version; they only log it


class IdentifyError(Exception):
    """Carries the error frame text (`E_BAD_BODY IDENTIFY ...`)."""


@dataclass(frozen=True, slots=True)
class ServerFeatures:
    tls_available: bool = False
    snappy_enabled: bool = True
    deflate_enabled: bool = True
    max_deflate_level: int = 6
    auth_required: bool = False
    max_rdy_count: int = 2500
    msg_timeout: int = 60000  # ms
    max_msg_timeout: int = 900000
    heartbeat_interval: int = 30000  # default: nsqd's client-timeout / 2
    max_heartbeat_interval: int = 60000
    output_buffer_size: int = 16384
    max_output_buffer_size: int = 65536
    output_buffer_timeout: int = 250
    min_output_buffer_timeout: int = 25
    max_output_buffer_timeout: int = 30000


@dataclass(frozen=True, slots=True)
class Identity:
    client_id: str
    hostname: str
    user_agent: str
    feature_negotiation: bool
    heartbeat_interval: int  # ms, -1 = disabled
    output_buffer_size: int  # bytes, 0 = unbuffered
    output_buffer_timeout: int  # ms, 0 = no timer
    sample_rate: int
    msg_timeout: int  # ms, effective
    tls_v1: bool  # negotiated (asked and available)
    snappy: bool
    deflate: bool
    deflate_level: int


# Go struct fields: JSON key -> expected Python type. Go matches keys case-insensitively
# when no exact match exists; a wrong JSON type is a decode error, null leaves the default.
_FIELDS: dict[str, type] = {
    "client_id": str,
    "hostname": str,
    "user_agent": str,
    "feature_negotiation": bool,
    "heartbeat_interval": int,
    "output_buffer_size": int,
    "output_buffer_timeout": int,
    "tls_v1": bool,
    "snappy": bool,
    "deflate": bool,
    "deflate_level": int,
    "sample_rate": int,
    "msg_timeout": int,
    "short_id": str,
    "long_id": str,
}
_INT32 = ("sample_rate",)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _decode(body: bytes) -> dict[str, object]:
    decode_error = IdentifyError("E_BAD_BODY IDENTIFY failed to decode JSON body")
    try:
        # As Go's encoding/json: UTF-8 only (a BOM or UTF-16 is refused, not detected),
        # invalid bytes read as U+FFFD
        raw = json.loads(body.decode("utf-8", "replace"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        # RecursionError: Python's parser gives up near 1000 levels of nesting, Go's at
        # 10000; no client nests its IDENTIFY at all
        raise decode_error from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise decode_error
    fields: dict[str, object] = {}
    lowered = {k.lower(): k for k in _FIELDS}
    for key, value in raw.items():
        name = key if key in _FIELDS else lowered.get(key.lower())
        if name is None or value is None:
            continue  # unknown keys are ignored, null keeps the zero value
        want = _FIELDS[name]
        if want is int:
            if type(value) is not int or not -(2**63) <= value < 2**63:
                raise decode_error
            if name in _INT32 and not -(2**31) <= value < 2**31:
                raise decode_error
        elif type(value) is not want:
            raise decode_error
        elif want is str:
            # an unpaired surrogate escape ("\ud800") is U+FFFD too: kept, it could
            # not be encoded again, and /stats would fail for everyone while it lasts
            value = _LONE_SURROGATE.sub("\ufffd", value)  # type: ignore[arg-type]
        fields[name] = value
    return fields


def identify(body: bytes, server: ServerFeatures, remote_ip: str) -> Identity:
    """Validate an IDENTIFY body; raises IdentifyError with nsqd's text."""
    f = _decode(body)

    hb = int(f.get("heartbeat_interval", 0))  # type: ignore[call-overload]
    if hb == -1:
        pass
    elif hb == 0:
        hb = server.heartbeat_interval
    elif not 1000 <= hb <= server.max_heartbeat_interval:
        raise IdentifyError(f"E_BAD_BODY IDENTIFY heartbeat interval ({hb}) is invalid")

    obt = int(f.get("output_buffer_timeout", 0))  # type: ignore[call-overload]
    obs = int(f.get("output_buffer_size", 0))  # type: ignore[call-overload]
    if obt == -1:
        obt = 0
    elif obt == 0:
        obt = server.output_buffer_timeout
    elif not server.min_output_buffer_timeout <= obt <= server.max_output_buffer_timeout:
        raise IdentifyError(f"E_BAD_BODY IDENTIFY output buffer timeout ({obt}) is invalid")
    if obs == -1:
        obs, obt = 1, 0  # nsqd's "no buffer": every delivery fills it
    elif obs == 0:
        obs = server.output_buffer_size
    elif not 64 <= obs <= server.max_output_buffer_size:
        raise IdentifyError(f"E_BAD_BODY IDENTIFY output buffer size ({obs}) is invalid")

    rate = int(f.get("sample_rate", 0))  # type: ignore[call-overload]
    if not 0 <= rate <= 99:
        raise IdentifyError(f"E_BAD_BODY IDENTIFY sample rate ({rate}) is invalid")

    mt = int(f.get("msg_timeout", 0))  # type: ignore[call-overload]
    if mt == 0:
        mt = server.msg_timeout
    elif not 1000 <= mt <= server.max_msg_timeout:
        raise IdentifyError(f"E_BAD_BODY IDENTIFY msg timeout ({mt}) is invalid")

    negotiate = bool(f.get("feature_negotiation", False))
    deflate = negotiate and server.deflate_enabled and bool(f.get("deflate", False))
    # nsqd keeps its default level unless deflate is on, whatever level was asked for
    asked = int(f.get("deflate_level", 0))  # type: ignore[call-overload]
    level = min(asked if deflate and asked > 0 else 6, server.max_deflate_level)
    return Identity(
        client_id=str(f.get("client_id", "")),
        hostname=str(f.get("hostname", "")),
        user_agent=str(f.get("user_agent", "")),
        feature_negotiation=negotiate,
        heartbeat_interval=hb,
        output_buffer_size=obs,
        output_buffer_timeout=obt,
        sample_rate=rate,
        msg_timeout=mt,
        tls_v1=negotiate and server.tls_available and bool(f.get("tls_v1", False)),
        snappy=negotiate and server.snappy_enabled and bool(f.get("snappy", False)),
        deflate=deflate,
        deflate_level=level,
    )


def negotiation_response(identity: Identity, server: ServerFeatures) -> bytes:
    """The JSON reply to a feature-negotiating IDENTIFY, keys in nsqd 1.3.0's order."""
    doc = {
        "max_rdy_count": server.max_rdy_count,
        "version": _VERSION,
        "max_msg_timeout": server.max_msg_timeout,
        "msg_timeout": identity.msg_timeout,
        "tls_v1": identity.tls_v1,
        "deflate": identity.deflate,
        "deflate_level": identity.deflate_level,
        "max_deflate_level": server.max_deflate_level,
        "snappy": identity.snappy,
        "sample_rate": identity.sample_rate,
        "auth_required": server.auth_required,
        "output_buffer_size": identity.output_buffer_size,
        "output_buffer_timeout": identity.output_buffer_timeout,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")  # Go's decoder refuses NaN and Infinity
