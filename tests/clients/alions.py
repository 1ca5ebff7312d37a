"""ali-ons (npm, unmodified) from trio tests: node/rocketmq_client.js in subprocesses.

The gateway runs in the test's own event loop, so the node processes are awaited with
Trio. Each prints one JSON object per line; `AliOns` streams them as they come, so a test
can wait for `ready` before it produces, with no sleep.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from typing import Any

import pytest
import trio

from gateway.app import Gateway
from tests.clients.harness import NODE_DIR

SCRIPT = NODE_DIR / "rocketmq_client.js"


def b64(body: bytes) -> str:
    return base64.b64encode(body).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def name_server(gateway: Gateway) -> str:
    host, port = gateway.addresses["rocketmq"]
    return f"{host}:{port}"


def command(mode: str, options: dict[str, Any]) -> list[str]:
    """`node rocketmq_client.js MODE JSON`; fails (never skips) when ali-ons is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the ali-ons tests need Node.js 20")
    if not (NODE_DIR / "node_modules" / "ali-ons" / "package.json").is_file():
        pytest.fail(
            f"ali-ons is not installed in {NODE_DIR}/node_modules: "
            "run `npm ci --prefix tests/clients/node` first"
        )
    return [node, str(SCRIPT), mode, json.dumps(options)]


def message(body: bytes, tag: str | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"body": b64(body), "tag": tag}
    spec.update(extra)
    return spec


class AliOns:
    """One ali-ons process; its JSON lines arrive on `events` as they are printed."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[dict[str, Any]] = []
        self.stderr = bytearray()
        self._send, self.events = trio.open_memory_channel[dict[str, Any]](10000)

    async def _pump(self) -> None:
        proc = self.process
        assert proc.stdout is not None and proc.stderr is not None
        buf = b""

        async def errors() -> None:
            assert proc.stderr is not None
            async for chunk in proc.stderr:
                self.stderr += chunk

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(errors)
                async with self._send:
                    async for chunk in proc.stdout:
                        buf += chunk
                        while b"\n" in buf:
                            line, buf = buf.split(b"\n", 1)
                            if line.startswith(b"{"):
                                event = json.loads(line)
                                self.lines.append(event)
                                self._send.send_nowait(event)
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()

    async def until(self, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next event of this kind (earlier ones of other kinds are passed over)."""
        with trio.fail_after(timeout):
            async for event in self.events:
                if event["event"] == kind:
                    return event
                if event["event"] == "fatal":
                    raise AssertionError(f"ali-ons failed: {event}\n{self.stderr.decode()[-3000:]}")
        raise AssertionError(f"ali-ons ended before {kind}: {self.lines}\n{self.stderr[-3000:]!r}")

    async def wait(self, timeout: float = 60.0) -> int:
        with trio.fail_after(timeout):
            return await self.process.wait()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.lines if e["event"] == kind]


async def start(nursery: trio.Nursery, mode: str, options: dict[str, Any]) -> AliOns:
    proc = await trio.lowlevel.open_process(
        command(mode, options), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    client = AliOns(proc)
    nursery.start_soon(client._pump)
    return client


async def produce(
    gateway: Gateway, topic: str, messages: list[dict[str, Any]], timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Send the messages from one producer, in order; the send results."""
    options = {"nameSrv": name_server(gateway), "topic": topic, "messages": messages}
    async with trio.open_nursery() as nursery:
        client = await start(nursery, "produce", options)
        code = await client.wait(timeout)
    sent = client.of("sent")
    assert code == 0 and len(sent) == len(messages), (
        f"producer exited {code}: {client.lines}\n{client.stderr.decode()[-3000:]}"
    )
    return sent


def consumer_options(
    gateway: Gateway, topic: str, group: str, count: int, **extra: Any
) -> dict[str, Any]:
    options = {
        "nameSrv": name_server(gateway),
        "topic": topic,
        "group": group,
        "count": count,
        "timeoutMs": 30000,
    }
    options.update(extra)
    return options
