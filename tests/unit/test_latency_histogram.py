"""The broker's acknowledgement-latency histogram: samples appended on the hot path, sorted
into Prometheus buckets in batches and before any read."""

from __future__ import annotations

from gateway.broker.stats import FOLD_AT, LATENCY_BUCKETS, Histogram


def test_samples_land_in_prometheus_le_buckets_when_read() -> None:
    h = Histogram()
    for ns in (0, 1_000_000, 1_000_001, 7_000_000, 4_000_000_000_000, -5):
        h.observe_ns(ns)
    assert h.samples  # not sorted yet: a read does it
    cumulative = dict(h.cumulative())
    assert not h.samples
    # le is inclusive: 1 ms itself counts in the 0.001 bucket; a negative sample (the wall
    # clock stepped back) counts as 0
    assert cumulative["0.001"] == 3
    assert cumulative["0.0025"] == 4
    assert cumulative["0.01"] == 5
    assert cumulative[repr(LATENCY_BUCKETS[-1])] == 5
    assert cumulative["+Inf"] == 6
    assert h.count == 6
    assert h.sum_ns == 1_000_000 + 1_000_001 + 7_000_000 + 4_000_000_000_000


def test_appending_to_samples_directly_is_counted_and_folds_in_batches() -> None:
    h = Histogram()
    append = h.samples.append  # what a consumer holds
    for _ in range(FOLD_AT - 1):
        append(2_000_000)
    h.observe_ns(2_000_000)  # the FOLD_AT-th sample folds the batch
    assert not h.samples and h.buckets[1] == FOLD_AT
    append(3_000_000)  # the same list, still appended to after the fold
    assert h.count == FOLD_AT + 1
    assert dict(h.cumulative())["0.005"] == FOLD_AT + 1
