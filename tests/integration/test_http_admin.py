"""The admin page and /metrics against a gateway with real traffic from NSQ, beanstalkd
and NATS clients.

The page is loaded in headless Chromium (Debian's package, installed by the test command)
through Playwright, in a subprocess (tests/clients/browser/admin_page.py), in a 1366x768
window; its screenshots (the overview, the message view as text and as hex, a topic's
detail) are kept in test-artifacts/admin-page*.png (or $TEST_ARTIFACTS).
"""

from __future__ import annotations

import base64
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from gateway import __version__
from gateway.app import Gateway
from tests.clients import harness as h
from tests.helpers import RawBeanstalk, RawNSQ, be32, running_gateway

pytestmark = pytest.mark.clients

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", ROOT / "test-artifacts"))
NONE = "\u2013"  # what the page shows for a value it does not have
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


async def headed_nats_message(gw: Gateway, topic: str) -> trio.SocketStream:
    """A NATS publish on `topic` with two headers and a body that is not all text."""
    nats = await trio.open_tcp_stream(*gw.addresses["nats"])
    block = b"NATS/1.0\r\nTrace-Id: abc-123\r\nKind: test\r\n\r\n"
    body = b"with headers \x00\xff"
    await nats.send_all(
        b'CONNECT {"verbose":false,"headers":true}\r\n'
        + b"HPUB %s %d %d\r\n" % (topic.encode(), len(block), len(block) + len(body))
        + block + body + b"\r\nPING\r\n"
    )  # fmt: skip
    buf = b""
    while b"PONG" not in buf:
        buf += await nats.receive_some(4096)
    return nats


def _fits(fit: dict[str, int]) -> None:
    assert fit["scroll_width"] <= fit["inner_width"], fit  # no horizontal scrolling
    assert fit["buttons"] > 0 and fit["buttons_outside"] == 0, fit


