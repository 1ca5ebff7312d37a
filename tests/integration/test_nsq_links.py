"""The NSQ links (`[[nsq_import]]`, `[[nsq_export]]`, gateway/links/) against an upstream
nsqd. The upstream is a second gateway, whose NSQ bytes are checked against real nsqd
transcripts (test_nsq_transcripts.py, test_nsq_link_recording.py) and which answers
nsqlookupd's `/lookup` for itself; a scripted nsqd stand-in injects the failures.

Every wait is on a condition with a timeout; nothing sleeps for timing.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.app import Gateway
from gateway.broker import query
from gateway.http.lookupd import LookupdAPI
from gateway.links import LinkStatus, nsq_import
from gateway.protocols.nsq import events as ev
from gateway.protocols.nsq.codec import OK_FRAME, NSQServerCodec, error_frame, response_frame
from gateway.stores import SQLiteStore
from tests.helpers import RawNSQ, be32, http_base, parse_message, running_gateway, settings
from tests.integration.test_store_failures import Disk

FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    with trio.move_on_after(timeout) as scope:
        while not condition():
            await trio.sleep(0.01)
    if scope.cancelled_caught:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def started(nursery: trio.Nursery, **overrides: Any) -> tuple[Gateway, trio.CancelScope]:
    """A gateway running in `nursery` until the returned scope is cancelled."""
    gateway = Gateway(settings(**overrides))
    scope = trio.CancelScope()

    async def serve(task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await gateway.serve(task_status=task_status)

    await nursery.start(serve)
    return gateway, scope


def nsq_address(gw: Gateway) -> str:
    host, port = gw.addresses["nsq"]
    return f"{host}:{port}"


def status_of(gw: Gateway) -> LinkStatus:
    (link,) = gw.links.links
    return link.status


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = be32(len(bodies)) + b"".join(be32(len(b)) + b for b in bodies)
    return f"MPUB {topic}\n".encode() + be32(len(payload)) + payload


async def publish(gw: Gateway, topic: str, bodies: list[bytes]) -> None:
    conn = await RawNSQ.connect(gw)
    for start in range(0, len(bodies), 500):
        await conn.send(mpub(topic, bodies[start : start + 500]))
        assert await conn.frame() == (FRAME_RESPONSE, b"OK")
    await conn.aclose()


async def drain(gw: Gateway, topic: str, channel: str, count: int) -> list[bytes]:
    """`count` messages of topic/channel, FIN'd; then checks that no more are there."""
    conn = await RawNSQ.connect(gw)
    await conn.send(f"SUB {topic} {channel}\nRDY 2500\n".encode())
    assert await conn.frame() == (FRAME_RESPONSE, b"OK")
    bodies = []
    while len(bodies) < count:
        ftype, data = await conn.frame(15.0)
        if ftype == FRAME_RESPONSE and data == b"_heartbeat_":
            await conn.send(b"NOP\n")
            continue
        assert ftype == FRAME_MESSAGE, (ftype, data[:200])
        _, _, msg_id, body = parse_message(data)
        bodies.append(body)
        await conn.send(b"FIN " + msg_id + b"\n")
    # nothing more: a FIN of an id nobody holds is answered in order after any delivery
    await conn.send(b"FIN " + b"0" * 16 + b"\n")
    ftype, data = await conn.frame()
    assert ftype == FRAME_ERROR and data.startswith(b"E_FIN_FAILED"), (ftype, data[:200])
    await conn.aclose()
    return bodies


async def drain_all(gw: Gateway, topic: str, channel: str) -> list[bytes]:
    """Every message topic/channel holds (fewer than 2500), FIN'd."""
    conn = await RawNSQ.connect(gw)
    # the deliveries of RDY go out before the answer to the FIN after it
    await conn.send(f"SUB {topic} {channel}\nRDY 2500\nFIN {'0' * 16}\n".encode())
    assert await conn.frame() == (FRAME_RESPONSE, b"OK")
    bodies = []
    while True:
        ftype, data = await conn.frame(15.0)
        if ftype == FRAME_ERROR:
            assert data.startswith(b"E_FIN_FAILED"), data
            break
        assert ftype == FRAME_MESSAGE, (ftype, data[:200])
        _, _, msg_id, body = parse_message(data)
        bodies.append(body)
        await conn.send(b"FIN " + msg_id + b"\n")
    await conn.aclose()
    return bodies


