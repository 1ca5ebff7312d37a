"""A peer that resets its connection is normal: at most one log line, never a traceback.

Every listener gets clients that go away with a TCP reset (SO_LINGER 0, then close) at
the moments a real client dies: right after connecting, in the middle of a frame, after
a complete request whose reply is still being written, and for HTTP in the middle of a
body announced with a huge Content-Length. The gateway runs in-process; the test waits
until it has seen every reset (its connection gauges are back to zero, then every task
is idle) and reads what it logged.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct

import pytest
import trio
import trio.testing

from gateway.app import Gateway
from tests.helpers import running_gateway

_LISTENERS = {
    "nsq": "nsq",
    "beanstalk": "beanstalk",
    "nats": "nats",
    "nats_route": "nats-route",
    "http": "http",
}

# What each protocol's client has sent when it dies: nothing, half a frame, or a whole
# request (the reply may be on its way when the reset arrives).
_SENT: dict[str, tuple[bytes, ...]] = {
    "nsq": (
        b"",
        b"  V2",
        b"  V2PUB t\n" + struct.pack(">i", 1000) + b"x" * 10,
        b"  V2SUB t c\nRDY 10\n",
        b"  V2" + b"NOP\n" * 2000,
    ),
    "beanstalk": (
        b"",
        b"put 0 0 10 1000\r\nxx",
        b"use t\r\nwatch t\r\nreserve\r\n",
        b"list-tubes\r\n" * 2000,
    ),
    "nats": (
        b"",
        b"CONNECT {}\r\nPUB x 1000\r\nxx",
        b"CONNECT {}\r\nSUB > 1\r\nPING\r\n",
        b"CONNECT {}\r\n" + b"PING\r\n" * 5000,
    ),
    "nats-route": (
        b"",
        b'CONNECT {"verbose":false,"name":"X"}\r\nRMSG $G x 1000\r\nxx',
        b'CONNECT {"verbose":false,"name":"X"}\r\n' + b"PING\r\n" * 5000,
    ),
    "http": (
        b"",
        b"GET /stats HTTP/1.1\r\nHost: x\r\n",
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\nabc",
        b"POST /mpub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000000\r\n\r\nabc",
        b"GET /stats?format=json HTTP/1.1\r\nHost: x\r\n\r\n" * 200,
    ),
}


def _huge_upload(path: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n" % path


async def _reset(address: tuple[str, int], data: bytes, upload: int = 0) -> None:
    """Connect, send `data`, then reset; with `upload`, send that many more bytes and
    reset at once, while the gateway is still answering."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        await sock.connect(address)
        if data:
            await sock.send(data)
        if upload:
            with contextlib.suppress(OSError):  # the gateway may have closed already
                for _ in range(upload // 65536):
                    await sock.send(b"x" * 65536)
        else:
            # let the gateway read what was sent (and start answering) before the reset
            await trio.testing.wait_all_tasks_blocked(0.05)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # closed with linger 0: the kernel sends RST and drops anything unsent


async def _settled(gateway: Gateway) -> None:
    """Until the gateway has closed every connection it was told about, and is idle."""
    with trio.fail_after(10):
        while any(
            sample.value
            for metric in gateway.metrics.registry.collect()
            if metric.name == "gateway_connections"
            for sample in metric.samples
            if sample.name == "gateway_connections"
        ):
            await trio.sleep(0.01)
        await trio.testing.wait_all_tasks_blocked(0.1)


@pytest.mark.parametrize("protocol", sorted(_SENT))
async def test_a_reset_logs_one_line_at_most_and_no_traceback(
    protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    listeners = {key: "off" for key in _LISTENERS}
    key = next(k for k, name in _LISTENERS.items() if name == protocol)
    listeners[key] = "127.0.0.1:0"
    caplog.set_level(logging.DEBUG)
    async with running_gateway(**listeners) as gw:
        address = gw.addresses[protocol]
        caplog.clear()
        resets = 0
        for data in _SENT[protocol]:
            await _reset(address, data)
            resets += 1
        if protocol == "http":
            # the case that logged "Error in ASGI Framework" (trio.BusyResourceError): a
            # huge Content-Length, the body pouring in, the 413, then the reset
            for path in (b"/pub?topic=t", b"/mpub?topic=t", b"/mpub?topic=t&binary=true"):
                await _reset(address, _huge_upload(path), 131072)
                resets += 1
        await _settled(gw)
        records = [r for r in caplog.records if r.name.startswith(("gateway", "hypercorn"))]
        shown = [r for r in records if r.levelno >= logging.INFO]
        tracebacks = [r for r in records if r.exc_info or "Traceback" in r.getMessage()]
        assert not tracebacks, "\n".join(logging.Formatter().format(r) for r in tracebacks)
        assert len(shown) <= resets, [r.getMessage() for r in shown]
