"""NSQ AUTH: reply parsing, permission checks and the auth HTTP client (against a stub server)."""

from __future__ import annotations

import json
import random
import socket
import ssl
from typing import Any

import pytest
import trio
import trustme
from hypothesis import given
from hypothesis import strategies as st

from gateway.protocols.nsq.auth import (
    AuthClient,
    AuthFailed,
    AuthState,
    parse_auth_response,
)
from tests.auth_stub import Request, Responder, start_stub

NOW = 1000.0


def reply(**fields: Any) -> bytes:
    document: dict[str, Any] = {
        "ttl": 60,
        "identity": "alice",
        "identity_url": "http://x/alice",
        "authorizations": [
            {"topic": "^allowed$", "channels": [".*"], "permissions": ["subscribe", "publish"]},
            {"topic": "pubonly", "channels": ["^c1$"], "permissions": ["publish"]},
        ],
    }
    document.update(fields)
    return json.dumps(document).encode()


def grant(topic: str, channels: list[str], permissions: list[str]) -> AuthState:
    authorizations = [{"topic": topic, "channels": channels, "permissions": permissions}]
    return parse_auth_response(reply(authorizations=authorizations), NOW)


# -- parse_auth_response ------------------------------------------------------------------------


def test_parse_good_reply() -> None:
    state = parse_auth_response(reply(), NOW)
    assert state.identity == "alice"
    assert state.identity_url == "http://x/alice"
    assert state.ttl == 60.0
    assert state.expires_at == NOW + 60
    assert len(state.authorizations) == 2
    first = state.authorizations[0]
    assert first.topic.pattern == "^allowed$"
    assert [c.pattern for c in first.channels] == [".*"]
    assert first.permissions == frozenset({"subscribe", "publish"})


def test_parse_minimal_reply_has_empty_fields() -> None:
    # nsqd accepts a reply with only a ttl; the session then says "no authorizations found".
    state = parse_auth_response(b'{"ttl": 5}', NOW)
    assert (state.identity, state.identity_url, state.authorizations) == ("", "", ())


def test_parse_empty_authorizations_is_not_a_failure() -> None:
    assert parse_auth_response(reply(authorizations=[]), NOW).authorizations == ()
    assert parse_auth_response(reply(authorizations=None), NOW).authorizations == ()


@pytest.mark.parametrize(
    "body",
    [
        reply(ttl=0),
        reply(ttl=-5),
        reply(ttl=None),  # null leaves the zero value
        b'{"identity": "alice", "authorizations": []}',  # ttl missing
        b"{}",
        reply(ttl=2.5),
        b'{"ttl": 5.0}',  # Go cannot put 5.0 into an int
        b'{"ttl": 5e0}',
        reply(ttl="60"),
        reply(ttl=True),
        reply(ttl=2**63),  # out of int64 range
        b'{"ttl": ' + b"9" * 5000 + b"}",
    ],
)
def test_parse_bad_ttl(body: bytes) -> None:
    with pytest.raises(AuthFailed):
        parse_auth_response(body, NOW)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b'{"ttl": 60',
        b'{"ttl": 60} x',
        b'{"ttl": NaN}',
        b'{"ttl": 60, "x": Infinity}',
        b"\xef\xbb\xbf" + reply(),  # Go rejects a byte order mark
        b"[]",
        b"null",
        b'"text"',
        b"[" * 100_000,
    ],
)
def test_parse_bad_json(body: bytes) -> None:
    with pytest.raises(AuthFailed):
        parse_auth_response(body, NOW)


@pytest.mark.parametrize(
    "authorizations",
    [
        [{"topic": "t", "channels": [".*"], "permissions": ["read"]}],
        [{"topic": "t", "channels": [".*"], "permissions": ["Publish"]}],
        [{"topic": "t", "channels": [".*"], "permissions": ["publish", ""]}],
        [{"topic": "t", "channels": [".*"], "permissions": [None]}],  # null string -> ""
        [{"topic": "(", "channels": [".*"], "permissions": ["publish"]}],
        [{"topic": "t", "channels": ["[a-"], "permissions": ["publish"]}],
        [{"topic": "t", "channels": "c", "permissions": ["publish"]}],
        [{"topic": 5, "channels": [".*"], "permissions": ["publish"]}],
        [{"topic": "t", "channels": [5], "permissions": ["publish"]}],
        ["t"],
        {"topic": "t"},
    ],
)
def test_parse_bad_authorizations(authorizations: Any) -> None:
    with pytest.raises(AuthFailed):
        parse_auth_response(reply(authorizations=authorizations), NOW)


