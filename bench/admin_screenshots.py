"""Screenshots of the admin page for the documentation, from a gateway with live traffic.

    .venv/bin/python bench/admin_screenshots.py [--out docs/images] [--seconds 40]

Starts a gateway in this process (a SQLite store in a temporary directory, the history
sampled every second so that a short run fills the charts), drives traffic for
`--seconds`: NSQ publishes to `orders` at a rate that rises and falls, one NSQ consumer
finishes what channel `billing` gets while channel `audit` has none and grows, beanstalkd
puts to `jobs` and a worker deletes most of them, NATS publishes to `events`. Then opens
the page in headless Chromium at 1366x768 and saves admin-overview.png (the overview
with its history), admin-node.png (the node panel) and admin-confirm.png (the question
an empty asks).
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from gateway import config
from gateway.app import Gateway
from gateway.http.history import History

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]


def _settings(data_dir: str) -> config.Settings:
    return config.Settings.model_validate(
        {
            "data_dir": data_dir,
            "nsq": "127.0.0.1:0",
            "http": "127.0.0.1:0",
            "https": "off",
            "beanstalk": "127.0.0.1:0",
            "nats": "127.0.0.1:0",
            "nats_route": "off",
            "rocketmq": "off",
        }
    )


async def _nsq(gw: Gateway) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(*gw.addresses["nsq"])
    await stream.send_all(b"  V2")
    return stream


async def frames(stream: trio.SocketStream) -> AsyncIterator[tuple[int, bytes]]:
    """NSQ frames as they come: (frame type, data)."""
    buf = b""
    while data := await stream.receive_some(65536):
        buf += data
        while len(buf) >= 8:
            size, kind = struct.unpack(">ii", buf[:8])
            if len(buf) < 4 + size:
                break
            yield kind, buf[8 : 4 + size]
            buf = buf[4 + size :]


async def publisher(gw: Gateway, seconds: float) -> None:
    stream = await _nsq(gw)
    replies = frames(stream)
    end = trio.current_time() + seconds
    n = 0
    while trio.current_time() < end:
        # a rate that rises and falls: 20 to 180 messages a second
        rate = 100 + 80 * math.sin(trio.current_time() / 4)
        batch = max(1, int(rate / 10))
        bodies = [b"order %d" % (n + i) for i in range(batch)]
        n += batch
        payload = struct.pack(">i", len(bodies)) + b"".join(
            struct.pack(">i", len(b)) + b for b in bodies
        )
        await stream.send_all(b"MPUB orders\n" + struct.pack(">i", len(payload)) + payload)
        await anext(replies)
        await trio.sleep(0.1)


async def consumer(gw: Gateway) -> None:
    stream = await _nsq(gw)
    await stream.send_all(b"SUB orders billing\nRDY 50\n")
    async for kind, data in frames(stream):
        if kind == 0 and data == b"_heartbeat_":
            await stream.send_all(b"NOP\n")
        elif kind == 2:
            await stream.send_all(b"FIN " + data[10:26] + b"\n")


async def beanstalk(gw: Gateway, seconds: float) -> None:
    producer = await trio.open_tcp_stream(*gw.addresses["beanstalk"])
    worker = await trio.open_tcp_stream(*gw.addresses["beanstalk"])
    await producer.send_all(b"use jobs\r\n")
    await worker.send_all(b"watch jobs\r\n")
    end = trio.current_time() + seconds
    i = 0
    while trio.current_time() < end:
        body = b"resize image %d" % i
        await producer.send_all(b"put 100 0 60 %d\r\n%s\r\n" % (len(body), body))
        await producer.receive_some(4096)
        if i % 5:  # the worker keeps up with four jobs in five
            await worker.send_all(b"reserve-with-timeout 0\r\n")
            reply = await worker.receive_some(4096)
            if reply.startswith(b"RESERVED"):
                await worker.send_all(b"delete %s\r\n" % reply.split()[1])
                await worker.receive_some(4096)
        i += 1
        await trio.sleep(0.05)


async def nats(gw: Gateway, seconds: float) -> None:
    stream = await trio.open_tcp_stream(*gw.addresses["nats"])
    await stream.send_all(b'CONNECT {"verbose":false}\r\n')
    end = trio.current_time() + seconds
    while trio.current_time() < end:
        await stream.send_all(b"PUB events 11\r\nuser signup\r\n" * 3)
        await trio.sleep(0.1)


def _shoot(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.goto(url)
            row = 'tr.group[data-topic="orders"][data-group="audit"]'
            page.wait_for_selector(row)
            page.wait_for_function(
                f"() => Number(document.querySelector('{row} svg.chart').dataset.points) >= 10"
                f" && document.querySelector('{row} [data-field=in_rate]')"
                ".textContent !== '\\u2013'"
            )
            page.screenshot(path=out / "admin-overview.png")
            box = page.locator("#node").bounding_box()
            assert box is not None
            # the node panel with the header above it: the facts an operator reads first
            page.screenshot(
                path=out / "admin-node.png",
                clip={"x": 0, "y": 0, "width": 1366, "height": box["y"] + box["height"] + 8},
            )
            page.click(f'{row} button[data-action="empty"]')
            page.wait_for_selector("dialog#confirm[open]")
            page.screenshot(path=out / "admin-confirm.png")
            page.click("#confirm-cancel")
        finally:
            browser.close()


async def main(out: Path, seconds: float) -> None:
    with tempfile.TemporaryDirectory(prefix="gateway-shots-") as data_dir:
        gw = Gateway(_settings(data_dir))
        gw.history = History(gw.broker, interval=1.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(gw.serve)
            audit = await _nsq(gw)  # channel audit exists, and nobody reads it
            await audit.send_all(b"SUB orders audit\n")
            nursery.start_soon(consumer, gw)
            # still running while the page is shot: live rates beside the history
            nursery.start_soon(publisher, gw, seconds + 60)
            nursery.start_soon(beanstalk, gw, seconds + 60)
            nursery.start_soon(nats, gw, seconds + 60)
            await trio.sleep(seconds)
            host, port = gw.addresses["http"]
            out.mkdir(parents=True, exist_ok=True)
            await trio.to_thread.run_sync(_shoot, f"http://{host}:{port}/", out)
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    p.add_argument("--seconds", type=float, default=40.0)
    args = p.parse_args()
    trio.run(main, args.out, args.seconds)
