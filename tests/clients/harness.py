"""Running the client scripts from trio tests: subprocesses, their JSON results, checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.app import Gateway
from gateway.protocols.nsq.session import NSQSession
from tests.clients import corpus

CLIENTS_DIR = Path(__file__).resolve().parent
NODE_DIR = CLIENTS_DIR / "node"
PYTHON_CLIENTS = ("pynsq", "gnsq", "ansq")
ALL_CLIENTS = (*PYTHON_CLIENTS, "nsqjs")
USER_AGENTS = {
    "pynsq": "pynsq/0.9.1",
    "gnsq": "gnsq/1.0.2",
    "ansq": "ansq/",
    "nsqjs": "nsqjs/0.13.0",
}


def node_command() -> list[str]:
    """`node nsqjs_client.js`; fails (never skips) when node or the npm install is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the nsqjs client tests need Node.js 20")
    if not (NODE_DIR / "node_modules" / "nsqjs" / "package.json").is_file():
        pytest.fail(
            f"nsqjs is not installed in {NODE_DIR}/node_modules: "
            "run `npm ci --prefix tests/clients/node` first"
        )
    return [node, str(NODE_DIR / "nsqjs_client.js")]


def command(client: str, mode: str, gateway: Gateway, topic: str, *options: Any) -> list[str]:
    host, port = gateway.addresses["nsq"]
    if client == "nsqjs":
        base = node_command()
    else:
        base = [sys.executable, str(CLIENTS_DIR / f"{client}_client.py")]
    args = [mode, "--host", host, "--port", str(port), "--topic", topic]
    return [*base, *args, *(str(o) for o in options)]


@dataclass
class ClientProcess:
    """One client script in a subprocess; its stdout and stderr are collected as it runs."""

    name: str
    process: trio.Process
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exited: trio.Event = field(default_factory=trio.Event)

    async def _pump(self) -> None:
        proc = self.process
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_drain, proc.stdout, self.stdout)
                nursery.start_soon(_drain, proc.stderr, self.stderr)
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

    async def stop(self) -> None:
        """Close the script's stdin: a `--count 0` consumer finishes and reports."""
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    async def result(self) -> dict[str, Any]:
        """Wait for the exit; the JSON line it printed, or AssertionError with its stderr."""
        await self.exited.wait()
        lines = self.stdout.decode(errors="replace").strip().splitlines()
        try:
            parsed = json.loads(lines[-1]) if lines else None
        except ValueError:
            parsed = None
        if self.process.returncode != 0 or not isinstance(parsed, dict):
            raise AssertionError(
                f"{self.name} exited with {self.process.returncode}\n"
                f"--- stdout (tail) ---\n{_tail(self.stdout)}\n"
                f"--- stderr (tail) ---\n{_tail(self.stderr)}"
            )
        return parsed


async def _drain(stream: trio.abc.ReceiveStream | None, into: bytearray) -> None:
    assert stream is not None
    async for chunk in stream:
        into += chunk


def _tail(data: bytearray, size: int = 4000) -> str:
    text = data.decode(errors="replace")
    return text if len(text) <= size else "..." + text[-size:]


async def spawn(nursery: trio.Nursery, cmd: Sequence[str], name: str = "") -> ClientProcess:
    proc = await trio.lowlevel.open_process(
        list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    client = ClientProcess(name or Path(cmd[1]).name + " " + cmd[2], proc)
    nursery.start_soon(client._pump)
    return client


async def run(cmd: Sequence[str], name: str = "") -> dict[str, Any]:
    """Run a script to completion; its JSON result."""
    async with trio.open_nursery() as nursery:
        client = await spawn(nursery, cmd, name)
        return await client.result()


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait for gateway state that the test cannot get an event for (a count reaching N)."""
    with trio.move_on_after(timeout) as scope:
        while not predicate():
            await trio.sleep(0.005)
    if scope.cancelled_caught:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# -- corpus and checks ---------------------------------------------------------------------------


def write_corpus(tmp_path: Path, bodies: list[bytes], name: str = "bodies.bin") -> Path:
    path = tmp_path / name
    corpus.write_bodies(path, bodies)
    return path


def digests(bodies: Iterable[bytes]) -> Counter[str]:
    return Counter(corpus.digest(b) for b in bodies)


def received(result: dict[str, Any]) -> Counter[str]:
    return Counter(sha for _attempts, sha in result["deliveries"])


def assert_published(result: dict[str, Any], commands: int) -> None:
    assert result["errors"] == [], result["errors"]
    assert result["commands"] == commands
    assert result["ok"] == commands


def assert_same_bodies(got: Counter[str], want: Counter[str]) -> None:
    """Multiset equality with a short report (sizes of the differences) instead of 5000 hashes."""
    missing = want - got
    extra = got - want
    assert not missing and not extra, (
        f"{sum(missing.values())} bodies missing, {sum(extra.values())} unexpected or duplicated "
        f"(got {sum(got.values())}, want {sum(want.values())})"
    )


def group(gateway: Gateway, topic: str, channel: str) -> Any:
    return gateway.broker.topics[topic].groups[channel]


def has_consumers(gateway: Gateway, topic: str, channel: str, n: int = 1) -> Callable[[], bool]:
    def check() -> bool:
        t = gateway.broker.topics.get(topic)
        g = t.groups.get(channel) if t is not None else None
        return g is not None and len(g.consumers) >= n

    return check


def finished(gateway: Gateway, topic: str, channel: str, n: int) -> Callable[[], bool]:
    def check() -> bool:
        t = gateway.broker.topics.get(topic)
        g = t.groups.get(channel) if t is not None else None
        return g is not None and g.finish_count >= n

    return check


def assert_drained(gateway: Gateway, topic: str, channel: str, n: int) -> None:
    """The channel finished exactly `n` messages and holds nothing (ready, deferred, in flight)."""
    g = group(gateway, topic, channel)
    assert g.finish_count == n
    assert g.depth == 0
    assert not g.in_flight
    assert not g.deferred


# -- what the gateway saw ------------------------------------------------------------------------


class _SessionLog(set[NSQSession]):
    """Stands in for NSQServer.sessions and also keeps every session after it has ended."""

    def __init__(self, current: set[NSQSession]) -> None:
        super().__init__(current)
        self.seen: list[NSQSession] = list(current)

    def add(self, session: NSQSession) -> None:
        self.seen.append(session)
        super().add(session)


def record_sessions(gateway: Gateway) -> list[NSQSession]:
    """Every NSQ session the gateway runs from now on, with its negotiated state (user_agent,
    tls, snappy, deflate, msg_timeout), still readable after the connection closed."""
    log = _SessionLog(gateway.nsq.sessions)
    gateway.nsq.sessions = log
    return log.seen


def assert_client_sessions(sessions: list[NSQSession], client: str, minimum: int = 1) -> None:
    """Only `client` talked to the gateway (IDENTIFY's user_agent), at least `minimum` times."""
    agents = [s.user_agent for s in sessions]
    assert len(agents) >= minimum, agents
    assert all(a.startswith(USER_AGENTS[client]) for a in agents), agents


def tls_files(directory: Path) -> tuple[str, str, str]:
    """A trustme CA and a server certificate for 127.0.0.1 and localhost: (cert, key, ca)."""
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_path = directory / "server.pem", directory / "server.key", directory / "ca.pem"
    cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_path))
    return str(cert), str(key), str(ca_path)


def assert_clean(result: dict[str, Any]) -> None:
    """A run with no errors and no dropped connections."""
    assert result["errors"] == [], result["errors"]
    assert result["closes"] == 0, result.get("close_reasons")
    assert not result.get("timed_out")
