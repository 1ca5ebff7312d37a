"""The nsqlookupd TCP protocol (V1), the side nsqd speaks: sans-IO, bytes in and out.

nsqd registers with each nsqlookupd over one TCP connection (nsqd/lookup.go,
nsqd/lookup_peer.go; the server is nsqlookupd/lookup_protocol_v1.go, all at v1.3.0):

* the 4-byte magic `"  V1"`, then commands, each one line ended by `\\n`;
* `IDENTIFY\\n` + a 4-byte big-endian size + a JSON body naming the nsqd: where clients
  reach it (`broadcast_address`, `tcp_port`, `http_port`), its `version` and `hostname`;
* `REGISTER topic [channel]\\n`, `UNREGISTER topic [channel]\\n`, `PING\\n`.

Every command gets exactly one response: a 4-byte big-endian size and that many bytes,
with no frame type (unlike nsqd's V2 frames): `OK`, the lookupd's own JSON for IDENTIFY,
or an error text (`E_INVALID client must IDENTIFY`, `E_BAD_TOPIC ...`). Every error is
fatal: nsqlookupd closes the connection after sending it. tests/data holds a recording of
both directions against the real servers, which the unit tests compare these bytes with.

No socket, no clock, no Trio here (gateway/protocols/nsq/lookupd.py runs the connection).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

MAGIC: Final = b"  V1"
PING: Final = b"PING\n"

# nsqd reads a response of at most its --max-body-size (5 MiB by default) and drops the
# connection past it (readResponseBounded); the largest real one is IDENTIFY's JSON.
MAX_RESPONSE_SIZE: Final = 5 * 1024 * 1024

_SIZE = struct.Struct(">i")


class LookupdProtocolError(Exception):
    """The lookupd sent what no nsqlookupd sends (a negative or oversize response)."""


@dataclass(frozen=True, slots=True)
class Response:
    """One response: `OK`, IDENTIFY's JSON, or an error the lookupd closes after."""

    data: bytes

    @property
    def is_error(self) -> bool:
        # nsqlookupd's error codes all start E_ (protocol.FatalClientErr's Code)
        return self.data.startswith(b"E_")

    def identity(self) -> dict[str, Any]:
        """IDENTIFY's answer: the lookupd's own address, ports, version and hostname.
        nsqd only logs it; an answer that is no JSON object gives {}."""
        try:
            doc = json.loads(self.data)
        except ValueError:
            return {}
        return doc if isinstance(doc, dict) else {}


def identify(info: Mapping[str, Any]) -> bytes:
    """IDENTIFY with nsqd's body: Go marshals a map with its keys sorted and no spaces,
    so the same fields give the same bytes as nsqd sends."""
    body = json.dumps(dict(info), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    encoded = body.encode("utf-8")
    return b"IDENTIFY\n" + _SIZE.pack(len(encoded)) + encoded


def register(topic: str, channel: str | None = None) -> bytes:
    """REGISTER a topic, or a channel of it (which registers the topic too)."""
    return _command(b"REGISTER", topic, channel)


def unregister(topic: str, channel: str | None = None) -> bytes:
    """UNREGISTER a channel; without one, the topic and every channel of it from this
    nsqd (nsqlookupd logs a warning for channels still registered then)."""
    return _command(b"UNREGISTER", topic, channel)


def _command(name: bytes, topic: str, channel: str | None) -> bytes:
    words = [name, topic.encode("utf-8")]
    if channel:
        words.append(channel.encode("utf-8"))
    return b" ".join(words) + b"\n"


class ResponseReader:
    """Splits the lookupd's byte stream into responses, wherever TCP cut it."""

    def __init__(self, max_size: int = MAX_RESPONSE_SIZE) -> None:
        self._buf = bytearray()
        self._max_size = max_size

    def receive_data(self, data: bytes) -> list[Response]:
        """The responses `data` completes (none while one is still partial); raises
        LookupdProtocolError for a size no nsqlookupd sends."""
        buf = self._buf
        buf += data
        out: list[Response] = []
        while len(buf) >= 4:
            (size,) = _SIZE.unpack_from(buf)
            if size < 0 or size > self._max_size:
                raise LookupdProtocolError(
                    f"response body size ({size}) is greater than limit ({self._max_size})"
                )
            if len(buf) < 4 + size:
                break
            out.append(Response(bytes(buf[4 : 4 + size])))
            del buf[: 4 + size]
        return out
