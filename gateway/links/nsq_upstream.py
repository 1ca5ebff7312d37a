"""What both NSQ links share: finding the upstream nsqds (listed, or through nsqlookupd's
HTTP API as a pynsq Reader or go-nsq's ConnectToNSQLookupd does), opening a connection
to one (magic, IDENTIFY), reading its frames, and the backoff between attempts.

Discovery: `Upstream.poll()` asks every lookupd at once, then every
`lookupd_poll_interval` seconds: `GET /lookup?topic=` for the producers of a topic (each
reached at its `broadcast_address:tcp_port`), or `GET /nodes` for every nsqd a lookupd
knows. A lookupd that cannot be asked keeps the producers it named last, so one lookupd
restarting does not take nsqds away; a topic it does not know (404 TOPIC_NOT_FOUND) has
no producer there.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Final

import httpx
import trio

from gateway import __version__
from gateway.addresses import parse_address
from gateway.links import nsq_client as nc

if TYPE_CHECKING:
    from gateway.config_links import NSQUpstreamSettings

log = logging.getLogger("gateway.links")

CONNECT_TIMEOUT: Final = 5.0
IDENTIFY_TIMEOUT: Final = 5.0
LOOKUPD_TIMEOUT: Final = 5.0
_RECEIVE_SIZE: Final = 65536
# seconds without a byte from nsqd before its connection counts as dead: two of its
# default heartbeat intervals (30 s), as nsqd allows its clients
SILENCE: Final = 65.0

USER_AGENT: Final = f"gateway-link/{__version__}"

Connect = Callable[[str, int], Awaitable[trio.abc.Stream]]


class Ended(Exception):
    """One connection is over; the text says why, for the status and the log."""


def identify_fields() -> dict[str, object]:
    hostname = socket.gethostname()
    return {
        "client_id": hostname.split(".", 1)[0],
        "hostname": hostname,
        "user_agent": USER_AGENT,
        "feature_negotiation": True,
    }


class NSQConnection:
    """One connection to an nsqd, past its IDENTIFY: frames in, bytes out."""

    def __init__(self, address: str, stream: trio.abc.Stream) -> None:
        self.address = address
        self.stream = stream
        self.reader = nc.FrameReader()
        self.features: dict[str, object] = {}
        self._frames: list[nc.Frame] = []
        # the reading task answers heartbeats while another sends commands
        self._sending = trio.Lock()
        self.closed = False

    @classmethod
    async def open(cls, address: str, connect: Connect) -> NSQConnection:
        """Connect and IDENTIFY; raises Ended when that fails."""
        host, port = parse_address(address)
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                stream = await connect(host, port)
        except (OSError, trio.TooSlowError) as exc:
            raise Ended(f"cannot connect to {address}: {exc or 'timed out'}") from None
        conn = cls(address, stream)
        try:
            await conn.send(nc.MAGIC_V2 + nc.identify(identify_fields()))
            with trio.fail_after(IDENTIFY_TIMEOUT):
                answer = await conn.frame()
            if isinstance(answer, nc.ErrorFrame):
                raise Ended(f"{address} refused IDENTIFY: {answer}")
            if not isinstance(answer, nc.ResponseFrame):
                raise Ended(f"{address} answered IDENTIFY with a message")
            conn.features = nc.negotiated(answer)
        except trio.TooSlowError:
            await conn.aclose()
            raise Ended(f"{address} did not answer IDENTIFY in {IDENTIFY_TIMEOUT} s") from None
        except nc.NSQClientError as exc:
            await conn.aclose()
            raise Ended(f"{address} is not an nsqd: {exc}") from None
        except BaseException:
            await conn.aclose()
            raise
        return conn

    async def send(self, data: bytes) -> None:
        if self.closed:
            raise Ended(f"connection to {self.address} closed")
        try:
            async with self._sending:
                await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise Ended(f"connection to {self.address} lost: {exc}") from None

    async def frame(self) -> nc.Frame:
        """The next frame, heartbeats answered here (NOP) and not returned."""
        while True:
            while self._frames:
                frame = self._frames.pop(0)
                if isinstance(frame, nc.ResponseFrame) and frame.is_heartbeat:
                    await self.send(nc.NOP)
                    continue
                return frame
            await self._fill()

    async def frames(self) -> list[nc.Frame]:
        """Every frame one receive completed (at least one), heartbeats answered here."""
        out: list[nc.Frame] = []
        while not out:
            if not self._frames:
                await self._fill()
            frames, self._frames = self._frames, []
            for frame in frames:
                if isinstance(frame, nc.ResponseFrame) and frame.is_heartbeat:
                    await self.send(nc.NOP)
                else:
                    out.append(frame)
        return out

    async def _fill(self) -> None:
        try:
            with trio.fail_after(SILENCE):
                data = await self.stream.receive_some(_RECEIVE_SIZE)
        except trio.TooSlowError:
            raise Ended(f"{self.address} silent for {SILENCE:.0f} s") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise Ended(f"connection to {self.address} lost: {exc}") from None
        if not data:
            raise Ended(f"{self.address} closed the connection")
        try:
            self._frames.extend(self.reader.receive_data(data))
        except nc.NSQClientError as exc:
            raise Ended(f"{self.address} is not an nsqd: {exc}") from None

    async def aclose(self) -> None:
        self.closed = True
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _producers(body: bytes) -> list[tuple[str, str | None]]:
    """(host:tcp_port, host:http_port or None) of each producer in a /lookup or /nodes
    answer (nsqlookupd 1.x, or the 0.x envelope `{"status_code": 200, "data": {...}}`)."""
    value = json.loads(body)
    if isinstance(value, dict) and isinstance(value.get("data"), dict):
        value = value["data"]
    out = []
    for producer in value.get("producers") or []:
        host = producer.get("broadcast_address")
        port = producer.get("tcp_port")
        http = producer.get("http_port")
        if isinstance(host, str) and host and isinstance(port, int):
            out.append(
                (
                    _host_port(host, port),
                    _host_port(host, http) if isinstance(http, int) and http > 0 else None,
                )
            )
    return out


class Upstream:
    """The nsqds a link talks to: those configured, and those the lookupds name."""

    def __init__(
        self,
        settings: NSQUpstreamSettings,
        topic: str,
        on_change: Callable[[], None],
        *,
        any_node: bool = False,
        itself: Callable[[], Collection[str]] = tuple,
    ) -> None:
        self.static = list(settings.nsqd_tcp_addresses)
        # where the gateway itself is registered (broadcast_address:tcp_port), when it
        # joins the same lookupds: an import would consume what it publishes, an export
        # publish to itself, each without end
        self.itself = itself
        self.lookupds = list(settings.lookupd_http_addresses)
        self.poll_interval = settings.lookupd_poll_interval
        # for people (the link's status): the servers as configured
        self.configured = ", ".join([*self.static, *self.lookupds])
        self.topic = topic  # /lookup?topic= of it
        # when no lookupd lists a producer of the topic, every nsqd they know (/nodes): a
        # publisher may make the topic on any
        self.any_node = any_node
        self.on_change = on_change
        self.found: dict[str, list[str]] = {}  # lookupd -> producers it named last
        # nsqd (host:tcp_port) -> its HTTP API (host:http_port), as the lookupds say
        self.http: dict[str, str] = {}
        self.nodes: dict[str, list[str]] = {}  # lookupd -> every nsqd it knew last
        self.polled = trio.Event()  # set after the first round of polls

    @property
    def addresses(self) -> list[str]:
        """Every nsqd, configured first, then as the lookupds named them, no repeats."""
        seen = dict.fromkeys(self.static)
        itself = self.itself()
        for producers in self.found.values():
            seen.update(dict.fromkeys(p for p in producers if p not in itself))
        if self.any_node and len(seen) == len(self.static):
            for nodes in self.nodes.values():
                seen.update(dict.fromkeys(n for n in nodes if n not in itself))
        return list(seen)

    async def poll(self) -> None:
        """Ask the lookupds every poll interval, for as long as the link runs."""
        if not self.lookupds:
            self.polled.set()
            return
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(LOOKUPD_TIMEOUT), trust_env=False
        ) as client:
            while True:
                before = self.addresses
                async with trio.open_nursery() as nursery:
                    for lookupd in self.lookupds:
                        nursery.start_soon(self._ask, client, lookupd)
                self.polled.set()
                if self.addresses != before:
                    self.on_change()
                await trio.sleep(self.poll_interval)

    async def _ask(self, client: httpx.AsyncClient, lookupd: str) -> None:
        found = await _get(client, f"http://{lookupd}/lookup", {"topic": self.topic})
        if found is not None:
            self.found[lookupd] = [tcp for tcp, _ in found]
            self.http.update((tcp, http) for tcp, http in found if http is not None)
        if self.any_node:
            nodes = await _get(client, f"http://{lookupd}/nodes", {})
            if nodes is not None:
                self.nodes[lookupd] = [tcp for tcp, _ in nodes]


async def channel_depth(
    client: httpx.AsyncClient, http: str, topic: str, channel: str
) -> int | None:
    """The messages waiting in topic/channel on the nsqd whose HTTP API is at `http`
    (`/stats`: the channel's depth, memory and disk), or None if it could not be read."""
    try:
        reply = await client.get(
            f"http://{http}/stats",
            params={"format": "json", "topic": topic, "channel": channel},
        )
        reply.raise_for_status()
        value = reply.json()
        if isinstance(value.get("data"), dict):  # nsqd 0.x's envelope
            value = value["data"]
        return sum(
            int(ch["depth"])
            for t in value.get("topics") or []
            if t.get("topic_name") == topic
            for ch in t.get("channels") or []
            if ch.get("channel_name") == channel
        )
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.debug("nsqd %s /stats: %s", http, exc)
        return None


async def _get(
    client: httpx.AsyncClient, url: str, params: dict[str, str]
) -> list[tuple[str, str | None]] | None:
    """The producers a lookupd names at `url`; None when it could not be asked."""
    try:
        reply = await client.get(url, params=params, headers={"Accept": "application/json"})
        if reply.status_code == 404:
            return []  # it knows no such topic: no producer there
        reply.raise_for_status()
        return _producers(reply.content)
    except (httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
        log.debug("nsqlookupd %s: %s", url, exc)
        return None
