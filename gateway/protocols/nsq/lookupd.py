"""Registration with nsqlookupd, as nsqd does it (--lookupd-tcp-address).

An NSQ cluster's consumers and nsqadmin find nsqds through nsqlookupd: each nsqd keeps one
TCP connection to every lookupd, says who it is (IDENTIFY: broadcast address, TCP and HTTP
ports), registers each topic and channel it has, unregisters them as they are deleted, and
PINGs every 15 s (a producer silent for 5 minutes is dropped from `/lookup`). When the
connection is lost, the lookupd forgets everything this nsqd registered; nsqd reconnects
and registers it all again. The gateway does the same, with every topic and group it has
whichever protocol made it: a beanstalkd tube is a topic, its workers' group a channel.

`Registrar` holds what every lookupd should know (the broker's topic and group names that
NSQ can use, kept current by `Broker.watch_names`); one `LookupdPeer` task per configured
address owns its connection and brings the lookupd's view up to it: on connecting,
everything; then each topic whose names changed since. Changes are compared by topic,
not replayed, so a burst of them costs a few commands and nothing is queued per change.

nsqd sends each command and waits for its response before the next (nsqd/lookup_peer.go);
so does a peer here. Any error response is fatal on nsqlookupd's side (it closes the
connection), so the peer reconnects with backoff, as it does when the connection is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from gateway.addresses import parse_address
from gateway.backoff import Backoff
from gateway.broker import query
from gateway.protocols.nsq import lookupd_codec as lc
from gateway.protocols.nsq.names import is_valid_name

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.metrics import Metrics

log = logging.getLogger("gateway.nsq.lookupd")

# nsqd's lookupLoop ticker: a PING every 15 s keeps the producer alive in the lookupd's
# view (its --inactive-producer-timeout is 300 s) and finds a dead connection.
PING_INTERVAL: Final = 15.0
# nsqd dials with a 1 s timeout and gives each read and write 1 s; a gateway registering
# thousands of names over a slow link needs more slack, and loses nothing by waiting.
CONNECT_TIMEOUT: Final = 5.0
RESPONSE_TIMEOUT: Final = 5.0
# Between connection attempts: from FIRST_RETRY, doubling up to MAX_RETRY (nsqd itself
# retries only at the next 15 s tick). A connection that stayed up STABLE_AFTER seconds
# starts the next backoff from the beginning.
FIRST_RETRY: Final = 0.1
MAX_RETRY: Final = 15.0
STABLE_AFTER: Final = 10.0

# how a peer opens its connection: trio.open_tcp_stream, or an in-memory pair in tests
Connect = Callable[[str, int], Awaitable[trio.abc.Stream]]


@dataclass(frozen=True, slots=True)
class Identity:
    """What IDENTIFY tells the lookupd, and through it every consumer and nsqadmin: where
    the gateway's NSQ TCP and HTTP listeners are reached, its nsqd version and hostname."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str
    version: str

    def body(self) -> dict[str, object]:
        # nsqd's connectCallback fields, no more: nsqlookupd requires all but hostname
        return {
            "broadcast_address": self.broadcast_address,
            "hostname": self.hostname,
            "http_port": self.http_port,
            "tcp_port": self.tcp_port,
            "version": self.version,
        }


def _nsq_name(name: str) -> bool:
    # a tube or subject NSQ cannot name (`a+b`, `orders.>`) is not announced: nsqlookupd
    # would answer E_BAD_TOPIC and close the connection
    return is_valid_name(name.encode("utf-8", "surrogateescape"))


