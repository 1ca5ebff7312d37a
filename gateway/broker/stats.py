"""Counters the broker keeps for metrics: plain integers, bumped on the hot paths, read
only when someone scrapes. Nothing here knows Prometheus (gateway/metrics.py does).

Per group and per consumer protocol, five counts (see COUNTS); every consumer holds the
list of its own protocol, so counting a delivery or an acknowledgement is one list-item
increment, with no lookup and nothing to fold in when the consumer leaves.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

# indexes into a group's per-protocol count list
DELIVERED, ACKNOWLEDGED, REQUEUED, TIMED_OUT, BURIED = range(5)
COUNTS: Final = ("delivered", "acknowledged", "requeued", "timed_out", "buried")

# publish -> acknowledgement, seconds: from a millisecond (a local consumer keeping up) to
# an hour (a job that waited in a queue)
LATENCY_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
_BOUNDS_NS: Final = tuple(int(b * 1e9) for b in LATENCY_BUCKETS)


def new_counts() -> list[int]:
    return [0, 0, 0, 0, 0]


class Histogram:
    """A latency histogram as bare counts (prometheus_client's Histogram takes a lock and
    does more work per observation than an acknowledgement itself costs)."""

    __slots__ = ("buckets", "count", "sum_ns")

    def __init__(self) -> None:
        self.buckets = [0] * (len(_BOUNDS_NS) + 1)  # the last one is +Inf
        self.count = 0
        self.sum_ns = 0

    def observe_ns(self, elapsed_ns: int) -> None:
        if elapsed_ns < 0:
            elapsed_ns = 0  # the wall clock stepped back
        self.buckets[bisect_left(_BOUNDS_NS, elapsed_ns)] += 1
        self.count += 1
        self.sum_ns += elapsed_ns

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, +Inf last: the shape Prometheus wants."""
        out = []
        total = 0
        for bound, n in zip((*LATENCY_BUCKETS, None), self.buckets, strict=True):
            total += n
            out.append(("+Inf" if bound is None else repr(bound), total))
        return out
