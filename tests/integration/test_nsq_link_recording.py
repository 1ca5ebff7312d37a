"""The NSQ links' conversation with nsqd, recorded from a real nsqd 1.3.0
(tests/data/nsqd_link_recording.json, made by tests/record_nsqd_link.py) and replayed
against the gateway, the links' stand-in nsqd in the other tests: the same frames, byte
for byte, but for message ids and timestamps (nsqd's own) and the order of IDENTIFY's
JSON keys. The links' own commands are checked against the recorded ones too."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from gateway.links import nsq_client as nc
from gateway.links.nsq_upstream import identify_fields
from tests.helpers import running_gateway
from tests.nsq_link_conversation import IDENTIFY_FIELDS, decode, play

RECORDING = Path(__file__).resolve().parents[1] / "data" / "nsqd_link_recording.json"


def recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDING.read_text())
    assert data["server"].startswith("nsqd v1.3.0")
    for step in data["steps"]:
        step["send"] = decode(step["send"])
        step["reply"] = [decode(frame) for frame in step["reply"]]
        step["frames"] = len(step["reply"])
    return data


def normalized(frame: bytes) -> Any:
    size, kind = struct.unpack_from(">ii", frame)
    if kind == 2:  # message: timestamp (8 bytes) and id (16) are the server's own
        return (size, kind, frame[16:18], frame[34:])
    if frame[8:9] == b"{":  # IDENTIFY's JSON: Go's key order is the struct's
        return (kind, json.loads(frame[8:]))
    return frame


async def test_the_gateway_answers_the_links_as_nsqd_1_3_0_does() -> None:
    steps = recorded()["steps"]
    async with running_gateway() as gw:
        played = await play(gw.addresses["nsq"], steps)
    for want, got in zip(steps, played, strict=True):
        assert [normalized(f) for f in got["reply"]] == [normalized(f) for f in want["reply"]], (
            want["send"][:60]
        )
        assert got.get("closed") == want.get("closed")


def test_the_links_send_what_was_recorded() -> None:
    sends = [step["send"] for step in recorded()["steps"]]
    identify = sends[0].removeprefix(nc.MAGIC_V2)
    assert identify == nc.identify(IDENTIFY_FIELDS)
    assert identify_fields().keys() == IDENTIFY_FIELDS.keys()
    assert identify_fields()["user_agent"] == IDENTIFY_FIELDS["user_agent"]
    assert sends[1] == nc.sub("links", "gw")
    assert sends[2] == nc.rdy(2)
    assert sends[4] == nc.mpub("links", [b"first", b"second"])
    assert sends[6] == nc.fin(b"{msg0}") + nc.req(b"{msg1}", 0)
    assert sends[8] == nc.mpub("links", [b"third"])  # one message: PUB
    assert sends[11] == nc.mpub("bad!topic", [b"x", b"y"])


def test_the_links_read_what_was_recorded() -> None:
    reader = nc.FrameReader()
    frames = [
        f for step in recorded()["steps"] for f in reader.receive_data(b"".join(step["reply"]))
    ]
    kinds = [type(f).__name__ for f in frames]
    assert kinds.count("MessageFrame") == 4 and kinds.count("ErrorFrame") == 2
    features = nc.negotiated(frames[0])  # type: ignore[arg-type]
    assert features["max_rdy_count"] == 2500
    messages = [f for f in frames if isinstance(f, nc.MessageFrame)]
    assert [(m.body, m.attempts) for m in messages] == [
        (b"first", 1), (b"second", 1), (b"second", 2), (b"third", 1)
    ]  # fmt: skip
    errors = [f for f in frames if isinstance(f, nc.ErrorFrame)]
    assert [e.code for e in errors] == ["E_FIN_FAILED", "E_BAD_TOPIC"]