@pytest.mark.parametrize(
    ("key", "value"),
    [("identity", 5), ("identity", True), ("identity_url", ["x"]), ("identity_url", {})],
)
def test_parse_wrong_types_fail(key: str, value: Any) -> None:
    with pytest.raises(AuthFailed):
        parse_auth_response(reply(**{key: value}), NOW)


def test_parse_keys_match_case_insensitively_like_go() -> None:
    body = b'{"TTL": 7, "Identity": "bob", "IDENTITY_URL": "u", "Authorizations": [{"Topic":'
    body += b' "t", "CHANNELS": [".*"], "Permissions": ["publish"]}]}'
    state = parse_auth_response(body, NOW)
    assert (state.ttl, state.identity, state.identity_url) == (7.0, "bob", "u")
    assert state.is_allowed("t", "", "publish")
    # Go's simple folding also maps the long s to "s" (and the Kelvin sign to "k").
    body = '{"ttl": 1, "authorizations": [{"topic": "t", "channels": [""], '
    body += '"permi\u017f\u017fions": ["publish"]}]}'
    assert parse_auth_response(body.encode(), NOW).is_allowed("t", "", "publish")


def test_parse_nulls_keep_zero_values() -> None:
    state = parse_auth_response(reply(identity=None, identity_url=None), NOW)
    assert (state.identity, state.identity_url) == ("", "")
    state = parse_auth_response(reply(authorizations=[None]), NOW)
    assert len(state.authorizations) == 1  # counts in permission_count, grants nothing
    assert not state.is_allowed("t", "", "publish")


def test_parse_duplicate_keys_last_wins_but_all_are_checked() -> None:
    assert parse_auth_response(b'{"ttl": 0, "ttl": 9}', NOW).ttl == 9.0
    assert parse_auth_response(b'{"ttl": 9, "ttl": null}', NOW).ttl == 9.0
    with pytest.raises(AuthFailed):
        parse_auth_response(b'{"ttl": "x", "ttl": 9}', NOW)


@pytest.mark.parametrize(
    ("expires", "ok"),
    [
        (None, True),
        ("2024-01-02T03:04:05Z", True),
        ("2024-02-29T23:59:59.123456789+05:30", True),
        ("2024-01-02T3:04:05-01:00", True),  # Go 1.19 accepts a one-digit hour
        (1700000000, False),
        ("tomorrow", False),
        ("2023-02-29T00:00:00Z", False),
        ("2024-01-02 03:04:05Z", False),
        ("2024-01-02T24:00:00Z", False),
        ({}, False),
    ],
)
def test_parse_expires_key_must_be_a_go_time(expires: Any, ok: bool) -> None:
    # nsqd's State has an untagged Expires time.Time field, so "expires" is decoded into it.
    body = reply(expires=expires)
    if ok:
        assert parse_auth_response(body, NOW).ttl == 60.0
    else:
        with pytest.raises(AuthFailed):
            parse_auth_response(body, NOW)


def test_parse_invalid_utf8_and_lone_surrogates_become_replacement_chars() -> None:
    body = b'{"ttl": 1, "identity": "a\xff\xe2\x82b", "identity_url": "\\ud800x"}'
    state = parse_auth_response(body, NOW)
    assert state.identity == "a\ufffd\ufffd\ufffdb"  # one per bad byte, as in Go
    assert state.identity_url == "\ufffdx"


def test_parse_huge_ttl_wraps_like_go_duration() -> None:
    assert not parse_auth_response(reply(ttl=9_000_000_000), NOW).is_expired(NOW + 1e9)
    # 10**10 s overflows int64 nanoseconds: nsqd's state is expired at once.
    assert parse_auth_response(reply(ttl=10**10), NOW).is_expired(NOW)


# -- Go regexp syntax ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "regex",
    [
        "(?=a)",
        "(?!a)",
        "(?<=a)b",
        "(?<!a)b",
        "(?>a)",
        "(?#comment)a",
        "(a)\\1",
        "(?P<n>a)(?P=n)",
        "(a)(?(1)b)",
        "a*+",
        "a{2}+",
        "a\\Z",
        "\\u0041",
        "(?x)a",
        "(?a)a",
        "a{1001}",
        "[\\b]",
        "[[:nope:]]",
        "[[:^alpha:]]",
        "\\pL",  # valid RE2 that Python cannot express: a known false failure
    ],
)
def test_regex_rejected(regex: str) -> None:
    with pytest.raises(AuthFailed):
        grant(regex, [".*"], ["publish"])


