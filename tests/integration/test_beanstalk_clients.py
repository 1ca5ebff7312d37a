"""Unmodified beanstalkd client libraries (greenstalk, pystalk, fivebeans), each in a
subprocess, against the gateway's beanstalkd listener AND against a real beanstalkd 1.12.

Every test runs twice (the `server` fixture): against /usr/bin/beanstalkd, which proves the
test and its expectations, and against the gateway. The scripts (tests/clients/beanstalk/)
only drive the library and print what they observed; the assertions are here. Job ids are
whatever the server assigned (a fresh server per test), never hard-coded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.app import Gateway
from tests.clients import corpus
from tests.clients import harness as h
from tests.clients.beanstalk import servers
from tests.helpers import running_gateway

pytestmark = pytest.mark.clients


def _words(text: str) -> list[str]:
    return text.split()


# every key of `stats`, stats-job and stats-tube (docs/protocols/beanstalkd.md §10)
STATS_KEYS = _words("""current-jobs-urgent current-jobs-ready current-jobs-reserved
current-jobs-delayed current-jobs-buried cmd-put cmd-peek cmd-peek-ready cmd-peek-delayed
cmd-peek-buried cmd-reserve cmd-reserve-with-timeout cmd-delete cmd-release cmd-use cmd-watch
cmd-ignore cmd-bury cmd-kick cmd-touch cmd-stats cmd-stats-job cmd-stats-tube cmd-list-tubes
cmd-list-tube-used cmd-list-tubes-watched cmd-pause-tube job-timeouts total-jobs max-job-size
current-tubes current-connections current-producers current-workers current-waiting
total-connections pid version rusage-utime rusage-stime uptime binlog-oldest-index
binlog-current-index binlog-records-migrated binlog-records-written binlog-max-size draining id
hostname os platform""")
STATS_JOB_KEYS = _words("""id tube state pri age delay ttr time-left file reserves timeouts
releases buries kicks""")
STATS_TUBE_KEYS = _words("""name current-jobs-urgent current-jobs-ready current-jobs-reserved
current-jobs-delayed current-jobs-buried total-jobs current-using current-watching
current-waiting cmd-delete cmd-pause-tube pause pause-time-left""")


@dataclass
class Server:
    kind: str  # "beanstalkd" or "gateway"
    address: tuple[str, int]
    gateway: Gateway | None = None

    @property
    def real(self) -> bool:
        return self.kind == "beanstalkd"


@pytest.fixture(params=["beanstalkd", "gateway"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    if request.param == "beanstalkd":
        async with servers.real_beanstalkd() as address:
            yield Server("beanstalkd", address)
    else:
        async with running_gateway(beanstalk="127.0.0.1:0") as gw:
            yield Server("gateway", gw.addresses["beanstalk"], gw)


def greenstalk(server: Server, scenario: str, tube: str, *options: Any) -> list[str]:
    return servers.greenstalk(scenario, server.address, "--tube", tube, *options)


def keepalive(server: Server) -> list[str]:
    """Only for the real beanstalkd: see wait_holding() in greenstalk_client.py (a 1.12 bug)."""
    return ["--holder-keepalive", "0.05"] if server.real else []


def job(job_id: int, body: bytes) -> list[Any]:
    return [job_id, body.hex()]


def steps(result: dict[str, Any]) -> dict[str, Any]:
    return dict(result["steps"])


async def stats_tube(server: Server, tube: str) -> dict[str, Any] | str:
    return (await h.run(greenstalk(server, "stats-tube", tube)))["stats"]


# -- greenstalk ----------------------------------------------------------------------------------


async def test_greenstalk_priorities(server: Server) -> None:
    """2000 jobs with mixed priorities (0, 1, 1023, 1024, 65536, 2^31, 2^32-1 and random
    uint32s), then reserve-with-timeout 0 until TIMED_OUT: the reserve order is (pri, id)."""
    n = 2000
    with trio.fail_after(60):
        out = await h.run(greenstalk(server, "priorities", "prio", "--count", n, "--seed", 7))
    ids = [i for i, _pri in out["puts"]]
    assert ids == sorted(ids) and len(set(ids)) == n, "ids must grow with each put"
    want = [i for i, _pri in sorted(out["puts"], key=lambda p: (p[1], p[0]))]
    got = out["reserved"]
    assert len(got) == n, f"{len(got)} reserved, {n} put"
    first_bad = next((k for k, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
    assert first_bad is None, (
        f"reserve #{first_bad} gave job {got[first_bad]}, expected {want[first_bad]} "
        f"(pri of each: {dict(map(tuple, out['puts']))[got[first_bad]]} vs "
        f"{dict(map(tuple, out['puts']))[want[first_bad]]})"
    )
    assert out["last"] == ["reserve-with-timeout 0", "!TimedOutError"]


async def test_greenstalk_delay(server: Server) -> None:
    """A delay-1 job (pri 0) next to a ready one (pri 100): it is `delayed`, peek-delayed shows
    it, reserve-with-timeout 0 gives the ready one and then TIMED_OUT (the delayed one is not
    reservable, despite its priority), and a waiting reserve gets it 1 s after the put."""
    with trio.fail_after(30):
        out = await h.run(greenstalk(server, "delay", "later"))
    delayed, ready = out["delayed"], out["ready"]
    assert out["steps"] == [
        ["stats-job delayed.state", "delayed"],
        ["peek-delayed", delayed],
        ["reserve-with-timeout 0 #1", job(ready, b"now")],
        ["delete ready", None],
        ["reserve-with-timeout 0 #2", "!TimedOutError"],
        ["reserve-with-timeout 5", job(delayed, b"later")],
        ["stats-job delayed.state", "reserved"],
        ["delete delayed", None],
    ]
    assert out["checked_before"] < 0.9, "too slow to prove anything about the delay"
    assert 0.99 <= out["reserved_after"] < 2.5, out["reserved_after"]


async def test_greenstalk_ttr_expiry(server: Server) -> None:
    """A ttr-1 job reserved by A and never deleted: A's second reserve gets DEADLINE_SOON at once
    (the 1 s safety margin), B waiting in reserve gets the job back ~1 s after A reserved it;
    stats-job then shows reserves 2, timeouts 1; A's delete is NOT_FOUND, B's works."""
    with trio.fail_after(30):
        out = await h.run(greenstalk(server, "ttr", "slow", *keepalive(server)))
    jid = out["id"]
    s = steps(out)
    assert s["A reserve"] == job(jid, b"slow")
    assert s["A stats-job.state"] == "reserved"
    assert s["A reserve-with-timeout 0 again"] == "!DeadlineSoonError"
    assert s["B reserve-with-timeout 5"] == job(jid, b"slow"), (
        "the job did not come back after its ttr",
        s["B stats-job"],
    )
    stats = s["B stats-job"]
    assert stats["state"] == "reserved"
    assert (stats["reserves"], stats["timeouts"], stats["ttr"]) == (2, 1, 1), stats
    assert s["A delete"] == "!NotFoundError"
    assert s["B delete"] is None
    assert 0.99 <= out["back_after"] < 3.0, out["back_after"]


async def test_greenstalk_bury_kick(server: Server) -> None:
    """bury sets pri and buries; a buried job is not reservable; kick moves it back to ready;
    kick-job does the same for one job and is NOT_FOUND for a job that is not buried/delayed;
    the counters of stats-job and stats-tube follow."""
    with trio.fail_after(30):
        out = await h.run(greenstalk(server, "bury", "graves"))
    first, second = out["first"], out["second"]
    s = steps(out)
    assert s["reserve #1"] == job(first, b"first")
    assert s["bury #1 pri 5"] is None
    assert pick(s["stats-job #1"], "state", "pri", "reserves", "buries", "kicks") == [
        "buried",
        5,
        1,
        1,
        0,
    ]
    assert s["peek-buried"] == job(first, b"first")
    tube = s["stats-tube"]
    assert pick(tube, "current-jobs-buried", "current-jobs-ready", "current-jobs-urgent") == [
        1,
        1,
        1,
    ]
    assert s["reserve #2"] == job(second, b"second")
    assert s["delete #2"] is None
    assert s["reserve (only buried left)"] == "!TimedOutError"
    assert s["kick 10"] == 1
    assert s["kick 10 again"] == 0
    assert pick(s["stats-job #1 after kick"], "state", "pri", "buries", "kicks") == [
        "ready",
        5,
        1,
        1,
    ]
    assert s["reserve kicked"] == job(first, b"first")
    assert s["bury again"] is None
    assert s["kick-job"] is None
    assert s["kick-job not buried"] == "!NotFoundError"
    assert s["reserve kick-jobbed"] == job(first, b"first")
    final = s["stats-job #1 final"]
    assert pick(final, "state", "pri", "reserves", "buries", "kicks") == [
        "reserved",
        7,
        3,
        2,
        2,
    ]
    assert s["delete #1"] is None
    tube = s["stats-tube final"]
    assert pick(tube, "current-jobs-buried", "current-jobs-ready", "total-jobs", "cmd-delete") == [
        0,
        0,
        2,
        2,
    ]
    assert set(final) == set(STATS_JOB_KEYS) and set(tube) == set(STATS_TUBE_KEYS)


def pick(d: dict[str, Any], *keys: str) -> list[Any]:
    return [d.get(k, f"<missing {k}>") for k in keys]


async def test_greenstalk_touch_extends(server: Server) -> None:
    """A reserves a ttr-2 job and touches it 1 s later: B, waiting in reserve, gets it only
    2 s after the touch (3 s after the reserve, not 2); a touch after expiry is NOT_FOUND."""
    with trio.fail_after(30):
        out = await h.run(
            greenstalk(
                server, "touch", "touchy", "--ttr", 2, "--touch-after", 1.0, *keepalive(server)
            )
        )
    jid = out["id"]
    assert out["steps"] == [
        ["A reserve", job(jid, b"long")],
        ["A touch", None],
        ["stats-job.state", "reserved"],
        ["B reserve-with-timeout", job(jid, b"long")],
        ["A touch after expiry", "!NotFoundError"],
        ["stats-job.timeouts", 1],
        ["B delete", None],
    ]
    assert 1.9 <= out["back_after_touch"] < 3.5, out["back_after_touch"]


async def test_greenstalk_four_workers_each_job_once(server: Server) -> None:
    """4 worker processes blocked in reserve on one tube while a producer puts 4000 jobs (binary
    bodies), then 4 STOP jobs behind them: every job is reserved+deleted exactly once, with its
    body intact, and the tube ends empty."""
    n, workers = 4000, 4
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            procs = [
                await h.spawn(nursery, greenstalk(server, "work", "shared", "--timeout", 60))
                for _ in range(workers)
            ]
            produced = await h.run(
                greenstalk(server, "produce", "shared", "--count", n, "--stops", workers)
            )
            results = [await p.result() for p in procs]
        tube = await stats_tube(server, "shared")
    assert all(not r["timed_out"] for r in results), [r["timed_out"] for r in results]
    assert sorted(r["stop"] for r in results) == sorted(produced["stops"])
    want = {i: body for i, body in produced["jobs"]}
    got = [(i, body) for r in results for i, body in r["deliveries"]]
    dup = [i for i, c in Counter(i for i, _ in got).items() if c > 1]
    missing = sorted(want.keys() - {i for i, _ in got})
    assert not dup and not missing, (
        f"{len(dup)} jobs delivered more than once (e.g. {dup[:5]}), "
        f"{len(missing)} never delivered (e.g. {missing[:5]}); per worker "
        f"{[len(r['deliveries']) for r in results]}"
    )
    wrong = [i for i, body in got if want[i] != body]
    assert not wrong, f"{len(wrong)} bodies changed, e.g. job {wrong[0]}"
    # no job left in it and nobody using or watching it: the tube is gone (beanstalkd deletes
    # such tubes), so any job left behind (ready, reserved, delayed, buried) would show here
    assert tube == "!NotFoundError", tube


def binary_bodies() -> list[bytes]:
    bodies = corpus.make_bodies(400, seed=3, max_size=3000)
    bodies += [
        b"",
        b"put 0 0 1 1\r\nx\r\n",
        b"RESERVED 1 1\r\nx\r\n",
        b"\r\n" * 500,
        b"\x00" * 1000,
        b"a\r\n" * 21845,  # 65535 bytes: beanstalkd's default max-job-size
    ]
    return bodies


async def test_greenstalk_binary_bodies(server: Server, tmp_path: Path) -> None:
    """greenstalk with encoding=None: ~400 bodies full of \\r\\n, \\n, NUL, 0xff, command-like
    text, an empty body and a 65535-byte one come back byte-exact from peek and reserve."""
    bodies = binary_bodies()
    path = h.write_corpus(tmp_path, bodies)
    with trio.fail_after(60):
        out = await h.run(greenstalk(server, "binary", "bin", "--bodies", path))
    ids = out["ids"]
    assert len(ids) == len(bodies)
    want = {i: b.hex() for i, b in zip(ids, bodies, strict=True)}
    bad_peek = [i for i, got in zip(ids, out["peeked"], strict=True) if got != want[i]]
    assert not bad_peek, f"peek changed {len(bad_peek)} bodies, e.g. job {bad_peek[0]}"
    assert [i for i, _ in out["reserved"]] == ids, "same priority: reserve order is the id order"
    bad = [i for i, got in out["reserved"] if got != want[i]]
    assert not bad, f"reserve changed {len(bad)} bodies, e.g. job {bad[0]}"


# -- pystalk and fivebeans -----------------------------------------------------------------------


@pytest.mark.parametrize("client", ["pystalk", "fivebeans"])
async def test_put_reserve_delete_and_stats(client: str, server: Server, tmp_path: Path) -> None:
    """300 binary bodies put (fivebeans: all pipelined), reserved and deleted; stats-job,
    stats-tube, stats and list-tubes parsed by the library's YAML parser (PyYAML / js-yaml)
    with the right keys, types and values."""
    n = 300
    bodies = corpus.make_bodies(n, seed=4, max_size=2000)
    path = h.write_corpus(tmp_path, bodies)
    make = servers.pystalk if client == "pystalk" else servers.fivebeans
    with trio.fail_after(60):
        out = await h.run(make("basic", server.address, "--tube", "lib", "--bodies", path))
    assert not out["timed_out"] and not out.get("errors") and "error" not in out, out
    ids = out["ids"]
    assert ids == sorted(ids) and len(set(ids)) == n
    want = [[i, b.hex()] for i, b in zip(ids, bodies, strict=True)]
    assert [i for i, _ in out["jobs"]] == ids, "same priority: reserve order is the id order"
    bad = [i for (i, got), (_, exp) in zip(out["jobs"], want, strict=True) if got != exp]
    assert not bad, f"{len(bad)} bodies changed, e.g. job {bad[0]}"

    sj = out["stats_job"]
    assert set(sj) == set(STATS_JOB_KEYS), sorted(sj)
    assert pick(sj, "id", "tube", "state", "pri", "ttr", "reserves", "timeouts") == [
        ids[0],
        "lib",
        "reserved",
        100,
        60,
        1,
        0,
    ]
    assert sj["time-left"] in (58, 59, 60), sj
    assert all(isinstance(sj[k], int) for k in STATS_JOB_KEYS if k not in ("tube", "state"))

    before, after = out["tube_before"], out["tube_after"]
    assert set(before) == set(STATS_TUBE_KEYS), sorted(before)
    assert pick(before, "name", "current-jobs-ready", "current-jobs-urgent", "total-jobs") == [
        "lib",
        n,
        n,
        n,
    ]
    assert pick(before, "current-using", "current-watching", "current-waiting") == [1, 1, 0]
    assert pick(after, "current-jobs-ready", "current-jobs-reserved", "total-jobs") == [0, 0, n]
    assert after["cmd-delete"] == n

    stats = out["stats"]
    missing = [k for k in STATS_KEYS if k not in stats]
    assert not missing, f"stats lacks {missing}"
    assert isinstance(stats["version"], str) and isinstance(stats["id"], str), stats
    assert stats["draining"] is False
    assert stats["max-job-size"] == 65535
    assert stats["total-jobs"] >= n and stats["cmd-put"] >= n
    assert stats["current-connections"] >= 1
    assert isinstance(out["tubes"], list) and {"default", "lib"} <= set(out["tubes"]), out["tubes"]
