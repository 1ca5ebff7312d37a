"""The admin page's history ring: sampled by the gateway at a fixed interval on Trio's
clock (MockClock here), bounded in samples and in series."""

from __future__ import annotations

import trio
import trio.testing

from gateway.http.history import History
from tests.helpers import running_broker


async def test_samples_rates_and_depths_at_a_fixed_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_broker() as broker:
        broker.group("orders", "ch")
        history = History(broker, interval=10.0, keep=4, wall=trio.current_time)
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            await nursery.start(history.run)
            assert len(history.samples) == 1  # one at once: a page opened now has a point
            broker.publish("orders", [b"x"] * 50)
            await trio.sleep(10.5)  # MockClock: no real waiting
            [_, second] = history.as_json()["samples"]
            assert second["time"] == start + 10
            assert second["groups"]["orders"]["ch"] == {
                "in": 5.0, "acked": 0.0, "depth": 50, "held": 0
            }  # fmt: skip
            assert second["topics"]["orders"]["in"] == 5.0
            assert second["topics"]["orders"]["held"] == 50
            broker.topics["orders"].groups["ch"].empty()
            await trio.sleep(60)
            data = history.as_json()
            assert data["interval"] == 10.0
            samples = data["samples"]
            assert len(samples) == 4  # the ring keeps the newest `keep`
            assert [s["time"] - start for s in samples] == [40, 50, 60, 70]
            assert samples[-1]["groups"]["orders"]["ch"] == {
                "in": 0.0, "acked": 0.0, "depth": 0, "held": 0
            }  # fmt: skip
            nursery.cancel_scope.cancel()


async def test_a_sample_covers_a_bounded_number_of_series() -> None:
    async with running_broker() as broker:
        for i in range(20):
            broker.group(f"t{i:02d}", "g")
        history = History(broker, max_series=7, wall=trio.current_time)
        history.sample()
        [sample] = history.samples
        assert len(sample.points) <= 7
        assert (("t00", None) in sample.points) and (("t00", "g") in sample.points)
