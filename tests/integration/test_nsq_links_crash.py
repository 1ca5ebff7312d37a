"""The NSQ links in a real `gateway serve` process on the durable default store, killed
with SIGKILL in the middle of moving messages and started again on the same data dir:
every message arrives, and the only duplicates are of what was in flight at the kill.
The upstream nsqd is an in-process gateway (memory store)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from gateway.app import Gateway
from gateway.broker.errors import StoreUnavailable
from tests.helpers import running_gateway
from tests.integration.test_durability import (
    GatewayProc,
    channel_stats,
    create_channel,
    start_gateway,
    supervised,
)
from tests.integration.test_nsq_links import bodies_of, drain, nsq_address, publish

N = 3000
MAX_IN_FLIGHT = 200


async def wait_for_stats(
    gw: GatewayProc, topic: str, channel: str, settled: bool, timeout: float = 30.0
) -> dict:
    """The channel's /stats once it is settled (nothing ready or in flight) or not."""
    with trio.fail_after(timeout):
        while True:
            stats = await channel_stats(gw, topic, channel)
            if (stats["depth"] == 0 and stats["in_flight_count"] == 0) == settled:
                return stats
            await trio.sleep(0.05)


async def wait_for(condition: object, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not condition():  # type: ignore[operator]
            await trio.sleep(0.01)


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "links.toml"
    path.write_text(text)
    return str(path)


def check_counts(got: list[bytes], sent: list[bytes]) -> None:
    assert set(got) == set(sent), f"{len(set(sent) - set(got))} lost"
    duplicates = sum(n - 1 for n in Counter(got).values())
    assert duplicates <= MAX_IN_FLIGHT, f"{duplicates} duplicates"
    print(f"{len(sent)} sent, {len(got)} received, {duplicates} duplicates")


async def test_an_import_killed_midway_loses_nothing(tmp_path: Path) -> None:
    sent = bodies_of(N)
    # nsqd's msg_timeout at 1 s: what the killed gateway held comes back soon
    async with running_gateway(nsqd__msg_timeout=1000) as upstream, supervised() as sup:
        await publish(upstream, "src", sent)
        toml = config(
            tmp_path,
            f"""
[[nsq_import]]
topic = "src"
channel = "ch"
nsqd_tcp_addresses = ["{nsq_address(upstream)}"]
max_in_flight = {MAX_IN_FLIGHT}
""",
        )
        data = tmp_path / "data"
        gw = await start_gateway(sup, data, "--config", toml)
        upstream_ch = upstream.broker.topics["src"].groups
        await wait_for(lambda: "ch" in upstream_ch and upstream_ch["ch"].finish_count >= N // 10)
        await gw.sigkill()
        gw = await start_gateway(sup, data, "--config", toml)
        ch = upstream_ch["ch"]
        await wait_for(lambda: ch.finish_count == N and not ch.in_flight and not ch.depth)
        await create_channel(gw, "src", "c")  # the gateway's own topic, drained
        stats = await channel_stats(gw, "src", "c")
        total = stats["depth"] + stats["in_flight_count"]
        check_counts(await drain(gw, "src", "c", total), sent)  # type: ignore[arg-type]


async def test_an_export_killed_midway_loses_nothing(tmp_path: Path) -> None:
    sent = bodies_of(N)
    async with running_gateway() as upstream, supervised() as sup:
        up: Gateway = upstream
        got_up = up.broker.group("up", "c")
        # The upstream refuses the export's publishes once a tenth has arrived, until the
        # exporter is killed: however fast the export runs, the kill finds most of it
        # unsent (nsqd's E_MPUB_FAILED; the exporter keeps them and tries again).
        holding = True
        publish_upstream = up.broker.publish

        def held_back(topic: str, bodies: Sequence[bytes], **kwargs: Any) -> object:
            if holding and topic == "up" and got_up.message_count >= N // 10:
                raise StoreUnavailable("held back until the exporter is killed")
            return publish_upstream(topic, bodies, **kwargs)

        up.broker.publish = held_back  # type: ignore[method-assign]
        toml = config(
            tmp_path,
            f"""
[[nsq_export]]
topic = "out"
to_topic = "up"
nsqd_tcp_addresses = ["{nsq_address(up)}"]
batch = 50
max_in_flight = {MAX_IN_FLIGHT}
""",
        )
        data = tmp_path / "data"
        gw = await start_gateway(sup, data, "--config", toml)
        await publish(gw, "out", sent)  # type: ignore[arg-type]
        await wait_for(lambda: got_up.message_count >= N // 10)
        await gw.sigkill()
        assert got_up.message_count < N, "all exported before the kill"
        holding = False
        gw = await start_gateway(sup, data, "--config", toml)
        await wait_for_stats(gw, "out", "nsq_export", settled=True)
        check_counts(await drain(up, "up", "c", got_up.message_count), sent)
