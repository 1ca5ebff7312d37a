"""nsqd's /stats: every topic and group in nsqd's JSON shape (key order included) and its
text report.

Topics are the broker's topics and channels its groups, whichever protocol made them: a
beanstalkd tube is a topic, its workers' group a channel. A group's clients are its
consumers: NSQ connections with every field nsqd shows, other protocols' workers with the
fields that apply (`version` names their protocol). Producers are the NSQ connections
that have published, as in nsqd.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
from collections import deque
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from gateway.broker import Broker, query
from gateway.clients import Client, ClientInfo
from gateway.http.gocompat import go_duration

VERSION = "1.3.0"  # the nsqd version the gateway answers as (clients only log it)
# nsqd has no end-to-end latency percentiles unless configured: this is its empty result
_NO_E2E: dict[str, Any] = {"count": 0, "percentiles": None}


def topic_stats(
    broker: Broker, topic_name: str, channel_name: str, include_clients: bool
) -> list[dict[str, Any]] | None:
    """nsqd's GetStats: topics sorted by name, channels by name. A `topic_name` that does
    not exist gives None (JSON null); a `channel_name` leaves out topics without it."""
    if topic_name:
        topic = query.topic(broker, topic_name)
        if topic is None:
            return None
        topics = [topic]
    else:
        topics = query.topics(broker, by_name=True)
    out = []
    for topic in topics:
        if channel_name:
            group = query.group(broker, topic.name, channel_name, clients=include_clients)
            if group is None:
                continue
            groups = [group]
        else:
            groups = query.groups(broker, topic.name, by_name=True, clients=include_clients)
        channels = [_channel(g, topic_name, include_clients) for g in groups]
        out.append(_topic(topic, channels))
    return out


def _topic(topic: query.TopicView, channels: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "topic_name": topic.name,
        "channels": channels,
        "depth": topic.backlog,
        "backend_depth": topic.spilled,  # past the memory window, on disk only
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        "e2e_processing_latency": _NO_E2E,
    }


def _channel(group: query.GroupView, topic_filter: str, include_clients: bool) -> dict[str, Any]:
    clients = [client_stats(c, topic_filter) for c in group.consumers] if include_clients else None
    counts = group.counts
    return {
        "channel_name": group.name,
        # nsqd: depth is memory plus disk, backend_depth the part on disk
        "depth": counts.ready,
        "backend_depth": counts.spilled,
        "in_flight_count": counts.reserved,
        "deferred_count": counts.delayed,
        "message_count": group.message_count,
        "requeue_count": group.requeue_count,
        "timeout_count": group.timeout_count,
        "client_count": len(group.consumers),
        "clients": clients,
        "paused": group.paused,
        "e2e_processing_latency": _NO_E2E,
    }


def client_stats(consumer: query.ConsumerInfo, topic_filter: str = "") -> dict[str, Any]:
    """One consumer's clientV2 stats: its session's ClientInfo, its window from the
    broker (a beanstalkd worker has a consumer per tube, each with its own)."""
    info = consumer.client
    if info is None:  # a sink that is no session (a test's)
        info = ClientInfo.worker(consumer.address, "unknown", int(time.time()))
    return _client(info, topic_filter, consumer.ready, consumer.in_flight)


def _client(info: ClientInfo, topic_filter: str, ready: int, in_flight: int) -> dict[str, Any]:
    """clientV2.Stats: ClientV2Stats's fields in their order; the omitempty ones only when
    set."""
    out: dict[str, Any] = {
        "client_id": info.client_id,
        "hostname": info.hostname,
        "version": info.version,
        "remote_address": info.remote_address,
        "state": info.state,
        "ready_count": ready,
        "in_flight_count": in_flight,
        "message_count": info.message_count,
        "finish_count": info.finish_count,
        "requeue_count": info.requeue_count,
        "connect_ts": info.connect_ts,
        "sample_rate": info.sample_rate,
        "deflate": info.deflate,
        "snappy": info.snappy,
        "user_agent": info.user_agent,
    }
    if info.authed:
        out["authed"] = True
        if info.auth_identity:
            out["auth_identity"] = info.auth_identity
        if info.auth_identity_url:
            out["auth_identity_url"] = info.auth_identity_url
    for topic, count in info.pub_counts:
        if topic_filter and topic != topic_filter:
            continue
        # nsqd 1.3.0 breaks out of this loop after the first topic: one entry at most
        out["pub_counts"] = [{"topic": topic, "count": count}]
        break
    tls = info.tls
    if tls is None:
        out.update(
            tls=False,
            tls_cipher_suite="",
            tls_version="",
            tls_negotiated_protocol="",
            tls_negotiated_protocol_is_mutual=False,
        )
    else:
        out.update(
            tls=True,
            tls_cipher_suite=tls.cipher_suite,
            tls_version=tls.version,
            tls_negotiated_protocol=tls.negotiated_protocol,
            tls_negotiated_protocol_is_mutual=True,
        )
    return out


def producers(sessions: Iterable[Client], topic_filter: str) -> list[dict[str, Any]] | None:
    """NSQ connections that have published at least once; None (JSON null) when none."""
    publishing = sorted(
        (info for info in (s.client_info() for s in sessions) if info.pub_counts),
        key=lambda info: (info.connect_ts, info.remote_address),
    )
    return [
        _client(info, topic_filter, info.ready_count, info.in_flight_count) for info in publishing
    ] or None


# -- memory: nsqd's Go runtime figures, with Python's nearest equivalents ----------------------


class _GCPauses:
    """The last 256 collection pauses (Go's MemStats.PauseNs keeps 256), timed by a
    gc callback: one entry per collection, nothing per message."""

    def __init__(self) -> None:
        self.pauses: deque[int] = deque(maxlen=256)
        self._started = 0
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self._on_gc)
            self.installed = True

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        elif self._started:
            self.pauses.append(time.perf_counter_ns() - self._started)


GC_PAUSES = _GCPauses()


def _percentile(perc: float, ordered: list[int]) -> int:
    """nsqd's percentile(): nearest rank, rounding half up."""
    if not ordered:
        return 0
    index = min(int(perc / 100.0 * len(ordered) + 0.5), len(ordered) - 1)
    return ordered[index]


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_stats() -> dict[str, int]:
    """nsqd's memStats keys. heap_objects: blocks the allocator holds; heap_in_use_bytes:
    resident memory; GC pauses from the collector callback. Python has no idle, released
    or next-GC byte figures: those are 0."""
    pauses = sorted(GC_PAUSES.pauses)
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": _resident_bytes(),
        "heap_released_bytes": 0,
        "gc_pause_usec_100": _percentile(100.0, pauses) // 1000,
        "gc_pause_usec_99": _percentile(99.0, pauses) // 1000,
        "gc_pause_usec_95": _percentile(95.0, pauses) // 1000,
        "next_gc_bytes": 0,
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()),
    }


