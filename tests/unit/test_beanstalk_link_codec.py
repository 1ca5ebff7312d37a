"""The beanstalkd client codec alone (gateway/links/beanstalk_client.py): commands out,
replies in, split anywhere; the YAML of the stats commands, as 1.12 and 1.13 write it."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.links.beanstalk_codec import (
    ProtocolError,
    Reply,
    ReplyReader,
    command,
    put,
    yaml_dict,
    yaml_list,
)

STREAM = (
    b"INSERTED 12\r\n"
    b"RESERVED 3 5\r\nhe\r\no\r\n"  # a body may hold CRLF: its length says where it ends
    b"TIMED_OUT\r\n"
    b"FOUND 4 0\r\n\r\n"
    b'OK 23\r\n---\n- default\n- "jobs"\n\r\n'
    b"NOT_FOUND\r\n"
)
REPLIES = [
    Reply("INSERTED", ("12",)),
    Reply("RESERVED", ("3", "5"), b"he\r\no"),
    Reply("TIMED_OUT"),
    Reply("FOUND", ("4", "0"), b""),
    Reply("OK", ("23",), b'---\n- default\n- "jobs"\n'),
    Reply("NOT_FOUND"),
]


def read_all(reader: ReplyReader) -> list[Reply]:
    out = []
    while (reply := reader.next_reply()) is not None:
        out.append(reply)
    return out


def test_commands() -> None:
    assert command("reserve-with-timeout", 0) == b"reserve-with-timeout 0\r\n"
    assert command("release", 5, 1024, 1) == b"release 5 1024 1\r\n"
    assert command("list-tubes") == b"list-tubes\r\n"
    assert put(10, 0, 60, b"a\r\nb") == b"put 10 0 60 4\r\na\r\nb\r\n"


def test_replies_in_one_piece() -> None:
    reader = ReplyReader()
    reader.receive_data(STREAM)
    assert read_all(reader) == REPLIES
    assert REPLIES[1].id == 3 and str(REPLIES[0]) == "INSERTED 12"


@given(st.lists(st.integers(0, len(STREAM)), max_size=8))
def test_replies_split_anywhere(cuts: list[int]) -> None:
    reader = ReplyReader()
    got: list[Reply] = []
    points = [0, *sorted(cuts), len(STREAM)]
    for a, b in itertools.pairwise(points):
        reader.receive_data(STREAM[a:b])
        got += read_all(reader)
    assert got == REPLIES


@pytest.mark.parametrize(
    "data",
    [
        b"RESERVED 1\r\n",  # no length
        b"OK x\r\n",
        b"FOUND 1 2\r\nabcd",  # the data is not followed by CRLF
        b"\xff\xfe\r\n",
        b"x" * 2000,  # no line end in sight
    ],
)
def test_garbage_is_a_protocol_error(data: bytes) -> None:
    reader = ReplyReader()
    reader.receive_data(data)
    with pytest.raises(ProtocolError):
        read_all(reader)


def test_a_reply_without_an_id() -> None:
    with pytest.raises(ProtocolError):
        _ = Reply("INSERTED").id


def test_yaml_of_1_12_and_1_13() -> None:
    v112 = b"---\nid: 3\ntube: jobs\nstate: delayed\npri: 10\ntime-left: 99\n"
    v113 = b'---\nid: 3\ntube: "jobs"\nstate: "delayed"\npri: 10\ntime-left: 99\n'
    want = {"id": "3", "tube": "jobs", "state": "delayed", "pri": "10", "time-left": "99"}
    assert yaml_dict(v112) == yaml_dict(v113) == want
    assert yaml_list(b'---\n- default\n- "a+b"\n') == ["default", "a+b"]
