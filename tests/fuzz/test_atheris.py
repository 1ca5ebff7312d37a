"""Every codec under atheris (libFuzzer), coverage-guided, a bounded run each.

libFuzzer owns its process, so each run is a subprocess (atheris_main.py) with a fixed
seed and `-runs`, which makes it deterministic. The seed corpus is the target's own valid
frames; a failure leaves libFuzzer's input in the run's temporary directory and its report
in the assertion message. bench/fuzz.py runs the same harness for as long as asked.

Each run is one single-threaded process and the test only waits for it, so the selected
runs start together at the module's first test, as many at a time as there are CPUs, the
longest first; each test then waits for its own run and checks it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS

pytest.importorskip("atheris", reason="atheris has no wheel for this platform")

ROOT = Path(__file__).resolve().parents[2]
# With the Hypothesis runs (test_codecs.py, test_http_router.py): ~20,000 inputs each.
RUNS = 18000
NAMES = [*sorted(TARGETS), "http"]
# the longest runs first (the HTTP target imports the whole gateway), so that the last to
# start are short ones
LONGEST_FIRST = ["http", "rocketmq", "nats-route", "nats-client"]


def _run(name: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    corpus = tmp / "corpus"
    corpus.mkdir()
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fuzz.atheris_main",
            name,
            f"-runs={RUNS}",
            "-seed=1",
            "-timeout=30",  # one input taking longer has hung
            f"-artifact_prefix={tmp}/",
            str(corpus),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """name -> its run, for every name this session selected, all started here."""
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_atheris_finds_no_failure"
        and hasattr(item, "callspec")
    }
    rank = {n: i for i, n in enumerate(LONGEST_FIRST)}
    order = sorted(selected, key=lambda n: (rank.get(n, len(rank)), n))
    workers = max(1, min(len(order), len(os.sched_getaffinity(0))))
    with ThreadPoolExecutor(workers, thread_name_prefix="atheris") as pool:
        yield {n: pool.submit(_run, n, tmp_path_factory.mktemp(f"atheris-{n}")) for n in order}


@pytest.mark.parametrize("name", NAMES)
def test_atheris_finds_no_failure(
    name: str, runs: dict[str, Future[subprocess.CompletedProcess[str]]]
) -> None:
    result = runs[name].result()
    report = result.stderr[-4000:]
    assert result.returncode == 0, report
    assert f"Done {RUNS} runs" in result.stderr, report
