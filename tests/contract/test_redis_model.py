"""Two gateways sharing one Redis database (the default `redis://` mode) against a model of
the queue: hypothesis draws what clients of either gateway do to one topic (publish with
or without groups, add a group, deliver, finish, requeue with another priority or a
delay, bury, kick, delete and reserve by id, restart a gateway cleanly), and after every
step each model message must be where the model says, as either gateway finds it in
Redis (ready, reserved, delayed or buried; gone once finished or deleted), every
delivery the most urgent ready message of all, with its attempts counted.

A gateway claims only what its consumers have room for and gives back what they did not
take, so with one delivery asked for at a time nothing waits claimed in one gateway while
the other asks: the order is the queue's, whichever gateway delivers."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.broker import Broker, query
from gateway.broker.members import Consumer, Outcome
from gateway.stores import open_store
from tests.redis_server import RedisServer
from tests.unit.test_broker import Collector

GATEWAYS = 2
GROUPS = ("a", "b")
PRIORITIES = (0, 1024, 2000)
HOUR = 3600.0  # a delay nothing in a run waits out: delayed until kicked


@dataclass
class Held:
    """One group as the model has it: message id -> priority, per state; the gateway that
    holds each delivered one; deliveries per id."""

    ready: dict[int, int] = field(default_factory=dict)
    in_flight: dict[int, int] = field(default_factory=dict)
    holder: dict[int, int] = field(default_factory=dict)
    buried: dict[int, int] = field(default_factory=dict)
    deferred: dict[int, int] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)

    def state(self, msg_id: int) -> str | None:
        for name, queue in (
            ("ready", self.ready),
            ("reserved", self.in_flight),
            ("buried", self.buried),
            ("delayed", self.deferred),
        ):
            if msg_id in queue:
                return name
        return None


@dataclass
class Model:
    backlog: dict[int, int] = field(default_factory=dict)  # before any group: ready
    backlog_deferred: dict[int, int] = field(default_factory=dict)
    groups: dict[str, Held] = field(default_factory=dict)
    bodies: dict[int, bytes] = field(default_factory=dict)


Step = tuple[Any, ...]
gateways = st.integers(0, GATEWAYS - 1)
steps = st.one_of(
    st.tuples(
        st.just("publish"),
        gateways,
        st.integers(1, 5),
        st.sampled_from(PRIORITIES),
        st.booleans(),
    ),
    st.tuples(st.just("group"), gateways, st.sampled_from(GROUPS)),
    st.tuples(st.just("deliver"), gateways, st.sampled_from(GROUPS), st.integers(1, 3)),
    st.tuples(st.just("finish"), st.sampled_from(GROUPS), st.integers(0, 7)),
    st.tuples(
        st.just("requeue"),
        st.sampled_from(GROUPS),
        st.integers(0, 7),
        st.sampled_from((None, *PRIORITIES)),
        st.booleans(),
    ),
    st.tuples(st.just("bury"), st.sampled_from(GROUPS), st.integers(0, 7)),
    st.tuples(st.just("kick"), gateways, st.sampled_from(GROUPS)),
    st.tuples(st.just("delete"), gateways, st.sampled_from(GROUPS), st.integers(0, 20)),
    st.tuples(st.just("take"), gateways, st.sampled_from(GROUPS), st.integers(0, 20)),
    st.tuples(st.just("restart"), gateways),
)


class Gateway:
    """One gateway's broker on its own store and connection, in a nursery of its own."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.broker: Broker | None = None
        self.cancel: trio.CancelScope | None = None
        self.sinks: dict[str, Collector] = {}
        self.consumers: dict[str, Consumer] = {}

    async def start(self, nursery: trio.Nursery) -> None:
        broker = self.broker = Broker(open_store(self.url, self.tmp))
        await broker.open()
        self.sinks.clear()
        self.consumers.clear()

        async def run(task_status: trio.TaskStatus[None]) -> None:
            with trio.CancelScope() as self.cancel:
                await broker.run(task_status=task_status)

        await nursery.start(run)

    async def stop(self) -> None:
        """A clean stop: what this gateway held is ready in Redis again."""
        assert self.broker is not None and self.cancel is not None
        await self.broker.close()
        self.cancel.cancel()

    def consumer(self, name: str) -> tuple[Consumer, Collector]:
        assert self.broker is not None
        c = self.consumers.get(name)
        if c is None:
            sink = self.sinks[name] = Collector()
            c = self.consumers[name] = self.broker.group("t", name).attach(sink, HOUR)
        return c, self.sinks[name]


