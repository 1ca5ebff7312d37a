"""beanstalkd cases the recorded transcripts do not cover, run now against a live beanstalkd
and the gateway side by side (the harness of test_beanstalk_differential.py), replies
compared after masking. Each came from a review that found the gateway answering
differently: a timed pause that ends while nobody waits, tubes a connection holds a job
of without watching them, and two counters of `stats`."""

from __future__ import annotations

import re

import pytest
import trio

from tests.beanstalk_replay import Case, Step, beanstalkd_target, normalize, run_case
from tests.integration.test_beanstalk_differential import gateway_target

WAIT = 0.3  # seconds to collect each reply


def case(name: str, *steps: tuple[str, ...]) -> Case:
    """Steps as (conn, bytes to send) or ("sleep", seconds) or (conn, "close")."""
    out = []
    for i, step in enumerate(steps):
        if step[0] == "sleep":
            out.append(Step(i, "sleep", seconds=float(step[1])))
        elif step[1] == "close":
            out.append(Step(i, "close", conn=step[0]))
        else:
            out.append(Step(i, "send", conn=step[0], send=step[1].encode(), wait_s=WAIT))
    return Case(name, (), tuple(out))


CASES = [
    case(
        "pause_ends_with_nobody_waiting",
        ("a", "pause-tube default 1\r\n"),
        ("sleep", "1.3"),
        ("a", "list-tube-used\r\n"),
        ("b", "put 0 0 10 1\r\nx\r\n"),
        ("b", "peek-ready\r\n"),
    ),
    case(
        "tube_freed_after_reserve_job_and_delete",
        ("a", "use foo\r\n"),
        ("a", "put 0 0 10 1\r\nx\r\n"),
        ("a", "use default\r\n"),
        ("b", "reserve-job 1\r\n"),
        ("b", "delete 1\r\n"),
        ("b", "list-tubes\r\n"),
        ("b", "stats-tube foo\r\n"),
    ),
    case(
        "tube_freed_after_ignore_then_delete",
        ("a", "use foo\r\n"),
        ("a", "put 0 0 10 1\r\nx\r\n"),
        ("a", "use default\r\n"),
        ("b", "watch foo\r\n"),
        ("b", "reserve-with-timeout 0\r\n"),
        ("b", "ignore foo\r\n"),
        ("b", "list-tubes\r\n"),
        ("b", "delete 1\r\n"),
        ("b", "list-tubes\r\n"),
    ),
    case(
        "tube_freed_when_the_holder_leaves",
        ("a", "use foo\r\n"),
        ("a", "put 0 0 10 1\r\nx\r\n"),
        ("a", "use default\r\n"),
        ("b", "reserve-job 1\r\n"),
        ("b", "close"),
        ("a", "list-tubes\r\n"),
        ("a", "peek-ready\r\n"),
        ("a", "stats-tube foo\r\n"),
    ),
]


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
async def test_the_gateway_answers_as_a_live_beanstalkd(c: Case) -> None:
    async with trio.open_nursery() as nursery:
        runs = {}

        async def run(side: str, factory: object) -> None:
            runs[side] = await run_case(c, factory)  # type: ignore[arg-type]

        nursery.start_soon(run, "beanstalkd", beanstalkd_target)
        nursery.start_soon(run, "gateway", gateway_target)
    real, gw = runs["beanstalkd"], runs["gateway"]
    assert real.results is not None, real.error
    assert gw.results is not None, gw.error
    for x, y in zip(real.results, gw.results, strict=True):
        x, y = normalize(x), normalize(y)  # masked, YAML quoting set aside (1.12 vs 1.13)
        assert (x.reply, x.closed) == (y.reply, y.closed), (x.index, c.steps[x.index], x, y)


COUNTERS = case(
    "counters",
    ("a", "pause-tube nosuch 1\r\n"),
    ("b", "put 0 0 10 3\r\nabcde"),
    ("c", "stats\r\n"),
)


async def test_stats_counts_a_refused_pause_and_a_put_with_a_bad_body() -> None:
    """beanstalkd counts cmd-pause-tube before it looks for the tube, and makes a put's
    connection a producer before it reads the body (EXPECTED_CRLF)."""
    fields = re.compile(rb"^(cmd-pause-tube|current-producers|cmd-put): (\d+)$", re.M)
    seen = {}
    for side, factory in (("beanstalkd", beanstalkd_target), ("gateway", gateway_target)):
        run = await run_case(COUNTERS, factory)  # type: ignore[arg-type]
        assert run.results is not None, run.error
        stats = run.results[-1].reply or b""
        seen[side] = dict(fields.findall(stats))
    assert (
        seen["gateway"]
        == seen["beanstalkd"]
        == {
            b"cmd-pause-tube": b"1",
            b"current-producers": b"1",
            b"cmd-put": b"1",
        }
    )
