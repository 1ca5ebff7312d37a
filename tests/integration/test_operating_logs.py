"""What a running gateway tells its operator in its log, read from a real `gateway serve`
process's stderr: the start-up facts, connections, refused commands of every protocol
(a few lines per client, however much garbage it sends), HTTP write actions, the access
log, and the JSON format that log pipelines read.

One process serves the whole module; it starts on a data directory that a first gateway
left messages in, so that its recovery line has something to count.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import trio

from gateway import __version__
from gateway.app import Gateway
from tests.helpers import RawBeanstalk, RawNSQ, be32, running_gateway

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    lines: list[str] = field(default_factory=list)
    addresses: dict[str, tuple[str, int]] = field(default_factory=dict)

    def records(self) -> list[dict[str, Any]]:
        """The log records so far (the `listening` contract lines are plain text)."""
        return [json.loads(line) for line in list(self.lines) if line.startswith("{")]

    def messages(self) -> list[str]:
        """The messages of every logger but the access log's."""
        return [r["msg"] for r in self.records() if r["logger"] != "gateway.http.access"]

    async def wait_for(self, match: Callable[[str], bool], what: str) -> list[str]:
        """Every log message that `match`es, once there is one (10 s at most)."""
        with trio.fail_after(10):
            while True:
                found = [m for m in self.messages() if match(m)]
                if found:
                    return found
                await trio.sleep(0.01)

    def gateway(self) -> Gateway:
        """What the raw client helpers read of a gateway: its listeners' addresses."""
        return cast(Gateway, SimpleNamespace(addresses=self.addresses))


def peer(stream: trio.SocketStream) -> str:
    """How the gateway names this client: its host:port."""
    host, port = stream.socket.getsockname()[:2]
    return f"{host}:{port}"


async def _seed(data_dir: Path) -> None:
    """A first gateway on `data_dir`: 3 messages ready on kept/ch and one deferred."""
    async with running_gateway(store=None, data_dir=str(data_dir)) as gw:
        sub = await RawNSQ.connect(gw)
        await sub.send(b"SUB kept ch\n")
        assert await sub.frame() == (0, b"OK")
        await sub.aclose()
        pub = await RawNSQ.connect(gw)
        for i in range(3):
            await pub.send(b"PUB kept\n" + be32(3) + b"m-%d" % i)
            assert await pub.frame() == (0, b"OK")
        await pub.send(b"DPUB kept 600000\n" + be32(5) + b"later")
        assert await pub.frame() == (0, b"OK")
        await pub.aclose()


@pytest.fixture(scope="module")
def gateway_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    data_dir = tmp_path_factory.mktemp("operating-logs")
    trio.run(_seed, data_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--data-dir", str(data_dir),
         "--nsq", "127.0.0.1:0", "--http", "127.0.0.1:0", "--beanstalk", "127.0.0.1:0",
         "--nats", "127.0.0.1:0", "--nats-route", "off", "--rocketmq", "off",
         "--log-level", "debug", "--log-format", "json", "--access-log"],
        stderr=subprocess.PIPE, cwd=REPO, env={**os.environ},
    )  # fmt: skip
    running = Process(proc)
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            running.lines.append(line)
            if line.startswith("listening protocol="):
                fields = dict(kv.split("=", 1) for kv in line.split()[1:])
                host, _, port = fields["address"].rpartition(":")
                running.addresses[fields["protocol"]] = (host, int(port))
            elif '"msg": "ready: ' in line:
                ready.set()
        ready.set()  # the process ended: the test says what is missing

    threading.Thread(target=read, daemon=True).start()
    assert ready.wait(20), running.lines
    assert proc.poll() is None, "\n".join(running.lines)
    yield running
    proc.send_signal(signal.SIGTERM)
    proc.wait(20)


def test_start_up_says_version_config_store_recovery_and_archive(gateway_process: Process) -> None:
    records = gateway_process.records()
    assert records, gateway_process.lines
    for r in records:  # --log-format json: every log line is one object
        assert set(r) >= {"time", "level", "logger", "msg"} and r["time"].endswith("Z")
    messages = [r["msg"] for r in records]
    assert f"gateway {__version__} starting, config file: none" in messages
    [store] = [m for m in messages if m.startswith("store: ")]
    assert store.startswith("store: sqlite at ") and "gateway.db" in store
    assert store.endswith("fsync: every 50 ms")
    assert "archive: off" in messages
    assert (
        "recovered 4 messages (ready 3, deferred 1, reserved 0, buried 0) in 1 topics, 1 groups"
        in messages
    )
    listening = [ln for ln in gateway_process.lines if ln.startswith("listening protocol=")]
    assert {ln.split()[1] for ln in listening} >= {
        f"protocol={p}" for p in ("nsq", "http", "beanstalk", "nats")
    }


