"""The HTTP listener's token (`[http] auth_token`, `protect_reads`): which endpoints ask
for it, what they answer without it, that nothing changes when they refuse, and the admin
page asking for it in a real browser."""

from __future__ import annotations

import base64
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from gateway import config
from gateway.app import Gateway
from tests.clients import harness as h
from tests.helpers import http_base, running_gateway

TOKEN = "s3cret-token"
ROOT = Path(__file__).resolve().parents[2]
LOGIN_SCRIPT = ROOT / "tests" / "clients" / "browser" / "admin_login.py"

WRITES = [
    ("/pub?topic=t", b"hello"),
    ("/mpub?topic=t", b"a\nb"),
    ("/topic/create?topic=t2", b""),
    ("/topic/empty?topic=t", b""),
    ("/topic/pause?topic=t", b""),
    ("/topic/delete?topic=t", b""),
    ("/channel/create?topic=t&channel=c2", b""),
    ("/channel/empty?topic=t&channel=c", b""),
    ("/channel/pause?topic=t&channel=c", b""),
    ("/channel/delete?topic=t&channel=c", b""),
    ("/topic/tombstone?topic=t&node=x:1", b""),
    ("/admin/api/empty?topic=t&group=c", b""),
    ("/admin/api/pause?topic=t", b""),
]
READS = ["/stats?format=json", "/metrics", "/info", "/lookup?topic=t", "/topics",
         "/admin/api/state", "/config/nsqlookupd_tcp_addresses"]  # fmt: skip
ALWAYS_OPEN = ["/ping", "/health", "/ready", "/"]


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def seed(client: httpx.AsyncClient) -> None:
    """Topic t with channel c holding 3 messages (written with the token)."""
    for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
        r = await client.post(path, headers=bearer())
        assert r.status_code == 200
    r = await client.post("/mpub?topic=t", content=b"1\n2\n3", headers=bearer())
    assert r.status_code == 200


def depth(gw: Gateway) -> int:
    return len(gw.broker.topics["t"].groups["c"].ready)