def channel_of(gw: Gateway, topic: str, channel: str) -> Any:
    return gw.broker.topics[topic].groups[channel]


def bodies_of(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}-{i:05d}".encode() for i in range(n)]


# -- import -------------------------------------------------------------------------------


async def test_import_from_listed_nsqds_moves_every_message_once() -> None:
    sent = bodies_of(1000)
    async with running_gateway() as upstream, running_gateway() as other:
        # two nsqds with half each: both get a connection, max_in_flight split over them
        await publish(upstream, "src", sent[:500])
        await publish(other, "src", sent[500:])
        link = {
            "topic": "src",
            "channel": "ch",
            "to_topic": "dst",
            "nsqd_tcp_addresses": [nsq_address(upstream), nsq_address(other)],
            "max_in_flight": 60,
        }
        async with running_gateway(nsq_import=[link]) as gw:
            status = status_of(gw)
            assert status.name == "nsq_import:src/ch"
            await wait_for(lambda: status.moved == 1000, "1000 moved")
            got = await drain(gw, "dst", "c", 1000)
            assert sorted(got) == sent  # each exactly once
            for each in (upstream, other):
                ch = channel_of(each, "src", "ch")
                await wait_for(lambda ch=ch: not ch.in_flight, "every FIN upstream")
                assert (ch.finish_count, ch.requeue_count, ch.depth) == (500, 0, 0)
                (client,) = each.nsq.sessions
                assert client.user_agent.startswith("gateway-link/")
                assert client.consumer is not None and client.consumer.ready == 30
            assert status.state == "connected" and status.errors == 0
            assert status.in_flight == 0


async def test_import_through_lookupd_follows_the_producers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_gateway(http="127.0.0.1:0") as upstream:
        await publish(upstream, "src", bodies_of(300))  # /lookup knows the topic from here
        link = {
            "topic": "src",
            "channel": "ch",
            "lookupd_http_addresses": [http_base(upstream)],
            "lookupd_poll_interval": 0.2,
            "name": "from-lookupd",
        }
        async with running_gateway(nsq_import=[link]) as gw:
            status = status_of(gw)
            assert status.name == "from-lookupd"
            await wait_for(lambda: status.moved == 300, "300 moved")
            assert sorted(await drain(gw, "src", "c", 300)) == bodies_of(300)
            (link_obj,) = gw.links.links
            assert list(link_obj.readers) == [nsq_address(upstream)]  # type: ignore[attr-defined]
            # /lookup no longer names the nsqd: its connection is closed (it holds nothing)
            monkeypatch.setattr(LookupdAPI, "_producers", lambda self: [])
            await wait_for(lambda: not link_obj.readers, "the connection dropped")  # type: ignore[attr-defined]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_links_never_take_the_gateway_itself_for_an_upstream_nsqd() -> None:
    """A gateway registered in the lookupds its import asks is one of the producers of the
    topic it imports into: consuming from itself, it would move its messages in a circle."""
    async with running_gateway() as upstream:
        http = f"127.0.0.1:{free_port()}"  # the gateway's own /lookup is the lookupd here
        link = {
            "topic": "src",
            "channel": "ch",
            "nsqd_tcp_addresses": [nsq_address(upstream)],
            "lookupd_http_addresses": [http],
            "lookupd_poll_interval": 0.05,
        }
        async with running_gateway(http=http, nsq_import=[link]) as gw:
            (importer,) = gw.links.links
            await publish(upstream, "src", bodies_of(50))
            await wait_for(lambda: status_of(gw).moved == 50, "50 moved")
            found = importer.upstream.found  # type: ignore[attr-defined]
            await wait_for(lambda: found.get(http) == [nsq_address(gw)], "/lookup names it")
            assert importer.upstream.addresses == [nsq_address(upstream)]  # type: ignore[attr-defined]
            assert list(gw.broker.topics["src"].groups) == []  # no SUB of its own
            assert sorted(await drain_all(gw, "src", "c")) == bodies_of(50)


