"""Counters the broker keeps for metrics: plain integers, bumped on the hot paths, read
only when someone scrapes. Nothing here knows Prometheus (gateway/metrics.py does).

Per group and per consumer protocol, five counts (see COUNTS); every consumer holds the
list of its own protocol, so counting a delivery or an acknowledgement is one list-item
increment, with no lookup and nothing to fold in when the consumer leaves.
"""

from __future__ import annotations

from typing import Final

import numpy as np

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
# numpy is imported with this module, at start-up: imported at the first fold, it held
# the event loop for a tenth of a second in the middle of traffic
_BOUNDS: Final = np.array(_BOUNDS_NS, dtype=np.int64)


class Histogram:
    """A latency histogram as bare counts (prometheus_client's Histogram takes a lock and
    does more work per observation than an acknowledgement itself costs).

    An acknowledgement only appends its latency to `samples` (a bound `list.append`, no
    Python call); they are sorted into the buckets FOLD_AT at a time, with numpy, and
    before anything reads the counts."""

    __slots__ = ("_count", "_sum_ns", "buckets", "samples")

    def __init__(self) -> None:
        self.buckets = [0] * (len(_BOUNDS_NS) + 1)  # the last one is +Inf
        self._count = 0
        self._sum_ns = 0
        # never replaced (emptied in place): consumers keep a reference to it
        self.samples: list[int] = []

    def observe_ns(self, elapsed_ns: int) -> None:
        samples = self.samples
        samples.append(elapsed_ns)
        if len(samples) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Sort the samples taken so far into the buckets."""
        samples = self.samples
        if not samples:
            return
        values = np.maximum(np.array(samples, dtype=np.int64), 0)  # a clock stepped back
        del samples[:]
        placed = np.bincount(
            np.searchsorted(_BOUNDS, values, side="left"), minlength=len(self.buckets)
        )
        buckets = self.buckets
        for i, n in enumerate(placed.tolist()):
            buckets[i] += n
        self._count += len(values)
        self._sum_ns += int(values.sum())

    @property
    def count(self) -> int:
        self.fold()
        return self._count

    @property
    def sum_ns(self) -> int:
        self.fold()
        return self._sum_ns

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, +Inf last: the shape Prometheus wants."""
        self.fold()
        out = []
        total = 0
        for bound, n in zip((*LATENCY_BUCKETS, None), self.buckets, strict=True):
            total += n
            out.append(("+Inf" if bound is None else repr(bound), total))
        return out


# samples an acknowledgement path lets pile up before it folds them (a few hundred KB)
FOLD_AT: Final = 4096
