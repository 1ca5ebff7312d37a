"""The Go behaviours the HTTP API copies: json.Marshal, url.ParseQuery, Duration.String,
and nsqd's /mpub body readers."""

from __future__ import annotations

import pytest

from gateway.http.gocompat import QueryError, go_duration, go_json, parse_query
from gateway.http.nsqd import _binary_bodies, _go_duration_ms, _text_bodies
from gateway.http.router import HTTPError


def test_go_json_is_compact_utf8_and_html_safe() -> None:
    value = {"b": [1, None, True], "a": "<é&>\u2028"}
    assert go_json(value) == '{"b":[1,null,true],"a":"\\u003cé\\u0026\\u003e\\u2028"}'.encode()


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (b"", {}),
        (b"topic=t&topic=u", {"topic": ["t", "u"]}),
        (b"a=1+2&b=%2B%41&c", {"a": ["1 2"], "b": ["+A"], "c": [""]}),
        (b"&&x=&", {"x": [""]}),
        (b"t=caf%C3%A9", {"t": ["café"]}),
    ],
)
def test_parse_query_like_url_parse_query(raw: bytes, parsed: dict[str, list[str]]) -> None:
    assert parse_query(raw) == parsed


@pytest.mark.parametrize("raw", [b"a=%", b"a=%G1", b"a=%4", b"a=1;b=2", b"ok=1&bad=%zz"])
def test_parse_query_errors(raw: bytes) -> None:
    with pytest.raises(QueryError):
        parse_query(raw)


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (800, "800ns"),
        (1_500, "1.5µs"),
        (65_247_297, "65.247297ms"),
        (1_000_000_000, "1s"),
        (60 * 10**9, "1m0s"),
        (3_723_500_000_000, "1h2m3.5s"),
        (3600 * 10**9, "1h0m0s"),
        (-2 * 10**9, "-2s"),
    ],
)
def test_go_duration(ns: int, text: str) -> None:
    assert go_duration(ns) == text


def test_defer_parses_as_go_and_wraps_as_int64() -> None:
    assert _go_duration_ms("+5") == 5_000_000
    assert _go_duration_ms("-1") == -1_000_000
    for bad in ("", " 5", "5 ", "1_000", "0x10", "1.0", "٣", "9223372036854775808"):
        assert _go_duration_ms(bad) is None
    # Duration(ms) * Millisecond overflows silently in Go: a huge value wraps negative
    assert _go_duration_ms("9223372036854775807") == -1_000_000


def test_text_bodies_follow_nsqds_read_loop() -> None:
    assert _text_bodies(b"", 10, 101) == []
    assert _text_bodies(b"\n\n", 10, 101) == []
    assert _text_bodies(b"a\r\nb\n\nc", 10, 101) == [b"a\r", b"b", b"c"]
    with pytest.raises(HTTPError) as too_big:
        _text_bodies(b"x" * 11, 10, 101)
    assert (too_big.value.status, too_big.value.message) == (413, "MSG_TOO_BIG")
    with pytest.raises(HTTPError) as body:
        _text_bodies(b"ab\n" * 33 + b"xy", 10, 101)  # 101 bytes read: one past the limit
    assert body.value.message == "BODY_TOO_BIG"


def test_binary_bodies() -> None:
    def frame(*parts: int | bytes) -> bytes:
        return b"".join(
            p.to_bytes(4, "big", signed=True) if isinstance(p, int) else p for p in parts
        )

    assert _binary_bodies(frame(2, 1, b"a", 2, b"bc"), 10, 100) == [b"a", b"bc"]
    cases = [
        (b"", "BAD_BODY"),
        (frame(0), "BAD_BODY"),
        (frame(20), "BAD_BODY"),  # (100 - 4) // 5 = 19 at most
        (frame(1, 11, b"x" * 11), "BAD_MESSAGE"),
        (frame(1, 0), "BAD_MESSAGE"),
        (frame(2, 1, b"a"), "BAD_MESSAGE"),
        (frame(1, 3, b"ab"), "BAD_MESSAGE"),
    ]
    for data, message in cases:
        with pytest.raises(HTTPError) as error:
            _binary_bodies(data, 10, 100)
        assert (error.value.status, error.value.message) == (413, message)
