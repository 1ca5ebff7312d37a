"""The NSQ conversation the links (gateway/links/) have with nsqd, as steps both the
recorder (tests/record_nsqd_link.py, against a real nsqd) and the replay test
(tests/integration/test_nsq_link_recording.py, against the gateway) play.

Two connections: `consumer` speaks as nsq_import does (IDENTIFY, SUB, RDY, FIN, REQ), and
`producer` as nsq_export does (IDENTIFY, MPUB, PUB); an MPUB to a topic nsqd cannot name
ends it with E_BAD_TOPIC. A step sends its bytes (`{msgN}` stands for the id of the N-th
message received so far), then reads `frames` whole frames and, with `closed`, checks
the server closed the connection next.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import trio

MAGIC = b"  V2"
# the link's IDENTIFY (gateway/links/nsq_upstream.py identify_fields), with a fixed host
IDENTIFY_FIELDS = {
    "client_id": "recorder",
    "hostname": "recorder.example",
    "user_agent": "gateway-link/0.1.0",
    "feature_negotiation": True,
}


def _identify() -> bytes:
    body = json.dumps(IDENTIFY_FIELDS, separators=(",", ":")).encode()
    return MAGIC + b"IDENTIFY\n" + struct.pack(">I", len(body)) + body


def _mpub(topic: bytes, bodies: list[bytes]) -> bytes:
    payload = struct.pack(">I", len(bodies))
    payload += b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    return b"MPUB " + topic + b"\n" + struct.pack(">I", len(payload)) + payload


def _pub(topic: bytes, body: bytes) -> bytes:
    return b"PUB " + topic + b"\n" + struct.pack(">I", len(body)) + body


STEPS: list[dict[str, Any]] = [
    {"conn": "consumer", "send": _identify(), "frames": 1},
    {"conn": "consumer", "send": b"SUB links gw\n", "frames": 1},
    {"conn": "consumer", "send": b"RDY 2\n", "frames": 0},
    {"conn": "producer", "send": _identify(), "frames": 1},
    {"conn": "producer", "send": _mpub(b"links", [b"first", b"second"]), "frames": 1},
    {"conn": "consumer", "send": b"", "frames": 2},
    {"conn": "consumer", "send": b"FIN {msg0}\nREQ {msg1} 0\n", "frames": 1},
    {"conn": "consumer", "send": b"FIN {msg2}\n", "frames": 0},
    {"conn": "producer", "send": _pub(b"links", b"third"), "frames": 1},
    {"conn": "consumer", "send": b"", "frames": 1},
    {"conn": "consumer", "send": b"FIN {msg3}\nFIN 0000000000000000\n", "frames": 1},
    {"conn": "producer", "send": _mpub(b"bad!topic", [b"x", b"y"]), "frames": 1, "closed": True},
]


def encode(data: bytes) -> str:
    """Bytes as a JSON string (one code point per byte)."""
    return data.decode("latin-1")


def decode(text: str) -> bytes:
    return text.encode("latin-1")


class Conn:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def frame(self, timeout: float) -> bytes:
        """One whole frame, size and type included."""
        with trio.fail_after(timeout):
            while True:
                if len(self.buf) >= 4:
                    size = struct.unpack_from(">i", self.buf)[0]
                    if len(self.buf) >= 4 + size:
                        frame = bytes(self.buf[: 4 + size])
                        del self.buf[: 4 + size]
                        return frame
                chunk = await self.stream.receive_some(65536)
                if not chunk:
                    raise EOFError("closed by the server")
                self.buf += chunk

    async def closed(self, timeout: float) -> bool:
        with trio.fail_after(timeout):
            try:
                return not await self.stream.receive_some(65536) and not self.buf
            except trio.BrokenResourceError:
                return True


async def play(address: tuple[str, int], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Play `steps` against the nsqd at `address`; each step with what it got back."""
    conns: dict[str, Conn] = {}
    ids: list[bytes] = []
    out = []
    try:
        for step in steps:
            conn = conns.get(step["conn"])
            if conn is None:
                conn = conns[step["conn"]] = Conn(await trio.open_tcp_stream(*address))
            send = step["send"]
            for n, msg_id in enumerate(ids):
                send = send.replace(b"{msg%d}" % n, msg_id)
            if send:
                await conn.stream.send_all(send)
            frames = []
            for _ in range(step["frames"]):
                frame = await conn.frame(10.0)
                if struct.unpack_from(">i", frame, 4)[0] == 2:  # a message: keep its id
                    ids.append(frame[18:34])
                frames.append(frame)
            done = {**step, "reply": frames}
            if step.get("closed"):
                done["closed"] = await conn.closed(10.0)
            out.append(done)
    finally:
        for conn in conns.values():
            await conn.stream.aclose()
    return out
