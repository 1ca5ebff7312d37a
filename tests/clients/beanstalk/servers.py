"""For the beanstalkd client tests: a real beanstalkd on an ephemeral port, and the command
lines of the client scripts in this directory."""

from __future__ import annotations

import errno
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

HERE = Path(__file__).resolve().parent
NODE_DIR = HERE.parent / "node"
BEANSTALKD = "/usr/bin/beanstalkd"

Address = tuple[str, int]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _accepts(address: Address, proc: trio.Process, timeout: float) -> bool:
    """Wait until `address` accepts a connection; False if the process exited first."""
    with trio.fail_after(timeout):
        while proc.poll() is None:
            try:
                stream = await trio.open_tcp_stream(*address)
            except OSError as exc:
                if exc.errno not in (errno.ECONNREFUSED, None):
                    raise
                await trio.sleep(0.01)
                continue
            await stream.aclose()
            return True
    return False


@asynccontextmanager
async def real_beanstalkd(*flags: str) -> AsyncIterator[Address]:
    """/usr/bin/beanstalkd on 127.0.0.1 and a free port; killed (by pid) afterwards."""
    if not Path(BEANSTALKD).is_file():
        pytest.fail(f"{BEANSTALKD} is missing (apt-get install beanstalkd)")
    for _attempt in range(5):
        address = ("127.0.0.1", _free_port())
        proc = await trio.lowlevel.open_process(
            [BEANSTALKD, "-l", address[0], "-p", str(address[1]), *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            if await _accepts(address, proc, timeout=10):
                yield address
                return
        finally:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
    raise RuntimeError("beanstalkd did not start (port taken five times?)")


def python_script(name: str, scenario: str, address: Address, *options: Any) -> list[str]:
    host, port = address
    return [
        sys.executable,
        str(HERE / name),
        scenario,
        "--host",
        host,
        "--port",
        str(port),
        *(str(o) for o in options),
    ]


def greenstalk(scenario: str, address: Address, *options: Any) -> list[str]:
    return python_script("greenstalk_client.py", scenario, address, *options)


def pystalk(scenario: str, address: Address, *options: Any) -> list[str]:
    return python_script("pystalk_client.py", scenario, address, *options)


def fivebeans(scenario: str, address: Address, *options: Any) -> list[str]:
    """`node fivebeans_client.js ...`; fails (never skips) without node or the npm install."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the fivebeans tests need Node.js 20")
    if not (NODE_DIR / "node_modules" / "fivebeans" / "package.json").is_file():
        pytest.fail(
            f"fivebeans is not installed in {NODE_DIR}/node_modules: "
            "run `npm ci --prefix tests/clients/node` first"
        )
    host, port = address
    args: Sequence[str] = [scenario, "--host", host, "--port", str(port)]
    return [node, str(HERE / "fivebeans_client.js"), *args, *(str(o) for o in options)]
