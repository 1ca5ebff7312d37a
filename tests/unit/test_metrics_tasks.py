"""gateway_tasks: the Trio tasks alive, counted at scrape time (a leak shows as growth)."""

from __future__ import annotations

import trio

from gateway.metrics import Metrics


def gauge(metrics: Metrics) -> float:
    metrics.refresh()
    for metric in metrics.registry.collect():
        if metric.name == "gateway_tasks":
            return metric.samples[0].value
    raise AssertionError("no gateway_tasks")


async def test_counts_tasks_as_they_come_and_go() -> None:
    metrics = Metrics()
    before = gauge(metrics)
    assert before >= 1
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(release.wait)
        await trio.testing.wait_all_tasks_blocked()
        assert gauge(metrics) == before + 5  # the five, in the test's own nursery
        release.set()
    assert gauge(metrics) == before


def test_outside_a_run_is_zero() -> None:
    assert gauge(Metrics()) == 0
