"""Across protocols on one gateway: beanstalkd clients (greenstalk) and NSQ clients (pynsq)
share the same queues. A tube is a topic; the beanstalkd workers of a tube form one group,
named by the `[beanstalkd] group` setting (default "beanstalk"), which an NSQ consumer joins by
subscribing with that channel name (docs/semantics.md, "beanstalkd").

Clients run in subprocesses (tests/clients/beanstalk/greenstalk_client.py,
tests/clients/pynsq_client.py); the DPUB is sent by the raw in-process NSQ client so that the
test knows when the gateway acknowledged it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway import config
from gateway.app import Gateway
from tests.clients import corpus
from tests.clients import harness as h
from tests.clients.beanstalk import servers
from tests.helpers import RawNSQ, be32, running_gateway

pytestmark = pytest.mark.clients

GROUP = config.BeanstalkSettings().group  # the default the gateway below runs with


def greenstalk(gw: Gateway, scenario: str, tube: str, *options: Any) -> list[str]:
    return servers.greenstalk(scenario, gw.addresses["beanstalk"], "--tube", tube, *options)


def pynsq(gw: Gateway, mode: str, topic: str, *options: Any) -> list[str]:
    host, port = gw.addresses["nsq"]
    script = Path(h.CLIENTS_DIR) / "pynsq_client.py"
    args = [mode, "--host", host, "--port", str(port), "--topic", topic]
    return [sys.executable, str(script), *args, *(str(o) for o in options)]


@pytest.mark.parametrize("channel", [GROUP, "nsq-side"])
async def test_greenstalk_put_pynsq_reader_consumes(channel: str, tmp_path: Path) -> None:
    """800 binary bodies put by greenstalk into tube `b2n` with no one subscribed; a pynsq
    Reader on topic `b2n` then gets every one exactly once, byte for byte, attempts 1, whether
    it joins the beanstalkd workers' group or uses a channel of its own (the first group of a
    topic gets its backlog)."""
    n = 800
    bodies = corpus.make_bodies(n, seed=11, max_size=3000)
    path = h.write_corpus(tmp_path, bodies)
    async with running_gateway(beanstalk="127.0.0.1:0") as gw:
        with trio.fail_after(90):
            put = await h.run(greenstalk(gw, "put", "b2n", "--bodies", path))
            assert len(put["ids"]) == n
            sub = await h.run(
                pynsq(gw, "sub", "b2n", "--channel", channel, "--count", n, "--max-in-flight", 20)
            )
            await h.wait_until(h.finished(gw, "b2n", channel, n), f"{n} FINs at the gateway")
        h.assert_clean(sub)
        h.assert_same_bodies(h.received(sub), h.digests(bodies))
        assert {a for a, _sha in sub["deliveries"]} == {1}
        h.assert_drained(gw, "b2n", channel, n)


async def test_pynsq_writer_pub_greenstalk_reserves(tmp_path: Path) -> None:
    """A pynsq Writer publishes 600 binary bodies (300 PUB, then MPUB batches of 50, pipelined)
    while a greenstalk worker waits in reserve on tube `n2b`: it reserves+deletes all 600, byte
    for byte, in publish order (NSQ messages all get priority 1024, so (pri, id) is id order)."""
    n = 600
    bodies = corpus.make_bodies(n, seed=12, max_size=3000)
    path = h.write_corpus(tmp_path, bodies)
    async with running_gateway(beanstalk="127.0.0.1:0") as gw:
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                worker = await h.spawn(
                    nursery, greenstalk(gw, "reserve", "n2b", "--count", n, "--timeout", 20)
                )
                pub = await h.run(
                    pynsq(gw, "pub", "n2b", "--bodies", path, "--pub", 300, "--batch", 50)
                )
                h.assert_published(pub, 300 + 6)
                got = await worker.result()
        assert not got["timed_out"], f"only {len(got['jobs'])} of {n} reserved"
        ids = [i for i, _ in got["jobs"]]
        assert len(set(ids)) == n
        received = [bytes.fromhex(body) for _, body in got["jobs"]]
        h.assert_same_bodies(h.digests(received), h.digests(bodies))
        assert received == bodies, "not in publish order"
        assert ids == sorted(ids)


async def test_dpub_not_reservable_before_defer() -> None:
    """DPUB with a 1500 ms defer: right after the OK, stats-tube shows the job delayed and
    reserve-with-timeout 0 gets TIMED_OUT; a waiting reserve gets it no earlier than 1.5 s
    after the gateway acknowledged the DPUB."""
    defer_ms = 1500
    body = b"deferred\r\n\x00body"
    async with running_gateway(beanstalk="127.0.0.1:0") as gw:
        with trio.fail_after(30):
            nsq = await RawNSQ.connect(gw)
            await nsq.send(b"DPUB dpub %d\n" % defer_ms + be32(len(body)) + body)
            assert await nsq.frame() == (0, b"OK")
            acked = time.time()
            await nsq.aclose()
            early = await h.run(greenstalk(gw, "reserve", "dpub", "--count", 1, "--timeout", 0))
            stats = (await h.run(greenstalk(gw, "stats-tube", "dpub")))["stats"]
            checked = time.time() - acked
            late = await h.run(greenstalk(gw, "reserve", "dpub", "--count", 1, "--timeout", 5))
    assert checked < defer_ms / 1000 - 0.3, f"too slow ({checked:.2f} s) to prove anything"
    assert early == {"jobs": [], "reserved_at": [], "timed_out": True}, early
    assert isinstance(stats, dict), stats
    assert (stats["current-jobs-delayed"], stats["current-jobs-ready"]) == (1, 0), stats
    assert not late["timed_out"] and [b for _, b in late["jobs"]] == [body.hex()], late
    waited = late["reserved_at"][0] - acked
    assert defer_ms / 1000 - 0.01 <= waited < defer_ms / 1000 + 1.5, waited


async def test_pynsq_dpub_not_reservable_before_defer(tmp_path: Path) -> None:
    """The same with pynsq's own Writer.dpub: the job is delayed once pynsq has its OK, and a
    waiting greenstalk reserve gets it no earlier than the defer after pynsq was started
    (the DPUB cannot have been acknowledged before that)."""
    defer_ms = 3000  # leaves room for the interpreter start of the pynsq process
    body = b"pynsq deferred\r\n\x00"
    path = h.write_corpus(tmp_path, [body])
    async with running_gateway(beanstalk="127.0.0.1:0") as gw:
        with trio.fail_after(30):
            started = time.time()
            pub = await h.run(
                pynsq(gw, "pub", "dpub2", "--bodies", path, "--pub", 1, "--defer", defer_ms)
            )
            published = time.time()
            stats = (await h.run(greenstalk(gw, "stats-tube", "dpub2")))["stats"]
            late = await h.run(greenstalk(gw, "reserve", "dpub2", "--count", 1, "--timeout", 5))
    h.assert_published(pub, 1)
    assert published - started < defer_ms / 1000 - 0.2, "pynsq too slow to prove anything"
    assert (stats["current-jobs-delayed"], stats["current-jobs-ready"]) == (1, 0), stats
    assert not late["timed_out"] and [b for _, b in late["jobs"]] == [body.hex()], late
    assert late["reserved_at"][0] - started >= defer_ms / 1000 - 0.01


async def test_nsq_consumer_sees_beanstalk_priority_order(tmp_path: Path) -> None:
    """greenstalk puts 300 jobs with mixed priorities (several jobs per priority, puts
    interleaved) while no NSQ consumer exists; a pynsq Reader with max_in_flight 1 joining the
    beanstalkd group then receives them in (priority, id) order."""
    n = 300
    pris = [500, 10, 70000, 0, 10, 1023, 1024, 4294967295, 500, 3]
    bodies = corpus.make_bodies(n, seed=13, max_size=200)
    path = h.write_corpus(tmp_path, bodies)
    async with running_gateway(beanstalk="127.0.0.1:0") as gw:
        with trio.fail_after(60):
            put = await h.run(
                greenstalk(gw, "put", "prio", "--bodies", path, *[f"--pri={p}" for p in pris])
            )
            sub = await h.run(
                pynsq(gw, "sub", "prio", "--channel", GROUP, "--count", n, "--max-in-flight", 1)
            )
        h.assert_clean(sub)
    jobs = [
        (pris[i % len(pris)], job_id, corpus.digest(body))
        for i, (job_id, body) in enumerate(zip(put["ids"], bodies, strict=True))
    ]
    want = [sha for _pri, _id, sha in sorted(jobs)]
    got = [sha for _attempts, sha in sub["deliveries"]]
    assert len(got) == n
    by_sha = {sha: (pri, job_id) for pri, job_id, sha in jobs}
    first_bad = next((k for k, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
    assert first_bad is None, (
        f"delivery #{first_bad} was (pri, id) {by_sha[got[first_bad]]}, expected "
        f"{by_sha[want[first_bad]]}; first 12 delivered: {[by_sha[s] for s in got[:12]]}"
    )