class Registrar:
    """What every lookupd should have registered, and the peers that register it."""

    def __init__(
        self,
        broker: Broker,
        metrics: Metrics,
        addresses: list[str],
        identity: Callable[[], Identity],
        connect: Connect = trio.open_tcp_stream,
    ) -> None:
        self.broker = broker
        # topic -> its channels, both in creation order (the order a lookupd is told)
        self.wanted: dict[str, dict[str, None]] = {}
        # read at each connection: the listeners' ports are known only once bound
        self.identity = identity
        self.peers = [LookupdPeer(self, metrics, address, connect) for address in addresses]

    def attach(self) -> None:
        """Take the broker's names as they are now (the store's, once it is open) and hear
        of every change from here on."""
        broker = self.broker
        for topic in query.topic_names(broker):
            if _nsq_name(topic):
                self.wanted[topic] = dict.fromkeys(
                    g for g in query.group_names(broker, topic) if _nsq_name(g)
                )
        broker.watch_names(self._changed)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for peer in self.peers:
                nursery.start_soon(peer.run)
            task_status.started()

    def _changed(self, topic: str, group: str | None, made: bool) -> None:
        if not _nsq_name(topic) or (group is not None and not _nsq_name(group)):
            return
        channels = self.wanted.get(topic)
        if group is None:
            if made and channels is None:
                self.wanted[topic] = {}
            elif not made and channels is not None:
                del self.wanted[topic]
            else:
                return
        elif made:
            if channels is None:  # not heard of: a group can only be made in a topic
                channels = self.wanted[topic] = {}
            channels[group] = None
        elif channels is not None and group in channels:
            del channels[group]
        else:
            return
        for peer in self.peers:
            peer.touched(topic)


class _Ended(Exception):
    """One connection to a lookupd is over; the text says why, for the log."""


