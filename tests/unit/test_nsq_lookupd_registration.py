"""The nsqlookupd registration client on Trio's MockClock: in-memory streams to the
stand-in's protocol, no sockets. PINGs every 15 s, backoff between attempts, what is
registered as topics and groups come and go, everything again on a new connection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from gateway.broker import Broker
from gateway.metrics import Metrics
from gateway.protocols.nsq.lookupd import FIRST_RETRY, MAX_RETRY, PING_INTERVAL, Identity, Registrar
from tests import lookupd_standin
from tests.helpers import running_broker
from tests.lookupd_standin import Database, LookupdConnection, converse

IDENTITY = Identity("127.0.0.1", 4150, 4151, "gw-host", "1.3.0")


@dataclass
class MemoryLookupd:
    """The stand-in's protocol behind in-memory streams; records when each line came."""

    nursery: trio.Nursery
    db: Database = field(default_factory=Database)
    refuse: int = 0  # connection attempts still to fail
    attempts: list[float] = field(default_factory=list)
    lines: list[tuple[float, bytes]] = field(default_factory=list)
    conns: list[trio.abc.Stream] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        self.attempts.append(trio.current_time())
        if self.refuse:
            self.refuse -= 1
            raise OSError(111, "Connection refused")
        client, server = trio.testing.memory_stream_pair()
        self.conns.append(server)
        self.nursery.start_soon(self._serve, server, len(self.conns))
        return client

    async def _serve(self, stream: trio.abc.Stream, n: int) -> None:
        conn = LookupdConnection(
            self.db, f"conn{n}", hostname="h", broadcast_address="l", tcp_port=1, http_port=2
        )
        seen = 0

        def changed() -> None:  # when each command came, on the mock clock
            nonlocal seen
            self.lines += [(trio.current_time(), c) for c in conn.commands[seen:]]
            seen = len(conn.commands)
            self.changed.set()
            self.changed = trio.Event()

        await converse(conn, stream, changed)

    async def until(self, condition: Callable[[], bool]) -> None:
        with trio.fail_after(600):  # clock seconds: MockClock jumps
            while not condition():
                await self.changed.wait()

    def registered(self) -> dict[str, set[str]]:
        return lookupd_standin.registered(self.db)

    def commands(self) -> list[bytes]:
        return [line for _, line in self.lines]


@asynccontextmanager
async def registered(
    broker: Broker, lookupd_refuses: int = 0
) -> AsyncIterator[tuple[MemoryLookupd, Registrar, Metrics]]:
    async with trio.open_nursery() as nursery:
        lookupd = MemoryLookupd(nursery, refuse=lookupd_refuses)
        metrics = Metrics()
        registrar = Registrar(
            broker, metrics, ["127.0.0.1:4160"], lambda: IDENTITY, connect=lookupd.connect
        )
        registrar.attach()
        await nursery.start(registrar.run)
        yield lookupd, registrar, metrics
        nursery.cancel_scope.cancel()


def sample(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"lookupd": "127.0.0.1:4160"})


async def test_identifies_registers_what_exists_and_pings_every_15_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_broker() as broker:
        broker.group("orders", "billing")
        broker.group("orders", "audit")
        broker.topic("bare")
        broker.topic("not+nsq")  # a beanstalkd tube NSQ cannot name: left out
        async with registered(broker) as (lookupd, _, metrics):
            await lookupd.until(lambda: sum(c == b"PING" for c in lookupd.commands()) == 3)
            start = lookupd.lines[0][0]
            assert lookupd.commands()[:4] == [
                b"IDENTIFY",
                b"REGISTER orders billing",
                b"REGISTER orders audit",
                b"REGISTER bare",
            ]
            info = lookupd.db.registrations[("client", "", "")]["conn1"]
            assert {k: info[k] for k in IDENTITY.body()} == IDENTITY.body()
            pings = [t - start for t, c in lookupd.lines if c == b"PING"]
            assert pings == [PING_INTERVAL, 2 * PING_INTERVAL, 3 * PING_INTERVAL]
            assert lookupd.registered() == {"orders": {"billing", "audit"}, "bare": set()}
            assert sample(metrics, "gateway_nsqlookupd_connected") == 1
            assert sample(metrics, "gateway_nsqlookupd_connection_errors_total") == 0


