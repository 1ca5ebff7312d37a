"""One beanstalkd connection: commands in order, one reply each, jobs from the broker.

Commands are applied in order and their replies leave together after the batch, on the
connection shell (connection.Connection). A reply that the broker says must wait for its
commit (`Broker.owed`: a put's, and with a shared store any write's) waits in the shell's reply
gate, and one store commit releases every such reply of the batch: as they are, or
INTERNAL_ERROR for a write, beanstalkd's reply when its binlog write fails.

A `reserve` that finds nothing ready blocks the connection as beanstalkd does: later
pipelined commands wait, while the socket is still watched for a half-close.

Reserving across tubes: the session has a consumer in the group of each watched tube.
While it waits, each of them gets a window of one more job; the first delivery, in
whichever tube, closes every window again, so one reserve gets one job.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from gateway.broker import Consumer, Group, Topic, query
from gateway.broker.errors import StoreUnavailable
from gateway.clients import ClientInfo
from gateway.connection import Connection
from gateway.model import Message
from gateway.protocols.beanstalk import codec as bc
from gateway.protocols.beanstalk import events as ev
from gateway.protocols.beanstalk import stats
from gateway.protocols.beanstalk.server import DEFAULT_TUBE, BeanstalkServer

log = logging.getLogger("gateway.beanstalk")

_RECEIVE_SIZE = 65536
_SAFETY_MARGIN = 1.0  # beanstalkd's DEADLINE_SOON margin, seconds
_PAGE_IN_WAIT = 10.0  # seconds a reserve-with-timeout 0 waits for jobs paged in from disk
_MAX_BUFFERED_WHILE_WAITING = 1024 * 1024  # pipelined input kept while a reserve blocks


class _Wait:
    """One blocking reserve: the broker delivers later, from another task's call (a put,
    a release, a timer), so the job it hands over reaches the waiting reserve here."""

    __slots__ = ("arrived", "job")

    def __init__(self) -> None:
        self.arrived = trio.Event()
        self.job: Message | None = None


class BeanstalkSession:
    """Every reply is made in the session's own task, so its connection needs no writer
    task: the batch's replies leave in one write at its end, and a client that does not
    read blocks its session there (nothing more is read from it)."""

    protocol = "beanstalk"  # the metrics label of this consumer's deliveries

    def __init__(self, server: BeanstalkServer, stream: trio.abc.Stream, remote: str) -> None:
        self.server = server
        self.remote = remote
        self.conn = Connection(
            stream,
            remote,
            "beanstalk",
            server.metrics,
            max_errors_in_a_row=server.max_errors_in_a_row,
            turn_budget=server.turn_budget,
            commit=server.broker.flush,
            commit_now=server.broker.flush_now,
            pass_end=server.broker.pass_end,
            batched_bytes=True,
        )
        self._owed = server.broker.owed  # which replies wait for their commit
        self.codec = bc.BeanstalkCodec(server.max_job_size)
        self.used = DEFAULT_TUBE
        self.watched: list[str] = [DEFAULT_TUBE]
        # a consumer per tube this connection watches or holds jobs in
        self.consumers: dict[str, Consumer] = {}
        self.reserved: dict[int, Consumer] = {}  # job id -> the consumer that holds it
        self.is_producer = False
        self.is_worker = False
        self.waiting = False
        self._wait: _Wait | None = None  # the blocking reserve under way, if any
        self._eof = False
        self._metrics = server.metrics
        self._origin = f"beanstalk {remote}"

    # -- life cycle ------------------------------------------------------------

    async def run(self) -> None:
        server = self.server
        server.sessions.add(self)
        server.total_connections += 1
        server.using[DEFAULT_TUBE] += 1
        server.watching[DEFAULT_TUBE] += 1
        self._consumer(DEFAULT_TUBE)
        await self.conn.run(self._reader, on_close=self._cleanup, writer=False)

    async def _reader(self) -> None:
        conn = self.conn
        while not self._eof:
            data = await conn.receive(_RECEIVE_SIZE)
            if not data:
                break
            self.codec.receive_data(data)
            if not await self._process():
                break

    def _cleanup(self) -> None:
        server = self.server
        server.sessions.discard(self)
        for consumer in self.consumers.values():
            # beanstalkd: reserved jobs are ready again at once, no timeout counted
            consumer.group.detach(consumer, requeue=True)
        # the tubes of jobs it held without watching them (reserve-job) too
        tubes = {self.used, *self.watched, *self.consumers}
        self.consumers.clear()
        server.using[self.used] -= 1
        for tube in self.watched:
            server.watching[tube] -= 1
        for tube in tubes:
            server.release_tube(tube)

    def _consumer(self, tube: str, group: Group | None = None) -> Consumer:
        consumer = self.consumers.get(tube)
        if consumer is None or not consumer.attached:
            group = group or self.server.worker_group(tube)
            consumer = self.consumers[tube] = group.attach(self, self.server.default_ttr)
        return consumer

    # -- commands ----------------------------------------------------------------

    async def _process(self) -> bool:
        """Apply every complete command; False when the connection must close."""
        conn = self.conn
        codec = self.codec
        owed = self._owed
        keep_open = True
        turn = conn.turn
        turn.start()
        while True:
            if turn.over():
                # this connection had its share: what it has done so far is committed
                # (and answered, tcp.PAUSES_PER_FLUSH), then everyone else runs
                if conn.open_commit is not None:
                    await conn.commit()
                if turn.flush_due():
                    await conn.flush()
                await turn.pause()
                turn.start()
            event = codec.next_event()
            if event is None:
                break
            cls = event.__class__
            before = owed.count
            if cls is ev.Put:
                reply = self._put(event)  # type: ignore[arg-type]
            elif cls is ev.Reserve or cls is ev.ReserveWithTimeout:
                if conn.open_commit is not None:
                    await conn.commit()
                reply = await self._reserve(event)
            elif cls in _AWAITED:
                # the answer may come from a shared store: it must hold what was put here
                if conn.open_commit is not None:
                    await conn.commit()
                reply = await _AWAITED[cls](self, event)
                conn.errors_in_a_row = 0
            elif cls is ev.Quit:
                keep_open = False
                break
            else:
                handler = _HANDLERS.get(cls)
                if handler is None:  # Reply or PutRejected: bad input
                    reply = self._rejected(event)
                    conn.errors_in_a_row += 1
                    # beanstalkd answers bad input for ever; a client that sends
                    # nothing else is cut off instead (README, Limits)
                    if conn.too_many_errors():
                        conn.out.append(reply)
                        keep_open = False
                        break
                else:
                    reply = handler(self, event)
                    if reply is bc.NOT_FOUND and cls is ev.Delete:
                        # a job this connection does not hold may be another gateway's
                        if conn.open_commit is not None:
                            await conn.commit()
                        reply = await self._delete_elsewhere(event)  # type: ignore[arg-type]
                    conn.errors_in_a_row = 0
            if owed.count != before:
                # it changed what must be stored before it is answered (Broker.owed)
                conn.reply_after_commit(reply, self._internal_error if cls in _WRITES else None)
            else:
                conn.out.append(reply)
            if self._eof:
                keep_open = False
                break
        if conn.open_commit is not None:
            await conn.commit()  # group commit before INSERTED goes out
        await conn.flush()
        return keep_open

    def _internal_error(self, exc: StoreUnavailable) -> bytes:
        """A write whose commit failed: beanstalkd's reply when its binlog write fails."""
        self.conn.protocol_error(b"INTERNAL_ERROR")
        return bc.INTERNAL_ERROR

    def report_bytes(self) -> None:
        self.conn.report_bytes()

    def _rejected(self, event: object) -> bytes:
        if isinstance(event, ev.PutRejected):
            self.server.commands["put"] += 1
            if event.consumes_id:
                # beanstalkd made the job (and counted a producer) before the body failed
                self.is_producer = True
                self.server.broker.burn_id()
            reply = event.reply
        else:
            reply = event.data  # type: ignore[attr-defined]
        self.conn.protocol_error(reply.rstrip(b"\r\n"))
        return reply

    def _put(self, event: ev.Put) -> bytes:
        server = self.server
        server.commands["put"] += 1
        self.is_producer = True  # beanstalkd counts it before the drain check
        if server.draining:
            return bc.DRAINING
        server.ensure_tube(self.used)
        try:
            (msg,), _ = server.broker.publish(
                self.used,
                [event.body],
                delay=float(event.delay),
                priority=event.pri,
                ttr=float(event.ttr),
                origin=self._origin,
            )
        except StoreUnavailable:
            # the store cannot write: refused before anything is queued, as beanstalkd
            # answers a put it cannot reserve binlog space for
            self.conn.protocol_error(b"OUT_OF_MEMORY")
            return bc.OUT_OF_MEMORY
        return bc.inserted(msg.id)

    # -- reserve -------------------------------------------------------------------

    async def _reserve(self, event: ev.Reserve | ev.ReserveWithTimeout) -> bytes:
        server = self.server
        timeout = None
        if isinstance(event, ev.ReserveWithTimeout):
            server.commands["reserve-with-timeout"] += 1
            timeout = event.timeout
        else:
            server.commands["reserve"] += 1
        self.is_worker = True
        now = trio.current_time()
        taken = self._take_ready(now)
        if taken is not None:
            return bc.reserved(taken.id, taken.body)
        soon = self._deadline_soon_at()
        if soon <= now:
            return bc.DEADLINE_SOON
        if timeout == 0:
            if not self._on_disk(now):
                return bc.TIMED_OUT
            # ready jobs past the memory window are on their way in from disk: they are
            # ready, as every job of beanstalkd's is, so the reserve waits for them
            timeout = _PAGE_IN_WAIT
        await self.conn.flush()  # the client sees earlier replies while this one waits
        until = min(soon, now + timeout if timeout is not None else math.inf)
        wait = self._wait = _Wait()
        self.waiting = True
        try:
            for tube in self.watched:
                consumer = self._consumer(tube)
                consumer.set_ready(consumer.in_flight + 1)  # may deliver at once
                if wait.job is not None:
                    break
            if wait.job is None:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_socket, nursery.cancel_scope)
                    with trio.move_on_at(until):
                        await wait.arrived.wait()
                    nursery.cancel_scope.cancel()
        finally:
            self.waiting = False
            self._wait = None
            self._close_windows()
        if wait.job is not None:
            return bc.reserved(wait.job.id, wait.job.body)
        if self._eof:
            return bc.TIMED_OUT  # half-closed while waiting: answer, then close
        if soon <= trio.current_time():
            return bc.DEADLINE_SOON
        return bc.TIMED_OUT

    async def _watch_socket(self, cancel: trio.CancelScope) -> None:
        """While a reserve blocks, keep reading (buffered, not executed) to see a close."""
        while self.codec.buffered < _MAX_BUFFERED_WHILE_WAITING:
            try:
                data = await self.conn.receive(_RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self._eof = True
                cancel.cancel()
                return
            self.codec.receive_data(data)
        await trio.sleep_forever()

    def _take_ready(self, now: float) -> Message | None:
        """Reserve the most urgent ready job over every watched, unpaused tube."""
        best: tuple[int, int] | None = None
        best_group: Group | None = None
        for tube in self.watched:
            group = self._consumer(tube).group
            key = query.ready_head(group)
            if key is None or group.is_paused(now):
                continue
            if best is None or key < best:
                best, best_group = key, group
        if best_group is None:
            return None
        return best_group.take(self._consumer(best_group.topic.name, best_group))

    def _on_disk(self, now: float) -> bool:
        """Whether a watched, unpaused tube has ready jobs on disk only (paged in soon)."""
        for tube in self.watched:
            group = self._consumer(tube).group
            if query.spilled(group) and not group.is_paused(now):
                return True
        return False

    def _deadline_soon_at(self) -> float:
        """When the first job this connection holds enters the safety margin."""
        soonest = math.inf
        for job_id, consumer in list(self.reserved.items()):
            deadline = query.deadline(consumer.group, job_id, consumer)
            if deadline is None:
                del self.reserved[job_id]  # timed out (and maybe reserved by another)
                continue
            soonest = min(soonest, deadline - _SAFETY_MARGIN)
        return soonest

    def _close_windows(self) -> None:
        # 0, not in_flight: a later delete or release must not reopen a window
        for consumer in self.consumers.values():
            consumer.ready = 0

    def client_info(self) -> ClientInfo:
        """What /stats shows of this worker (its windows are its consumers')."""
        return ClientInfo.worker(self.remote, self.protocol, int(self.conn.opened))

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        """Called by the broker: a job for this connection. A take or a reserve-job
        has it as their call's value; a blocking reserve hears it through its _Wait."""
        self.reserved[message.id] = consumer
        self._close_windows()
        wait = self._wait
        if wait is not None:
            wait.job = message
            wait.arrived.set()
        return True

    # -- jobs this connection holds ---------------------------------------------------

    def _held(self, job_id: int) -> Consumer | None:
        consumer = self.reserved.get(job_id)
        if consumer is None:
            return None
        if query.deadline(consumer.group, job_id, consumer) is None:
            del self.reserved[job_id]
            return None
        return consumer

    def _delete(self, event: ev.Delete) -> bytes:
        server = self.server
        server.commands["delete"] += 1
        consumer = self._held(event.id)
        if consumer is not None:
            group = consumer.group
            group.finish(consumer, event.id)
            del self.reserved[event.id]
            server.tube_deletes[group.topic.name] += 1
            if not consumer.in_flight:
                self._done_with(consumer)
            return bc.DELETED
        found = server.find_job(event.id)
        if found is None or found.state == "reserved":
            return bc.NOT_FOUND
        view = server.view(found.topic)
        if isinstance(view, Group):
            view.delete(event.id)
        elif view is not None:
            view.delete_backlog(event.id)
        tube = found.topic
        server.tube_deletes[tube] += 1
        server.release_tube(tube)
        return bc.DELETED

    async def _reserve_job(self, event: ev.ReserveJob) -> bytes:
        found = await self.server.find_shared_job(event.id)
        if found is None or found.state == "reserved":
            return bc.NOT_FOUND
        # in the backlog (no group): the tube's new group adopts the backlog
        group = self.server.group(found.topic, create=True)
        assert group is not None
        self.is_worker = True
        consumer = self._consumer(group.topic.name, group)
        if found.stored:  # a shared store keeps it: claimed there for us
            taken = await self.server.broker.take_stored(group, consumer, event.id)
        else:
            taken = group.take_any(consumer, event.id)
        if taken is None:
            return bc.NOT_FOUND
        return bc.reserved(taken.id, taken.body)

    # -- jobs this connection holds, besides delete ------------------------------------

    def _release(self, event: ev.Release) -> bytes:
        self.server.commands["release"] += 1
        consumer = self._held(event.id)
        if consumer is None:
            return bc.NOT_FOUND
        consumer.group.requeue(consumer, event.id, float(event.delay), event.pri)
        del self.reserved[event.id]
        self._done_with(consumer)
        return bc.RELEASED

    def _bury(self, event: ev.Bury) -> bytes:
        self.server.commands["bury"] += 1
        consumer = self._held(event.id)
        if consumer is None:
            return bc.NOT_FOUND
        consumer.group.bury(consumer, event.id, event.pri)
        del self.reserved[event.id]
        self._done_with(consumer)
        return bc.BURIED

    def _touch(self, event: ev.Touch) -> bytes:
        self.server.commands["touch"] += 1
        consumer = self._held(event.id)
        if consumer is None:
            return bc.NOT_FOUND
        consumer.group.touch(consumer, event.id, None, math.inf)  # by the job's own ttr
        return bc.TOUCHED

    def _done_with(self, consumer: Consumer) -> None:
        """A job this connection held is its no more. The consumer of a tube it does not
        watch (a reserve-job, or ignored since) goes once it holds nothing there, and the
        tube is freed as beanstalkd frees it (nobody uses or watches it, no job)."""
        tube = consumer.group.topic.name
        if consumer.in_flight or tube in self.watched or self.consumers.get(tube) is not consumer:
            return
        consumer.group.detach(consumer, requeue=False)
        del self.consumers[tube]
        self.server.release_tube(tube)

    async def _delete_elsewhere(self, event: ev.Delete) -> bytes:
        """delete of a job found nowhere here (NOT_FOUND): with a shared store (Redis) it
        may be ready, deferred or buried there, where another gateway left it."""
        server = self.server
        found = await server.find_shared_job(event.id)
        if found is None or found.state == "reserved" or not found.stored:
            return bc.NOT_FOUND  # gone, held by a worker, or here and no longer deletable
        # in the backlog (no group): the tube's new group adopts the backlog
        group = server.group(found.topic, create=True)
        if group is None or not await server.broker.delete_stored(group, event.id):
            return bc.NOT_FOUND
        tube = group.topic.name
        server.tube_deletes[tube] += 1
        server.release_tube(tube)
        return bc.DELETED

    def _use(self, event: ev.Use) -> bytes:
        server = self.server
        server.commands["use"] += 1
        if event.tube != self.used:
            old, self.used = self.used, event.tube
            server.using[old] -= 1
            server.using[event.tube] += 1
            server.ensure_tube(event.tube)
            server.release_tube(old)
        return bc.using(event.tube)

    def _watch(self, event: ev.Watch) -> bytes:
        server = self.server
        server.commands["watch"] += 1
        if event.tube not in self.watched:
            self.watched.append(event.tube)
            server.watching[event.tube] += 1
            self._consumer(event.tube)
        return bc.watching(len(self.watched))

    def _ignore(self, event: ev.Ignore) -> bytes:
        server = self.server
        server.commands["ignore"] += 1
        tube = event.tube
        if tube in self.watched:
            if len(self.watched) == 1:
                return bc.NOT_IGNORED
            # beanstalkd moves the last entry into the freed slot
            i = self.watched.index(tube)
            self.watched[i] = self.watched[-1]
            self.watched.pop()
            server.watching[tube] -= 1
            consumer = self.consumers.get(tube)
            if consumer is not None and not consumer.in_flight:
                consumer.group.detach(consumer, requeue=False)
                del self.consumers[tube]
            server.release_tube(tube)
        return bc.watching(len(self.watched))

    def _list_tube_used(self, event: ev.ListTubeUsed) -> bytes:
        self.server.commands["list-tube-used"] += 1
        return bc.using(self.used)

    def _list_tubes(self, event: ev.ListTubes) -> bytes:
        self.server.commands["list-tubes"] += 1
        return bc.ok_yaml(bc.yaml_list(self.server.tube_names()))

    def _list_tubes_watched(self, event: ev.ListTubesWatched) -> bytes:
        self.server.commands["list-tubes-watched"] += 1
        return bc.ok_yaml(bc.yaml_list(self.watched))

    async def _pause_tube(self, event: ev.PauseTube) -> bytes:
        server = self.server
        server.commands["pause-tube"] += 1  # counted first, as beanstalkd does
        if await server.broker.existing_topic(event.tube) is None:
            return bc.NOT_FOUND
        server.tube_pauses[event.tube] += 1
        group = server.group(event.tube, create=True)
        if group is not None:
            group.pause_for(event.delay)
        return bc.PAUSED

    # -- peek and kick --------------------------------------------------------------

    async def _peek(self, event: ev.Peek) -> bytes:
        self.server.commands["peek"] += 1
        found = await self.server.find_shared_job(event.id)
        return bc.NOT_FOUND if found is None else bc.found(found.message.id, found.message.body)

    def _used_view(self) -> Group | Topic | None:
        return self.server.view(self.used)

    async def _peek_state(self, state: query.State) -> bytes:
        view = self._used_view()
        msg = await query.peek(self.server.broker, view, state) if view is not None else None
        return bc.NOT_FOUND if msg is None else bc.found(msg.id, msg.body)

    async def _peek_ready(self, event: ev.PeekReady) -> bytes:
        self.server.commands["peek-ready"] += 1
        return await self._peek_state("ready")

    async def _peek_delayed(self, event: ev.PeekDelayed) -> bytes:
        self.server.commands["peek-delayed"] += 1
        return await self._peek_state("delayed")

    async def _peek_buried(self, event: ev.PeekBuried) -> bytes:
        self.server.commands["peek-buried"] += 1
        return await self._peek_state("buried")

    async def _kick(self, event: ev.Kick) -> bytes:
        self.server.commands["kick"] += 1
        group = self.server.group(self.used, create=True)
        if group is None:
            return bc.kicked(0)
        return bc.kicked(await self.server.broker.kick(group, event.bound))

    async def _kick_job(self, event: ev.KickJob) -> bytes:
        found = await self.server.find_shared_job(event.id)
        if found is None or found.state not in ("buried", "delayed"):
            return bc.NOT_FOUND
        # in the backlog (no group): the tube's new group adopts the backlog
        group = self.server.group(found.topic, create=True)
        if group is None:
            return bc.NOT_FOUND
        if found.stored:  # found in a shared store: kicked there
            group.kick_stored(found.message, buried=found.state == "buried")  # committed
        elif not group.kick_message(event.id):
            return bc.NOT_FOUND
        return bc.KICKED

    # -- stats ---------------------------------------------------------------------------

    async def _stats_job(self, event: ev.StatsJob) -> bytes:
        self.server.commands["stats-job"] += 1
        found = await self.server.find_shared_job(event.id)
        if found is None:
            return bc.NOT_FOUND
        return bc.ok_yaml(bc.yaml_dict(stats.stats_job(found, self.server.default_ttr)))

    async def _stats_tube(self, event: ev.StatsTube) -> bytes:
        server = self.server
        server.commands["stats-tube"] += 1
        # with a store shared by several gateways: also a tube another one made just now
        topic = await server.broker.existing_topic(event.tube)
        if topic is None:
            return bc.NOT_FOUND
        await server.broker.fresh_counts(topic)
        return bc.ok_yaml(
            bc.yaml_dict(stats.stats_tube(server, event.tube, server.view(event.tube)))
        )

    def _stats(self, event: ev.Stats) -> bytes:
        self.server.commands["stats"] += 1
        return bc.ok_yaml(bc.yaml_dict(stats.stats(self.server)))


# commands whose answer may come from the store (a shared one keeps what other gateways
# hold): awaited, once what the batch did so far is committed
_AWAITED: dict[type, Callable[[BeanstalkSession, Any], Awaitable[bytes]]] = {
    ev.ReserveJob: BeanstalkSession._reserve_job,
    ev.Peek: BeanstalkSession._peek,
    ev.PeekReady: BeanstalkSession._peek_ready,
    ev.PeekDelayed: BeanstalkSession._peek_delayed,
    ev.PeekBuried: BeanstalkSession._peek_buried,
    ev.Kick: BeanstalkSession._kick,
    ev.KickJob: BeanstalkSession._kick_job,
    ev.StatsJob: BeanstalkSession._stats_job,
    ev.StatsTube: BeanstalkSession._stats_tube,
    ev.PauseTube: BeanstalkSession._pause_tube,
}

# the writes: when the commit a reply waits for fails, it becomes INTERNAL_ERROR (any
# other reply that waited, a reserve's or a watch's, stands)
_WRITES = frozenset(
    {ev.Put, ev.Delete, ev.Release, ev.Bury, ev.Touch, ev.PauseTube, ev.Kick, ev.KickJob}
)

_HANDLERS = {
    ev.Use: BeanstalkSession._use,
    ev.Delete: BeanstalkSession._delete,
    ev.Release: BeanstalkSession._release,
    ev.Bury: BeanstalkSession._bury,
    ev.Touch: BeanstalkSession._touch,
    ev.Watch: BeanstalkSession._watch,
    ev.Ignore: BeanstalkSession._ignore,
    ev.Stats: BeanstalkSession._stats,
    ev.ListTubes: BeanstalkSession._list_tubes,
    ev.ListTubeUsed: BeanstalkSession._list_tube_used,
    ev.ListTubesWatched: BeanstalkSession._list_tubes_watched,
}