async def test_import_lag_is_the_upstream_channels_depth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nsq_import, "LAG_INTERVAL", 0.05)
    async with running_gateway(http="127.0.0.1:0") as upstream, httpx.AsyncClient() as http:
        base = http_base(upstream)
        await publish(upstream, "src", bodies_of(300))
        for call in ("channel/create", "channel/pause"):  # nothing leaves it meanwhile
            reply = await http.post(f"{base}/{call}", params={"topic": "src", "channel": "ch"})
            assert reply.status_code == 200
        link = {
            "topic": "src",
            "channel": "ch",
            "lookupd_http_addresses": [base],  # which names the nsqd's HTTP port
            "lookupd_poll_interval": 0.05,
        }
        async with running_gateway(nsq_import=[link]) as gw:
            status = status_of(gw)
            await wait_for(lambda: status.lag == 300, "the depth upstream read")
            assert status.moved == 0
            await http.post(f"{base}/channel/unpause", params={"topic": "src", "channel": "ch"})
            await wait_for(lambda: status.moved == 300 and status.lag == 0, "moved, lag 0")


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    # the link's backoff passes on the test's clock; a jump waits until nothing has
    # moved for 2 ms, which leaves the sockets and the store's thread their time
    return trio.testing.MockClock(autojump_threshold=0.002)


