"""A real server as a test peer: started on 127.0.0.1 and a free port, killed by pid after."""

from __future__ import annotations

import errno
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

Address = tuple[str, int]


def free_port() -> int:
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
async def running(
    binary: str, argv: Callable[[Address], list[str]], missing: str
) -> AsyncIterator[Address]:
    """Run `binary` with `argv(address)`; retried on another port if the one picked was
    taken in between. A missing binary fails the test (it is installed by the test command)."""
    if not Path(binary).is_file():
        pytest.fail(f"{binary} is missing ({missing})")
    for _attempt in range(5):
        address = ("127.0.0.1", free_port())
        proc = await trio.lowlevel.open_process(
            [binary, *argv(address)],
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
    raise RuntimeError(f"{binary} did not start (port taken five times?)")


NODE_DIR = Path(__file__).resolve().parent / "node"


def node_script(
    script: Path, package: str, scenario: str, address: Address, options: tuple[object, ...]
) -> list[str]:
    """`node <script> <scenario> --host H --port P ...`; fails (never skips) without node or
    without `package` in tests/clients/node (the test command runs npm ci there)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"node is not on PATH: the {package} tests need Node.js 20")
    if not (NODE_DIR / "node_modules" / package / "package.json").is_file():
        pytest.fail(
            f"{package} is not installed in {NODE_DIR}/node_modules: "
            "run `npm ci --prefix tests/clients/node` first"
        )
    host, port = address
    return [node, str(script), scenario, "--host", host, "--port", str(port), *map(str, options)]
