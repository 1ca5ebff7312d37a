"""The gateway registers with nsqlookupd as nsqd does (--lookupd-tcp-address), against the
stand-in lookupd (tests/lookupd_standin.py, its bytes checked against the real one):
names made over NSQ and beanstalkd are registered, deleted ones unregistered, everything
registered again after the lookupd restarts, and the metrics count it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import trio

from gateway.app import Gateway
from tests.helpers import RawBeanstalk, RawNSQ, http_base, running_gateway
from tests.integration.test_cli import _start, _stop
from tests.lookupd_standin import StandInLookupd


@asynccontextmanager
async def registered_gateway(
    lookupd: StandInLookupd, **overrides: object
) -> AsyncIterator[Gateway]:
    settings: dict[str, object] = {"http": "127.0.0.1:0", "beanstalk": "127.0.0.1:0"}
    settings.update(overrides)
    async with running_gateway(nsqd__lookupd_tcp_addresses=[lookupd.address], **settings) as gw:
        yield gw


def sample(gw: Gateway, name: str, lookupd: StandInLookupd) -> float | None:
    return gw.metrics.registry.get_sample_value(name, {"lookupd": lookupd.address})


async def test_names_from_nsq_and_beanstalkd_are_registered_and_unregistered() -> None:
    lookupd = StandInLookupd()
    async with trio.open_nursery() as nursery:
        await lookupd.start(nursery)
        async with (
            registered_gateway(lookupd) as gw,
            httpx.AsyncClient(base_url=http_base(gw)) as http,
        ):
            await lookupd.wait_for(lambda: len(lookupd.producers()) == 1)
            (producer,) = lookupd.producers()
            assert producer["broadcast_address"] == "127.0.0.1"
            assert producer["tcp_port"] == gw.addresses["nsq"][1]
            assert producer["http_port"] == gw.addresses["http"][1]
            assert producer["hostname"] == gw.nsq.hostname
            assert producer["version"] == "1.3.0"

            nsq = await RawNSQ.connect(gw)
            await nsq.send(b"SUB orders billing\n")
            assert await nsq.frame() == (0, b"OK")
            await lookupd.wait_for(lambda: lookupd.registered().get("orders") == {"billing"})

            # a tube is a topic, its workers' group a channel
            bean = await RawBeanstalk.connect(gw)
            assert await bean.call(b"use jobs\r\n") == b"USING jobs\r\n"
            await lookupd.wait_for(lambda: "jobs" in lookupd.registered())
            assert await bean.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"
            await lookupd.wait_for(lambda: lookupd.registered().get("jobs") == {"beanstalk"})
            # a tube NSQ cannot name is not sent (nsqlookupd would refuse it and close)
            assert await bean.call(b"use a+b\r\n") == b"USING a+b\r\n"

            reply = await http.post(
                "/channel/delete", params={"topic": "orders", "channel": "billing"}
            )
            assert reply.status_code == 200
            await lookupd.wait_for(lambda: lookupd.registered().get("orders") == set())
            # the tube goes with its last worker and its last user
            await bean.aclose()
            await lookupd.wait_for(lambda: "jobs" not in lookupd.registered())
            reply = await http.post("/topic/delete", params={"topic": "orders"})
            assert reply.status_code == 200
            await lookupd.wait_for(lambda: "orders" not in lookupd.registered())

            commands = lookupd.commands()
            assert b"UNREGISTER orders billing" in commands
            assert b"UNREGISTER orders" in commands
            assert not any(b"a+b" in c for c in commands)
            assert lookupd.connects == 1
            await nsq.aclose()
        nursery.cancel_scope.cancel()


async def test_everything_is_registered_again_after_the_lookupd_restarts() -> None:
    lookupd = StandInLookupd()
    async with trio.open_nursery() as nursery:
        await lookupd.start(nursery)
        # no beanstalkd listener: its default tube would be registered too
        async with registered_gateway(lookupd, beanstalk="off") as gw:
            gw.broker.group("orders", "billing")
            gw.broker.topic("bare")
            wanted = {"orders": {"billing"}, "bare": set()}
            await lookupd.wait_for(lambda: lookupd.registered() == wanted)
            assert sample(gw, "gateway_nsqlookupd_connected", lookupd) == 1
            assert sample(gw, "gateway_nsqlookupd_connection_errors_total", lookupd) == 0

            lookupd.stop()  # killed: the connection and the listener go at once
            # made while the lookupd is away: told once it is back
            gw.broker.group("orders", "audit")
            await lookupd.start(nursery)  # the same port, an empty database
            wanted["orders"].add("audit")
            await lookupd.wait_for(lambda: lookupd.registered() == wanted)
            assert sample(gw, "gateway_nsqlookupd_connected", lookupd) == 1
            # the lost connection, and any attempt refused before the restart
            errors = sample(gw, "gateway_nsqlookupd_connection_errors_total", lookupd)
            assert errors is not None and errors >= 1
            assert lookupd.connects == 2
            async with httpx.AsyncClient(base_url=http_base(gw)) as http:
                text = (await http.get("/metrics")).text
            assert f'gateway_nsqlookupd_connected{{lookupd="{lookupd.address}"}} 1.0' in text
        nursery.cancel_scope.cancel()


async def test_the_flags_of_a_gateway_process() -> None:
    lookupd = StandInLookupd()
    async with trio.open_nursery() as nursery:
        await lookupd.start(nursery)
        proc, _ = await _start(
            "--nsq", "127.0.0.1:0", "--http", "127.0.0.1:0", "--beanstalk", "off",
            "--nats", "off", "--nats-route", "off", "--rocketmq", "off",
            "--store", "memory://",
            "--lookupd-tcp-address", lookupd.address,
            "--lookupd-tcp-address", "127.0.0.1:9",  # nothing there: retried, counted
            "--broadcast-address", "gw.example",
            marker=b"listening protocol=http",
        )  # fmt: skip
        try:
            await lookupd.wait_for(lambda: len(lookupd.producers()) == 1, timeout=10)
            (producer,) = lookupd.producers()
            assert producer["broadcast_address"] == "gw.example"
        finally:
            assert await _stop(proc) == 0
        nursery.cancel_scope.cancel()
