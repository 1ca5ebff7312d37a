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
from gateway.broker.members import Consumer
from gateway.stores import open_store
from tests.contract import queue_model
from tests.contract.queue_model import GROUPS, HOUR, PRIORITIES, Held
from tests.redis_server import RedisServer
from tests.unit.test_broker import Collector

GATEWAYS = 2


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
    *queue_model.ANSWERS,
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
        where = f"gateway {at} group {name}"
        held.holder[await queue_model.deliver(c, sink, held, model.bodies, where)] = at

    async def answer(self, model: Model, step: Step) -> None:
        """finish, requeue or bury, by the gateway that holds the message."""
        kind, name, k = step[:3]
        held = model.groups.get(name)
        if held is None or not held.in_flight:
            return
        msg_id = sorted(held.in_flight)[k % len(held.in_flight)]
        b = self.broker(held.holder.pop(msg_id))
        priority, delayed = step[3:] if kind == "requeue" else (None, False)
        queue_model.answer(b.group("t", name), held, kind, msg_id, priority, delayed)
        await b.flush()

    async def by_id(self, model: Model, step: Step) -> None:
        """kick, and beanstalkd's delete and reserve-job of a job any gateway left."""
        kind, at, name = step[:3]
        held = model.groups.get(name)
        if held is None:
            return
        b = self.broker(at)
        g = b.group("t", name)
        if kind == "kick":
            await queue_model.kick(b, g, held)
        else:
            c = self.gateways[at].consumer(name)[0] if kind == "take" else None
            taken = await queue_model.by_id(b, g, held, kind, step[3], c, model.bodies)
            if taken is not None and kind == "take":
                held.holder[taken] = at
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
