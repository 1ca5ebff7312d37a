"""The admin page's history: rates and depths of every topic and group, sampled by the
gateway at a fixed interval and kept in a bounded ring, so that a page opened during an
incident draws the last half hour at once instead of only what it polls itself.

The sampler reads the queues through the broker's query API like every other reader
above the broker. Its interval is measured on Trio's clock (a test's MockClock moves it)
and each sample is stamped with `wall()` (time.time unless a test says otherwise).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from gateway.broker import query

if TYPE_CHECKING:
    from gateway.broker import Broker

INTERVAL = 10.0  # seconds between samples
KEEP = 180  # samples kept: 30 minutes at the default interval
# topics and groups a sample covers at most: memory stays bounded whatever clients create
MAX_SERIES = 500
log = logging.getLogger("gateway.http")


@dataclass(frozen=True, slots=True)
class Point:
    """One series at one sample: in/s and acked/s since the sample before, and depths."""

    rate_in: float
    rate_acked: float
    depth: int  # a topic: its backlog (nsqd's topic depth); a group: ready
    held: int  # a topic: every group's messages together; a group: in flight


@dataclass(frozen=True, slots=True)
class Sample:
    time: float
    points: dict[tuple[str, str | None], Point]  # (topic, group or None for the topic)


class History:
    def __init__(
        self,
        broker: Broker,
        *,
        interval: float = INTERVAL,
        keep: int = KEEP,
        max_series: int = MAX_SERIES,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.broker = broker
        self.interval = interval
        self.max_series = max_series
        self.wall = wall
        self.samples: deque[Sample] = deque(maxlen=keep)
        # the counters at the last sample, for the next one's rates
        self._last: dict[tuple[str, str | None], tuple[int, int]] = {}
        self._last_at: float | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample now and then every `interval` seconds, until cancelled."""
        task_status.started()
        while True:
            try:
                self.sample()
            except Exception:
                # the charts miss a point; the gateway, which serves without them, goes on
                log.exception("admin history: a sample failed")
            await trio.sleep(self.interval)

    def _counters(self) -> dict[tuple[str, str | None], tuple[int, int, int, int]]:
        """(messages in, acknowledged, depth, held) of every topic and group."""
        out: dict[tuple[str, str | None], tuple[int, int, int, int]] = {}
        for topic in query.topics(self.broker, by_name=True):
            if len(out) >= self.max_series:
                break
            acked = held = 0
            groups = query.groups(self.broker, topic.name, by_name=True)
            for g in groups[: max(0, self.max_series - len(out) - 1)]:
                c = g.counts
                out[(topic.name, g.name)] = (g.message_count, g.finish_count, c.ready, c.reserved)
                acked += g.finish_count
                held += c.ready + c.delayed + c.reserved + c.buried
            # a topic's acked/s is its groups' together, each acknowledging its own copy
            out[(topic.name, None)] = (topic.message_count, acked, topic.backlog, held)
        return out

    def sample(self) -> None:
        now = trio.current_time()
        counters = self._counters()
        seconds = now - self._last_at if self._last_at is not None else 0.0
        points: dict[tuple[str, str | None], Point] = {}
        for key, (n_in, n_acked, depth, held) in counters.items():
            # a series new since the last sample counted all of its messages since then
            before = self._last.get(key, (0, 0))
            if seconds <= 0:  # the first sample: no interval to divide by
                rate_in = rate_acked = 0.0
            else:
                # a counter that went down (a topic deleted and made again) is 0, not less
                rate_in = max(0, n_in - before[0]) / seconds
                rate_acked = max(0, n_acked - before[1]) / seconds
            points[key] = Point(rate_in, rate_acked, depth, held)
        self._last = {key: (c[0], c[1]) for key, c in counters.items()}
        self._last_at = now
        self.samples.append(Sample(self.wall(), points))

    def as_json(self) -> dict[str, Any]:
        """{"interval", "samples": [{"time", "topics": {topic: point}, "groups":
        {topic: {group: point}}}]}, oldest first; a point is {in, acked, depth, held}."""
        out = []
        for s in self.samples:
            topics: dict[str, Any] = {}
            groups: dict[str, dict[str, Any]] = {}
            for (topic, group), p in s.points.items():
                point = {
                    "in": round(p.rate_in, 3),
                    "acked": round(p.rate_acked, 3),
                    "depth": p.depth,
                    "held": p.held,
                }
                if group is None:
                    topics[topic] = point
                else:
                    groups.setdefault(topic, {})[group] = point
            out.append({"time": s.time, "topics": topics, "groups": groups})
        return {"interval": self.interval, "samples": out}
