"""One beanstalkd connection: commands in order, one reply each, jobs from the broker.

Commands are applied in order and their replies leave together after the batch (one
store flush acknowledges every put of the batch). A `reserve` that finds nothing ready
blocks the connection as beanstalkd does: later pipelined commands wait, while the
socket is still watched for a half-close.

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

from gateway.broker import Consumer, Group, query
from gateway.broker.errors import StoreUnavailable
from gateway.model import Message
from gateway.protocols.beanstalk import codec as bc
from gateway.protocols.beanstalk import events as ev
from gateway.protocols.beanstalk.commands import TubeCommands
from gateway.protocols.beanstalk.server import DEFAULT_TUBE, BeanstalkServer
from gateway.tcp import Buffered, ByteCount, QueuedWriter, Turn, receive, socket_fd

log = logging.getLogger("gateway.beanstalk")

_RECEIVE_SIZE = 65536
_SAFETY_MARGIN = 1.0  # beanstalkd's DEADLINE_SOON margin, seconds
_MAX_BUFFERED_WHILE_WAITING = 1024 * 1024  # pipelined input kept while a reserve blocks


class BeanstalkSession(TubeCommands, QueuedWriter):
    """Every reply is made in the session's own task, so its output (tcp.QueuedWriter)
    needs no writer task: the batch's replies leave in one write at its end, and a client
    that does not read blocks its session there (nothing more is read from it)."""

    protocol = "beanstalk"  # the metrics label of this consumer's deliveries

    def __init__(self, server: BeanstalkServer, stream: trio.abc.Stream, remote: str) -> None:
        self.server = server
        self.stream = stream
        self.remote = remote
        self.codec = bc.BeanstalkCodec(server.max_job_size)
        self.used = DEFAULT_TUBE
        self.watched: list[str] = [DEFAULT_TUBE]
        # a consumer per tube this connection watches or holds jobs in
        self.consumers: dict[str, Consumer] = {}
        self.reserved: dict[int, Consumer] = {}  # job id -> the consumer that holds it
        self.is_producer = False
        self.is_worker = False
        self.waiting = False
        self._got: Message | None = None
        self._got_event = trio.Event()
        self._eof = False
        # output: tcp.QueuedWriter's
        self._out: list[bytes] = []
        self._pending = 0
        self._buffered = Buffered.unbounded()  # no listener-wide bound
        self._sending = False
        self._wake = trio.Event()
        self._cancel = trio.CancelScope()
        self._fd = socket_fd(stream)
        self._metrics = server.metrics
        self._bytes_in = ByteCount(server.metrics.bytes_in.labels("beanstalk"))
        self._bytes_out = ByteCount(server.metrics.bytes_out.labels("beanstalk"))
        self._origin = f"beanstalk {remote}"
        self._turn = Turn(server.turn_budget)
        self._errors_in_a_row = 0
        # asked on every command, fixed for the process's life (memory store: no commit)
        self._shared = server.shared
        self._commits = server.broker.flush_waits

    # -- life cycle ------------------------------------------------------------

    async def run(self) -> None:
        server = self.server
        server.sessions.add(self)
        server.total_connections += 1
        server.using[DEFAULT_TUBE] += 1
        server.watching[DEFAULT_TUBE] += 1
        self._consumer(DEFAULT_TUBE)
        m = self._metrics
        m.connections.labels("beanstalk").inc()
        m.connections_total.labels("beanstalk").inc()
        bytes_in = self._bytes_in
        try:
            while not self._eof:
                data = await receive(self.stream, self._fd, _RECEIVE_SIZE)
                if not data:
                    break
                bytes_in.inc(len(data))
                self.codec.receive_data(data)
                if not await self._process():
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._fd = None  # never write to a descriptor number that may be reused
            self._report_bytes()
            self._cleanup()
            m.connections.labels("beanstalk").dec()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

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
        codec = self.codec
        out = self._out
        start = len(out)
        published = False
        keep_open = True
        turn = self._turn
        turn.start()
        while True:
            if turn.over():
                # this connection had its share: what it has done so far is committed
                # (and answered, tcp.PAUSES_PER_FLUSH), then everyone else runs
                if published:
                    await self._commit(start)
                    published = False
                if turn.flush_due():
                    await self._flush()
                await self._turn.pause()
                out = self._out
                start = len(out)
                turn.start()
            event = codec.next_event()
            if event is None:
                break
            cls = event.__class__
            if cls is ev.Put:
                reply = self._put(event)  # type: ignore[arg-type]
                published = published or (self._commits and reply[0:1] == b"I")
            elif cls is ev.Reserve or cls is ev.ReserveWithTimeout:
                if published:
                    await self._commit(start)
                    published = False
                reply = await self._reserve(event)
                out = self._out  # a reserve that waited has sent what came before
                start = len(out)  # what came before is committed (or refused)
                # shared store: the job's deadline is in Redis before the worker has it
                published = self._shared and reply[0:1] == b"R"
            elif cls in _READS_STORE or (
                # a job this connection does not hold may be another gateway's
                cls is ev.Delete and self._shared and event.id not in self.reserved  # type: ignore[attr-defined]
            ):
                # the answer may come from a shared store: it must hold what was put here
                if published:
                    await self._commit(start)
                    published = False
                reply = await _READS_STORE.get(cls, TubeCommands._delete_anywhere)(self, event)
                self._errors_in_a_row = 0
                # a write is committed before its reply, like a put
                published = self._shared and reply.startswith(_STORE_WRITES)
                out = self._out  # what came before may have been sent meanwhile
                start = len(out)
            elif cls is ev.Quit:
                keep_open = False
                break
            else:
                handler = _HANDLERS.get(cls)
                if handler is None:  # Reply or PutRejected: bad input
                    reply = self._rejected(event)
                    self._errors_in_a_row += 1
                    if self._errors_in_a_row >= self.server.max_errors_in_a_row:
                        # beanstalkd answers bad input for ever; a client that sends
                        # nothing else is cut off instead (README, Limits)
                        log.info(
                            "beanstalk client %s: %d protocol errors in a row: closing",
                            self.remote,
                            self._errors_in_a_row,
                        )
                        self._metrics.protocol_error("beanstalk", "TOO_MANY_ERRORS")
                        out.append(reply)
                        keep_open = False
                        break
                else:
                    reply = handler(self, event)
                    self._errors_in_a_row = 0
                    if cls in _WRITES_STORE and self._shared:
                        # another gateway's next read sees it: committed before the reply
                        published = True
            out.append(reply)
            if self._eof:
                keep_open = False
                break
        if published:
            await self._commit(start)  # group commit before INSERTED goes out
        await self._flush()
        return keep_open

    async def _commit(self, start: int) -> None:
        """Flush the store; if it cannot write, every INSERTED since `start` becomes
        INTERNAL_ERROR, beanstalkd's reply when its binlog write fails (with a shared
        store, so does every other write committed before its reply)."""
        try:
            await self.server.broker.flush()
        except StoreUnavailable:
            out = self._out
            failed = _SHARED_WRITES if self.server.shared else (b"INSERTED",)
            for i in range(start, len(out)):
                if out[i].startswith(failed):
                    out[i] = bc.INTERNAL_ERROR
                    self._metrics.protocol_error("beanstalk", b"INTERNAL_ERROR")

    def _report_bytes(self) -> None:
        self._bytes_in.report()
        self._bytes_out.report()

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
        self._metrics.protocol_error("beanstalk", reply.rstrip(b"\r\n"))
        return reply

    def _put(self, event: ev.Put) -> bytes:
        server = self.server
        server.commands["put"] += 1
        self.is_producer = True  # beanstalkd counts it before the drain check
        if server.draining:
            return bc.DRAINING
        server.ensure_tube(self.used)
        try:
            (msg,) = server.broker.publish(
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
            self._metrics.protocol_error("beanstalk", b"OUT_OF_MEMORY")
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
        if self._take_ready(now):
            return self._reserved_reply()
        soon = self._deadline_soon_at()
        if soon <= now:
            return bc.DEADLINE_SOON
        if timeout == 0:
            return bc.TIMED_OUT
        await self._flush()  # the client sees earlier replies while this one waits
        until = min(soon, now + timeout if timeout is not None else math.inf)
        self._got = None
        self._got_event = trio.Event()
        self.waiting = True
        try:
            for tube in self.watched:
                consumer = self._consumer(tube)
                consumer.set_ready(consumer.in_flight + 1)
                if self._got is not None:
                    break
            if self._got is None:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_socket, nursery.cancel_scope)
                    with trio.move_on_at(until):
                        await self._got_event.wait()
                    nursery.cancel_scope.cancel()
        finally:
            self.waiting = False
            self._close_windows()
        if self._got is not None:
            return self._reserved_reply()
        if self._eof:
            return bc.TIMED_OUT  # half-closed while waiting: answer, then close
        if soon <= trio.current_time():
            return bc.DEADLINE_SOON
        return bc.TIMED_OUT

    async def _watch_socket(self, cancel: trio.CancelScope) -> None:
        """While a reserve blocks, keep reading (buffered, not executed) to see a close."""
        while self.codec.buffered < _MAX_BUFFERED_WHILE_WAITING:
            try:
                data = await receive(self.stream, self._fd, _RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self._eof = True
                cancel.cancel()
                return
            self.codec.receive_data(data)
        await trio.sleep_forever()

    def _take_ready(self, now: float) -> bool:
        """Reserve the most urgent ready job over every watched, unpaused tube."""
        best: tuple[int, int] | None = None
        best_group: Group | None = None
        for tube in self.watched:
            group = self._consumer(tube).group
            head = query.peek_ready(group)
            if head is None or group.is_paused(now):
                continue
            key = (head.priority, head.id)
            if best is None or key < best:
                best, best_group = key, group
        if best_group is None:
            return False
        self._got = None
        best_group.take(self._consumer(best_group.topic.name, best_group))
        return self._got is not None

    def _deadline_soon_at(self) -> float:
        """When the first job this connection holds enters the safety margin."""
        soonest = math.inf
        for job_id, consumer in list(self.reserved.items()):
            entry = query.reservation(consumer.group, job_id)
            if entry is None or entry.consumer is not consumer:
                del self.reserved[job_id]  # timed out (and maybe reserved by another)
                continue
            soonest = min(soonest, entry.deadline - _SAFETY_MARGIN)
        return soonest

    def _reserved_reply(self) -> bytes:
        msg = self._got
        assert msg is not None
        self._got = None
        return bc.reserved(msg.id, msg.body)

    def _close_windows(self) -> None:
        # 0, not in_flight: a later delete or release must not reopen a window
        for consumer in self.consumers.values():
            consumer.ready = 0

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        """Called by the broker: a job for this connection (a take, or a waiting reserve)."""
        self.reserved[message.id] = consumer
        self._got = message
        self._close_windows()
        self._got_event.set()
        return True

    # -- jobs this connection holds ---------------------------------------------------

    def _held(self, job_id: int) -> Consumer | None:
        consumer = self.reserved.get(job_id)
        if consumer is None:
            return None
        entry = query.reservation(consumer.group, job_id)
        if entry is None or entry.consumer is not consumer:
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
        if found.group is not None:
            found.group.delete(event.id)
        else:
            found.topic.delete_backlog(event.id)
        tube = found.message.topic
        server.tube_deletes[tube] += 1
        server.release_tube(tube)
        return bc.DELETED

    async def _reserve_job(self, event: ev.ReserveJob) -> bytes:
        found = await self.server.find_shared_job(event.id)
        if found is None or found.state == "reserved":
            return bc.NOT_FOUND
        group = found.group
        if group is None:  # in the backlog: the tube's new group adopts the backlog
            group = self.server.group(found.message.topic, create=True)
        assert group is not None
        self.is_worker = True
        self._got = None
        consumer = self._consumer(group.topic.name, group)
        if found.left is not None:  # a shared store keeps it: claimed there for us
            await self.server.broker.take_stored(group, consumer, event.id)
        else:
            group.take_any(consumer, event.id)
        if self._got is None:
            return bc.NOT_FOUND
        return self._reserved_reply()

    # -- tubes -------------------------------------------------------------------------


# commands whose answer may come from a shared store (Redis): awaited
_READS_STORE: dict[type, Callable[[BeanstalkSession, Any], Awaitable[bytes]]] = {
    ev.ReserveJob: BeanstalkSession._reserve_job,
    ev.Peek: BeanstalkSession._peek,
    ev.PeekReady: BeanstalkSession._peek_ready,
    ev.PeekDelayed: BeanstalkSession._peek_delayed,
    ev.PeekBuried: BeanstalkSession._peek_buried,
    ev.Kick: BeanstalkSession._kick,
    ev.KickJob: BeanstalkSession._kick_job,
    ev.StatsJob: BeanstalkSession._stats_job,
}

# with a shared store (Redis) these are committed before their reply, like a put, so
# that what a client was told holds for a client of any other gateway at once
_WRITES_STORE = frozenset({ev.Delete, ev.Release, ev.Bury, ev.Touch, ev.PauseTube})
# ... and so are these answers of the commands that may ask a shared store
_STORE_WRITES = (bc.DELETED, bc.KICKED, b"RESERVED")
# what a failed commit turns into INTERNAL_ERROR with a shared store
_SHARED_WRITES = (b"INSERTED", b"DELETED", b"RELEASED", b"BURIED", b"TOUCHED", b"PAUSED", b"KICKED")

_HANDLERS = {
    ev.Use: BeanstalkSession._use,
    ev.Delete: BeanstalkSession._delete,
    ev.Release: BeanstalkSession._release,
    ev.Bury: BeanstalkSession._bury,
    ev.Touch: BeanstalkSession._touch,
    ev.Watch: BeanstalkSession._watch,
    ev.Ignore: BeanstalkSession._ignore,
    ev.StatsTube: BeanstalkSession._stats_tube,
    ev.Stats: BeanstalkSession._stats,
    ev.ListTubes: BeanstalkSession._list_tubes,
    ev.ListTubeUsed: BeanstalkSession._list_tube_used,
    ev.ListTubesWatched: BeanstalkSession._list_tubes_watched,
    ev.PauseTube: BeanstalkSession._pause_tube,
}
