"""The shared Redis store (the default `redis://` mode): brokers of several gateways claim
from one Redis database. Here two brokers in one process, each on its own store and
connection, on the session's real redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import trio.testing

from gateway.archive.read import read_archive
from gateway.archive.writer import Archive
from gateway.broker import Broker
from gateway.broker.claims import Claims
from gateway.broker.group import Consumer, Group
from gateway.model import Message
from gateway.stores import open_store
from tests.redis_server import RedisServer


class Finisher:
    """A consumer that finishes every message at once (or holds them: `hold`)."""

    def __init__(self, hold: bool = False) -> None:
        self.got: list[Message] = []
        self.hold = hold
        self.consumer: Consumer | None = None
        self.arrived = trio.Event()

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        self.got.append(message)
        self.arrived.set()
        if not self.hold:
            consumer.group.finish(consumer, message.id, pump=False)
        return True


@asynccontextmanager
async def gateway(url: str, tmp: Path, *, dies: bool = False) -> AsyncIterator[Broker]:
    """A gateway's broker for the block; `dies`: at the end its tasks stop and its
    connection closes with nothing given back (Redis's leases bring its claims back)."""
    broker = Broker(open_store(url, tmp))
    await broker.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        yield broker
        nursery.cancel_scope.cancel()
    if dies:
        await broker.journal.store.link.close()  # type: ignore[attr-defined]
    else:
        await broker.close()


async def until(predicate: object, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():  # type: ignore[operator]
            await trio.sleep(0.01)


async def the_rest_come_back(b: Broker, held: Finisher, finished: list[Message]) -> None:
    """Gateway B delivers exactly what a dead claimer held of group t/c and had not
    finished, each with its attempts counted (2)."""
    done = {m.id for m in finished}
    unfinished = sorted(m.id for m in held.got if m.id not in done)
    sb = Finisher()
    b.group("t", "c").attach(sb, 60).set_ready(1000)
    await until(lambda: len(sb.got) >= len(unfinished))
    await b.flush()
    assert sorted(m.id for m in sb.got) == unfinished
    assert all(m.attempts == 2 for m in sb.got)


async def test_two_gateways_share_a_channel_exactly_once(redis_url: str, tmp_path: Path) -> None:
    async with gateway(redis_url, tmp_path) as a, gateway(redis_url, tmp_path) as b:
        ga, gb = a.group("t", "c"), b.group("t", "c")
        sa, sb = Finisher(), Finisher()
        ga.attach(sa, 60).set_ready(5)
        gb.attach(sb, 60).set_ready(5)
        for i in range(0, 1000, 100):
            a.publish("t", [b"%d" % j for j in range(i, i + 100)])
            await a.flush()
        await until(lambda: len(sa.got) + len(sb.got) >= 1000)
        await trio.sleep(0.2)  # nothing more may come
        bodies = [m.body for m in sa.got + sb.got]
        assert sorted(bodies) == sorted(b"%d" % j for j in range(1000))
        assert sa.got and sb.got
        assert len({m.id for m in sa.got + sb.got}) == 1000


async def test_a_publish_on_one_gateway_wakes_an_idle_consumer_on_another(
    redis_url: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, tmp_path) as a, gateway(redis_url, tmp_path) as b:
        gb = b.group("t", "c")
        sb = Finisher()
        gb.attach(sb, 60).set_ready(1)
        await b.flush()
        await trio.sleep(0.1)  # b's claim found nothing: it is idle now
        a.topic("t")
        a.publish("t", [b"hello"])
        await a.flush()
        with trio.fail_after(0.5):  # far below the idle re-check (claims.REFRESH)
            await sb.arrived.wait()
        assert [m.body for m in sb.got] == [b"hello"]


async def test_a_dead_gateways_claims_come_back_with_attempts_counted(
    redis_url: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, tmp_path) as b:
        async with gateway(redis_url, tmp_path, dies=True) as a:
            ga = a.group("t", "c")
            held = Finisher(hold=True)
            ga.attach(held, 0.5).set_ready(10)
            a.publish("t", [b"%d" % i for i in range(10)])
            await a.flush()
            await until(lambda: len(held.got) == 10)
            await a.flush()
        gb = b.group("t", "c")
        sb = Finisher()
        gb.attach(sb, 60).set_ready(100)
        await until(lambda: len(sb.got) == 10)
        assert sorted(m.body for m in sb.got) == sorted(b"%d" % i for i in range(10))
        assert all(m.attempts == 2 for m in sb.got)


async def test_a_claim_is_one_entry_and_a_dead_claimers_unfinished_come_back(
    redis_url: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Range claims: 500 messages of five publishes, claimed at once, are one claim in
    Redis with nothing per message; finishing a third of them marks them in the claim;
    the claiming gateway dies, and another delivers exactly the other two thirds, attempts
    counted, and none of the finished."""
    cli = redis_server.cli
    async with gateway(redis_url, tmp_path) as b:
        async with gateway(redis_url, tmp_path, dies=True) as a:
            ga = a.group("t", "c")
            held = Finisher(hold=True)
            # deliveries time out after 1.5 s (the claim 1 s later), long after A died
            ca = ga.attach(held, 1.5)
            for k in range(5):
                a.publish("t", [b"%d" % (100 * k + i) for i in range(100)])
            await a.flush()
            ca.set_ready(500)
            await until(lambda: len(held.got) == 500)
            await a.flush()
            assert cli("ZCARD", "gw:{t}:c:c").strip() == "1"  # one run: one claim
            assert cli("ZCARD", "gw:{t}:f:c").strip() == "0"  # no claimed message...
            assert cli("HLEN", "gw:{t}:s:c").strip() == "0"  # ...and no fields of one
            assert cli("HGET", "gw:{t}:held", "c").strip() == "500"
            finished = held.got[::3]
            for m in finished:
                ga.finish(ca, m.id)
            await a.flush()
            assert cli("HGET", "gw:{t}:held", "c").strip() == str(500 - len(finished))
        await the_rest_come_back(b, held, finished)  # gateway A died holding the rest
        # every message finished now: no claim, no batch, nothing counted as held
        assert cli("EXISTS", "gw:{t}:c:c", "gw:{t}:e:c", "gw:{t}:m", "gw:{t}:x").strip() == "0"
        assert cli("HGET", "gw:{t}:held", "c").strip() in ("", "0")


async def test_registry_and_depth_are_the_same_on_every_gateway(
    redis_url: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, tmp_path) as a, gateway(redis_url, tmp_path) as b:
        a.group("orders", "audit")
        a.publish("orders", [b"x"] * 25)
        await a.flush()
        assert isinstance(b.queues, Claims) and isinstance(a.queues, Claims)
        await b.queues.refresh()
        await a.queues.refresh()
        gb = b.topics["orders"].groups["audit"]
        ga = a.topics["orders"].groups["audit"]
        assert gb.depth == ga.depth == 25
        gb.pause()
        await b.flush()
        await a.queues.refresh()
        assert ga.paused


async def test_requeue_and_bury_go_back_to_redis_for_any_gateway(
    redis_url: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, tmp_path) as a, gateway(redis_url, tmp_path) as b:
        ga = a.group("t", "c")
        held = Finisher(hold=True)
        ca = ga.attach(held, 60)
        ca.set_ready(2)
        a.publish("t", [b"one", b"two"])
        await a.flush()
        await until(lambda: len(held.got) == 2)
        one, two = held.got
        ca.set_ready(0)
        ga.requeue(ca, one.id, 0)
        ga.bury(ca, two.id)
        await a.flush()
        gb = b.group("t", "c")
        sb = Finisher()
        gb.attach(sb, 60).set_ready(10)
        await until(lambda: len(sb.got) == 1)
        assert sb.got[0].body == b"one" and sb.got[0].attempts == 2
        assert isinstance(b.queues, Claims)
        await b.queues.refresh()
        assert gb.queue.stored_buried == 1


async def test_a_publish_is_stored_once_and_goes_with_its_last_entry(
    redis_url: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """One batch per publish (the bodies end to end): two groups finishing at different
    times, and a backlog handed to two groups, free it only with the last entry."""
    async with gateway(redis_url, tmp_path) as a:
        a.topic("t")
        a.publish("t", [b"early %d" % i for i in range(30)])  # the backlog: no group yet
        await a.flush()
        a.topic("t").pause()
        g1, g2 = a.group("t", "c1"), a.group("t", "c2")
        a.topic("t").unpause()  # the backlog goes to both groups
        s1, s2 = Finisher(), Finisher(hold=True)
        g1.attach(s1, 60).set_ready(500)
        c2 = g2.attach(s2, 60)
        c2.set_ready(500)
        a.publish("t", [b"%d" % i for i in range(100)])
        await a.flush()
        await until(lambda: len(s1.got) == 130 and len(s2.got) == 130)
        await a.flush()
        assert sorted(m.body for m in s2.got) == sorted(m.body for m in s1.got)
        assert redis_server.cli("HLEN", "gw:{t}:m").strip() == "2"
        for m in s2.got:
            g2.finish(c2, m.id)
        await a.flush()
        assert redis_server.cli("EXISTS", "gw:{t}:m", "gw:{t}:n", "gw:{t}:x").strip() == "0"


async def test_claims_follow_priority_then_id_across_publishes_and_requeues(
    redis_url: str, tmp_path: Path
) -> None:
    """A publish waits as one range; requeued messages are placed one by one. Claims of
    any size merge both in (priority, id) order, and the counts follow."""
    store = open_store(redis_url, tmp_path)
    await store.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.add_topic("t")
        store.add_group("t", "g")
        expected = []
        for prio, n in ((5, 7), (1, 3), (5, 4), (9, 1)):
            first = store.take_ids(n)
            ids = range(first, first + n)
            msgs = [Message(i, "t", b"%d" % i, 1, priority=prio) for i in ids]
            store.put("t", ["g"], msgs, 0.0)
            expected += [(prio, m.id) for m in msgs]
        await store.flush()
        got, _, _ = await store.claim("t", "g", 5)
        claimed = [(m.priority, m.id) for m in got]
        assert claimed == sorted(expected)[:5]
        back = got[1]  # requeued with a priority between the others: placed on its own
        back.priority = 5
        store.update("t", "g", back, expect="f")
        await store.flush()
        rest = sorted([*(e for e in expected if e not in claimed), (5, back.id)])
        (counts,) = await store.counts([("t", ["g"])])
        assert counts[0][:3] == (len(rest), 0, 4)
        seen = []
        for size in (2, 1, 3, 100):
            part, _, _ = await store.claim("t", "g", size)
            seen += [(m.priority, m.id) for m in part]
            assert all(m.body == b"%d" % m.id for m in part)
        assert seen == rest
        (counts,) = await store.counts([("t", ["g"])])
        assert counts[0][:3] == (0, 0, 4 + len(rest))
        nursery.cancel_scope.cancel()
    await store.close()


def command_calls(redis_server: RedisServer, command: str) -> int:
    """How many times Redis ran `command` so far (INFO commandstats; a function's own
    calls of it included)."""
    for line in redis_server.cli("INFO", "commandstats").splitlines():
        if line.startswith(f"cmdstat_{command}:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


async def test_finishing_every_other_message_of_a_claim_costs_one_bitmap_write(
    redis_url: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two consumers sharing a gateway's claim get its messages in turn, so each finishes
    every other id: no two of them make a run. The finishes that fall in one claim are
    still one read and one write of its bitmap and one count for their batch, not a
    claim look-up, a bitmap write and a count per message; and what they leave is
    exactly what the claim still holds."""
    cli = redis_server.cli
    async with gateway(redis_url, tmp_path) as b:
        async with gateway(redis_url, tmp_path, dies=True) as a:
            ga = a.group("t", "c")
            held = Finisher(hold=True)
            ca = ga.attach(held, 1.5)
            a.publish("t", [b"%d" % i for i in range(400)])
            await a.flush()
            ca.set_ready(400)
            await until(lambda: len(held.got) == 400)
            await a.flush()
            assert cli("ZCARD", "gw:{t}:c:c").strip() == "1"
            before = command_calls(redis_server, "setrange")
            finished = held.got[::2]
            for m in finished:
                ga.finish(ca, m.id, pump=False)
            await a.flush()
            assert command_calls(redis_server, "setrange") - before == 1
            assert cli("HGET", "gw:{t}:held", "c").strip() == "200"
            assert cli("HGET", "gw:{t}:n", held.got[0].id.to_bytes(8).hex()).strip() == "200"
        await the_rest_come_back(b, held, finished)  # A died holding the other half
        assert cli("EXISTS", "gw:{t}:c:c", "gw:{t}:m", "gw:{t}:x").strip() == "0"


async def all_held(a: Broker, n: int) -> tuple[Group, Consumer, Finisher]:
    """`n` messages published on topic t in thousands, all delivered to one consumer of
    group c that holds them."""
    g = a.group("t", "c")
    holder = Finisher(hold=True)
    c = g.attach(holder, 600)
    for i in range(0, n, 1000):
        a.publish("t", [b"%d" % j for j in range(i, i + 1000)])
    await a.flush()
    c.set_ready(n)
    await until(lambda: len(holder.got) == n)
    return g, c, holder


async def test_a_batch_of_thousands_of_finishes_is_one_write_that_succeeds(
    redis_url: str, tmp_path: Path
) -> None:
    """Finishes of one group recorded together are merged into one call (a consumer's
    batch, or what waited while Redis was away): past the number of values a Lua call
    can unpack at once, it must still apply, not fail again on every retry."""
    async with gateway(redis_url, tmp_path) as a:
        g, c, holder = await all_held(a, 9000)
        for m in holder.got:
            g.finish(c, m.id, pump=False)
        with trio.fail_after(10):
            await a.flush()
        await until(lambda: query_depth(a) == 0)
        assert a.store_failed is None


async def test_a_batch_of_finishes_past_one_calls_size_is_split_and_applied(
    redis_url: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A consumer's batch of FINs goes into the group's pending remove at once
    (`finish_many`); past what one call may carry it is split, and every part applies."""
    async with gateway(redis_url, tmp_path) as a:
        g, c, holder = await all_held(a, 9000)
        await a.flush()
        before = command_calls(redis_server, "fcall")
        # every other one first (no runs), then the rest
        assert g.finish_many(c, [m.id for m in holder.got[::2]]) == []
        assert g.finish_many(c, [m.id for m in holder.got[1::2]]) == []
        with trio.fail_after(10):
            await a.flush()
        assert command_calls(redis_server, "fcall") - before <= 4
        await until(lambda: query_depth(a) == 0)
        assert a.store_failed is None
        assert redis_server.cli("HGET", "gw:{t}:held", "c").strip() in ("", "0")


def query_depth(b: Broker) -> int:
    g = b.topics["t"].groups["c"]
    return g.depth + len(g.in_flight) + g.queue.stored_delayed + g.queue.stored_buried


class ReplyCutter:
    """A TCP proxy in front of Redis. Armed, it lets the next pipeline that carries a put
    through to Redis and drops Redis's reply, closing that connection: the publish was
    applied, and its gateway cannot know (a reset at the wrong moment)."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.armed = False
        self.cut = trio.Event()
        self.port = 0

    async def serve(self, task_status: trio.TaskStatus[None]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._proxy, listeners)

    async def _proxy(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream("127.0.0.1", self.redis_port)
        carried_put = False
        async with trio.open_nursery() as nursery:

            async def up() -> None:
                nonlocal carried_put
                async for data in client:
                    if self.armed and b"gw_put" in data:
                        carried_put = True
                    await server.send_all(data)
                nursery.cancel_scope.cancel()

            async def down() -> None:
                async for data in server:
                    if carried_put:
                        self.armed = False
                        self.cut.set()
                        break  # the reply is lost with the connection
                    await client.send_all(data)
                nursery.cancel_scope.cancel()

            nursery.start_soon(up)
            nursery.start_soon(down)
        await client.aclose()
        await server.aclose()


async def test_a_put_sent_again_after_its_reply_was_lost_is_applied_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Redis applied a publish but its reply never reached the gateway, which sends the
    pipeline again once Redis answers. Meanwhile another gateway claimed part of it: no
    message may become claimable a second time."""
    redis_server.cli("FLUSHALL")
    async with trio.open_nursery() as nursery:
        cutter = ReplyCutter(redis_server.port)
        await nursery.start(cutter.serve)
        via_cutter = f"redis://127.0.0.1:{cutter.port}/0"
        async with gateway(via_cutter, tmp_path) as a, gateway(redis_server.url, tmp_path) as b:
            ga, gb = a.group("t", "c"), b.group("t", "c")
            on_b = Finisher(hold=True)
            cb = gb.attach(on_b, 600)
            await a.flush()
            await b.flush()
            cutter.armed = True
            a.publish("t", [b"m%d" % i for i in range(10)])
            with trio.fail_after(10):
                await cutter.cut.wait()
            cb.set_ready(4)  # b takes part of the put while a does not know it was applied
            await until(lambda: len(on_b.got) >= 4)
            assert len(on_b.got) == 4, [m.body for m in on_b.got]
            await until(lambda: not a.journal.store._pending and a.store_failed is None)  # type: ignore[attr-defined]
            on_a = Finisher(hold=True)
            ga.attach(on_a, 600).set_ready(100)
            cb.set_ready(100)
            await until(lambda: len({m.id for m in on_a.got + on_b.got}) == 10)
            await trio.sleep(0.3)  # nothing more may come
            bodies = sorted(m.body for m in on_a.got + on_b.got)
            assert bodies == sorted(b"m%d" % i for i in range(10)), bodies
        nursery.cancel_scope.cancel()


async def test_what_a_claim_brings_after_the_room_went_goes_back_at_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A consumer's room shrinks while its gateway's claim is on the wire (pynsq sends
    RDY 0 in backoff; a beanstalkd reserve times out). What the claim brought must go
    back to Redis at once, for any gateway, not wait here past its claim (the delivery
    timeout) to be delivered when another gateway may hold it."""
    redis_server.cli("FLUSHALL")
    async with gateway(redis_server.url, tmp_path) as a, gateway(redis_server.url, tmp_path) as b:
        ga, gb = a.group("t", "c"), b.group("t", "c")
        await b.flush()
        a.publish("t", [b"m%d" % i for i in range(5)])
        await a.flush()
        on_a, on_b = Finisher(hold=True), Finisher(hold=True)
        ca = ga.attach(on_a, 60)  # a claim lasts as long as a delivery: 60 s
        redis_server.cli("CLIENT", "PAUSE", "300", "ALL")  # the claim waits in Redis
        ca.set_ready(5)
        await trio.testing.wait_all_tasks_blocked()
        ca.set_ready(0)
        gb.attach(on_b, 60).set_ready(5)
        await until(lambda: len(on_b.got) == 5, timeout=5)
        ca.set_ready(5)
        await a.flush()
        await trio.sleep(0.3)  # nothing may come to A: B holds all five
        assert on_a.got == []
        assert sorted(m.body for m in on_b.got) == [b"m%d" % i for i in range(5)]


async def test_a_publish_after_another_gateway_deleted_the_topic_makes_it_anew(
    redis_url: str, tmp_path: Path
) -> None:
    """A publishes to a topic B just deleted, before A's refresh shows it gone. The
    publish was acknowledged: as in nsqd, it makes the topic anew, listed on every
    gateway with its message waiting for a channel; not left in Redis under a topic no
    gateway lists (seen again only if someone happened to use the name)."""
    async with gateway(redis_url, tmp_path) as a, gateway(redis_url, tmp_path) as b:
        b.group("t", "c")
        await b.flush()
        await until(lambda: "t" in a.topics)
        b.delete_topic("t")
        await b.flush()
        a.publish("t", [b"after"])
        await a.flush()
        await until(lambda: "t" in b.topics and b.topics["t"].stored_backlog == 1)
        # A learns of the deletion at its next refresh of the registry, which may come
        # after B's: wait for it rather than race it
        await until(lambda: "t" in a.topics and not a.topics["t"].groups)
        s = Finisher(hold=True)
        b.group("t", "c2").attach(s, 60).set_ready(1)
        await until(lambda: [m.body for m in s.got] == [b"after"])


async def test_kicks_in_redis_are_archived_with_their_messages(
    redis_url: str, tmp_path: Path
) -> None:
    """beanstalkd kick and kick-job of jobs Redis keeps buried: the archive records a
    `kicked` event for each, with the message's own fields, as for a local kick. Without
    them a kicked job's last event stayed `buried`: the report counted it a dead letter,
    and replay published it again while it was still queued."""
    archive = Archive(tmp_path / "archive")
    b = Broker(open_store(redis_url, tmp_path), archive=archive)
    await b.open()
    archive.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        g = b.group("t", "g")
        s = Finisher(hold=True)
        c = g.attach(s, 60)
        b.publish("t", [b"one", b"two"], priority=5)
        c.set_ready(2)
        await until(lambda: len(s.got) == 2)
        for m in s.got:
            g.bury(c, m.id)
        await b.flush()
        assert await b.kick(g, 1) == 1  # kick 1: the oldest burial
        found = await g.journal.find([("t", ["g"])], s.got[1].id)
        assert found is not None and found.state == "buried"
        g.kick_stored(found.message, buried=True)  # kick-job
        await b.flush()
        nursery.cancel_scope.cancel()
    await b.close()
    archive.close()
    kicked = [r for r in read_archive(tmp_path / "archive").to_pylist() if r["event"] == "kicked"]
    assert sorted((r["id"], r["body"], r["priority"], r["group"]) for r in kicked) == [
        (s.got[0].id, b"one", 5, "g"),
        (s.got[1].id, b"two", 5, "g"),
    ]
