"""The beanstalkd commands that choose, list, inspect and administer tubes and jobs
(`use`, `watch`, `ignore`, `list-*`, `pause-tube`, `peek*`, `kick*`, `stats*`,
`release`, `bury` and `touch` of a job the connection holds, and `delete` of a job a
shared store keeps): a part of the session kept apart from the put/reserve/delete path
it shares state with."""

from __future__ import annotations

import math

from gateway.broker import Consumer, Group, Topic, query
from gateway.protocols.beanstalk import codec as bc
from gateway.protocols.beanstalk import events as ev
from gateway.protocols.beanstalk import stats
from gateway.protocols.beanstalk.server import BeanstalkServer


class TubeCommands:
    """Mixed into BeanstalkSession; the attributes below are the session's."""

    server: BeanstalkServer
    used: str
    watched: list[str]
    consumers: dict[str, Consumer]
    reserved: dict[int, Consumer]

    def _consumer(self, tube: str, group: Group | None = None) -> Consumer:
        raise NotImplementedError  # the session's

    def _delete(self, event: ev.Delete) -> bytes:
        raise NotImplementedError  # the session's

    def _held(self, job_id: int) -> Consumer | None:
        raise NotImplementedError  # the session's

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

    def _pause_tube(self, event: ev.PauseTube) -> bytes:
        server = self.server
        server.commands["pause-tube"] += 1  # counted first, as beanstalkd does
        if server.broker.topic(event.tube, create=False) is None:
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

    def _stats_tube(self, event: ev.StatsTube) -> bytes:
        server = self.server
        server.commands["stats-tube"] += 1
        if server.broker.topic(event.tube, create=False) is None:
            return bc.NOT_FOUND
        return bc.ok_yaml(
            bc.yaml_dict(stats.stats_tube(server, event.tube, server.view(event.tube)))
        )

    def _stats(self, event: ev.Stats) -> bytes:
        self.server.commands["stats"] += 1
        return bc.ok_yaml(bc.yaml_dict(stats.stats(self.server)))