@pytest.mark.parametrize(
    ("regex", "topic", "allowed"),
    [
        ("allowed", "xallowedx", True),
        ("^allowed$", "allowed", True),
        ("^allowed$", "allowedx", False),
        ("", "anything", True),
        ("^a.z\\z", "abz", True),  # RE2's \z is end of text
        ("^[[:digit:]]+$", "123", True),
        ("^[[:digit:]_]+$", "1_2", True),
        ("^[[:digit:]]+$", "12a", False),
        ("^a{,2}$", "a{,2}", True),  # RE2 reads {,2} literally, Python would repeat
        ("^a{,2}$", "aa", False),
        ("^a{01}$", "a", False),
        ("^a{2}$", "aa", True),
        ("^a{1000}", "a" * 1000, True),
        ("(?U)^a+$", "aaa", True),  # ungreedy flag: dropped, it cannot change a search
        ("(?i)^ABC$", "abc", True),
        ("(?i:A)(?s-U:b)", "ab", True),
        ("^\\d+$", "\u0661", False),  # \d is ASCII-only in RE2
        ("^\\101$", "A", True),  # three-digit octal escape
        ("[]a]", "]", True),
        ("^[[]$", "[", True),
    ],
)
def test_regex_semantics(regex: str, topic: str, allowed: bool) -> None:
    state = grant(regex, [".*"], ["publish"])
    assert state.is_allowed(topic, "", "publish") is allowed


# -- AuthState ----------------------------------------------------------------------------------


def test_is_allowed_topic_is_unanchored() -> None:
    state = grant("allowed", [".*"], ["subscribe"])
    assert state.is_allowed("xallowedx", "c", "subscribe")
    assert not state.is_allowed("xallowex", "c", "subscribe")


def test_is_allowed_channel_is_unanchored_and_one_must_match() -> None:
    state = grant("t", ["^a$", "bb"], ["subscribe"])
    assert state.is_allowed("t", "a", "subscribe")
    assert state.is_allowed("t", "xbbx", "subscribe")
    assert not state.is_allowed("t", "ab", "subscribe")


def test_is_allowed_publish_tests_the_empty_channel() -> None:
    assert not grant("^t$", ["^c1$"], ["publish"]).is_allowed("t", "", "publish")
    assert grant("^t$", [".*"], ["publish"]).is_allowed("t", "", "publish")
    assert not grant("^t$", [], ["publish"]).is_allowed("t", "", "publish")


def test_is_allowed_needs_the_permission() -> None:
    state = parse_auth_response(reply(), NOW)
    assert state.is_allowed("pubonly_t", "", "publish") is False  # channel ^c1$ never matches ""
    assert state.is_allowed("pubonly_t", "c1", "subscribe") is False  # publish-only grant
    assert state.is_allowed("allowed", "c1", "subscribe")
    assert state.is_allowed("allowed", "", "publish")
    assert not state.is_allowed("allowed", "c1", "admin")
    assert not grant("t", [".*"], []).is_allowed("t", "c", "subscribe")


def test_response_json_exact_bytes() -> None:
    expected = b'{"identity":"alice","identity_url":"http://x/alice","permission_count":2}'
    assert parse_auth_response(reply(), NOW).response_json() == expected
    empty = parse_auth_response(b'{"ttl": 1}', NOW).response_json()
    assert empty == b'{"identity":"","identity_url":"","permission_count":0}'


def test_response_json_escapes_like_go() -> None:
    state = AuthState(
        identity='<a&b>"\\\n\t\b\x7f\u2028é\U0001f600\udcff',
        identity_url="",
        authorizations=(),
        ttl=1.0,
        expires_at=0.0,
    )
    expected = (
        '{"identity":"\\u003ca\\u0026b\\u003e\\"\\\\\\n\\t\\u0008\x7f\\u2028é\U0001f600\\ufffd",'
        '"identity_url":"","permission_count":0}'
    ).encode()
    assert state.response_json() == expected