class Run:
    def __init__(self, url: str, tmp: Path) -> None:
        self.gateways = [Gateway(url, tmp) for _ in range(GATEWAYS)]

    async def run(self, model: Model, todo: list[Step]) -> None:
        async with trio.open_nursery() as nursery:
            for gw in self.gateways:
                await gw.start(nursery)
            for step in todo:
                await self.do(model, step, nursery)
                await self.check(model)
            await self.drain(model)
            for gw in self.gateways:
                await gw.stop()

    def broker(self, at: int) -> Broker:
        broker = self.gateways[at].broker
        assert broker is not None
        return broker

    async def do(self, model: Model, step: Step, nursery: trio.Nursery) -> None:
        kind = step[0]
        if kind == "publish":
            _, at, n, priority, delayed = step
            b = self.broker(at)
            first = len(model.bodies) + 1
            bodies = [b"m%d" % (first + k) for k in range(n)]
            msgs, _ = b.publish("t", bodies, priority=priority, delay=HOUR if delayed else 0)
            await b.flush()
            if delayed:
                into = [h.deferred for h in model.groups.values()] or [model.backlog_deferred]
            else:
                into = [h.ready for h in model.groups.values()] or [model.backlog]
            for m in msgs:
                model.bodies[m.id] = m.body
                for queue in into:
                    queue[m.id] = priority
        elif kind == "restart":
            gw = self.gateways[step[1]]
            await gw.stop()
            await gw.start(nursery)
            for held in model.groups.values():  # what it held is ready again
                for msg_id in [i for i, at in held.holder.items() if at == step[1]]:
                    held.ready[msg_id] = held.in_flight.pop(msg_id)
                    del held.holder[msg_id]
        elif kind == "group":
            _, at, name = step
            if name not in model.groups:
                held = model.groups[name] = Held()
                if len(model.groups) == 1:  # the first group takes the topic's backlog
                    held.ready, model.backlog = model.backlog, {}
                    held.deferred, model.backlog_deferred = model.backlog_deferred, {}
            self.broker(at).group("t", name)
            await self.broker(at).flush()
        elif kind == "deliver":
            _, at, name, n = step
            held = model.groups.get(name)
            if held is not None:
                for _ in range(min(n, len(held.ready))):
                    await self.deliver(model, held, at, name)
        elif kind in ("finish", "requeue", "bury"):
            await self.answer(model, step)
        else:
            await self.by_id(model, step)

    async def deliver(self, model: Model, held: Held, at: int, name: str) -> None:
        c, sink = self.gateways[at].consumer(name)
        want = min(held.ready, key=lambda i: (held.ready[i], i))
        seen = len(sink.got)
        c.set_ready(c.in_flight + 1)
        with trio.fail_after(10):
            await sink.until(seen + 1)
        c.set_ready(0)
        got = sink.got[-1]
        assert len(sink.got) == seen + 1
        assert (got.id, got.priority) == (want, held.ready[want]), (
            f"gateway {at} group {name} delivered {got.id} (priority {got.priority}), the"
            f" most urgent ready is {want} (priority {held.ready[want]})"
        )
        assert got.body == model.bodies[want]
        held.deliveries[want] = held.deliveries.get(want, 0) + 1
        assert got.attempts == held.deliveries[want]
        held.in_flight[want] = held.ready.pop(want)
        held.holder[want] = at

    async def answer(self, model: Model, step: Step) -> None:
        """finish, requeue or bury, by the gateway that holds the message."""
        kind, name, k = step[:3]
        held = model.groups.get(name)
        if held is None or not held.in_flight:
            return
        msg_id = sorted(held.in_flight)[k % len(held.in_flight)]
        at = held.holder.pop(msg_id)
        b = self.broker(at)
        g = b.group("t", name)
        was = held.in_flight.pop(msg_id)
        if kind == "finish":
            outcome = g.finish(None, msg_id)
        elif kind == "requeue":
            _, _, _, priority, delayed = step
            outcome = g.requeue(None, msg_id, HOUR if delayed else 0.0, priority)
            into = held.deferred if delayed else held.ready
            into[msg_id] = was if priority is None else priority
        else:
            outcome = g.bury(None, msg_id)
            held.buried[msg_id] = was
        assert outcome is Outcome.OK
        await b.flush()

    async def by_id(self, model: Model, step: Step) -> None:
        """kick, and beanstalkd's delete and reserve-job of a job any gateway left."""
        kind, at, name = step[:3]
        held = model.groups.get(name)
        if held is None:
            return
        b = self.broker(at)
        g = b.group("t", name)
        if kind == "kick":  # beanstalkd: the buried ones, or if none the delayed ones
            kicked = await b.kick(g, 1000)
            moved = held.buried or held.deferred
            assert kicked == len(moved)
            held.ready.update(moved)
            moved.clear()
            await b.flush()
            return
        waiting = {**held.ready, **held.buried, **held.deferred}
        if not waiting:
            return
        msg_id = sorted(waiting)[step[3] % len(waiting)]
        for queue in (held.ready, held.buried, held.deferred):
            queue.pop(msg_id, None)
        if kind == "delete":
            assert await b.delete_stored(g, msg_id)
        else:
            c, _ = self.gateways[at].consumer(name)
            got = await b.take_stored(g, c, msg_id)
            assert got is not None and (got.id, got.body) == (msg_id, model.bodies[msg_id])
            held.deliveries[msg_id] = held.deliveries.get(msg_id, 0) + 1
            assert got.attempts == held.deliveries[msg_id]
            held.in_flight[msg_id] = waiting[msg_id]
            held.holder[msg_id] = at
        await b.flush()

    async def check(self, model: Model) -> None:
        """Every message where the model has it, as each gateway finds it by id."""
        for name, held in model.groups.items():
            for gw in self.gateways:
                assert gw.broker is not None
                g = gw.broker.group("t", name)
                for msg_id in model.bodies:
                    found = await query.find_in(gw.broker, g, msg_id)
                    state = None if found is None else found.state
                    assert state == held.state(msg_id), (name, msg_id)

    async def drain(self, model: Model) -> None:
        """Every ready message comes out once, in order, through either gateway."""
        for name, held in model.groups.items():
            at = 0
            while held.ready:
                await self.deliver(model, held, at, name)
                at = (at + 1) % GATEWAYS


@settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(todo=st.lists(steps, min_size=5, max_size=40))
def test_two_gateways_on_one_redis_are_the_model(
    todo: list[Step], redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    redis_server.cli("FLUSHALL")
    run = Run(redis_server.url, tmp_path_factory.mktemp("shared"))
    trio.run(run.run, Model(), list(todo))
