"""RocketMQ messages <-> the gateway's model (mapping.py): subscriptions, properties and
headers, inflating bodies, records; and Hypothesis over everything that reads a peer's
bytes: nothing but the format's own error (ValueError / MalformedBody) ever escapes."""

from __future__ import annotations

import contextlib
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.model import Message
from gateway.protocols.rocketmq.codec import encode_response
from gateway.protocols.rocketmq.mapping import (
    BodyTooLarge,
    born_host,
    encode_pulled,
    headers_from_properties,
    inflate,
    parse_subscription,
    properties_text,
    valid_group,
    valid_topic,
)
from gateway.protocols.rocketmq.message import (
    MalformedBody,
    decode_batch_body,
    decode_properties,
    decode_records,
)
from gateway.protocols.rocketmq.produce import _FRAME_PREFIX, _SEND_OK_JSON


@pytest.mark.parametrize(
    ("expression", "tags"),
    [
        ("*", None),
        ("", None),
        (None, None),
        ("TagA", {"TagA"}),
        ("TagA || TagB", {"TagA", "TagB"}),
        (" TagA||TagB ||", {"TagA", "TagB"}),
        ("TagA || *", None),
    ],
)
def test_subscriptions(expression: str | None, tags: set[str] | None) -> None:
    sub = parse_subscription(expression)
    assert sub.tags == (None if tags is None else frozenset(tags))


def test_untagged_messages_match_only_everything() -> None:
    assert parse_subscription("*").matches(None)
    assert not parse_subscription("TagA").matches(None)
    assert parse_subscription("TagA || TagB").matches("TagB")


def test_names() -> None:
    assert valid_topic("%RETRY%GID_x") and valid_topic("a|b-c_d")
    assert not valid_topic("a.b") and not valid_topic("") and not valid_topic("x" * 128)
    assert valid_group("G" * 255) and not valid_group("G" * 256)


def test_properties_become_headers_without_broker_instructions() -> None:
    text = "TAGS\x01A\x02WAIT\x01true\x02KEYS\x01k1 k2\x02color\x01red\x02"
    assert headers_from_properties(text) == [("TAGS", "A"), ("KEYS", "k1 k2"), ("color", "red")]


def test_headers_the_format_cannot_carry_are_left_out() -> None:
    headers = [("ok", "1"), ("", "x"), ("bad\x01", "v"), ("v", "has\x02sep"), ("ok", "2")]
    assert properties_text(headers) == "ok\x012\x02"
    # past the int16 length: cut at a whole entry
    many = [(f"name{i}", "v" * 100) for i in range(1000)]
    text = properties_text(many)
    assert len(text.encode()) <= 32767 and text.endswith("\x02")


def test_inflate_limits_and_errors() -> None:
    assert inflate(zlib.compress(b"x" * 100), 100) == b"x" * 100
    with pytest.raises(BodyTooLarge):
        inflate(zlib.compress(b"x" * 101), 100)
    with pytest.raises(ValueError, match="not a zlib stream"):
        inflate(b"plain", 100)
    with pytest.raises(ValueError, match="truncated"):
        inflate(zlib.compress(b"x" * 100)[:-3], 100)


def test_born_host_from_the_origin() -> None:
    msg = Message(1, "T", b"", 0, origin="nsq 10.1.2.3:4150")
    assert born_host(msg, ("127.0.0.1", 9876)) == ("10.1.2.3", 4150)
    msg.origin = "nats [::1]:5000"
    assert born_host(msg, ("127.0.0.1", 9876)) == ("127.0.0.1", 5000)  # v1 records: IPv4
    msg.origin = ""
    assert born_host(msg, ("127.0.0.1", 9876)) == ("127.0.0.1", 9876)


def test_a_message_from_another_protocol_as_a_record() -> None:
    msg = Message(
        42,
        "orders",
        b"\x00body",
        1_700_000_000_123_000_000,
        headers=[("TAGS", "A"), ("RECONSUME_TIME", "2"), ("trace", "x\x01y")],
        origin="beanstalk 127.0.0.1:5555",
    )
    [record] = decode_records(encode_pulled(msg, "orders", 3, 17, ("127.0.0.1", 9876)))
    assert (record.topic, record.body, record.queue_id, record.queue_offset) == (
        "orders",
        b"\x00body",
        3,
        17,
    )
    assert record.physical_offset == 42 and record.reconsume_times == 2
    assert record.born_timestamp == 1_700_000_000_123 and record.born_port == 5555
    assert decode_properties(record.properties) == {"TAGS": "A", "RECONSUME_TIME": "2"}
    assert record.msg_id == "7F00000100002694000000000000002A"


# -- Hypothesis: a peer's bytes never raise anything but the format's own error -------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 10_000))
def test_fuzz_inflate(data: bytes, limit: int) -> None:
    try:
        out = inflate(data, limit)
    except ValueError:
        return
    assert len(out) <= limit


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_batch_bodies(data: bytes) -> None:
    with contextlib.suppress(MalformedBody):
        decode_batch_body(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_records(data: bytes) -> None:
    with contextlib.suppress(MalformedBody):
        decode_records(data)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_properties_and_subscriptions(text: str) -> None:
    headers = headers_from_properties(text)
    # what came in as properties goes out as the same properties, but for a value holding
    # \x01 (Java reads "a\x01b\x01c" as a = "b\x01c", other clients split it), left out
    carried = {name: value for name, value in headers if "\x01" not in value}
    assert decode_properties(properties_text(headers)) == carried
    sub = parse_subscription(text)
    assert sub.tags is None or all(t and t == t.strip() for t in sub.tags)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.text("0123456789ABCDEF", min_size=32, max_size=32), min_size=1, max_size=3),
    st.integers(0, 1023),
    st.integers(0, 2**62),
    st.integers(-(2**31), 2**31 - 1),
)
def test_the_send_answer_template_is_what_the_encoder_writes(
    ids: list[str], queue_id: int, offset: int, opaque: int
) -> None:
    """produce.py formats SEND_OK answers directly; they must be the encoder's bytes."""
    header = _SEND_OK_JSON.format(",".join(ids), queue_id, offset, opaque).encode()
    fast = _FRAME_PREFIX.pack(4 + len(header), len(header)) + header
    ext = {
        "msgId": ",".join(ids),
        "queueId": queue_id,
        "queueOffset": offset,
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
    }
    assert fast == encode_response(opaque, ext_fields=ext)
