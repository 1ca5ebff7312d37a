"""beanstalkd commands by job id across gateways sharing one Redis (docs/storage.md,
"Redis"): two real `gateway serve --store redis://...` processes, greenstalk clients.

What another gateway holds, deferred or buried is in Redis only, so A's state is read
there: `peek <id>`, `stats-job`, `kick-job`, `reserve-job`, `delete`, `peek-delayed`, and the admin
page's lists and message view. Every wait is on a reply, bounded by a timeout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import greenstalk
import httpx
import pytest
import trio

from tests.integration.test_durability import GatewayProc, start_gateway, supervised

T = TypeVar("T")
TUBE = "shared-jobs"


@pytest.fixture
def url(redis_url: str) -> str:  # the session's redis-server (tests/conftest.py), emptied
    return redis_url


async def two_gateways(sup: object, tmp: Path, url: str) -> tuple[GatewayProc, GatewayProc]:
    a = await start_gateway(sup, tmp / "a", "--store", url)  # type: ignore[arg-type]
    b = await start_gateway(sup, tmp / "b", "--store", url)  # type: ignore[arg-type]
    return a, b


def client(gw: GatewayProc) -> greenstalk.Client[bytes]:
    host, port = gw.addresses["beanstalk"]
    return greenstalk.Client((host, port), encoding=None, use=TUBE, watch=TUBE)


async def run(call: Callable[[], T]) -> T:
    """A blocking greenstalk call, off the event loop, bounded."""
    with trio.fail_after(15):
        return await trio.to_thread.run_sync(call)


@asynccontextmanager
async def two_clients(
    url: str, tmp: Path
) -> AsyncIterator[tuple[greenstalk.Client[bytes], greenstalk.Client[bytes]]]:
    """A greenstalk client of gateway A and one of gateway B, both on `url`."""
    async with supervised() as sup:
        a, b = await two_gateways(sup, tmp, url)
        on_a, on_b = client(a), client(b)
        try:
            yield on_a, on_b
        finally:
            on_a.close()
            on_b.close()


async def admin(gw: GatewayProc, path: str, **params: Any) -> Any:
    async with httpx.AsyncClient() as http:
        reply = await http.get(gw.http + path, params=params, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()


async def groups_on(gw: GatewayProc, topic: str) -> list[str]:
    state = await admin(gw, "/admin/api/state")
    return [g["name"] for t in state["topics"] if t["name"] == topic for g in t["groups"]]


async def test_peek_and_stats_job_of_a_job_another_gateway_reserved(
    url: str, tmp_path: Path
) -> None:
    async with two_clients(url, tmp_path) as (on_a, on_b):
        job_id = await run(lambda: on_a.put(b"held on A", priority=7, ttr=120))
        job = await run(lambda: on_a.reserve(timeout=5))
        assert job.id == job_id
        peeked = await run(lambda: on_b.peek(job_id))
        assert (peeked.id, peeked.body) == (job_id, b"held on A")
        stats = await run(lambda: on_b.stats_job(job_id))
        assert stats["state"] == "reserved" and stats["tube"] == TUBE
        assert stats["pri"] == 7 and stats["reserves"] == 1
        assert 100 <= stats["time-left"] <= 120, stats  # the job's own TTR
        # nobody but A may take it: reserve-job and kick-job on B find nothing to do
        with pytest.raises(greenstalk.NotFoundError):
            await run(lambda: on_b.reserve_job(job_id))
        with pytest.raises(greenstalk.NotFoundError):
            await run(lambda: on_b.kick_job(job_id))
        await run(lambda: on_a.delete(job_id))
        with pytest.raises(greenstalk.NotFoundError):
            await run(lambda: on_b.peek(job_id))


async def test_kick_job_of_a_job_another_gateway_buried(url: str, tmp_path: Path) -> None:
    async with two_clients(url, tmp_path) as (on_a, on_b):
        job_id = await run(lambda: on_a.put(b"grim"))
        job = await run(lambda: on_a.reserve(timeout=5))
        await run(lambda: on_a.bury(job, priority=3))
        stats = await run(lambda: on_b.stats_job(job_id))
        assert (stats["state"], stats["pri"]) == ("buried", 3)
        assert (await run(on_b.peek_buried)).id == job_id
        await run(lambda: on_b.kick_job(job_id))
        assert (await run(lambda: on_b.stats_job(job_id)))["state"] == "ready"
        with pytest.raises(greenstalk.NotFoundError):
            await run(lambda: on_b.kick_job(job_id))  # ready now: nothing to kick
        again = await run(lambda: on_b.reserve(timeout=5))
        assert (again.id, again.body) == (job_id, b"grim")
        await run(lambda: on_b.delete(again))


async def test_reserve_job_and_peek_delayed_of_a_job_another_gateway_deferred(
    url: str, tmp_path: Path
) -> None:
    async with two_clients(url, tmp_path) as (on_a, on_b):
        await run(lambda: on_a.put(b"first", delay=300))
        later = await run(lambda: on_a.put(b"second", delay=600))
        peeked = await run(on_b.peek_delayed)
        assert peeked.body == b"first"
        stats = await run(lambda: on_b.stats_job(later))
        assert stats["state"] == "delayed" and 590 <= stats["time-left"] <= 600, stats
        job = await run(lambda: on_b.reserve_job(later))
        assert (job.id, job.body) == (later, b"second")
        stats = await run(lambda: on_a.stats_job(later))
        assert stats["state"] == "reserved" and stats["reserves"] == 1, stats
        await run(lambda: on_b.delete(job))
        assert (await run(on_a.peek_delayed)).body == b"first"


async def test_delete_of_a_job_another_gateway_deferred_buried_or_holds(
    url: str, tmp_path: Path
) -> None:
    async with two_clients(url, tmp_path) as (on_a, on_b):
        delayed = await run(lambda: on_a.put(b"later", delay=300))
        grim = await run(lambda: on_a.put(b"grim", priority=1))
        job = await run(lambda: on_a.reserve(timeout=5))
        assert job.id == grim
        await run(lambda: on_a.bury(job))
        held = await run(lambda: on_a.put(b"held", priority=2))
        assert (await run(lambda: on_a.reserve(timeout=5))).id == held
        unclaimed = await run(lambda: on_a.put(b"nobody's yet", priority=3))
        # B deletes what A deferred and buried, and a ready job no gateway claimed
        for job_id in (delayed, grim, unclaimed):
            await run(lambda job_id=job_id: on_b.delete(job_id))
            with pytest.raises(greenstalk.NotFoundError):
                await run(lambda job_id=job_id: on_a.peek(job_id))
            with pytest.raises(greenstalk.NotFoundError):  # and only once
                await run(lambda job_id=job_id: on_b.delete(job_id))
        # what a worker of A holds is its own to delete
        with pytest.raises(greenstalk.NotFoundError):
            await run(lambda: on_b.delete(held))
        assert (await run(lambda: on_b.stats_job(held)))["state"] == "reserved"
        await run(lambda: on_a.delete(held))
        counts = ["ready", "delayed", "buried", "reserved"]
        with trio.fail_after(10):  # the shared counts are read every second
            while True:
                stats = await run(lambda: on_a.stats_tube(TUBE))
                if all(stats[f"current-jobs-{c}"] == 0 for c in counts):
                    break
                await trio.sleep(0.05)


async def test_admin_lists_and_message_show_what_another_gateway_keeps(
    url: str, tmp_path: Path
) -> None:
    async with supervised() as sup:
        a, b = await two_gateways(sup, tmp_path, url)
        on_a = client(a)
        try:
            ready = [await run(lambda i=i: on_a.put(b"r%d" % i, priority=10 - i)) for i in range(3)]
            delayed = await run(lambda: on_a.put(b"later", delay=500))
            held = await run(lambda: on_a.reserve(timeout=5))  # the most urgent: r2
            assert held.id == ready[2]
            buried_id = await run(lambda: on_a.put(b"grim", priority=0))
            grim = await run(lambda: on_a.reserve(timeout=5))
            assert grim.id == buried_id
            await run(lambda: on_a.bury(grim))
            where = {"topic": TUBE, "group": "beanstalk"}
            with trio.fail_after(10):  # B reads the registry every second
                while "beanstalk" not in await groups_on(b, TUBE):
                    await trio.sleep(0.05)
            listed = await admin(b, "/admin/api/peek", state="ready", **where)
            assert [m["id"] for m in listed["messages"]] == [ready[1], ready[0]]
            listed = await admin(b, "/admin/api/peek", state="deferred", **where)
            assert [m["id"] for m in listed["messages"]] == [delayed]
            listed = await admin(b, "/admin/api/peek", state="buried", **where)
            assert [m["id"] for m in listed["messages"]] == [buried_id]
            seen = await admin(b, "/admin/api/message", id=held.id, **where)
            assert seen["state"] == "reserved" and seen["attempts"] == 1
        finally:
            on_a.close()
