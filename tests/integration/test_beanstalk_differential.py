"""beanstalkd differential cases (docs/protocols/beanstalkd.md §14): a real beanstalkd and the
gateway.

The transcripts in ``tests/data/beanstalkd_differential_cases.json`` were recorded against
beanstalkd 1.12 (Debian bookworm) and 1.13 (upstream tag); tests/data/README.md says how.
Three tests per case:

* ``test_harness_reproduces_beanstalkd_1_12``: the local ``/usr/bin/beanstalkd`` (1.12) replayed
  now must give the recorded 1.12 replies. This proves the replay harness (waits, lazy
  connections, close detection, masking) before anything is said about the gateway.
* ``test_gateway_matches_1_13``: the gateway's beanstalkd listener must give the recorded 1.13
  replies, the version it emulates.
* ``test_gateway_matches_live_beanstalkd``: the same case run in this session against both live
  servers, compared directly on every step where the recorded 1.12 and 1.13 replies agree once
  YAML quoting is set aside (the live server is 1.12, the gateway speaks 1.13 style quoting).

Each case gets a fresh server (a new beanstalkd process or a new in-process gateway). The cases
of one side run concurrently (each on its own server), once per session, and only those
selected; the waits are real, as recorded.

Replies are compared after masking (``tests.beanstalk_replay.mask``): the digits of ``age``,
``time-left`` and ``pause-time-left`` become ``#`` and so does the ``OK <n>`` length of the
reply that holds them. No case sends a server-wide ``stats``; if one did, its per-process fields
(pid, uptime, rusage-*, id, hostname, os, platform) would be masked too.

Where 1.12 and 1.13 differ in the recording (docs/protocols/beanstalkd.md §13; step numbers
are 0-based indexes into the JSON steps, one less than the row numbers a table would give):

* YAML quoting only: ``tube: "default"`` in stats-job and ``name: "<tube>"`` in stats-tube are
  quoted by 1.13 (``OK <n>`` two bytes longer). Cases: put_extremes_ok (step 4),
  reserve_blocks_until_put (3), non_owner_release_bury_touch (10), bury_kick_flow (4, 9),
  ttr_zero_becomes_one (1), pause_tube (7), stats_job_reserved (2), fresh_server_listings (3),
  disconnect_releases_reserved (4), deadline_soon_and_timeout (5, 8), delayed_promotion (2),
  release_with_delay (3), stats_tube_counts (7).
* reserve-with-timeout parsing, case reserve_timeouts (steps 2, 4, 5, 6): 1.12 reads the timeout
  leniently, 1.13 strictly:
  ``reserve-with-timeout abc`` 1.12 ``TIMED_OUT``, 1.13 ``BAD_FORMAT``;
  ``reserve-with-timeout 4294967296`` 1.12 ``TIMED_OUT``, 1.13 ``BAD_FORMAT``;
  ``reserve-with-timeout 2147483648`` 1.12 blocks (no reply), 1.13 ``BAD_FORMAT``;
  ``reserve-with-timeout -1`` 1.12 no reply (the connection is still blocked in the previous
  reserve), 1.13 ``BAD_FORMAT``.

Everything else is identical in both recordings.

A race in the real beanstalkd (1.12 and 1.13 alike), case deadline_soon_and_timeout: the server's
clock has microsecond resolution (``gettimeofday``) and ``conn_timeout`` (prot.c) releases a
reserved job only when ``deadline_at < now``. When the connection's tick runs within the very
microsecond of the deadline (likely: epoll's millisecond timeout wakes it early, then it spins),
the job is not released and the connection is not rescheduled, so the TTR expiry is lost until
the connection next changes state: ``stats-job 1`` 1.3 s later still says ``state: reserved``,
``timeouts: 0`` (about one replay in six here). The recording shows the intended behaviour (the
job back in ready, ``timeouts: 1``), so the harness replays that case on a fresh beanstalkd until
it reproduces the recording (``BEANSTALKD_RACES``); the gateway gets one attempt.

The JSON file is part of the repository (``tests/data/``); a missing file fails the tests,
it never skips them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.beanstalk_replay import (
    Case,
    CaseRun,
    StepResult,
    Target,
    beanstalkd_target,
    differences,
    load_cases,
    masked,
    normalize,
    parse_server_args,
    run_cases,
)

CASES_FILE = Path(__file__).resolve().parents[1] / "data" / "beanstalkd_differential_cases.json"
MISSING = "<cases file missing>"


def _load() -> dict[str, Case]:
    if not CASES_FILE.is_file():
        return {}
    return {case.name: case for case in load_cases(CASES_FILE)}


CASES = _load()
CASE_NAMES = list(CASES) or [MISSING]


def _case(name: str) -> Case:
    if name == MISSING:
        pytest.fail(
            f"beanstalkd differential cases not found at {CASES_FILE}: the file belongs to the "
            "repository (tests/data/README.md)"
        )
    return CASES[name]


# --- the two servers under test ---------------------------------------------------------------


def gateway_overrides(case: Case) -> dict[str, Any]:
    overrides: dict[str, Any] = {"beanstalk": "127.0.0.1:0", "nsq": "off"}
    for key, value in parse_server_args(case.server_args).items():
        overrides[f"beanstalkd__{key}"] = value  # -z N -> beanstalkd.max_job_size = N
    return overrides


@asynccontextmanager
async def gateway_target(case: Case) -> AsyncIterator[Target]:
    # Imported here so that the harness tests (beanstalkd only) run while the gateway is broken.
    from tests.helpers import running_gateway

    async with running_gateway(**gateway_overrides(case)) as gw:
        host, port = gw.addresses["beanstalk"]

        async def connect(name: str) -> trio.abc.Stream:
            return await trio.open_tcp_stream(host, port)

        async def signal_server(name: str) -> None:
            if name != "SIGUSR1":
                raise ValueError(f"no gateway equivalent for {name}")
            gw.beanstalk.draining = True  # beanstalkd's SIGUSR1: drain mode

        yield Target(connect, signal_server)


# --- one concurrent run per side and session --------------------------------------------------


def _selected(request: pytest.FixtureRequest, fixture: str) -> list[Case]:
    names = {
        item.callspec.params["name"]
        for item in request.session.items
        if fixture in getattr(item, "fixturenames", ())
        and hasattr(item, "callspec")
        and "name" in item.callspec.params
    }
    return [case for name, case in CASES.items() if name in names]


# Cases in which the real beanstalkd can lose a race of its own (see the module docstring),
# and how many fresh servers each may take to reproduce its recording. The gateway side
# always gets exactly one attempt.
BEANSTALKD_RACES = {"deadline_soon_and_timeout": 8}


def _matches_recording(case: Case, results: list[Any]) -> bool:
    expected = [masked(r) for r in case.recorded("1.12")]
    got = [masked(r) for r in results]
    return not differences(case, expected, got, labels=("recorded 1.12", "live 1.12"))


@pytest.fixture(scope="session")
def beanstalkd_runs(request: pytest.FixtureRequest) -> dict[str, CaseRun]:
    return trio.run(
        partial(
            run_cases,
            attempts=lambda case: BEANSTALKD_RACES.get(case.name, 1),
            accept=_matches_recording,
        ),
        _selected(request, "beanstalkd_runs"),
        beanstalkd_target,
    )


@pytest.fixture(scope="session")
def gateway_runs(request: pytest.FixtureRequest) -> dict[str, CaseRun]:
    return trio.run(run_cases, _selected(request, "gateway_runs"), gateway_target)


def _results(runs: dict[str, CaseRun], case: Case, server: str) -> list[StepResult]:
    run = runs[case.name]
    if run.results is None:
        pytest.fail(f"{case.name}: the {server} run failed:\n{run.error}", pytrace=False)
    return run.results


def _fail_on(problems: list[str], case: Case, title: str) -> None:
    if problems:
        pytest.fail(
            f"{case.name} {case.server_args or ''}: {title}\n" + "\n".join(problems),
            pytrace=False,
        )


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASE_NAMES)
def test_harness_reproduces_beanstalkd_1_12(name: str, beanstalkd_runs: dict[str, CaseRun]) -> None:
    case = _case(name)
    got = _results(beanstalkd_runs, case, "beanstalkd")
    expected = [masked(r) for r in case.recorded("1.12")]
    problems = differences(
        case, expected, [masked(r) for r in got], labels=("recorded 1.12", "live 1.12")
    )
    _fail_on(problems, case, "the live beanstalkd differs from the 1.12 recording (masked)")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_gateway_matches_1_13(name: str, gateway_runs: dict[str, CaseRun]) -> None:
    case = _case(name)
    got = _results(gateway_runs, case, "gateway")
    expected = [masked(r) for r in case.recorded("1.13")]
    problems = differences(
        case, expected, [masked(r) for r in got], labels=("recorded 1.13", "gateway")
    )
    _fail_on(problems, case, "the gateway differs from the 1.13 recording (masked)")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_gateway_matches_live_beanstalkd(
    name: str, beanstalkd_runs: dict[str, CaseRun], gateway_runs: dict[str, CaseRun]
) -> None:
    case = _case(name)
    live = [normalize(r) for r in _results(beanstalkd_runs, case, "beanstalkd")]
    gateway = [normalize(r) for r in _results(gateway_runs, case, "gateway")]
    differing = set(case.differing_steps())
    steps = [s.index for s in case.steps if s.index not in differing]
    problems = differences(case, live, gateway, steps=steps, labels=("live beanstalkd", "gateway"))
    _fail_on(problems, case, "the gateway differs from the live beanstalkd (masked, quotes aside)")


def test_recorded_version_differences_are_documented() -> None:
    """The module docstring lists every behaviour difference between 1.12 and 1.13."""
    if not CASES:
        _case(MISSING)
    differing = {name: case.differing_steps() for name, case in CASES.items()}
    assert {k: v for k, v in differing.items() if v} == {"reserve_timeouts": [2, 4, 5, 6]}
    quoting = {name: case.quoting_steps() for name, case in CASES.items()}
    assert {k: v for k, v in quoting.items() if v} == {
        "put_extremes_ok": [4],
        "reserve_blocks_until_put": [3],
        "non_owner_release_bury_touch": [10],
        "bury_kick_flow": [4, 9],
        "ttr_zero_becomes_one": [1],
        "pause_tube": [7],
        "stats_job_reserved": [2],
        "fresh_server_listings": [3],
        "disconnect_releases_reserved": [4],
        "deadline_soon_and_timeout": [5, 8],
        "delayed_promotion": [2],
        "release_with_delay": [3],
        "stats_tube_counts": [7],
    }