async def test_import_fins_only_what_the_store_kept(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sent = bodies_of(200)
    async with running_gateway() as upstream:
        link = {"topic": "src", "channel": "ch", "nsqd_tcp_addresses": [nsq_address(upstream)]}
        store = f"sqlite://{tmp_path / 'gateway.db'}"
        async with running_gateway(store=store, nsq_import=[link]) as gw:
            assert isinstance(gw.store, SQLiteStore)
            disk = Disk(gw.store)
            disk.full = True
            status = status_of(gw)
            await wait_for(lambda: upstream.broker.topics.get("src") is not None, "the SUB")
            await wait_for(lambda: "ch" in upstream.broker.topics["src"].groups, "the SUB")
            await publish(upstream, "src", sent)
            upstream_ch = channel_of(upstream, "src", "ch")
            await wait_for(lambda: upstream_ch.requeue_count > 0, "a REQ upstream")
            assert upstream_ch.finish_count == 0  # nothing FIN'd while the store fails
            assert status.errors > 0 and "No space left" in status.last_error
            assert status.moved == 0 and status.state == "backing off"
            # the wait after a failure ends; the store has not come back, and the link
            # still says so (nothing arrives meanwhile to fail again and say it anew)
            upstream_group = upstream.broker.topics["src"].groups["ch"]
            upstream_group.pause()
            await trio.sleep(60)
            assert status.state == "backing off"
            upstream_group.unpause()
            disk.full = False
            await wait_for(lambda: upstream_ch.finish_count == 200, "all FIN'd upstream")
            assert status.moved == 200 and status.state == "connected"
            # the batches whose flush failed were REQ'd upstream and taken back out of
            # the gateway (not written once the store recovered): each arrived once
            got = await drain_all(gw, "src", "c")
            assert sorted(got) == sorted(sent), Counter(got).most_common(3)


async def test_import_reconnects_after_the_upstream_restarts() -> None:
    async with trio.open_nursery() as nursery:
        upstream, stop = await started(nursery)
        port = upstream.addresses["nsq"][1]
        link = {"topic": "src", "channel": "ch", "nsqd_tcp_addresses": [nsq_address(upstream)]}
        async with running_gateway(nsq_import=[link]) as gw:
            status = status_of(gw)
            await publish(upstream, "src", bodies_of(100, "a"))
            await wait_for(lambda: status.moved == 100, "the first 100 moved")
            stop.cancel()  # the upstream goes away, and comes back on the same port
            await wait_for(lambda: status.state != "connected", "the connection lost")
            again, stop = await started(nursery, nsq=f"127.0.0.1:{port}")
            await publish(again, "src", bodies_of(100, "b"))
            await wait_for(lambda: status.moved == 200, "the next 100 moved")
            assert status.errors >= 1 and status.state == "connected"
            got = await drain(gw, "src", "c", 200)
            assert sorted(got) == bodies_of(100, "a") + bodies_of(100, "b")
        stop.cancel()


async def test_import_stopped_mid_batch_fins_the_batch_before_it_goes() -> None:
    """The gateway stopping while a batch is being stored: the batch is stored and FIN'd
    first, not left for nsqd to redeliver after its msg_timeout (and arrive twice)."""
    async with running_gateway() as upstream, trio.open_nursery() as nursery:
        link = {"topic": "src", "channel": "ch", "nsqd_tcp_addresses": [nsq_address(upstream)]}
        gw, stop = await started(nursery, nsq_import=[link])
        flushing, go_on = trio.Event(), trio.Event()
        flush = gw.broker.flush

        async def slow_flush() -> None:  # the store's commit, held until the test says
            flushing.set()
            await go_on.wait()
            await flush()

        gw.broker.flush = slow_flush  # type: ignore[method-assign]
        await wait_for(lambda: "src" in upstream.broker.topics, "the SUB")
        await publish(upstream, "src", bodies_of(10))
        await flushing.wait()
        stop.cancel()  # the gateway stops with the batch under way
        go_on.set()
        upstream_ch = channel_of(upstream, "src", "ch")
        await wait_for(lambda: upstream_ch.finish_count == 10, "the batch FIN'd upstream")
        assert upstream_ch.requeue_count == 0


# -- export -------------------------------------------------------------------------------


class ScriptedNSQD:
    """An nsqd stand-in for publishers that answers each PUB or MPUB as `script(connection,
    command)` says: "ok", "error" (E_MPUB_FAILED, then it closes, as nsqd does) or "drop"
    (closes without an answer). It keeps the batches it answered OK."""

    def __init__(self, script: Callable[[int, int], str]) -> None:
        self.script = script
        self.batches: list[list[bytes]] = []
        self.refused: list[list[bytes]] = []
        self.connections = 0
        self.changed = trio.Event()
        self.address = ""

    async def serve(self, task_status: trio.TaskStatus[None]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        number, commands = self.connections, 0
        codec = NSQServerCodec()
        async with stream:
            while data := await stream.receive_some(65536):
                codec.receive_data(data)
                while (event := codec.next_event()) is not None:
                    if isinstance(event, ev.Identify):
                        features = {"max_rdy_count": 2500, "version": "1.3.0"}
                        await stream.send_all(response_frame(json.dumps(features).encode()))
                        codec.resume()
                        continue
                    if not isinstance(event, ev.Pub | ev.Mpub):
                        continue
                    bodies = [event.body] if isinstance(event, ev.Pub) else event.bodies
                    action = self.script(number, commands)
                    commands += 1
                    self.changed.set()
                    if action == "ok":
                        self.batches.append(bodies)
                        await stream.send_all(OK_FRAME)
                        continue
                    self.refused.append(bodies)
                    if action == "error":
                        await stream.send_all(error_frame(b"E_MPUB_FAILED MPUB failed boom"))
                    return


async def test_export_publishes_in_batches_and_finishes_after_ok() -> None:
    sent = bodies_of(1000)
    async with running_gateway() as upstream:
        link = {
            "topic": "out",
            "to_topic": "up",
            "nsqd_tcp_addresses": [nsq_address(upstream)],
            "batch": 50,
        }
        async with running_gateway(nsq_export=[link]) as gw:
            status = status_of(gw)
            assert status.name == "nsq_export:out"
            await publish(gw, "out", sent)
            await wait_for(lambda: status.moved == 1000, "1000 moved")
            group = channel_of(gw, "out", "nsq_export")
            await wait_for(lambda: not group.in_flight, "every message finished")
            assert (group.finish_count, group.requeue_count, group.depth) == (1000, 0, 0)
            assert status.lag == 0 and status.in_flight == 0 and status.errors == 0
            assert sorted(await drain(upstream, "up", "c", 1000)) == sent


async def test_export_through_lookupd_publishes_to_an_nsqd_it_names() -> None:
    """No nsqd has the topic yet (/lookup names no producer): the link publishes to an
    nsqd the lookupd knows (/nodes), which makes the topic."""
    sent = bodies_of(100)
    async with running_gateway(http="127.0.0.1:0") as upstream:
        link = {
            "topic": "out",
            "lookupd_http_addresses": [http_base(upstream)],
            "lookupd_poll_interval": 0.05,
        }
        async with running_gateway(nsq_export=[link]) as gw:
            status = status_of(gw)
            await publish(gw, "out", sent)
            await wait_for(lambda: status.moved == 100, "100 moved")
            assert sorted(await drain(upstream, "out", "c", 100)) == sent


async def test_export_buries_what_nsqd_refuses_for_good_and_moves_the_rest() -> None:
    """A message nsqd refuses for what it is (bigger than its --max-msg-size; empty, as a
    beanstalkd job may be) would be refused again at every retry, with its batch: the
    batch's messages go alone, and the one refused alone is buried in the group."""
    good = bodies_of(38)
    big, empty = b"x" * 200, b""
    async with running_gateway(nsqd={"max_msg_size": 100}) as upstream:
        link = {"topic": "out", "nsqd_tcp_addresses": [nsq_address(upstream)], "batch": 10}
        async with running_gateway(nsq_export=[link]) as gw:
            status = status_of(gw)
            gw.broker.publish("out", [*good[:15], big, *good[15:30], empty, *good[30:]])
            await gw.broker.flush()
            group = channel_of(gw, "out", "nsq_export")
            await wait_for(lambda: status.moved == 38, "the 38 others moved", timeout=30)
            await wait_for(lambda: query.counts(group).buried == 2, "the two refused buried")
            buried = await query.first(gw.broker, group, "buried", 10)
            assert sorted(m.body for m in buried) == [empty, big]
            assert status.errors >= 2 and "E_BAD_MESSAGE" in status.last_error
            assert sorted(await drain(upstream, "out", "c", 38)) == good


async def test_export_gives_back_what_nsqd_refused_or_lost_and_retries() -> None:
    def script(connection: int, command: int) -> str:
        if connection == 1 and command == 1:
            return "error"  # the second batch of the first connection refused
        if connection == 2 and command == 0:
            return "drop"  # the second connection lost under the first batch
        return "ok"

    nsqd = ScriptedNSQD(script)
    sent = bodies_of(500)
    async with trio.open_nursery() as nursery:
        await nursery.start(nsqd.serve)
        link = {"topic": "out", "nsqd_tcp_addresses": [nsqd.address], "batch": 40}
        async with running_gateway(nsq_export=[link]) as gw:
            status = status_of(gw)
            await publish(gw, "out", sent)
            group = channel_of(gw, "out", "nsq_export")
            await wait_for(
                lambda: group.finish_count == 500 and not group.in_flight, "all finished"
            )
            got = [body for batch in nsqd.batches for body in batch]
            # nothing lost, nothing OK'd twice: what nsqd refused or lost went back
            assert sorted(got) == sent
            # requeued (with the batches sent after them), not deleted
            assert len(nsqd.refused) == 2
            assert group.requeue_count >= sum(map(len, nsqd.refused))
            assert all(1 <= len(batch) <= 40 for batch in nsqd.batches)
            assert max(map(len, nsqd.batches)) == 40  # MPUBs, not one PUB each
            assert status.errors == 2 and "closed the connection" in status.last_error
            assert status.moved == 500 and group.depth == 0 and status.state == "connected"
        nursery.cancel_scope.cancel()