# -- the text format -----------------------------------------------------------------------------


def text_report(
    topics: list[dict[str, Any]] | None,
    producer_list: list[dict[str, Any]] | None,
    memory: dict[str, int] | None,
    start_time: float,
    health: str,
) -> str:
    """nsqd's printStats, line for line (no client parses it; people read it)."""
    from gateway import __version__

    started = datetime.fromtimestamp(int(start_time)).astimezone()
    uptime = go_duration(int((time.time() - start_time) * 1e9))
    lines = [
        f"nsqd v{VERSION} (built w/mq-gateway {__version__})",
        f"start_time {started.isoformat().replace('+00:00', 'Z')}",  # Go's RFC3339
        f"uptime {uptime}",
        "",
        f"Health: {health}",
    ]
    if memory is not None:
        lines += ["", "Memory:"]
        lines += [f"   {key:<25}\t{value}" for key, value in memory.items()]
    out = "\n".join(lines) + "\n"
    out += "\nTopics:" if topics else "\nTopics: None\n"
    for t in topics or ():
        mark = "*P " if t["paused"] else "   "
        out += (
            f"\n{mark}[{t['topic_name']:<15}] depth: {t['depth']:<5} be-depth: "
            f"{t['backend_depth']:<5} msgs: {t['message_count']:<8} e2e%: \n"
        )
        for c in t["channels"]:
            mark = "   *P " if c["paused"] else "      "
            out += (
                f"{mark}[{c['channel_name']:<25}] depth: {c['depth']:<5} be-depth: "
                f"{c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} def: "
                f"{c['deferred_count']:<4} re-q: {c['requeue_count']:<5} timeout: "
                f"{c['timeout_count']:<5} msgs: {c['message_count']:<8} e2e%: \n"
            )
            for client in c["clients"] or ():
                out += f"        {_client_line(client)}\n"
    if not producer_list:
        out += "\nProducers: None\n"
    else:
        out += "\nProducers:\n"
        out += "".join(f"   {_client_line(p)}\n" for p in producer_list)
    return out


def _client_line(client: dict[str, Any]) -> str:
    """ClientV2Stats.String."""
    port = client["remote_address"].rsplit(":", 1)[-1]
    ident = f"{client['hostname']}:{port} {client['user_agent']}"
    connected = go_duration(max(0, int(time.time()) - client["connect_ts"]) * 10**9)
    pub_counts = client.get("pub_counts")
    if pub_counts:
        total = sum(p["count"] for p in pub_counts)
        topics = ",".join(f"{p['topic']}={p['count']}" for p in pub_counts)
        return (
            f"[{client['version']} {ident:<21}] msgs: {total:<8} topics: {topics} "
            f"connected: {connected}"
        )
    return (
        f"[{client['version']} {ident:<21}] state: {client['state']} inflt: "
        f"{client['in_flight_count']:<4} rdy: {client['ready_count']:<4} fin: "
        f"{client['finish_count']:<8} re-q: {client['requeue_count']:<8} msgs: "
        f"{client['message_count']:<8} connected: {connected}"
    )