@given(st.text(alphabet=st.characters(exclude_categories=("Cs",))), st.text())
def test_response_json_round_trips(identity: str, identity_url: str) -> None:
    state = AuthState(identity, identity_url, (), 1.0, 0.0)
    decoded = json.loads(state.response_json())
    assert decoded["identity"] == identity
    assert decoded["identity_url"] == identity_url.encode("utf-16", "surrogatepass").decode(
        "utf-16", "replace"
    )
    # Go escapes HTML-sensitive characters and the JavaScript line separators.
    assert not set(state.response_json().decode()) & {"<", ">", "&", "\u2028", "\u2029"}


def test_is_expired_after_ttl() -> None:
    state = parse_auth_response(reply(ttl=10), NOW)
    assert not state.is_expired(NOW)
    assert not state.is_expired(NOW + 10)  # Go: Expires.Before(now), strict
    assert state.is_expired(NOW + 10.001)


# -- AuthClient against a stub auth server ------------------------------------------------------


def answer(status: int = 200, body: bytes | None = None) -> Responder:
    content = reply() if body is None else body
    return lambda _request: (status, {}, content)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FixedStart(random.Random):
    """Makes AuthClient start at a chosen address instead of a random one."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def randrange(self, *_args: Any, **_kwargs: Any) -> int:  # type: ignore[override]
        return self.index


async def test_get_request_is_exactly_nsqds(nursery: trio.Nursery) -> None:
    server = await start_stub(nursery, answer())
    client = AuthClient([f"127.0.0.1:{server.port}"])
    state = await client.query("good", "127.0.0.1", tls=False)
    assert state.identity == "alice"
    assert state.expires_at > trio.current_time() + 59
    [request] = server.requests
    assert request.method == "GET"
    assert request.target == "/auth?common_name=&remote_ip=127.0.0.1&secret=good&tls=false"
    assert request.headers["accept"] == "application/vnd.nsq; version=1.0"
    assert request.headers["host"] == f"127.0.0.1:{server.port}"
    assert request.body == b""


async def test_get_escapes_values_like_go_query_escape(nursery: trio.Nursery) -> None:
    server = await start_stub(nursery, answer())
    client = AuthClient([f"127.0.0.1:{server.port}"])
    secret = "a b+c/&=é~_.-" + b"\xff".decode("utf-8", "surrogateescape")
    await client.query(secret, "::1", tls=True, common_name="CN x")
    assert server.requests[0].target == (
        "/auth?common_name=CN+x&remote_ip=%3A%3A1&secret=a+b%2Bc%2F%26%3D%C3%A9~_.-%FF&tls=true"
    )


async def test_post_sends_json_arrays(nursery: trio.Nursery) -> None:
    server = await start_stub(nursery, answer())
    client = AuthClient([f"127.0.0.1:{server.port}"], method="post")
    state = await client.query("good<&>", "127.0.0.1", tls=False)
    assert state.identity == "alice"
    [request] = server.requests
    assert request.method == "POST"
    assert request.target == "/auth"
    assert request.headers["accept"] == "application/vnd.nsq; version=1.0"
    assert request.headers["content-type"] == "application/json"
    assert request.body == (
        b'{"common_name":[""],"remote_ip":["127.0.0.1"],'
        b'"secret":["good\\u003c\\u0026\\u003e"],"tls":["false"]}'
    )


async def test_full_url_address_is_used_as_is(nursery: trio.Nursery) -> None:
    server = await start_stub(nursery, answer())
    url = f"http://127.0.0.1:{server.port}/custom/path"
    await AuthClient([url]).query("good", "127.0.0.1", tls=False)
    await AuthClient([url], method="post").query("good", "127.0.0.1", tls=False)
    # nsqd appends "?..." even when the URL already has a query string
    await AuthClient([url + "?k=v"]).query("good", "127.0.0.1", tls=False)
    assert [r.target for r in server.requests] == [
        "/custom/path?common_name=&remote_ip=127.0.0.1&secret=good&tls=false",
        "/custom/path",
        "/custom/path?k=v?common_name=&remote_ip=127.0.0.1&secret=good&tls=false",
    ]


@pytest.mark.parametrize(
    ("status", "body"),
    [(403, b"forbidden"), (403, b'{"error": "no"}'), (500, None), (201, None), (200, b"nope")],
)
async def test_bad_answers_fail(nursery: trio.Nursery, status: int, body: bytes | None) -> None:
    server = await start_stub(nursery, answer(status, body))
    with pytest.raises(AuthFailed):
        await AuthClient([f"127.0.0.1:{server.port}"]).query("bad", "127.0.0.1", tls=False)
    assert len(server.requests) == 1


async def test_invalid_reply_fails(nursery: trio.Nursery) -> None:
    server = await start_stub(nursery, answer(200, reply(ttl=0)))
    with pytest.raises(AuthFailed):
        await AuthClient([f"127.0.0.1:{server.port}"]).query("good", "127.0.0.1", tls=False)


async def test_unreachable_address_falls_back(nursery: trio.Nursery) -> None:
    server = await start_stub(nursery, answer())
    addresses = [f"127.0.0.1:{closed_port()}", f"127.0.0.1:{server.port}"]
    state = await AuthClient(addresses, rng=FixedStart(0)).query("good", "127.0.0.1", False)
    assert state.identity == "alice"
    assert len(server.requests) == 1


async def test_rejecting_address_falls_back(nursery: trio.Nursery) -> None:
    bad = await start_stub(nursery, answer(500))
    good = await start_stub(nursery, answer())
    addresses = [f"127.0.0.1:{good.port}", f"127.0.0.1:{bad.port}"]
    # Starting at index 1 goes round the list: bad, then good.
    await AuthClient(addresses, rng=FixedStart(1)).query("good", "127.0.0.1", tls=False)
    assert (len(bad.requests), len(good.requests)) == (1, 1)
    # Starting at the good one never touches the other.
    await AuthClient(addresses, rng=FixedStart(0)).query("good", "127.0.0.1", tls=False)
    assert (len(bad.requests), len(good.requests)) == (1, 2)


async def test_all_addresses_failing_is_auth_failed() -> None:
    addresses = [f"127.0.0.1:{closed_port()}", f"127.0.0.1:{closed_port()}"]
    with pytest.raises(AuthFailed) as info:
        await AuthClient(addresses).query("top-secret", "127.0.0.1", tls=False)
    assert str(info.value).count("failed to auth against") == 2
    assert "top-secret" not in str(info.value)


async def test_timeout_is_auth_failed(nursery: trio.Nursery, autojump_clock: Any) -> None:
    server = await start_stub(nursery, answer())
    server.hang = True
    client = AuthClient([f"127.0.0.1:{server.port}"], request_timeout=5.0)
    start = trio.current_time()
    with pytest.raises(AuthFailed, match="TooSlowError"):
        await client.query("good", "127.0.0.1", tls=False)
    assert trio.current_time() - start == pytest.approx(5.0)


async def test_redirects_are_followed(nursery: trio.Nursery) -> None:
    def respond(request: Request) -> tuple[int, dict[str, str], bytes]:
        if request.target.startswith("/auth"):
            return 302, {"Location": "/elsewhere"}, b""
        return 200, {}, reply()

    server = await start_stub(nursery, respond)
    await AuthClient([f"127.0.0.1:{server.port}"]).query("good", "127.0.0.1", tls=False)
    assert [r.target for r in server.requests][1] == "/elsewhere"
    assert server.requests[1].headers["accept"] == "application/vnd.nsq; version=1.0"


async def test_403_with_https_port_retries_over_https(nursery: trio.Nursery) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)

    secure = await start_stub(nursery, answer(), ssl_context=server_context)
    plain = await start_stub(nursery, answer(403, json.dumps({"https_port": secure.port}).encode()))
    client = AuthClient([f"127.0.0.1:{plain.port}"], ssl_context=client_context)
    state = await client.query("good", "127.0.0.1", tls=False)
    assert state.identity == "alice"
    target = "/auth?common_name=&remote_ip=127.0.0.1&secret=good&tls=false"
    assert [r.target for r in plain.requests] == [target]
    assert [r.target for r in secure.requests] == [target]


async def test_403_from_https_is_final(nursery: trio.Nursery) -> None:
    port = closed_port()
    server = await start_stub(nursery, answer(403, json.dumps({"https_port": port}).encode()))
    # The https retry hits a closed port: a failure, and no further attempt.
    with pytest.raises(AuthFailed):
        await AuthClient([f"127.0.0.1:{server.port}"]).query("good", "127.0.0.1", tls=False)
    assert len(server.requests) == 1


def test_client_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError):
        AuthClient([])
    with pytest.raises(ValueError):
        AuthClient(["127.0.0.1:4181"], method="POST")  # nsqd accepts only "post" or "get"
