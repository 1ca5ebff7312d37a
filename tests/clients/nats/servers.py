"""For the NATS client tests: a real nats-server on an ephemeral port, the command lines of the
client scripts in this directory, and a subprocess wrapper that reports a script's readiness.

Every script prints JSON lines on stdout: ``{"ready": true}`` once its subscriptions are known
to the server (a subscriber or responder), then one result line when it is done. A test waits
for the ready line (an event, never a sleep) before it starts the publisher.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from tests.clients import peer_server

HERE = Path(__file__).resolve().parent
NODE_DIR = HERE.parent / "node"
NATS_SERVER = str(Path(sys.prefix) / "bin" / "nats-server")  # the venv's, 2.15.1
DEBIAN_NATS_SERVER = "/usr/sbin/nats-server"  # Debian 12's, 2.9.10 (apt, by the test command)

Address = peer_server.Address


@asynccontextmanager
async def real_nats_server(*flags: str, binary: str = NATS_SERVER) -> AsyncIterator[Address]:
    """A real nats-server (the venv's 2.15.1 unless told) on 127.0.0.1 and a free port;
    killed (by pid) after."""
    async with peer_server.running(
        binary, lambda a: ["-a", a[0], "-p", str(a[1]), *flags], f"nats-server {binary}"
    ) as address:
        yield address


def natspy(scenario: str, address: Address, *options: Any) -> list[str]:
    host, port = address
    script = str(HERE / "natspy_client.py")
    args = [scenario, "--host", host, "--port", str(port), *(str(o) for o in options)]
    return [sys.executable, script, *args]


def natsjs(scenario: str, address: Address, *options: Any) -> list[str]:
    return peer_server.node_script(HERE / "natsjs_client.js", "nats", scenario, address, options)


def command(client: str, scenario: str, address: Address, *options: Any) -> list[str]:
    return (natspy if client == "natspy" else natsjs)(scenario, address, *options)


@dataclass
class Script:
    """One client script in a subprocess; `ready` is set when it prints its ready line."""

    name: str
    process: trio.Process
    lines: list[str] = field(default_factory=list)
    stderr: bytearray = field(default_factory=bytearray)
    ready: trio.Event = field(default_factory=trio.Event)
    exited: trio.Event = field(default_factory=trio.Event)

    async def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        buf = b""
        async for chunk in self.process.stdout:
            buf += chunk
            *whole, buf = buf.split(b"\n")
            for raw in whole:
                line = raw.decode(errors="replace")
                self.lines.append(line)
                if line.startswith('{"ready"'):
                    self.ready.set()
        if buf:
            self.lines.append(buf.decode(errors="replace"))

    async def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        async for chunk in self.process.stderr:
            self.stderr += chunk

    async def _pump(self) -> None:
        proc = self.process
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_stdout)
                nursery.start_soon(self._read_stderr)
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        await pipe.aclose()
            self.exited.set()
            self.ready.set()  # a script that died before its ready line must not hang a test

    def _failure(self, what: str) -> AssertionError:
        out = "\n".join(self.lines)
        err = self.stderr.decode(errors="replace")
        return AssertionError(
            f"{self.name} {what} (exit code {self.process.returncode})\n"
            f"--- stdout (tail) ---\n{out[-4000:]}\n--- stderr (tail) ---\n{err[-4000:]}"
        )

    async def wait_ready(self, timeout: float = 20.0) -> None:
        with trio.move_on_after(timeout):
            await self.ready.wait()
        if self.exited.is_set() and not any(x.startswith('{"ready"') for x in self.lines):
            raise self._failure("exited before it was ready")
        if not self.ready.is_set():
            raise self._failure(f"was not ready after {timeout} s")

    async def stop(self) -> None:
        """Close the script's stdin: a script that runs until stdin closes reports and exits."""
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    async def result(self) -> dict[str, Any]:
        """Wait for the exit; the last JSON line, or AssertionError with the output."""
        await self.exited.wait()
        parsed = None
        if self.lines:
            try:
                parsed = json.loads(self.lines[-1])
            except ValueError:
                parsed = None
        if self.process.returncode != 0 or not isinstance(parsed, dict):
            raise self._failure("failed")
        return parsed


async def spawn(nursery: trio.Nursery, cmd: Sequence[str], name: str = "") -> Script:
    proc = await trio.lowlevel.open_process(
        list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    script = Script(name or f"{Path(cmd[1]).name} {cmd[2]}", proc)
    nursery.start_soon(script._pump)
    return script


async def run(cmd: Sequence[str], name: str = "") -> dict[str, Any]:
    """Run a script to completion; its JSON result."""
    async with trio.open_nursery() as nursery:
        script = await spawn(nursery, cmd, name)
        return await script.result()
