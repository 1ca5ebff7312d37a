"""The RocketMQ remoting codec alone: golden frames and records from the notes
(docs/protocols/rocketmq-remoting.md), round trips, every error path, fuzzing."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocols.rocketmq.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    RemotingCodec,
    ResponseCode,
    encode_command,
    encode_request,
    encode_response,
    not_supported,
)
from gateway.protocols.rocketmq.events import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    Event,
    ProtocolError,
    Request,
    Response,
    SerializeType,
)
from gateway.protocols.rocketmq.header import ext_bool, ext_text
from gateway.protocols.rocketmq.message import (
    MAGIC_V1,
    BatchEntry,
    MalformedBody,
    StoredMessage,
    decode_batch_body,
    decode_offset_msg_id,
    decode_properties,
    decode_records,
    encode_batch_body,
    encode_properties,
    encode_record,
    ipv4_for_record,
    offset_msg_id,
)


def frame(header: bytes, body: bytes = b"", kind: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), kind << 24 | len(header)) + header + body


def feed(*chunks: bytes, codec: RemotingCodec | None = None) -> list[Event]:
    codec = codec or RemotingCodec()
    out: list[Event] = []
    for chunk in chunks:
        codec.receive_data(chunk)
        out += codec.events()
    return out


def one_error(*chunks: bytes, codec: RemotingCodec | None = None) -> str:
    events = feed(*chunks, codec=codec)
    assert len(events) == 1 and isinstance(events[0], ProtocolError), events
    return events[0].reason


# docs/protocols/rocketmq-remoting.md §1: ali-ons GET_ROUTEINFO_BY_TOPIC, exact bytes
GOLDEN_ROUTE_REQUEST = bytes.fromhex("0000006600000062") + (
    b'{"code":105,"language":"JAVA","opaque":1,"flag":0,"version":121,'
    b'"extFields":{"topic":"TopicTest"}}'
)
GOLDEN_ROUTE_EVENT = Request(
    code=105, opaque=1, flag=0, language="JAVA", version=121, ext_fields={"topic": "TopicTest"}
)

# docs/protocols/rocketmq-remoting.md §7.2: topic T, body hi, TAGS=A, born 127.0.0.1:50000,
# stored at :9876
GOLDEN_RECORD = bytes.fromhex(
    "00000065daa320a758932aac00000000000000000000000000000000000000000000000000000000"
    "0000018bcfe568007f0000010000c3500000018bcfe568017f000001000026940000000000000000"
    "000000000000000268690154000754414753014102"
)
GOLDEN_MESSAGE = StoredMessage(
    topic="T",
    body=b"hi",
    queue_id=0,
    queue_offset=0,
    physical_offset=0,
    born_timestamp=1700000000000,
    born_host="127.0.0.1",
    born_port=50000,
    store_timestamp=1700000000001,
    store_host="127.0.0.1",
    store_port=9876,
    properties="TAGS\x01A\x02",
)


# -- framing --------------------------------------------------------------------------------


def test_golden_route_request() -> None:
    assert feed(GOLDEN_ROUTE_REQUEST) == [GOLDEN_ROUTE_EVENT]


def test_golden_route_request_byte_at_a_time() -> None:
    codec = RemotingCodec()
    out: list[Event] = []
    for i in range(len(GOLDEN_ROUTE_REQUEST)):
        codec.receive_data(GOLDEN_ROUTE_REQUEST[i : i + 1])
        event = codec.next_event()
        if i < len(GOLDEN_ROUTE_REQUEST) - 1:
            assert event is None
        else:
            out.append(event)  # type: ignore[arg-type]
    assert out == [GOLDEN_ROUTE_EVENT]
    assert codec.buffered == 0


def test_every_complete_frame_from_one_receive() -> None:
    second = frame(b'{"code":34,"opaque":2}', b'{"clientID":"x"}')
    events = feed(GOLDEN_ROUTE_REQUEST + second + GOLDEN_ROUTE_REQUEST[:10])
    assert events == [
        GOLDEN_ROUTE_EVENT,
        Request(code=34, opaque=2, body=b'{"clientID":"x"}'),
    ]


def test_split_anywhere_gives_the_same_events() -> None:
    wire = GOLDEN_ROUTE_REQUEST + frame(b'{"code":11,"opaque":9}', b"body") * 2
    whole = feed(wire)
    for cut in range(len(wire) + 1):
        assert feed(wire[:cut], wire[cut:]) == whole


def test_java_send_message_v2_header_from_the_seed() -> None:
    # a Java client's SEND_MESSAGE_V2 (version 79): every ext value a string, \u0001 escapes
    header = (
        b'{"code":310,"extFields":{"f":"0","g":"1482158310125","d":"4","e":"0",'
        b'"b":"TopicTest","c":"TBW102","a":"please_rename_unique_group_name","j":"0",'
        b'"k":"false","h":"0","i":"TAGS\\u0001TagA\\u0002WAIT\\u0001true\\u0002"},'
        b'"flag":0,"language":"JAVA","opaque":206,"version":79}'
    )
    [event] = feed(frame(header, b"Hello RocketMQ"))
    assert isinstance(event, Request) and not event.oneway
    assert (event.code, event.opaque, event.version, event.body) == (
        310,
        206,
        79,
        b"Hello RocketMQ",
    )
    assert event.ext_fields["i"] == "TAGS\x01TagA\x02WAIT\x01true\x02"
    assert decode_properties(event.ext_fields["i"]) == {"TAGS": "TagA", "WAIT": "true"}
    assert ext_bool(event.ext_fields["k"]) is False


def test_empty_body_and_missing_fields_take_java_defaults() -> None:
    [event] = feed(frame(b"{}"))
    assert event == Request(code=0, opaque=0, flag=0, language="JAVA", version=0)


# -- extFields typing (notes 2.2) -----------------------------------------------------------


def test_ali_ons_numbers_and_booleans_become_java_text() -> None:
    header = json.dumps(
        {
            "code": 11,
            "language": "JAVA",
            "opaque": 5,
            "flag": 0,
            "version": 121,
            "extFields": {"queueId": 0, "sysFlag": 6, "k": False, "u": True, "commitOffset": -1},
        }
    ).encode()
    [event] = feed(frame(header))
    assert event.ext_fields == {  # type: ignore[union-attr]
        "queueId": "0",
        "sysFlag": "6",
        "k": "false",
        "u": "true",
        "commitOffset": "-1",
    }


def test_cpp_mixed_types_nulls_and_odd_values() -> None:
    header = (
        b'{"code":11,"language":"CPP","opaque":0,"flag":0,"version":63,"extFields":'
        b'{"queueId":0,"maxMsgNums":32,"queueOffset":"0","subVersion":"1795288591463",'
        b'"unitMode":"0","gone":null,"f":1.5,"e":1e3,"o":{"a":[1,true]}}}'
    )
    [event] = feed(frame(header))
    assert isinstance(event, Request)
    assert event.language == "CPP" and event.opaque == 0
    assert event.ext_fields == {
        "queueId": "0",
        "maxMsgNums": "32",
        "queueOffset": "0",
        "subVersion": "1795288591463",
        "unitMode": "0",
        "f": "1.5",
        "e": "1000",
        "o": '{"a":[1,true]}',
    }
    assert ext_bool(event.ext_fields["unitMode"]) is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("false", False), ("0", False), ("x", False)],
)
def test_ext_bool(text: str, expected: bool) -> None:
    assert ext_bool(text) is expected


def test_ext_bool_default_when_absent() -> None:
    assert ext_bool(None) is False and ext_bool(None, default=True) is True


def test_ext_text_of_scalars() -> None:
    assert [ext_text(v) for v in ("s", 7, -1, True, False, 0.25)] == [
        "s",
        "7",
        "-1",
        "true",
        "false",
        "0.25",
    ]


def test_header_ints_as_decimal_strings_and_language_by_ordinal() -> None:
    [event] = feed(frame(b'{"code":"105","opaque":"-3","flag":"2","language":1}'))
    assert event == Request(code=105, opaque=-3, flag=2, language="CPP")


# -- flag bits ------------------------------------------------------------------------------


def test_response_flag_gives_a_response_event() -> None:
    [event] = feed(frame(b'{"code":0,"opaque":4,"flag":1,"remark":"ok"}', b"x"))
    assert event == Response(code=0, opaque=4, flag=FLAG_RESPONSE, remark="ok", body=b"x")


def test_oneway_flag() -> None:
    [event] = feed(frame(b'{"code":15,"opaque":4,"flag":2}'))
    assert isinstance(event, Request) and event.oneway
    [event] = feed(frame(b'{"code":15,"opaque":4,"flag":0}'))
    assert isinstance(event, Request) and not event.oneway


# -- encoding -------------------------------------------------------------------------------


def test_response_bytes_exact() -> None:
    header = (
        b'{"code":0,"extFields":{"offset":"5","ok":"true"},"flag":1,"language":"JAVA",'
        b'"opaque":7,"version":409}'
    )
    assert encode_response(7, ext_fields={"offset": 5, "ok": True, "none": None}) == frame(header)


def test_response_with_remark_and_body_bytes_exact() -> None:
    header = (
        b'{"code":17,"flag":1,"language":"JAVA","opaque":-2,'
        b'"remark":"No topic route info in name server for the topic: X","version":409}'
    )
    wire = encode_response(
        -2,
        ResponseCode.TOPIC_NOT_EXIST,
        remark="No topic route info in name server for the topic: X",
        body=b"\x00\x01",
    )
    assert wire == frame(header, b"\x00\x01")


def test_empty_ext_fields_are_written_when_given() -> None:
    assert b'"extFields":{}' in encode_response(1, ext_fields={})
    assert b"extFields" not in encode_response(1)


def test_response_round_trip_through_the_codec() -> None:
    wire = encode_response(3, 19, remark="NO_MESSAGE", ext_fields={"nextBeginOffset": 0})
    [event] = feed(wire)
    assert event == Response(
        code=19,
        opaque=3,
        flag=FLAG_RESPONSE,
        language="JAVA",
        version=409,
        remark="NO_MESSAGE",
        ext_fields={"nextBeginOffset": "0"},
    )


def test_oneway_server_request() -> None:
    wire = encode_request(40, 11, ext_fields={"consumerGroup": "G"}, oneway=True)
    [event] = feed(wire)
    assert isinstance(event, Request) and event.oneway and event.flag == FLAG_ONEWAY
    assert event.ext_fields == {"consumerGroup": "G"}


def test_not_supported_echoes_opaque_with_java_remark() -> None:
    request = Request(code=9999, opaque=42)
    [event] = feed(not_supported(request))
    assert event == Response(
        code=3,
        opaque=42,
        flag=1,
        version=409,
        remark=" request type 9999 not supported",
    )


def test_non_ascii_written_as_utf8_and_lone_surrogates_escaped() -> None:
    wire = encode_response(1, remark="ü")
    assert "ü".encode() in wire
    wire = encode_response(1, remark="\ud800")
    assert b"\\ud800" in wire
    [event] = feed(wire)
    # read back as a Java peer would write it again ("?"): a lone surrogate kept in a
    # string could not be encoded later (a pull of such a property failed)
    assert event.remark == "?"  # type: ignore[union-attr]


def test_encode_rejects_what_the_header_cannot_carry() -> None:
    with pytest.raises(ValueError):
        encode_command(1, 1 << 31)
    with pytest.raises(ValueError):
        encode_command(1 << 15, 1, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(ValueError):
        encode_command(1, 1, ext_fields={"k" * 40000: "v"}, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(ValueError):
        encode_command(1, 1, remark="x" * (1 << 24))


# -- the binary ROCKETMQ header (notes 2.3) -------------------------------------------------


def binary_header(
    code: int, language: int, version: int, opaque: int, flag: int, remark: bytes, ext: bytes
) -> bytes:
    return (
        struct.pack(">hbhii", code, language, version, opaque, flag)
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(ext))
        + ext
    )


def ext_entry(key: bytes, value: bytes) -> bytes:
    return struct.pack(">h", len(key)) + key + struct.pack(">i", len(value)) + value


def test_binary_header_decodes() -> None:
    ext = ext_entry(b"topic", b"TopicTest") + ext_entry(b"queueId", b"3")
    header = binary_header(105, 0, 409, 7, 0, b"", ext)
    [event] = feed(frame(header, b"B", kind=1))
    assert event == Request(
        code=105,
        opaque=7,
        language="JAVA",
        version=409,
        ext_fields={"topic": "TopicTest", "queueId": "3"},
        body=b"B",
        serialize_type=SerializeType.ROCKETMQ,
    )


def test_binary_header_bytes_exact_from_the_encoder() -> None:
    header = binary_header(
        0, 0, 409, 7, 1, b"why", ext_entry(b"msgId", b"ID") + ext_entry(b"n", b"1")
    )
    wire = encode_response(
        7, remark="why", ext_fields={"msgId": "ID", "n": 1}, serialize_type=SerializeType.ROCKETMQ
    )
    assert wire == frame(header, kind=1)


def test_binary_header_language_codes_and_trailing_bytes() -> None:
    header = binary_header(10, 13, 1, 2, 0, b"r", b"") + b"ignored"
    [event] = feed(frame(header, kind=1))
    assert isinstance(event, Request)
    assert (event.language, event.remark, event.ext_fields) == ("NODE_JS", "r", {})
    [event] = feed(frame(binary_header(10, 99, 1, 2, 0, b"", b""), kind=1))
    assert event.language == "LANGUAGE_99"  # type: ignore[union-attr]
    wire = encode_command(10, 1, language="LANGUAGE_99", serialize_type=SerializeType.ROCKETMQ)
    assert wire[8 + 2] == 7  # an unknown name goes out as OTHER


@pytest.mark.parametrize(
    "header",
    [
        b"\x00" * 20,  # shorter than the fixed fields and two lengths
        binary_header(1, 0, 0, 0, 0, b"", b"")[:-4] + struct.pack(">i", 1),  # ext past the end
        struct.pack(">hbhii", 1, 0, 0, 0, 0) + struct.pack(">i", 100) + b"\x00" * 4,  # remark
        struct.pack(">hbhii", 1, 0, 0, 0, 0) + struct.pack(">i", -1) + b"\x00" * 4,  # negative
        binary_header(1, 0, 0, 0, 0, b"", b"")[:-4] + struct.pack(">i", -5),  # negative ext
        binary_header(1, 0, 0, 0, 0, b"", b"\x00"),  # key length cut
        binary_header(1, 0, 0, 0, 0, b"", struct.pack(">h", 9) + b"k"),  # key past the ext
        binary_header(1, 0, 0, 0, 0, b"", struct.pack(">h", -1) + b"\x00" * 8),
        binary_header(1, 0, 0, 0, 0, b"", ext_entry(b"k", b"v")[:-1]),  # value past the ext
        binary_header(1, 0, 0, 0, 0, b"", struct.pack(">h", 1) + b"k" + struct.pack(">i", -1)),
    ],
)
def test_bad_binary_headers_close(header: bytes) -> None:
    assert "binary header" in one_error(frame(header, kind=1))


# -- protocol errors: close, as NettyDecoder does ---------------------------------------------


def test_negative_length_closes_at_once() -> None:
    assert "negative frame length" in one_error(b"\xff\xff\xff\xff")


def test_oversize_length_closes_before_the_body_arrives() -> None:
    # Netty counts the length field: 16 MiB - 4 is the largest total length accepted
    codec = RemotingCodec()
    codec.receive_data(struct.pack(">iI", DEFAULT_MAX_FRAME_SIZE - 4, 2))
    assert codec.events() == []
    assert "over the limit" in one_error(struct.pack(">i", DEFAULT_MAX_FRAME_SIZE - 3))


def test_configured_frame_limit() -> None:
    codec = RemotingCodec(max_frame_size=64)
    assert feed(frame(b"{}", b"x" * 54), codec=codec) != []
    assert "over the limit of 64" in one_error(frame(b"{}", b"x" * 55), codec=RemotingCodec(64))


@pytest.mark.parametrize("total", [0, 1, 3])
def test_frame_too_short_for_its_header_word(total: int) -> None:
    assert "no room" in one_error(struct.pack(">i", total))


def test_header_length_beyond_the_frame() -> None:
    assert "beyond the frame" in one_error(struct.pack(">iI", 10, 7))


def test_header_length_over_the_limit() -> None:
    codec = RemotingCodec(max_header_size=8)
    assert "over the limit of 8" in one_error(frame(b'{"code":1}'), codec=codec)
    assert feed(frame(b"{}"), codec=RemotingCodec(max_header_size=8)) != []


def test_unknown_serialize_type() -> None:
    assert "serialize type 2" in one_error(frame(b"{}", kind=2))


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"code":NaN}', "not JSON"),
        (b'{"code":1.5}', "code"),
        (b'{"code":true}', "code"),
        (b'{"code":2147483648}', "code"),
        (b'{"opaque":"12345678901"}', "opaque"),
        (b'{"flag":[]}', "flag"),
        (b'{"version":{}}', "version"),
        (b'{"language":99}', "language"),
        (b'{"language":[]}', "language"),
        (b'{"extFields":[1]}', "extFields"),
        (b'{"extFields":"a"}', "extFields"),
        (b"[" * 100000 + b"]" * 100000, "not JSON"),
        (b'{"code":' + b"9" * 5000 + b"}", "not JSON"),
    ],
)
def test_bad_json_headers_close(header: bytes, reason: str) -> None:
    assert reason in one_error(frame(header))


def test_nothing_after_a_protocol_error() -> None:
    codec = RemotingCodec()
    codec.receive_data(frame(b"nope") + GOLDEN_ROUTE_REQUEST)
    assert isinstance(codec.next_event(), ProtocolError)
    assert codec.failed and codec.next_event() is None
    codec.receive_data(GOLDEN_ROUTE_REQUEST)
    assert codec.events() == [] and codec.buffered == 0


def test_events_stop_at_the_error_after_good_frames() -> None:
    events = feed(GOLDEN_ROUTE_REQUEST + b"\x80\x00\x00\x00" + GOLDEN_ROUTE_REQUEST)
    assert events[0] == GOLDEN_ROUTE_EVENT
    assert isinstance(events[1], ProtocolError) and len(events) == 2


@pytest.mark.parametrize(("frame_size", "header_size"), [(7, 0), (64, -1), (64, 1 << 24)])
def test_limits_are_checked(frame_size: int, header_size: int) -> None:
    with pytest.raises(ValueError):
        RemotingCodec(frame_size, header_size)


# -- stored records and message ids (notes 7) -----------------------------------------------


def test_golden_record_bytes_exact() -> None:
    assert len(GOLDEN_RECORD) == 101
    assert encode_record(GOLDEN_MESSAGE) == GOLDEN_RECORD
    assert decode_records(GOLDEN_RECORD) == [GOLDEN_MESSAGE]


def test_golden_msg_id() -> None:
    # what ali-ons computes from the golden record
    assert GOLDEN_MESSAGE.msg_id == "7F000001000026940000000000000000"
    assert decode_offset_msg_id(GOLDEN_MESSAGE.msg_id) == ("127.0.0.1", 9876, 0)


def test_msg_id_ipv4_and_ipv6() -> None:
    msg_id = offset_msg_id("10.1.2.3", 10911, 0x0102030405060708)
    assert msg_id == "0A010203" + "00002A9F" + "0102030405060708"
    assert len(offset_msg_id("::1", 9876, 5)) == 56
    assert decode_offset_msg_id(offset_msg_id("::1", 9876, 5)) == ("::1", 9876, 5)


@pytest.mark.parametrize("bad", ["", "zz", "00" * 15, "00" * 17])
def test_bad_msg_ids(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_offset_msg_id(bad)


def test_records_concatenate_and_round_trip() -> None:
    second = StoredMessage(
        topic="%RETRY%G",
        body=b"\x00" * 300,
        queue_id=3,
        queue_offset=1 << 40,
        physical_offset=-1,
        born_timestamp=1,
        born_host="192.0.2.2",
        born_port=65535,
        store_timestamp=2,
        store_host="127.0.0.1",
        store_port=9876,
        flag=-5,
        sys_flag=1,
        reconsume_times=16,
        properties=encode_properties({"RETRY_TOPIC": "T", "KEYS": "k1 k2"}),
    )
    body = encode_record(GOLDEN_MESSAGE) + encode_record(second)
    assert decode_records(body) == [GOLDEN_MESSAGE, second]


def test_ipv6_sysflag_bits_are_cleared_in_v1_records() -> None:
    message = StoredMessage(**{**_fields(GOLDEN_MESSAGE), "sys_flag": 0x31})
    [back] = decode_records(encode_record(message))
    assert back.sys_flag == 0x01


def _fields(message: StoredMessage) -> dict[str, object]:
    return {name: getattr(message, name) for name in StoredMessage.__slots__}


def test_record_encoder_refuses_what_v1_cannot_carry() -> None:
    for change in (
        {"topic": "t" * 128},
        {"properties": "p" * 32768},
        {"born_host": "::1"},
        {"store_host": "example.org"},
    ):
        with pytest.raises(ValueError):
            encode_record(StoredMessage(**{**_fields(GOLDEN_MESSAGE), **change}))  # type: ignore[arg-type]


def test_record_decoder_reads_v2_magic() -> None:
    # 5.x: magic ...AB and an int16 topic length; the golden record's body ends at byte 90
    v2 = struct.pack(">i", MAGIC_V1 + 4) + GOLDEN_RECORD[8:90] + b"\x00\x01T" + GOLDEN_RECORD[92:]
    [back] = decode_records(struct.pack(">i", len(v2) + 4) + v2)
    assert back == GOLDEN_MESSAGE


def test_record_decoder_reads_java_ipv6_hosts() -> None:
    # sysFlag bits 4/5: 16-byte born and store hosts, as a Java broker writes them
    born = b"\x00" * 15 + b"\x01" + struct.pack(">i", 50000)
    store = b"\x20\x01\x0d\xb8" + b"\x00" * 11 + b"\x07" + struct.pack(">i", 9876)
    head = struct.pack(">iiiqqiq", 0x58932AAC, 0, 0, 0, 0, 0x30, 1700000000000)
    record = (
        struct.pack(">i", MAGIC_V1)
        + head
        + born
        + struct.pack(">q", 1700000000001)
        + store
        + GOLDEN_RECORD[72:]  # reconsume times onwards
    )
    [back] = decode_records(struct.pack(">i", len(record) + 4) + record)
    assert (back.born_host, back.born_port) == ("::1", 50000)
    assert (back.store_host, back.store_port, back.sys_flag) == ("2001:db8::7", 9876, 0x30)
    assert len(back.msg_id) == 56 and back.body == b"hi" and back.topic == "T"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r[:50],  # truncated
        lambda r: r[:2],
        lambda r: b"\x00\x00\x00\x10" + r[4:],  # size too small
        lambda r: r[:4] + b"\x00\x00\x00\x00" + r[8:],  # magic
        lambda r: r[:8] + b"\x00\x00\x00\x00" + r[12:],  # CRC
        lambda r: struct.pack(">i", 102) + r[4:] + b"\x00",  # size past the fields
        lambda r: r[:84] + struct.pack(">i", 1000) + r[88:],  # body length past the end
    ],
)
def test_bad_records(mutate: object) -> None:
    with pytest.raises(MalformedBody):
        decode_records(mutate(GOLDEN_RECORD))  # type: ignore[operator]


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("::ffff:192.0.2.9", "192.0.2.9"),
        ("::1", "127.0.0.1"),
        ("localhost", "127.0.0.1"),
    ],
)
def test_ipv4_for_record(host: str, expected: str) -> None:
    assert ipv4_for_record(host) == expected


# -- batch bodies (notes 7.6) ---------------------------------------------------------------


def test_batch_body_hand_made() -> None:
    props = b"UNIQ_KEY\x01AB\x02"
    entry = struct.pack(">iiiii", 20 + 3 + 2 + len(props), 0, 0, 7, 3) + b"abc"
    entry += struct.pack(">h", len(props)) + props
    empty = struct.pack(">iiiii", 22, 0, 0, 0, 0) + struct.pack(">h", 0)
    assert decode_batch_body(entry + empty) == [
        BatchEntry(7, b"abc", "UNIQ_KEY\x01AB\x02"),
        BatchEntry(0, b"", ""),
    ]
    assert encode_batch_body([BatchEntry(7, b"abc", "UNIQ_KEY\x01AB\x02")]) == entry


def test_batch_body_empty() -> None:
    assert decode_batch_body(b"") == []


@pytest.mark.parametrize(
    "body",
    [
        b"\x00" * 19,
        struct.pack(">iiiii", 0, 0, 0, 0, 5) + b"abc",
        struct.pack(">iiiii", 0, 0, 0, 0, -1),
        struct.pack(">iiiii", 0, 0, 0, 0, 0) + b"\x00",
        struct.pack(">iiiii", 0, 0, 0, 0, 0) + struct.pack(">h", 4) + b"ab",
        struct.pack(">iiiii", 0, 0, 0, 0, 0) + struct.pack(">h", -2),
    ],
)
def test_bad_batch_bodies(body: bytes) -> None:
    with pytest.raises(MalformedBody) as info:
        decode_batch_body(body)
    assert info.value.code == ResponseCode.MESSAGE_ILLEGAL


def test_batch_encoder_refuses_long_properties() -> None:
    with pytest.raises(ValueError):
        encode_batch_body([BatchEntry(0, b"", "p" * 32768)])


# -- properties (notes 8) -------------------------------------------------------------------


def test_properties_as_clients_send_them() -> None:
    # ali-ons two-argument Message: the literal tag "null"; keys joined by a space
    wire = "TAGS\x01null\x02KEYS\x01k1 k2\x02"
    assert decode_properties(wire) == {"TAGS": "null", "KEYS": "k1 k2"}
    assert encode_properties({"TAGS": "null", "KEYS": "k1 k2"}) == wire


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("A\x01B", {"A": "B"}),  # no trailing separator
        ("A\x01\x02", {}),  # empty value: Java skips it
        ("\x01BC\x02", {}),  # empty name
        ("AB\x02", {}),  # no name separator
        ("\x02\x02A\x01B\x02\x02", {"A": "B"}),  # empty items
        ("A\x01B\x01C\x02", {"A": "B\x01C"}),  # the name ends at the first \x01
        ("A\x01B\x02A\x01C\x02", {"A": "C"}),  # the last one wins
    ],
)
def test_properties_decode_like_java(text: str, expected: dict[str, str]) -> None:
    assert decode_properties(text) == expected


@pytest.mark.parametrize(
    "properties", [{"": "v"}, {"k": ""}, {"a\x01": "v"}, {"a": "v\x02"}, {"a": "\x01"}]
)
def test_properties_that_would_not_survive_are_refused(properties: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        encode_properties(properties)


_prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_prop_text, _prop_text, max_size=6))
def test_properties_round_trip(properties: dict[str, str]) -> None:
    assert decode_properties(encode_properties(properties)) == properties


# -- property tests: round trips and fuzzing ------------------------------------------------

_text = st.text(max_size=20)
_int32 = st.integers(-(1 << 31), (1 << 31) - 1)
_int16 = st.integers(-(1 << 15), (1 << 15) - 1)


@settings(max_examples=150, deadline=None)
@given(
    code=_int16,
    opaque=_int32,
    flag=_int32,
    version=_int16,
    remark=st.none() | st.text(min_size=1, max_size=20),
    ext=st.dictionaries(_text, _text, max_size=5),
    body=st.binary(max_size=50),
    kind=st.sampled_from(SerializeType),
)
def test_command_round_trip(
    code: int,
    opaque: int,
    flag: int,
    version: int,
    remark: str | None,
    ext: dict[str, str],
    body: bytes,
    kind: SerializeType,
) -> None:
    if kind is SerializeType.ROCKETMQ:  # binary headers carry UTF-8 only
        remark = remark and remark.encode("utf-8", "replace").decode()  # type: ignore[assignment]
        ext = {
            k.encode("utf-8", "replace").decode(): v.encode("utf-8", "replace").decode()
            for k, v in ext.items()
        }
    wire = encode_command(
        code,
        opaque,
        flag=flag,
        language="CPP",
        version=version,
        remark=remark,
        ext_fields=ext,
        body=body,
        serialize_type=kind,
    )
    [event] = feed(wire)
    cls = Response if flag & FLAG_RESPONSE else Request
    assert event == cls(code, opaque, flag, "CPP", version, remark, ext, body, kind)


def _only_events_or_one_final_error(events: list[Event]) -> None:
    for i, event in enumerate(events):
        assert isinstance(event, Request | Response | ProtocolError)
        if isinstance(event, ProtocolError):
            assert i == len(events) - 1


def _chunked(wire: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(wire)) for c in cuts})
    return [wire[a:b] for a, b in zip([0, *points], [*points, len(wire)], strict=True)]


_cuts = st.lists(st.integers(0, 600), max_size=8)


@settings(max_examples=300, deadline=None)
@given(wire=st.binary(max_size=600), cuts=_cuts)
def test_fuzz_arbitrary_bytes(wire: bytes, cuts: list[int]) -> None:
    events = feed(*_chunked(wire, cuts), codec=RemotingCodec(max_frame_size=4096))
    _only_events_or_one_final_error(events)
    assert feed(wire, codec=RemotingCodec(max_frame_size=4096)) == events


@st.composite
def _framed_garbage(draw: st.DrawFn) -> bytes:
    """Well-framed frames with arbitrary headers, so the header decoders get fuzzed too."""
    frames = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from([0, 1]))
        if kind == 0 and draw(st.booleans()):
            values = st.recursive(
                st.none() | st.booleans() | st.integers() | st.floats() | _text,
                lambda inner: (
                    st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3)
                ),
                max_leaves=8,
            )
            doc = draw(
                st.dictionaries(
                    st.sampled_from(
                        [
                            "code",
                            "extFields",
                            "flag",
                            "language",
                            "opaque",
                            "remark",
                            "version",
                            "x",
                        ]
                    ),
                    values | _int32,
                    max_size=7,
                )
            )
            header = json.dumps(doc).encode()
        else:
            header = draw(st.binary(max_size=80))
        frames.append(frame(header, draw(st.binary(max_size=10)), kind))
    return b"".join(frames)


@settings(max_examples=300, deadline=None)
@given(wire=_framed_garbage(), cuts=_cuts)
def test_fuzz_framed_headers(wire: bytes, cuts: list[int]) -> None:
    events = feed(*_chunked(wire, cuts))
    _only_events_or_one_final_error(events)
    assert feed(wire) == events
