"""The YAML documents of stats, stats-tube and stats-job, with beanstalkd 1.13's keys in
its order and its quoting (strings quoted; list entries never are)."""

from __future__ import annotations

import os
import resource
import time

import trio

from gateway.broker import Group, Topic, query
from gateway.protocols.beanstalk.codec import quoted
from gateway.protocols.beanstalk.server import BeanstalkServer

VERSION = "1.13"
_BINLOG_MAX_SIZE = 10485760  # beanstalkd's default -s; the gateway has no binlog

Pairs = list[tuple[str, int | str | bool]]


def _job_counts(counts: query.Counts) -> Pairs:
    return [
        ("current-jobs-urgent", counts.urgent),
        ("current-jobs-ready", counts.ready),
        ("current-jobs-reserved", counts.reserved),
        ("current-jobs-delayed", counts.delayed),
        ("current-jobs-buried", counts.buried),
    ]


def stats_tube(server: BeanstalkServer, tube: str, view: Group | Topic | None) -> Pairs:
    now = trio.current_time()
    topic = query.topic(server.broker, tube)
    group = query.group(server.broker, tube, server.group_name, now=now)  # if view is one
    if group is not None:
        counts = group.counts
    else:  # the backlog of a topic with no group yet, or no tube of ours
        counts = query.counts(view, now) if view is not None else query.NO_COUNTS
    waiting = sum(1 for s in server.sessions if s.waiting and tube in s.watched)
    paused = group.pause_length if group is not None else 0
    left = int(group.pause_left) if group is not None and paused else 0
    return [
        ("name", quoted(tube)),
        *_job_counts(counts),
        ("total-jobs", topic.message_count if topic is not None else 0),
        ("current-using", server.using[tube]),
        ("current-watching", server.watching[tube]),
        ("current-waiting", waiting),
        ("cmd-delete", server.tube_deletes[tube]),
        ("cmd-pause-tube", server.tube_pauses[tube]),
        ("pause", paused),
        ("pause-time-left", left),
    ]


def stats_job(found: query.Located, default_ttr: int) -> Pairs:
    msg = found.message
    js = msg.stats
    return [
        ("id", msg.id),
        ("tube", quoted(msg.topic)),
        ("state", found.state),
        ("pri", msg.priority),
        ("age", max(0, (time.time_ns() - msg.timestamp) // 1_000_000_000)),
        ("delay", js.delay if js else 0),
        ("ttr", int(msg.ttr) or default_ttr),  # a message from NSQ has none: workers get this
        ("time-left", int(found.left)),
        ("file", 0),
        ("reserves", msg.attempts),
        ("timeouts", js.timeouts if js else 0),
        ("releases", js.releases if js else 0),
        ("buries", js.buries if js else 0),
        ("kicks", js.kicks if js else 0),
    ]


_COMMANDS = (
    "put",
    "peek",
    "peek-ready",
    "peek-delayed",
    "peek-buried",
    "reserve",
    "reserve-with-timeout",
    "delete",
    "release",
    "use",
    "watch",
    "ignore",
    "bury",
    "kick",
    "touch",
    "stats",
    "stats-job",
    "stats-tube",
    "list-tubes",
    "list-tube-used",
    "list-tubes-watched",
    "pause-tube",
)


def stats(server: BeanstalkServer) -> Pairs:
    now = trio.current_time()
    views = [server.view(name) for name in server.tube_names()]
    totals = sum((query.counts(v, now) for v in views if v is not None), query.NO_COUNTS)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    uname = os.uname()
    sessions = server.sessions
    pairs = _job_counts(totals)
    pairs += [(f"cmd-{name}", server.commands[name]) for name in _COMMANDS]
    pairs += [
        ("job-timeouts", server.broker.timeout_count),
        ("total-jobs", server.broker.published_count),
        ("max-job-size", server.max_job_size),
        ("current-tubes", len(server.tube_names())),
        ("current-connections", len(sessions)),
        ("current-producers", sum(1 for s in sessions if s.is_producer)),
        ("current-workers", sum(1 for s in sessions if s.is_worker)),
        ("current-waiting", sum(1 for s in sessions if s.waiting)),
        ("total-connections", server.total_connections),
        ("pid", server.pid),
        ("version", quoted(VERSION)),
        ("rusage-utime", f"{usage.ru_utime:.6f}"),
        ("rusage-stime", f"{usage.ru_stime:.6f}"),
        ("uptime", int(time.time() - server.started)),
        ("binlog-oldest-index", 0),
        ("binlog-current-index", 0),
        ("binlog-records-migrated", 0),
        ("binlog-records-written", 0),
        ("binlog-max-size", _BINLOG_MAX_SIZE),
        ("draining", server.draining),
        ("id", server.instance_id),
        ("hostname", quoted(uname.nodename)),
        ("os", quoted(uname.version)),
        ("platform", quoted(uname.machine)),
    ]
    return pairs
