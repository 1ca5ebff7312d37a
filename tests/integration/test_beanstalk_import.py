"""Importing from a live beanstalkd (`[[beanstalk_import]]`, `gateway import`): against a
real beanstalkd (the Debian package's /usr/bin/beanstalkd) on an ephemeral port.

Jobs keep their priority (the gateway's reserve order), remaining delay (the gateway's
time-left, not waited for) and TTR; buried jobs arrive buried; each is deleted on the old
server only once stored (a failing store gets them released back, none lost); `follow`
picks up later jobs and new tubes; the one-shot command moves into a running gateway
process; and a gateway killed -9 while importing loses nothing.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from gateway.app import Gateway
from gateway.config_links import BeanstalkImportSettings
from gateway.links import LinkStatus
from gateway.links.beanstalk_client import BeanstalkClient
from gateway.links.beanstalk_codec import command, put, yaml_dict
from gateway.links.beanstalk_import import BeanstalkImport
from gateway.links.beanstalk_mover import BATCH, Job, Mover
from tests.beanstalk_replay import beanstalkd
from tests.helpers import http_base, running_gateway
from tests.integration.test_durability import (
    REPO,
    drain_beanstalk,
    start_gateway,
    supervised,
)
from tests.integration.test_store_failures import Disk, sqlite_gateway

TIMEOUT = 15.0


@asynccontextmanager
async def old_server() -> AsyncIterator[BeanstalkClient]:
    """A fresh beanstalkd, and a client of it (for the test's own puts and checks)."""
    async with beanstalkd([]) as (_proc, port):
        client = await BeanstalkClient.connect("127.0.0.1", port)
        async with client:
            yield client


def url(client: BeanstalkClient) -> str:
    return f"beanstalk://{client.address}"


async def put_jobs(
    client: BeanstalkClient, tube: str, jobs: list[tuple[int, int, int, bytes]]
) -> list[int]:
    """(pri, delay, ttr, body) each; their ids."""
    await client.expect(command("use", tube), "USING")
    replies = await client.calls([put(*job) for job in jobs])
    assert all(r.word == "INSERTED" for r in replies), replies
    return [r.id for r in replies]


async def bury(client: BeanstalkClient, tube: str, body: bytes, pri: int) -> None:
    """A buried job in `tube`, from a connection of its own (which then leaves)."""
    async with await BeanstalkClient.connect(*_host_port(client)) as worker:
        (job_id,) = await put_jobs(worker, tube, [(pri, 0, 60, body)])
        await worker.expect(command("reserve-job", job_id), "RESERVED")
        await worker.expect(command("bury", job_id, pri), "BURIED")


def _host_port(client: BeanstalkClient) -> tuple[str, int]:
    host, port = client.address.rsplit(":", 1)
    return host, int(port)


async def tube_counts(client: BeanstalkClient, tube: str) -> dict[str, int]:
    """The tube's current-jobs-*; all 0 for a tube the server no longer has (beanstalkd
    drops an empty tube nobody uses or watches)."""
    stats = await client.stats_tube(tube) or {}
    states = ("urgent", "ready", "reserved", "delayed", "buried")
    return {s: int(stats.get(f"current-jobs-{s}", 0)) for s in states}


async def until(condition: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> None:
    """Wait for a condition (sync, or a coroutine function), checked every 10 ms."""
    with trio.move_on_after(timeout) as scope:
        while True:
            value = condition()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return
            await trio.sleep(0.01)
    if scope.cancelled_caught:
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def link_status(gateway: Gateway) -> LinkStatus:
    (status,) = gateway.links.statuses
    return status


@asynccontextmanager
async def importing_gateway(client: BeanstalkClient, **link: Any) -> AsyncIterator[Gateway]:
    config = {"url": url(client), **link}
    async with running_gateway(beanstalk="127.0.0.1:0", beanstalk_import=[config]) as gateway:
        yield gateway


async def gateway_client(gateway: Gateway, tube: str) -> BeanstalkClient:
    client = await BeanstalkClient.connect(*gateway.addresses["beanstalk"])
    await client.expect(command("use", tube), "USING")
    await client.expect(command("watch", tube), "WATCHING")
    if tube != "default":
        await client.expect(command("ignore", "default"), "WATCHING")
    return client


async def reserve_all(client: BeanstalkClient) -> list[tuple[bytes, dict[str, str]]]:
    """Reserve, describe and delete every ready job, in reserve order."""
    out = []
    while (reply := await client.call(b"reserve-with-timeout 0\r\n")).word == "RESERVED":
        stats = await client.stats_job(reply.id)
        assert stats is not None
        out.append((reply.data or b"", stats))
        await client.expect(command("delete", reply.id), "DELETED")
    return out


# -- the link -------------------------------------------------------------------------------


async def test_ready_jobs_keep_their_priority_and_ttr_and_leave_the_old_server() -> None:
    async with old_server() as old:
        await put_jobs(old, "jobs", [(50, 0, 7, b"c"), (10, 0, 8, b"a"), (30, 0, 9, b"b")])
        await put_jobs(old, "jobs", [(10, 0, 5, b"a2")])  # same priority: after a
        await put_jobs(old, "default", [(0, 0, 3, b"in default")])
        async with importing_gateway(old, follow=False) as gateway:
            status = link_status(gateway)
            assert status.name == f"beanstalk_import:{old.address}"
            await until(lambda: status.state == "done", "the link done")
            assert (status.moved, status.in_flight, status.errors, status.lag) == (5, 0, 0, 0)
            async with await gateway_client(gateway, "jobs") as gw:
                got = await reserve_all(gw)
                assert [body for body, _ in got] == [b"a", b"a2", b"b", b"c"]
                assert [(s["pri"], s["ttr"]) for _, s in got] == [
                    ("10", "8"),
                    ("10", "5"),
                    ("30", "9"),
                    ("50", "7"),
                ]
            async with await gateway_client(gateway, "default") as gw:
                assert [body for body, _ in await reserve_all(gw)] == [b"in default"]
        for tube in ("jobs", "default"):
            counts = await tube_counts(old, tube)
            assert counts["ready"] + counts["reserved"] == 0, (tube, counts)


async def test_a_link_reports_in_the_metrics_and_on_the_admin_page() -> None:
    async with old_server() as old:
        await put_jobs(old, "jobs", [(0, 0, 60, b"%d" % i) for i in range(7)])
        config = {"url": url(old), "follow": False, "name": "legacy"}
        async with running_gateway(
            beanstalk="127.0.0.1:0", http="127.0.0.1:0", beanstalk_import=[config]
        ) as gateway:
            await until(lambda: link_status(gateway).state == "done", "the link done")
            async with httpx.AsyncClient() as http:
                base = http_base(gateway)
                metrics = (await http.get(f"{base}/metrics")).text
                state = (await http.get(f"{base}/admin/api/state")).json()
        labels = '{kind="beanstalk_import",link="legacy"}'
        for line in (
            f"gateway_link_messages_moved_total{labels} 7.0",
            f"gateway_link_in_flight{labels} 0.0",
            f"gateway_link_errors_total{labels} 0.0",
            f"gateway_link_lag{labels} 0.0",
            f"gateway_link_connected{labels} 0.0",  # done: no longer connected
        ):
            assert line in metrics.splitlines(), line
        [link] = state["links"]
        assert link == {
            "kind": "beanstalk_import", "name": "legacy", "upstream": url(old),
            "state": "done", "moved": 7, "in_flight": 0, "errors": 0, "lag": 0,
            "last_error": "",
        }  # fmt: skip


async def test_delayed_jobs_keep_their_time_left_and_buried_ones_arrive_buried() -> None:
    async with old_server() as old:
        await put_jobs(old, "later", [(7, 1000, 11, b"delayed"), (8, 0, 12, b"ready")])
        await bury(old, "later", b"buried", 99)
        async with importing_gateway(old, tubes=["later"], follow=False) as gateway:
            status = link_status(gateway)
            await until(lambda: status.state == "done", "the link done")
            assert status.moved == 3
            async with await gateway_client(gateway, "later") as gw:
                delayed = await gw.expect(b"peek-delayed\r\n", "FOUND")
                assert delayed.data == b"delayed"
                stats = await gw.stats_job(delayed.id)
                assert stats is not None
                assert (stats["state"], stats["pri"], stats["ttr"]) == ("delayed", "7", "11")
                assert 995 <= int(stats["time-left"]) <= 1000
                buried = await gw.expect(b"peek-buried\r\n", "FOUND")
                assert buried.data == b"buried"
                stats = await gw.stats_job(buried.id)
                assert stats is not None and (stats["state"], stats["pri"]) == ("buried", "99")
                assert [body for body, _ in await reserve_all(gw)] == [b"ready"]
                assert (await gw.call(b"kick 1\r\n")).args == ("1",)  # a real buried job
                assert [body for body, _ in await reserve_all(gw)] == [b"buried"]
        counts = await tube_counts(old, "later")
        assert (counts["ready"], counts["delayed"], counts["buried"]) == (0, 0, 0)


async def test_a_failing_store_gets_the_jobs_released_back_and_none_is_lost(
    tmp_path: Path,
) -> None:
    async with old_server() as old:
        await put_jobs(old, "jobs", [(i, 0, 60, b"job %d" % i) for i in range(20)])
        config = {"url": url(old), "tubes": ["jobs"], "follow": True}
        async with sqlite_gateway(tmp_path, beanstalk_import=[]) as gateway:
            store = gateway.store
            disk = Disk(store)  # type: ignore[arg-type]
            disk.full = True
            # started here, after the disk is made to fail
            link = BeanstalkImport(BeanstalkImportSettings.model_validate(config), gateway.broker)
            async with trio.open_nursery() as nursery:
                await nursery.start(link.run)
                await until(lambda: link.status.errors >= 1, "a refused batch")
                assert link.status.moved == 0
                assert "store" in link.status.last_error
                # released back on the old server, with their priorities
                await until(
                    lambda: _nothing_reserved(old, "jobs"), "the jobs released on the old server"
                )
                disk.full = False
                await until(lambda: link.status.moved == 20, "every job moved", 20)
                nursery.cancel_scope.cancel()
            async with await gateway_client(gateway, "jobs") as gw:
                got = await reserve_all(gw)
        assert [body for body, _ in got] == [b"job %d" % i for i in range(20)]  # once each
        assert sum((await tube_counts(old, "jobs")).values()) == 0


async def _nothing_reserved(client: BeanstalkClient, tube: str) -> bool:
    counts = await tube_counts(client, tube)
    return counts["reserved"] == 0 and counts["ready"] + counts["delayed"] == 20


async def test_follow_picks_up_later_jobs_and_new_tubes() -> None:
    async with old_server() as old, importing_gateway(old, follow=True) as gateway:
        status = link_status(gateway)
        await until(lambda: status.state == "connected" and status.lag == 0, "connected")
        await put_jobs(old, "default", [(1, 0, 60, b"later")])
        await until(lambda: status.moved == 1, "the later job")
        await put_jobs(old, "new-tube", [(1, 0, 60, b"new tube")])
        await bury(old, "new-tube", b"buried later", 5)
        await until(lambda: status.moved == 3, "the new tube's jobs")
        assert status.state == "connected"
        async with await gateway_client(gateway, "new-tube") as gw:
            assert [body for body, _ in await reserve_all(gw)] == [b"new tube"]
            assert (await gw.expect(b"peek-buried\r\n", "FOUND")).data == b"buried later"


async def test_a_server_without_reserve_job_gets_its_jobs_kicked_then_reserved() -> None:
    """beanstalkd before 1.12: the mover kicks a delayed (buried) job and reserves it."""

    class Collected:
        def __init__(self) -> None:
            self.jobs: list[Job] = []

        async def store(self, jobs: Any) -> None:
            self.jobs += jobs

    async with old_server() as old:
        await put_jobs(old, "t", [(7, 1000, 11, b"delayed")])
        await bury(old, "t", b"buried", 99)
        async with await BeanstalkClient.connect(*_host_port(old)) as conn:
            dest = Collected()
            mover = Mover(conn, dest, ["t"], LinkStatus("beanstalk_import", "x", "y"))
            mover.reserve_job = False
            await mover.run(follow=False)
        got = {j.body: (j.pri, j.ttr, j.buried, j.delay > 990) for j in dest.jobs}
        assert got == {b"delayed": (7, 11, False, True), b"buried": (99, 60, True, False)}
        assert sum((await tube_counts(old, "t")).values()) == 0


async def test_jobs_in_transit_are_touched_before_their_ttr_runs_out() -> None:
    """A destination slower than the jobs' TTR (1 s): the mover touches them on the old
    server, which hands none to another worker; each is deleted once stored."""

    async with old_server() as old:

        async def touches() -> int:
            stats = yaml_dict((await old.expect(b"stats\r\n", "OK")).data or b"")
            return int(stats["cmd-touch"])

        class Slow:
            def __init__(self) -> None:
                self.jobs: list[Job] = []

            async def store(self, jobs: Any) -> None:
                # stores only once the old server saw touches past the TTR: the jobs
                # would have timed out there otherwise
                await until(lambda: _at_least(touches, 2 * len(jobs)), "two touches each")
                self.jobs += jobs

        await put_jobs(old, "t", [(i, 0, 1, b"%d" % i) for i in range(3)])
        async with await BeanstalkClient.connect(*_host_port(old)) as conn:
            dest = Slow()
            status = LinkStatus("beanstalk_import", "x", "y")
            await Mover(conn, dest, ["t"], status).run(follow=False)
        assert [j.body for j in dest.jobs] == [b"0", b"1", b"2"]
        assert status.moved == 3
        stats = yaml_dict((await old.expect(b"stats\r\n", "OK")).data or b"")
        assert (stats["job-timeouts"], stats["cmd-delete"]) == ("0", "3")


async def test_a_link_stopped_mid_batch_settles_the_batch_first() -> None:
    """Stopped between taking a batch and deleting it, the jobs would come back on the old
    server after their TTR and arrive twice: the batch is stored and deleted first."""
    stored: list[Job] = []
    storing, go_on = trio.Event(), trio.Event()

    class Slow:  # a destination that acknowledges when the test says so
        async def store(self, jobs: Sequence[Job]) -> None:
            storing.set()
            await go_on.wait()
            stored.extend(jobs)

    async with old_server() as old:
        await put_jobs(old, "jobs", [(0, 0, 60, b"%d" % i) for i in range(5)])
        status = LinkStatus("beanstalk_import", "t", url(old))
        client = await BeanstalkClient.connect(*_host_port(old))
        async with client, trio.open_nursery() as nursery:
            mover = Mover(client, Slow(), ["jobs"], status)
            nursery.start_soon(partial(mover.run, follow=True))
            await storing.wait()
            nursery.cancel_scope.cancel()  # the gateway stops
            go_on.set()
        assert len(stored) == 5 and status.moved == 5
        assert await tube_counts(old, "jobs") == dict.fromkeys(
            ("urgent", "ready", "reserved", "delayed", "buried"), 0
        )


async def test_an_unreachable_server_is_retried_with_a_backoff() -> None:
    async with old_server() as old:
        host, port = _host_port(old)
    config = {"url": f"beanstalk://{host}:{port}", "follow": True}  # nobody there now
    async with running_gateway(beanstalk="127.0.0.1:0", beanstalk_import=[config]) as gateway:
        status = link_status(gateway)
        await until(lambda: status.errors >= 3, "three failed connections")
        assert status.state == "backing off" and status.moved == 0 and status.last_error


# -- the command ----------------------------------------------------------------------------


async def test_the_import_command_moves_into_a_running_gateway(tmp_path: Path) -> None:
    async with old_server() as old, supervised() as sup:
        await put_jobs(old, "jobs", [(i % 3, 0, 30, b"job %d" % i) for i in range(30)])
        await put_jobs(old, "other", [(4, 1000, 20, b"delayed")])
        await bury(old, "other", b"buried", 6)
        gw = await start_gateway(sup, tmp_path / "data")
        host, port = gw.addresses["beanstalk"]
        to = f"beanstalk://{host}:{port}"
        result = await trio.run_process(
            [sys.executable, "-m", "gateway", "import", url(old), "--to", to],
            cwd=REPO,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        out = result.stdout.decode()
        assert result.returncode == 0, (out, result.stderr.decode())
        assert f"moved 32 jobs from {old.address}" in out
        assert "  jobs: 30" in out and "  other: 2" in out
        assert "delayed: 1, buried: 1" in out
        gw_client = await BeanstalkClient.connect(*gw.addresses["beanstalk"])
        async with gw_client:
            await gw_client.expect(command("use", "other"), "USING")
            buried = await gw_client.expect(b"peek-buried\r\n", "FOUND")
            assert buried.data == b"buried"
            stats = await gw_client.stats_job(buried.id)
            assert stats is not None and (stats["state"], stats["pri"]) == ("buried", "6")
            delayed = await gw_client.expect(b"peek-delayed\r\n", "FOUND")
            stats = await gw_client.stats_job(delayed.id)
            assert stats is not None and (stats["pri"], stats["ttr"]) == ("4", "20")
            assert 990 <= int(stats["time-left"]) <= 1000
        jobs = await drain_beanstalk(gw, "jobs")
        # priority order, then the order of the old server's ids
        assert [body for _, body in jobs] == [
            b"job %d" % i for p in range(3) for i in range(30) if i % 3 == p
        ]
        assert sum((await tube_counts(old, "jobs")).values()) == 0

        # and a server nobody listens on: one line, exit 1
        result = await trio.run_process(
            [
                sys.executable,
                "-m",
                "gateway",
                "import",
                url(old),
                "--to",
                "beanstalk://127.0.0.1:1",
            ],
            cwd=REPO,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert result.returncode == 1
        assert "cannot reach the gateway at 127.0.0.1:1" in result.stderr.decode()


# -- a crash while importing ------------------------------------------------------------------


async def test_a_gateway_killed_while_importing_loses_no_job(tmp_path: Path) -> None:
    jobs = 4000
    async with old_server() as old, supervised() as sup:
        for start in range(0, jobs, 500):
            await put_jobs(old, "crash", [(0, 0, 1, b"%d" % i) for i in range(start, start + 500)])
        config = tmp_path / "gateway.toml"
        config.write_text(f'[[beanstalk_import]]\nurl = "{url(old)}"\ntubes = ["crash"]\n')
        data = tmp_path / "data"
        gw = await start_gateway(sup, data, "--config", str(config))

        async def deleted() -> int:
            stats = await old.stats_tube("crash")
            return int(stats["cmd-delete"]) if stats else 0

        await until(lambda: _at_least(deleted, 500), "500 jobs moved")
        await gw.sigkill()
        moved_before = await deleted()
        assert moved_before < jobs, "the import ended before the kill: make it larger"
        # the old server hands back what the killed gateway had reserved (its connection
        # closed); restarted, the gateway goes on from there
        gw = await start_gateway(sup, data, "--config", str(config))
        await until(lambda: _at_least(deleted, jobs), "every job deleted on the old server", 30)
        counts = await tube_counts(old, "crash")
        assert sum(counts.values()) == 0, counts
        assert await gw.sigterm(20) == 0
        gw = await start_gateway(sup, data)  # no import: count what the store kept
        got = Counter(body for _, body in await drain_beanstalk(gw, "crash"))
        assert set(got) == {b"%d" % i for i in range(jobs)}  # none lost
        duplicates = sum(n - 1 for n in got.values())
        # at most what was in flight at the kill: one batch, stored but not yet deleted
        assert duplicates <= BATCH, duplicates
        print(f"killed after {moved_before} of {jobs} moved; {duplicates} arrived twice")


async def _at_least(count: Callable[[], Any], n: int) -> bool:
    return await count() >= n
