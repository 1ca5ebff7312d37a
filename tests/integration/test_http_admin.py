"""The admin page and /metrics against a gateway with real traffic from NSQ, beanstalkd
and NATS clients.

The page is loaded in headless Chromium (Debian's package, installed by the test command)
through Playwright, in a subprocess (tests/clients/browser/admin_page.py); its screenshot
is kept in test-artifacts/admin-page.png (or $TEST_ARTIFACTS).
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import Gateway
from tests.clients import harness as h
from tests.helpers import RawBeanstalk, RawNSQ, be32, running_gateway

pytestmark = pytest.mark.clients

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", ROOT / "test-artifacts"))
SCRIPT = ROOT / "tests" / "clients" / "browser" / "admin_page.py"


def url(gw: Gateway, path: str = "/") -> str:
    host, port = gw.addresses["http"]
    return f"http://{host}:{port}{path}"


async def traffic(gw: Gateway) -> tuple[RawNSQ, RawBeanstalk, trio.SocketStream]:
    """NSQ: 5 messages on `orders`, a consumer on channel `ch` with RDY 0 (they stay
    ready). beanstalkd: 3 jobs on `jobs`, one reserved and buried. NATS: a publish on
    `orders` too (the topic keeps it)."""
    nsq = await RawNSQ.connect(gw)
    await nsq.send(b"SUB orders ch\n")
    assert await nsq.frame() == (0, b"OK")
    pub = await RawNSQ.connect(gw)
    for i in range(5):
        await pub.send(b"PUB orders\n" + be32(8) + b"order #%d" % i)
        assert await pub.frame() == (0, b"OK")
    await pub.aclose()
    bs = await RawBeanstalk.connect(gw)
    await bs.call(b"use jobs\r\n")
    for i in range(3):
        await bs.call(b"put %d 0 60 5\r\njob-%d\r\n" % (i, i))
    await bs.call(b"watch jobs\r\n")
    reserved = await bs.call(b"reserve\r\n")
    job_id = reserved.split()[1]
    assert await bs.call(b"bury " + job_id + b" 1\r\n") == b"BURIED\r\n"
    nats = await trio.open_tcp_stream(*gw.addresses["nats"])
    await nats.send_all(b'CONNECT {"verbose":false}\r\nPUB orders 9\r\nfrom nats\r\nPING\r\n')
    buf = b""
    while b"PONG" not in buf:
        buf += await nats.receive_some(4096)
    return nsq, bs, nats


async def test_admin_page_in_chromium(tmp_path: Path) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "admin-page.png"
    async with running_gateway(
        http="127.0.0.1:0", beanstalk="127.0.0.1:0", nats="127.0.0.1:0"
    ) as gw:
        nsq, bs, nats = await traffic(gw)
        group = gw.broker.topics["orders"].groups["ch"]
        assert len(group.ready) == 6
        with trio.fail_after(60):
            result = await h.run(
                [sys.executable, str(SCRIPT), "--url", url(gw), "--topic", "orders",
                 "--group", "ch", "--screenshot", str(shot)]
            )  # fmt: skip
        assert result["page_errors"] == []
        assert result["state"] == "serving"
        assert {"orders", "jobs"} <= set(result["topics"])
        assert ["jobs", "beanstalk"] in result["groups"]
        assert result["cells"] == {
            "depth": 6, "in_flight": 0, "deferred": 0, "buried": 0, "message_count": 6
        }  # fmt: skip
        assert "nsq 1" in result["consumers"]
        assert result["pub_status"] == 200 and result["live_depth"] == 7  # refreshed live
        # the click went through to the broker
        assert result["paused_shown"] and group.paused
        assert any("order #0" in p for p in result["peek"])
        assert any("from nats" in p for p in result["peek"])
        assert shot.stat().st_size > 10000
        for stream in (nsq, bs):
            await stream.aclose()
        await nats.aclose()


async def test_admin_api_actions_and_peek() -> None:
    async with running_gateway(
        http="127.0.0.1:0", beanstalk="127.0.0.1:0", nats="127.0.0.1:0"
    ) as gw:
        nsq, bs, nats = await traffic(gw)
        async with httpx.AsyncClient() as client:
            state = (await client.get(url(gw, "/admin/api/state"))).json()
            jobs = next(t for t in state["topics"] if t["name"] == "jobs")
            [workers] = jobs["groups"]
            assert (workers["depth"], workers["buried"]) == (2, 1)
            assert workers["consumers"] == {"beanstalk": 1}
            assert jobs["published"] == {"beanstalk": 3}
            [worker] = workers["clients"]
            assert (worker["protocol"], worker["in_flight"]) == ("beanstalk", 0)
            assert worker["address"].startswith("127.0.0.1:")
            orders = next(t for t in state["topics"] if t["name"] == "orders")
            [ch] = orders["groups"]
            assert [(c["protocol"], c["in_flight"], c["ready"]) for c in ch["clients"]] == [
                ("nsq", 0, 0)
            ]
            buried = (
                await client.get(url(gw, "/admin/api/peek?topic=jobs&group=beanstalk&state=buried"))
            ).json()
            assert [m["body"] for m in buried["messages"]] == ["job-0"]
            job_id = buried["messages"][0]["id"]
            one = (
                await client.get(
                    url(gw, f"/admin/api/message?topic=jobs&group=beanstalk&id={job_id}")
                )
            ).json()
            assert (one["id"], one["id_hex"], one["state"]) == (job_id, f"{job_id:016x}", "buried")
            assert (one["attempts"], one["size"], one["truncated"]) == (1, 5, False)
            assert base64.b64decode(one["body_base64"]) == b"job-0"
            assert one["headers"] == [] and one["origin"].startswith("beanstalk ")
            for query, status in [
                ("group=beanstalk&id=999999", 404),
                ("group=beanstalk&id=x", 400),
            ]:
                reply = await client.get(url(gw, f"/admin/api/message?topic=jobs&{query}"))
                assert reply.status_code == status
            kick = await client.post(url(gw, "/admin/api/kick?topic=jobs&group=beanstalk"))
            assert kick.json() == {"ok": True, "kicked": 1}
            assert len(gw.broker.topics["jobs"].groups["beanstalk"].buried) == 0
            empty = await client.post(url(gw, "/admin/api/empty?topic=orders&group=ch"))
            assert empty.status_code == 200
            assert len(gw.broker.topics["orders"].groups["ch"].ready) == 0
            missing = await client.post(url(gw, "/admin/api/pause?topic=nope"))
            assert missing.status_code == 404
            assert missing.json() == {"message": "TOPIC_NOT_FOUND"}
        for stream in (nsq, bs):
            await stream.aclose()
        await nats.aclose()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_move_with_traffic_from_every_protocol() -> None:
    async with running_gateway(
        http="127.0.0.1:0", beanstalk="127.0.0.1:0", nats="127.0.0.1:0"
    ) as gw:
        async with httpx.AsyncClient() as client:
            before = _samples((await client.get(url(gw, "/metrics"))).text)
            nsq, bs, nats = await traffic(gw)
            await nsq.send(b"RDY 10\n")
            for _ in range(6):
                _ftype, data = await nsq.frame()
                await nsq.send(b"FIN " + data[10:26] + b"\n")
            await bs.call(b"reserve\r\n")  # the second job, left reserved
            reply = await client.get(url(gw, "/metrics"))
            assert reply.headers["content-type"].startswith("text/plain")
            after = _samples(reply.text)

        def delta(name: str, **labels: str) -> float:
            key = (name, frozenset(labels.items()))
            return after.get(key, 0.0) - before.get(key, 0.0)

        assert delta("gateway_messages_published_total", protocol="nsq", topic="orders") == 5
        assert delta("gateway_messages_published_total", protocol="nats", topic="orders") == 1
        assert delta("gateway_messages_published_total", protocol="beanstalk", topic="jobs") == 3
        assert (
            delta("gateway_messages_acknowledged_total", protocol="nsq", topic="orders", group="ch")
            == 6
        )
        assert (
            delta(
                "gateway_messages_buried_total",
                protocol="beanstalk",
                topic="jobs",
                group="beanstalk",
            )
            == 1
        )
        assert delta(
            "gateway_messages_delivered_total",
            protocol="beanstalk", topic="jobs", group="beanstalk",
        ) == 2  # fmt: skip
        assert (
            after[
                ("gateway_queue_in_flight", frozenset({("topic", "jobs"), ("group", "beanstalk")}))
            ]
            == 1
        )
        assert delta("gateway_publish_to_ack_seconds_count", protocol="nsq") == 6
        for protocol in ("nsq", "beanstalk", "nats"):
            assert after[("gateway_open_connections", frozenset({("protocol", protocol)}))] >= 1
            assert delta("gateway_bytes_received_total", protocol=protocol) > 0
        for stream in (nsq, bs):
            await stream.aclose()
        await nats.aclose()