async def test_topics_and_groups_are_registered_and_unregistered_as_they_change(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_broker() as broker, registered(broker) as (lookupd, _, _):
        await lookupd.until(lambda: lookupd.commands() == [b"IDENTIFY"])
        topic = broker.topic("t")
        assert topic is not None
        await lookupd.until(lambda: lookupd.registered() == {"t": set()})
        topic.group("c1")
        topic.group("c2")
        await lookupd.until(lambda: lookupd.registered() == {"t": {"c1", "c2"}})
        topic.delete_group("c1")
        await lookupd.until(lambda: lookupd.registered() == {"t": {"c2"}})
        broker.delete_topic("t")
        await lookupd.until(lambda: lookupd.registered() == {})
        assert lookupd.commands() == [
            b"IDENTIFY",
            b"REGISTER t",
            b"REGISTER t c1",
            b"REGISTER t c2",
            b"UNREGISTER t c1",
            # its channels first, then the topic, as nsqd deletes them
            b"UNREGISTER t c2",
            b"UNREGISTER t",
        ]


async def test_changes_between_two_commands_are_compared_not_replayed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_broker() as broker, registered(broker) as (lookupd, _, _):
        await lookupd.until(lambda: lookupd.commands() == [b"IDENTIFY"])
        # made and deleted before the peer runs: the lookupd need not hear of it
        broker.group("gone", "c")
        broker.delete_topic("gone")
        broker.group("kept", "c")
        await lookupd.until(lambda: lookupd.registered() == {"kept": {"c"}})
        assert lookupd.commands() == [b"IDENTIFY", b"REGISTER kept c"]


async def test_backoff_between_attempts_and_everything_again_after_a_lost_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_broker() as broker:
        broker.group("t", "c")
        async with registered(broker, lookupd_refuses=9) as (lookupd, _, metrics):
            await lookupd.until(lambda: lookupd.registered() == {"t": {"c"}})
            waits = [b - a for a, b in zip(lookupd.attempts, lookupd.attempts[1:], strict=False)]
            expected = [min(FIRST_RETRY * 2**i, MAX_RETRY) for i in range(9)]
            assert waits == pytest.approx(expected)
            assert sample(metrics, "gateway_nsqlookupd_connection_errors_total") == 9
            # the lookupd restarts: it forgets this producer; the gateway registers again
            await lookupd.conns[-1].aclose()
            lookupd.db = Database()
            await lookupd.until(lambda: sample(metrics, "gateway_nsqlookupd_connected") == 0)
            broker.group("t", "c2")  # made while disconnected
            await lookupd.until(lambda: lookupd.registered() == {"t": {"c", "c2"}})
            assert sample(metrics, "gateway_nsqlookupd_connection_errors_total") == 10
            assert sample(metrics, "gateway_nsqlookupd_connected") == 1
            assert lookupd.commands()[-3:] == [b"IDENTIFY", b"REGISTER t c", b"REGISTER t c2"]


async def test_an_error_response_ends_the_connection_and_it_is_made_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_broker() as broker:
        identities = iter([Identity("", 4150, 4151, "h", "1.3.0")])  # refused: no address

        def identity() -> Identity:
            return next(identities, IDENTITY)

        async with trio.open_nursery() as nursery:
            lookupd = MemoryLookupd(nursery)
            metrics = Metrics()
            registrar = Registrar(
                broker, metrics, ["127.0.0.1:4160"], identity, connect=lookupd.connect
            )
            registrar.attach()
            broker.topic("t")
            await nursery.start(registrar.run)
            await lookupd.until(lambda: lookupd.registered() == {"t": set()})
            assert len(lookupd.attempts) == 2
            assert sample(metrics, "gateway_nsqlookupd_connection_errors_total") == 1
            nursery.cancel_scope.cancel()