async def test_admin_page_in_chromium(tmp_path: Path) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    async with running_gateway(
        http="127.0.0.1:0", beanstalk="127.0.0.1:0", nats="127.0.0.1:0"
    ) as gw:
        nsq, bs, nats = await traffic(gw)
        headed = await headed_nats_message(gw, "orders")
        group = gw.broker.topics["orders"].groups["ch"]
        assert len(group.ready) == 7
        [headed_msg] = [m for m in group.ready if m.body.startswith(b"with headers")]
        # what the gateway sampled before the page opened, stamped 4 and 2 minutes ago
        past = [time.time() - 240, time.time() - 120]
        gw.history.wall = lambda: past.pop(0) if past else time.time()
        gw.history.samples.clear()
        gw.history.sample()  # the rates since the gateway's start: the traffic above
        gw.history.sample()
        with trio.fail_after(60):
            result = await h.run(
                [sys.executable, str(SCRIPT), "--url", url(gw), "--topic", "orders",
                 "--group", "ch", "--message", "with headers", "--other", "jobs",
                 "--screenshots", str(ARTIFACTS)]
            )  # fmt: skip
        assert result["page_errors"] == [] and result["console_errors"] == []
        # the first paint already charts the gateway's history: minutes the page never saw
        first = result["first_paint"]
        assert first["points"] >= 2 and first["peak"] > 0 and first["span"] >= 240
        assert result["state"] == "serving"
        assert {"orders", "jobs"} <= set(result["topics"])
        assert ["jobs", "beanstalk"] in result["groups"]
        assert result["cells"] == {
            "depth": 7, "in_flight": 0, "deferred": 0, "buried": 0, "message_count": 7
        }  # fmt: skip
        assert "nsq 1" in result["consumers"]
        # a 1366x768 laptop screen (and a 1280 one) shows the whole table, actions included
        for fit in ("fit", "fit_1280", "fit_with_peek", "detail_fit"):
            _fits(result[fit])
        assert result["pub_status"] == 200 and result["live_depth"] == 8  # refreshed live
        # the rate chart drew the live publish from successive polls
        chart = result["row_chart"]
        assert chart["points"] >= 1 and chart["peak"] > 0
        assert sorted(chart["lines"]) == ["acked", "in"]
        # the click went through to the broker
        assert result["paused_shown"] and group.paused
        assert any("order #0" in p for p in result["peek"])
        assert any("from nats" in p for p in result["peek"])
        # the message view: id, attempts, headers, body as text and as hex
        message = result["message"]
        assert message["id"] == str(headed_msg.id)
        assert message["facts"]["id"] == f"{headed_msg.id} (NSQ {headed_msg.id:016x})"
        assert message["facts"]["attempts"] == "0"
        assert message["facts"]["state"] == "ready"
        assert message["headers"] == [["Trace-Id", "abc-123"], ["Kind", "test"]]
        assert message["text"] == "with headers \x00\ufffd"
        assert message["mode"] == "hex"
        assert message["hex"].startswith("00000000  77 69 74 68 20 68 65 61 64 65 72 73 20 00 ff")
        assert message["hex"].rstrip().endswith("with headers ..")
        # the topic detail view: its groups, their consumers and a chart for each
        detail = result["detail"]
        assert detail["overview_hidden"] and detail["groups"] == ["ch"]
        [consumer] = detail["consumers"]
        assert consumer["group"] == "ch" and consumer["protocol"] == "nsq"
        assert consumer["address"].startswith("127.0.0.1:")
        assert (consumer["in_flight"], consumer["ready"]) == ("0", "0")
        assert detail["charts"] == ["topic", "ch"]
        assert result["back_to_overview"]
        # the node panel
        node = result["node"]
        assert node["version"] == __version__ and node["store"] == "memory memory"
        assert node["health"] == "ok" and node["rss"].endswith("MiB")
        assert "nsq 1" in node["connections"] and "beanstalk 1" in node["connections"]
        # every protocol's clients, with what their sessions know
        clients = {c["protocol"]: c for c in result["clients"]}
        assert {"nsq", "beanstalk", "nats"} <= set(clients)
        assert all(c["address"].startswith("127.0.0.1:") for c in result["clients"])
        assert NONE not in (clients["nsq"]["client_id"], clients["nsq"]["connected"])
        assert clients["nats"]["subscriptions"] == "0"
        # filter and sort: jobs alone; orders (8 held), jobs (3), default (beanstalkd's, 0)
        assert result["filtered"] == ["jobs"]
        assert result["sorted_by_held"] == ["orders", "jobs", "default"]
        # a topic's depth is its backlog, its groups' ready beside it
        assert result["topic_depth"] == "0 · 8"
        # empty asks first, naming the group and what goes; cancel keeps it all
        question = result["empty_question"]
        assert question["title"] == "empty group ch of topic orders?"
        assert question["text"].startswith("8 messages will be lost: 8 ready, 0 in flight")
        assert question["verb"] == "empty"
        assert result["depth_after_cancel"] == result["depth_before"] == 8
        assert result["depth_after_publish"] == 9
        assert result["emptied"] and len(group.ready) == 0
        deleting = result["delete_question"]
        assert deleting["title"] == "delete topic jobs?"
        assert deleting["text"].startswith(
            "3 messages will be lost: 2 ready, 0 in flight, 0 deferred, 1 buried."
        )
        assert "1 group: all go with it" in deleting["text"]
        assert result["deleted"] and "jobs" not in gw.broker.topics
        _fits(result["fit_after_actions"])
        for name in ("", "-full", "-message", "-message-hex", "-topic", "-node", "-confirm"):
            assert (ARTIFACTS / f"admin-page{name}.png").stat().st_size > 10000
        for stream in (nsq, bs, headed):
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
            # a topic's depth is its backlog (nsqd's /stats); its groups' totals beside it
            assert orders["backlog"] == 0
            assert orders["groups_total"] == {
                "depth": 6, "in_flight": 0, "deferred": 0, "buried": 0
            }  # fmt: skip
            # nsqadmin's client details, for every protocol's consumers
            [sub] = ch["clients"]
            assert sub["client_id"] and sub["connected_since"] > 0
            assert (sub["finish_count"], sub["requeue_count"], sub["tls"]) == (0, 0, "")
            assert (sub["snappy"], sub["deflate"]) == (False, False)
            assert worker["client_id"] == "127.0.0.1" and "message_count" in worker
            conns = state["clients"]
            assert sorted({c["protocol"] for c in conns}) == ["beanstalk", "nats", "nsq"]
            nats_client = next(c for c in conns if c["protocol"] == "nats")
            assert nats_client["subscriptions"] == 0 and nats_client["connected_since"] > 0
            # the node panel
            node = state["node"]
            assert node["version"] == __version__ and node["uptime"] >= 0
            assert node["rss"] > 10_000_000
            assert node["store"] == {
                "kind": "memory", "where": "memory", "fsync": "none (memory)", "size": None,
                "health": "ok",
            }  # fmt: skip
            # the gateway's own history: a point from the start, whoever polls
            history = (await client.get(url(gw, "/admin/api/history"))).json()
            assert history["interval"] == 10.0 and len(history["samples"]) >= 1
            assert "time" in history["samples"][0]
            empty = await client.post(url(gw, "/admin/api/empty?topic=orders&group=ch"))
            assert empty.status_code == 200
            assert empty.json()["dropped"] == {
                "ready": 6, "in_flight": 0, "deferred": 0, "buried": 0
            }  # fmt: skip
            assert len(gw.broker.topics["orders"].groups["ch"].ready) == 0
            published = await client.post(
                url(gw, "/admin/api/publish?topic=orders"), content=b"by hand"
            )
            assert published.status_code == 200
            [by_hand] = gw.broker.topics["orders"].groups["ch"].ready
            assert by_hand.body == b"by hand" and by_hand.id == published.json()["id"]
            for query, status in [("", 400), ("topic=a%20b", 400)]:
                reply = await client.post(url(gw, f"/admin/api/publish?{query}"), content=b"x")
                assert reply.status_code == status
            assert (
                await client.post(url(gw, "/admin/api/publish?topic=t"), content=b"")
            ).status_code == 400
            deleted = await client.post(url(gw, "/admin/api/delete?topic=orders&group=ch"))
            assert deleted.json()["dropped"]["ready"] == 1
            assert "ch" not in gw.broker.topics["orders"].groups
            assert (await client.post(url(gw, "/admin/api/delete?topic=jobs"))).status_code == 200
            assert "jobs" not in gw.broker.topics
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
            assert delta("gateway_received_bytes_total", protocol=protocol) > 0
        for stream in (nsq, bs):
            await stream.aclose()
        await nats.aclose()