class LookupdPeer:
    """One lookupd: its connection, kept up for as long as the gateway runs, and what it
    has been told on the current one."""

    def __init__(
        self, registrar: Registrar, metrics: Metrics, address: str, connect: Connect
    ) -> None:
        self.registrar = registrar
        self._connect = connect
        self.address = address  # as configured: the metrics label, the log's name
        self.host, self.port = parse_address(address)
        self._connected_gauge = metrics.lookupd_connected.labels(address)
        self._errors = metrics.lookupd_errors.labels(address)
        self._connected_gauge.set(0)
        self.connected = False
        # what the lookupd has registered from this connection: topic -> channels
        self.registered: dict[str, set[str]] = {}
        # topics whose names changed since the lookupd was last brought up to date
        self._touched: dict[str, None] = {}
        self._wake = trio.Event()
        self._failing = False  # a failure was logged: the next ones are debug only

    def touched(self, topic: str) -> None:
        """The names of `topic` changed: bring the lookupd up to date when connected."""
        if self.connected:
            self._touched[topic] = None
            self._wake.set()

    async def run(self) -> None:
        backoff = Backoff(FIRST_RETRY, MAX_RETRY, STABLE_AFTER)
        while True:
            started = trio.current_time()
            try:
                await self._connection()
            except _Ended as why:
                self._errors.inc()
                self._lost(str(why))
            finally:
                self.connected = False
                self._connected_gauge.set(0)
            backoff.lasted(trio.current_time() - started)
            await trio.sleep(backoff.next())

    def _lost(self, why: str) -> None:
        where = f"nsqlookupd {self.address}"
        if self._failing:
            log.debug("%s: %s", where, why)
            return
        self._failing = True
        log.warning("%s: %s; retrying with backoff", where, why)

    async def _connection(self) -> None:
        """Connect, identify, register everything, then keep the lookupd up to date and
        PING it until the connection ends (raises _Ended)."""
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                stream = await self._connect(self.host, self.port)
        except (OSError, trio.TooSlowError) as exc:
            raise _Ended(f"cannot connect: {exc or 'timed out'}") from None
        ended: list[str] = []
        send, responses = trio.open_memory_channel[lc.Response](1)
        async with stream, trio.open_nursery() as nursery:
            # Reading all the time, not only after a command: a lookupd that restarts
            # closes the connection, and the gateway registers again at once instead of
            # at its next PING.
            nursery.start_soon(self._read, stream, send, ended, nursery.cancel_scope)
            try:
                await self._converse(stream, responses)
            except _Ended as why:
                ended.append(str(why))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                ended.append(f"connection lost: {exc}")
            nursery.cancel_scope.cancel()
        raise _Ended(ended[0] if ended else "connection closed")

    async def _read(
        self,
        stream: trio.abc.Stream,
        send: trio.MemorySendChannel[lc.Response],
        ended: list[str],
        scope: trio.CancelScope,
    ) -> None:
        reader = lc.ResponseReader()
        try:
            while data := await stream.receive_some(65536):
                for response in reader.receive_data(data):
                    await send.send(response)
            ended.append("connection closed by the lookupd")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            ended.append(f"connection lost: {exc}")
        except lc.LookupdProtocolError as exc:
            ended.append(f"not an nsqlookupd: {exc}")
        scope.cancel()

    async def _command(
        self,
        stream: trio.abc.Stream,
        responses: trio.MemoryReceiveChannel[lc.Response],
        command: bytes,
    ) -> lc.Response:
        await stream.send_all(command)
        try:
            with trio.fail_after(RESPONSE_TIMEOUT):
                response = await responses.receive()
        except trio.TooSlowError:
            raise _Ended(f"no response to {_shown(command)} in {RESPONSE_TIMEOUT} s") from None
        if response.is_error:
            # nsqlookupd closes the connection after any error
            raise _Ended(f"{_shown(command)} refused: {response.data.decode('utf-8', 'replace')}")
        return response

    async def _converse(
        self, stream: trio.abc.Stream, responses: trio.MemoryReceiveChannel[lc.Response]
    ) -> None:
        identity = self.registrar.identity()
        answer = await self._command(stream, responses, lc.MAGIC + lc.identify(identity.body()))
        info = answer.identity()
        self.connected = True
        self.registered = {}
        self._touched = dict.fromkeys(self.registrar.wanted)
        self._connected_gauge.set(1)
        self._failing = False
        log.info(
            "nsqlookupd %s (version %s): identified as %s, TCP %d, HTTP %d",
            self.address,
            info.get("version", "?"),
            identity.broadcast_address,
            identity.tcp_port,
            identity.http_port,
        )
        next_ping = trio.current_time() + PING_INTERVAL
        while True:
            self._wake = trio.Event()
            while self._touched:
                topic = next(iter(self._touched))
                del self._touched[topic]
                await self._bring_up_to_date(stream, responses, topic)
            with trio.move_on_at(next_ping):
                await self._wake.wait()
            if trio.current_time() >= next_ping:
                await self._command(stream, responses, lc.PING)
                next_ping = trio.current_time() + PING_INTERVAL

    async def _bring_up_to_date(
        self,
        stream: trio.abc.Stream,
        responses: trio.MemoryReceiveChannel[lc.Response],
        topic: str,
    ) -> None:
        """The commands that make the lookupd's view of `topic` what is wanted now; what
        changes while they are sent touches the topic again."""
        wanted = self.registrar.wanted.get(topic)
        have = self.registered.get(topic)
        if wanted is None:
            if have is None:
                return
            # channels first, as nsqd deletes them with their topic: UNREGISTER of the
            # topic alone would drop them too, with a warning in the lookupd's log
            for channel in sorted(have):
                await self._command(stream, responses, lc.unregister(topic, channel))
                have.discard(channel)
            await self._command(stream, responses, lc.unregister(topic))
            del self.registered[topic]
            return
        channels = list(wanted)
        if have is None:
            have = self.registered[topic] = set()
            if not channels:
                await self._command(stream, responses, lc.register(topic))
                return
            # as nsqd on connecting: a topic with channels is registered through them
            # (REGISTER topic channel registers the topic too)
        for channel in sorted(have - set(channels)):
            await self._command(stream, responses, lc.unregister(topic, channel))
            have.discard(channel)
        for channel in channels:
            if channel not in have:
                await self._command(stream, responses, lc.register(topic, channel))
                have.add(channel)


def _shown(command: bytes) -> str:
    """A command as the log names it: its line, without IDENTIFY's body or the magic."""
    line = command.removeprefix(lc.MAGIC).split(b"\n", 1)[0]
    return line.decode("utf-8", "replace")