async def test_connections_and_protocol_errors_are_logged_per_client(
    gateway_process: Process,
) -> None:
    gw = gateway_process.gateway()
    # NSQ: garbage after the magic is E_INVALID, and the connection ends
    nsq = await RawNSQ.connect(gw)
    nsq_peer = peer(nsq.stream)
    await nsq.send(b"GARBAGE\n")
    kind, data = await nsq.frame()
    assert kind == 1 and data.startswith(b"E_INVALID")
    assert await nsq.closed()
    # beanstalkd: 30 unknown commands in a row get a few log lines, not 30
    bs = await RawBeanstalk.connect(gw)
    bs_peer = peer(bs.stream)
    await bs.send(b"frobnicate\r\n" * 30)
    for _ in range(30):
        assert await bs.reply() == b"UNKNOWN_COMMAND\r\n"
    assert await bs.call(b"use fine\r\n") == b"USING fine\r\n"  # the connection lives on
    # NATS: an unknown operation
    nats = await trio.open_tcp_stream(*gateway_process.addresses["nats"])
    nats_peer = peer(nats)
    await nats.send_all(b"CONNECT {}\r\nBOGUS\r\n")
    buf = b""
    with trio.fail_after(5):
        while b"-ERR" not in buf:
            buf += await nats.receive_some(4096)
    await nats.aclose()

    opened = await gateway_process.wait_for(
        lambda m: m == f"nsq connection from {nsq_peer} opened", "NSQ open"
    )
    assert opened
    await gateway_process.wait_for(lambda m: m == f"nsq connection from {nsq_peer} closed", "")
    [nsq_error] = await gateway_process.wait_for(
        lambda m: m.startswith(f"nsq client {nsq_peer}: protocol error"), "NSQ error"
    )
    assert "replied E_INVALID" in nsq_error
    await gateway_process.wait_for(lambda m: m.startswith(f"nats client {nats_peer}:"), "")
    [nats_error] = [m for m in gateway_process.messages() if nats_peer in m and "error" in m]
    assert "Unknown Protocol Operation" in nats_error
    bs_errors = [
        m for m in gateway_process.messages() if m.startswith(f"beanstalk client {bs_peer}")
    ]
    # five at once, then one every ten seconds: 30 bad commands in a burst give 5 lines
    assert len(bs_errors) == 5, bs_errors
    assert all(m.endswith("protocol error, replied UNKNOWN_COMMAND") for m in bs_errors)
    await bs.aclose()
    await gateway_process.wait_for(lambda m: m == f"beanstalk connection from {bs_peer} closed", "")


async def test_http_refusals_writes_and_the_access_log(gateway_process: Process) -> None:
    host, port = gateway_process.addresses["http"]
    base = f"http://{host}:{port}"
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{base}/no/such/page")).status_code == 404
        created = await client.post(f"{base}/topic/create?topic=made")
        assert created.status_code == 200
        assert (await client.post(f"{base}/pub?topic=made", content=b"data")).status_code == 200
        assert (await client.post(f"{base}/topic/empty?topic=missing")).status_code == 404
    await gateway_process.wait_for(lambda m: "/topic/empty?topic=missing" in m, "refusal")
    messages = gateway_process.messages()
    assert any(
        m.startswith("http client 127.0.0.1:")
        and m.endswith("GET /no/such/page refused, replied 404 NOT_FOUND")
        for m in messages
    ), messages
    [write] = [m for m in messages if m.startswith("http write POST /topic/create?topic=made")]
    assert " from 127.0.0.1:" in write and write.endswith("token none: 200")
    # a refused write is a refusal, not a write action; a publish is data, not an action
    assert not any(
        m.startswith(("http write POST /topic/empty", "http write POST /pub")) for m in messages
    )
    access = [r for r in gateway_process.records() if r["logger"] == "gateway.http.access"]
    assert any('"GET /no/such/page HTTP/1.1" 404' in r["msg"] for r in access), access
    assert any('"POST /topic/create?topic=made HTTP/1.1" 200 0' in r["msg"] for r in access)


async def test_admin_actions_say_what_they_dropped(gateway_process: Process) -> None:
    host, port = gateway_process.addresses["http"]
    api = f"http://{host}:{port}/admin/api"
    async with httpx.AsyncClient() as client:
        published = await client.post(f"{api}/publish?topic=kept", content=b"one more")
        assert published.status_code == 200
        empty = await client.post(f"{api}/empty?topic=kept&group=ch")
        assert empty.json()["dropped"] == {"ready": 4, "in_flight": 0, "deferred": 1, "buried": 0}
        headers = {"authorization": "Bearer anything"}  # no token is set: any goes
        deleted = await client.post(f"{api}/delete?topic=kept", headers=headers)
        assert deleted.status_code == 200
    [line] = await gateway_process.wait_for(lambda m: "/admin/api/delete" in m, "delete")
    assert line.startswith("http write POST /admin/api/delete?topic=kept from 127.0.0.1:")
    assert line.endswith(
        "token used: 200, delete kept: 0 messages dropped"
        " (ready 0, in_flight 0, deferred 0, buried 0)"
    )
    [empty_line] = [m for m in gateway_process.messages() if "/admin/api/empty" in m]
    assert empty_line.endswith(
        "token none: 200, empty kept/ch: 5 messages dropped"
        " (ready 4, in_flight 0, deferred 1, buried 0)"
    )
    [pub_line] = [m for m in gateway_process.messages() if "/admin/api/publish" in m]
    assert "published message" in pub_line and "(8 B) to kept" in pub_line
