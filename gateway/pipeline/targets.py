"""Where a replay publishes: a URL parsed and checked on the driver, and a blocking
publisher per scheme that Spark's executors open once per partition.

* `nsq://HOST:PORT/TOPIC`: MPUB batches over NSQ's TCP protocol, by the small client below.
  pynsq (tornado) and gnsq (gevent) need their event loop, or monkey-patching, inside the
  executor's Python worker, and report outcomes through callbacks; a publisher that sends
  one MPUB and reads its one reply needs neither.
* `beanstalk://HOST:PORT/TUBE`: `use TUBE` and one `put` per message, by greenstalk
  (blocking, no event loop).
* `nats://HOST:PORT/SUBJECT`: PUBs by nats-py on an asyncio loop of the partition's own,
  then a flush (PING/PONG) so that the server has taken them all before the count is made.
* `http://HOST:PORT/TOPIC`: nsqd's `POST /mpub?topic=TOPIC&binary=true` by httpx.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote, urlsplit

from gateway.pipeline.session import PipelineError

SCHEMES = ("nsq", "beanstalk", "nats", "http")
CONNECT_SECONDS = 5.0
REPLY_SECONDS = 30.0
# An MPUB (or /mpub) carries at most this many messages and bytes: below nsqd's defaults
# (max-body-size 5 MiB), so that a default server takes every batch.
BATCH_MESSAGES = 500
BATCH_BYTES = 4 * 1024 * 1024

# the names each protocol accepts (nsqd's topic regexp, beanstalkd's tube name charset,
# a NATS subject without wildcards)
_NAMES = {
    "nsq": re.compile(r"[.a-zA-Z0-9_-]{1,64}(#ephemeral)?"),
    "http": re.compile(r"[.a-zA-Z0-9_-]{1,64}(#ephemeral)?"),
    "beanstalk": re.compile(r"[A-Za-z0-9+/;.$_()][A-Za-z0-9+/;.$_()-]{0,199}"),
    "nats": re.compile(r"[^\s.*>]+(\.[^\s.*>]+)*"),
}


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    name: str  # topic, tube or subject

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/{self.name}"

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme not in SCHEMES:
            raise PipelineError(
                f"--to {url!r}: the scheme must be one of {', '.join(s + '://' for s in SCHEMES)}"
            )
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            host = port = None
        if not host or port is None:
            raise PipelineError(f"--to {url!r}: needs a host and a port ({scheme}://HOST:PORT/...)")
        name = unquote(parts.path.removeprefix("/"))
        if parts.fragment:  # nsq://h:4150/t#ephemeral: the fragment is part of the name
            name += "#" + parts.fragment
        if not _NAMES[scheme].fullmatch(name) or parts.query:
            what = {"beanstalk": "tube", "nats": "subject"}.get(scheme, "topic")
            raise PipelineError(f"--to {url!r}: {name!r} is not a valid {what} name")
        return cls(scheme, host, port, name)

    def probe(self) -> None:
        """Fail now, before Spark starts, if nothing listens at the target."""
        try:
            socket.create_connection((self.host, self.port), CONNECT_SECONDS).close()
        except OSError as exc:
            raise PipelineError(f"--to {self.url}: cannot connect: {exc.strerror or exc}") from None

    def publisher(self) -> Publisher:
        return _PUBLISHERS[self.scheme](self)


class Publisher(Protocol):
    def publish(self, bodies: list[bytes]) -> None:
        """Publish every body, or raise (OSError, ReplayError): then only the first
        `ReplayError.done` of them count as published (none, for another error)."""

    def close(self) -> None: ...


class ReplayError(Exception):
    """The target refused a publish: the message is its reply. `done`: how many bodies of
    the batch it had confirmed before (a target that takes them one at a time)."""

    def __init__(self, message: str, done: int = 0) -> None:
        super().__init__(message)
        self.done = done


def batches(bodies: Iterable[bytes]) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    size = 0
    for body in bodies:
        if batch and (len(batch) >= BATCH_MESSAGES or size + len(body) > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(body)
        size += len(body) + 4
    if batch:
        yield batch


class NSQPublisher:
    def __init__(self, target: Target) -> None:
        self.topic = target.name.encode()
        self.sock = socket.create_connection((target.host, target.port), CONNECT_SECONDS)
        self.sock.settimeout(REPLY_SECONDS)
        self.sock.sendall(b"  V2")
        self.buf = b""

    def publish(self, bodies: list[bytes]) -> None:
        payload = b"".join(struct.pack(">i", len(b)) + b for b in bodies)
        command = b"MPUB %s\n" % self.topic
        self.sock.sendall(command + struct.pack(">ii", len(payload) + 4, len(bodies)) + payload)
        while True:
            ftype, data = self._frame()
            if ftype == 0 and data == b"_heartbeat_":
                self.sock.sendall(b"NOP\n")
                continue
            if ftype == 0 and data == b"OK":
                return
            raise ReplayError(data.decode(errors="replace"))

    def _frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buf) >= 8:
                size, ftype = struct.unpack_from(">ii", self.buf)
                if len(self.buf) >= 4 + size:
                    data = self.buf[8 : 4 + size]
                    self.buf = self.buf[4 + size :]
                    return ftype, data
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ReplayError("connection closed by the server")
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


class BeanstalkPublisher:
    def __init__(self, target: Target) -> None:
        import greenstalk

        self.client = greenstalk.Client((target.host, target.port), encoding=None, use=target.name)

    def publish(self, bodies: list[bytes]) -> None:
        import greenstalk

        for done, body in enumerate(bodies):
            try:
                self.client.put(body)  # answered INSERTED: confirmed, whatever comes next
            except greenstalk.Error as exc:  # JOB_TOO_BIG, DRAINING, ...
                raise ReplayError(type(exc).__name__, done) from None
            except OSError as exc:
                raise ReplayError(f"{exc.strerror or exc}", done) from None

    def close(self) -> None:
        self.client.close()


class NATSPublisher:
    def __init__(self, target: Target) -> None:
        import nats

        self.subject = target.name
        self.loop = asyncio.new_event_loop()
        self.nc = self.loop.run_until_complete(
            nats.connect(
                f"nats://{target.host}:{target.port}",
                connect_timeout=CONNECT_SECONDS,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                error_cb=self._ignore,
                closed_cb=self._nothing,
            )
        )

    @staticmethod
    async def _ignore(exc: Exception) -> None:
        pass  # raised by the calls below instead

    @staticmethod
    async def _nothing() -> None:
        pass

    def publish(self, bodies: list[bytes]) -> None:
        async def send() -> None:
            for body in bodies:
                await self.nc.publish(self.subject, body)
            await self.nc.flush(timeout=REPLY_SECONDS)

        self.loop.run_until_complete(send())

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.nc.close())
        finally:
            self.loop.close()


class HTTPPublisher:
    def __init__(self, target: Target) -> None:
        import httpx

        self.client = httpx.Client(
            base_url=f"http://{target.host}:{target.port}",
            timeout=httpx.Timeout(REPLY_SECONDS, connect=CONNECT_SECONDS),
        )
        self.params = {"topic": target.name, "binary": "true"}

    def publish(self, bodies: list[bytes]) -> None:
        payload = struct.pack(">i", len(bodies)) + b"".join(
            struct.pack(">i", len(b)) + b for b in bodies
        )
        reply = self.client.post("/mpub", params=self.params, content=payload)
        if reply.status_code != 200:
            raise ReplayError(f"HTTP {reply.status_code} {reply.text.strip()}")

    def close(self) -> None:
        self.client.close()


_PUBLISHERS: dict[str, type[Publisher]] = {
    "nsq": NSQPublisher,
    "beanstalk": BeanstalkPublisher,
    "nats": NATSPublisher,
    "http": HTTPPublisher,
}