async def test_writes_need_the_token_and_change_nothing_without_it() -> None:
    async with (
        running_gateway(http="127.0.0.1:0", http_settings__auth_token=TOKEN) as gw,
        httpx.AsyncClient(base_url=http_base(gw)) as client,
    ):
        await seed(client)
        for path, body in WRITES:
            for headers in ({}, bearer("wrong"), {"authorization": "Token " + TOKEN}):
                r = await client.post(path, content=body, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.json() == {"message": "UNAUTHORIZED"}
                assert r.headers["www-authenticate"] == 'Bearer realm="gateway"'
        # nothing happened: the same topics, channel, depth; not paused; no t2
        assert set(gw.broker.topics) == {"t"}
        assert depth(gw) == 3 and not gw.broker.topics["t"].paused
        assert not gw.broker.topics["t"].groups["c"].paused
        # the refusals are counted
        r = await client.get("/metrics")
        assert 'gateway_protocol_errors_total{code="UNAUTHORIZED",protocol="http"}' in r.text
        # with the token (bearer, or basic with the token as password) they work
        r = await client.post("/admin/api/empty?topic=t&group=c", headers=bearer())
        assert r.status_code == 200 and depth(gw) == 0
        basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
        r = await client.post(
            "/pub?topic=t", content=b"x", headers={"authorization": "Basic " + basic}
        )
        assert r.status_code == 200 and depth(gw) == 1
        r = await client.put("/config/nsqlookupd_tcp_addresses", content=b"[]")
        assert r.status_code == 401


async def test_reads_are_open_unless_protected() -> None:
    async with (
        running_gateway(http="127.0.0.1:0", http_settings__auth_token=TOKEN) as gw,
        httpx.AsyncClient(base_url=http_base(gw)) as client,
    ):
        await seed(client)
        for path in READS + ALWAYS_OPEN:
            r = await client.get(path)
            assert r.status_code == 200, (path, r.status_code)
    async with (
        running_gateway(
            http="127.0.0.1:0", http_settings__auth_token=TOKEN, http_settings__protect_reads=True
        ) as gw,
        httpx.AsyncClient(base_url=http_base(gw)) as client,
    ):
        await seed(client)
        for path in READS:
            r = await client.get(path)
            assert r.status_code == 401, path
            r = await client.get(path, headers=bearer())
            assert r.status_code == 200, path
        for path in ALWAYS_OPEN:  # probes, and the page shell that asks for the token
            r = await client.get(path)
            assert r.status_code == 200, path


async def test_no_token_configured_means_no_check() -> None:
    async with (
        running_gateway(http="127.0.0.1:0") as gw,
        httpx.AsyncClient(base_url=http_base(gw)) as client,
    ):
        r = await client.post("/pub?topic=t", content=b"x")
        assert r.status_code == 200


def test_http_table_and_top_level_address(tmp_path: Path) -> None:
    table = tmp_path / "table.toml"
    table.write_text('[http]\naddress = "127.0.0.1:4999"\nauth_token = "abc"\n')
    s = config.load(table, environ={})
    assert s.http == "127.0.0.1:4999" and s.http_settings.auth_token == "abc"
    # --http overrides the address and keeps the table's other keys
    s = config.load(table, {"http": "127.0.0.1:0"}, environ={})
    assert s.http == "127.0.0.1:0" and s.http_settings.auth_token == "abc"
    # the top-level form still works, and the environment reaches the table
    plain = tmp_path / "plain.toml"
    plain.write_text('http = "127.0.0.1:4998"\n')
    s = config.load(plain, environ={"GATEWAY_HTTP__AUTH_TOKEN": "env", "GATEWAY_HTTP": "off"})
    assert s.http == "off" and s.http_settings.auth_token == "env"


def test_check_config_explains_the_clash(tmp_path: Path) -> None:
    both = tmp_path / "both.toml"
    both.write_text('http = "127.0.0.1:4151"\n\n[http]\nauth_token = "abc"\n')
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(both)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert "[http] table cannot both appear" in out.stdout
    assert 'address = "host:port"' in out.stdout and str(both) in out.stdout
    reads = tmp_path / "reads.toml"
    reads.write_text("[http]\nprotect_reads = true\n")
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(reads)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 1 and f"{reads}:http: protect_reads needs an auth_token" in out.stdout


@pytest.mark.parametrize(
    ("protocol", "overrides", "warned"),
    [
        ("beanstalk", {}, True),
        ("http", {}, True),
        ("http", {"http_settings__auth_token": TOKEN}, False),
        ("nats", {"nats_server__token": TOKEN}, False),
        ("nsq", {}, True),
    ],
)
def test_a_listener_reachable_from_other_hosts_without_protection_is_warned_about(
    caplog: pytest.LogCaptureFixture, protocol: str, overrides: dict[str, str], warned: bool
) -> None:
    from tests.helpers import settings

    gw = Gateway(settings(**overrides))
    with caplog.at_level(logging.WARNING, logger="gateway"):
        gw._announce(protocol, [("192.0.2.10", 4000)])  # announced, not bound
        gw._announce(protocol + "-loopback", [("127.0.0.1", 4001)])
    lines = [r.getMessage() for r in caplog.records if "reachable from other hosts" in r.message]
    assert lines == ([f"listener {protocol} on 192.0.2.10:4000 is reachable from other hosts"
                      " with neither TLS nor authentication: anyone who reaches it can"
                      " publish, consume and delete"] if warned else [])  # fmt: skip


@pytest.mark.clients
@pytest.mark.parametrize("reads_protected", [False, True])
async def test_admin_page_asks_for_the_token(reads_protected: bool) -> None:
    overrides: dict[str, object] = {"http": "127.0.0.1:0", "http_settings__auth_token": TOKEN}
    if reads_protected:
        overrides["http_settings__protect_reads"] = True
    async with (
        running_gateway(**overrides) as gw,
        httpx.AsyncClient(base_url=http_base(gw)) as client,
    ):
        await seed(client)
        with trio.fail_after(60):
            result = await h.run(
                [sys.executable, str(LOGIN_SCRIPT), "--url", http_base(gw) + "/",
                 "--topic", "t", "--group", "c", "--token", TOKEN,
                 *(["--reads-protected"] if reads_protected else [])]
            )  # fmt: skip
        assert result["page_errors"] == []
        assert result["dialog_title"] == "Access token"
        assert "refused" in result["refused_shown"]
        assert result["topics_after_token"] == ["t"]
        statuses = {tuple(s) for s in result["statuses"]}
        if reads_protected:
            # nothing shown before the token; the data answered 401, then 200
            assert result["topics_before_token"] == []
            # (the page's first read is the gateway's history, then its state)
            assert (http_base(gw) + "/admin/api/history", 401) in statuses
            assert (http_base(gw) + "/admin/api/state", 200) in statuses
            assert depth(gw) == 3
        else:
            # the data showed at once; the click's action answered 401 until the token
            assert result["topics_before_token"] == ["t"]
            assert (http_base(gw) + "/admin/api/empty", 401) in statuses
            assert (http_base(gw) + "/admin/api/empty", 200) in statuses
            assert depth(gw) == 0


@pytest.mark.parametrize(
    ("tls_listeners", "protocol", "warned"),
    [
        (None, "nats", False),  # TLS on every listener that can carry it
        (None, "https", False),
        (None, "http", True),  # plain HTTP whatever the certificate, as nsqd's
        (["https"], "nsq", True),  # a certificate, but not offered on NSQ
        (["https"], "nats", True),
    ],
)
def test_the_warning_counts_a_listeners_own_tls_only(
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    tls_listeners: list[str] | None,
    protocol: str,
    warned: bool,
) -> None:
    """Found by a review: NATS and HTTPS serving TLS were warned about, NSQ was not when
    the certificate was not offered on it."""
    import trustme

    from tests.helpers import settings
    from tests.integration.test_tls import issue

    cert, key = issue(trustme.CA(), tmp_path, "server")
    overrides: dict[str, object] = {"tls_cert": cert, "tls_key": key}
    if tls_listeners is not None:
        overrides["tls_settings__listeners"] = tls_listeners
    gw = Gateway(settings(**overrides))
    with caplog.at_level(logging.WARNING, logger="gateway"):
        gw._announce(protocol, [("192.0.2.10", 4000)])
    lines = [r.getMessage() for r in caplog.records if "reachable from other hosts" in r.message]
    assert bool(lines) is warned, lines
