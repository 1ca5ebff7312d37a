"""What one gateway process runs on: its store, its memory, what its queues hold.

Read by the start-up log lines (gateway.app) and the admin page's node panel
(gateway.http.admin); the queues through the broker's query API, like every reader
above the broker.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.broker import query

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.broker import Broker


def store_kind(url: str | None) -> str:
    """memory, sqlite, redis or redis+cluster, as the `--store` URL names it."""
    if url is None:
        return "sqlite"
    return url.partition("://")[0]


def fsync_policy(gateway: Gateway) -> str:
    """How the store makes writes durable: only a SQLite store has a policy of its own;
    memory keeps nothing, Redis does as its own configuration says."""
    kind = store_kind(gateway.settings.store)
    if kind != "sqlite":
        return "none (memory)" if kind == "memory" else "the Redis server's own"
    fsync = gateway.settings.storage.fsync
    return f"every {fsync} ms" if isinstance(fsync, int) else fsync


def store_size(gateway: Gateway) -> int | None:
    """Bytes the store's files take on disk (a SQLite store: the index, its WAL and the
    log directory); None for a store with no files here."""
    store = gateway.store
    path = getattr(store, "path", None)
    if not isinstance(path, Path):
        return None
    total = 0
    for one in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(OSError):
            total += one.stat().st_size
    log_dir = getattr(store, "log_dir", None)
    if isinstance(log_dir, Path) and log_dir.is_dir():
        for entry in log_dir.iterdir():
            with contextlib.suppress(OSError):
                total += entry.stat().st_size
    return total


def store_info(gateway: Gateway) -> dict[str, Any]:
    failed = gateway.broker.store_failed
    return {
        "kind": store_kind(gateway.settings.store),
        # the file or the server's address: never a URL's password
        "where": gateway.store.where if gateway.store is not None else "",
        "fsync": fsync_policy(gateway),
        "size": store_size(gateway),
        "health": "ok" if failed is None else f"failing: {failed}",
    }


def rss() -> int:
    """The process's resident memory now, in bytes (the peak where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def held(broker: Broker) -> tuple[Counter[str], int, int]:
    """Messages per state over every topic (a topic's backlog, waiting for its first
    group, counts as ready), and the number of topics and groups."""
    states: Counter[str] = Counter()
    topics = groups = 0
    for topic in query.topics(broker):
        topics += 1
        states["ready"] += topic.backlog
        for g in query.groups(broker, topic.name):
            groups += 1
            c = g.counts
            states["ready"] += c.ready
            states["deferred"] += c.delayed
            states["reserved"] += c.reserved
            states["buried"] += c.buried
    return states, topics, groups
