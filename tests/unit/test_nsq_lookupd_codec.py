"""The nsqlookupd V1 protocol against a recording of the real servers: the stand-in
lookupd the integration tests use answers what nsqlookupd 1.3.0 answered, byte for byte,
and the gateway's codec sends what nsqd 1.3.0 sent (tests/data/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.protocols.nsq import lookupd_codec as lc
from tests.lookupd_standin import Database, LookupdConnection

RECORDING = json.loads(
    (Path(__file__).parents[1] / "data" / "nsqlookupd_v1_recording.json").read_text()
)


def raw(text: str) -> bytes:
    return text.encode("latin-1")


def standin(peer_id: str = "127.0.0.1:50000", db: Database | None = None) -> LookupdConnection:
    me = RECORDING["lookupd"]
    return LookupdConnection(
        db or Database(),
        peer_id,
        hostname=me["hostname"],
        broadcast_address=me["broadcast_address"],
        tcp_port=me["tcp_port"],
        http_port=me["http_port"],
    )


@pytest.mark.parametrize("case", RECORDING["cases"], ids=lambda c: c["name"])
@pytest.mark.parametrize("split", ["whole", "byte by byte"])
def test_the_standin_answers_what_nsqlookupd_answered(case: dict[str, Any], split: str) -> None:
    conn = standin()
    got = conn.receive_data(raw(case["magic"]))
    for step in case["exchanges"]:
        data = raw(step["send"])
        if split == "whole":
            got += conn.receive_data(data)
        else:
            for i in range(len(data)):
                got += conn.receive_data(data[i : i + 1])
        assert got == raw(step["recv"]), step["send"]
        got = b""
    assert conn.closed == case["closed"]


def _session(conn_no: int) -> list[tuple[str, bytes]]:
    return [(e["from"], raw(e["bytes"])) for e in RECORDING["nsqd_session"] if e["conn"] == conn_no]


@pytest.mark.parametrize("conn_no", [1, 2])
def test_the_standin_answers_nsqd_as_nsqlookupd_did(conn_no: int) -> None:
    conn = standin()
    answer = b""
    expected = b""
    for who, data in _session(conn_no):
        if who == "nsqd":
            answer += conn.receive_data(data)
        else:
            expected += data
    assert answer == expected
    assert not conn.closed


def test_the_codec_sends_what_nsqd_sent() -> None:
    n = RECORDING["nsqd"]
    identity = {
        "broadcast_address": n["broadcast_address"],
        "hostname": n["hostname"],
        "http_port": n["http_port"],
        "tcp_port": n["tcp_port"],
        "version": "1.3.0",
    }
    sent = [data for who, data in _session(1) if who == "nsqd"]
    # the first write is the magic and IDENTIFY together, as nsqd writes them
    assert sent[0] == lc.MAGIC + lc.identify(identity)
    assert sent[1:] == [
        lc.register("orders"),
        lc.register("orders", "billing"),
        lc.unregister("orders", "billing"),
        lc.unregister("orders"),
        lc.register("kept"),
        lc.register("kept", "ch"),
        lc.register("bare"),
        lc.PING,
    ]


def test_responses_split_anywhere_are_the_same() -> None:
    stream = b"".join(data for who, data in _session(1) if who == "lookupd")
    whole = lc.ResponseReader().receive_data(stream)
    assert [r.data for r in whole[1:]] == [b"OK"] * 8
    assert whole[0].identity()["tcp_port"] == RECORDING["lookupd"]["tcp_port"]
    for cut in range(1, len(stream)):
        reader = lc.ResponseReader()
        assert reader.receive_data(stream[:cut]) + reader.receive_data(stream[cut:]) == whole


def test_errors_are_told_apart_and_a_bad_size_is_refused() -> None:
    errors = [raw(c["exchanges"][-1]["recv"]) for c in RECORDING["cases"]]
    for data in errors[2:]:  # every case past the first two ends in an error
        (response,) = lc.ResponseReader().receive_data(data)
        assert response.is_error, data
    assert not lc.Response(b"OK").is_error
    with pytest.raises(lc.LookupdProtocolError):
        lc.ResponseReader(max_size=10).receive_data(b"\x00\x00\x00\x0b")
    with pytest.raises(lc.LookupdProtocolError):
        lc.ResponseReader().receive_data(b"\xff\xff\xff\xff")


def test_the_standin_forgets_a_producer_whose_connection_closed() -> None:
    db = Database()
    a, b = standin("a:1", db), standin("b:2", db)
    for conn in (a, b):
        conn.receive_data(lc.MAGIC + lc.identify(RECORDING["lookupd"] | {"version": "1.3.0"}))
    a.receive_data(lc.register("t", "c"))
    b.receive_data(lc.register("t"))
    assert db.channels("t") == {"c"}
    a.lost()
    assert [p["remote_address"] for p in db.producers("t")] == ["b:2"]
    assert db.registrations[("channel", "t", "c")] == {}
