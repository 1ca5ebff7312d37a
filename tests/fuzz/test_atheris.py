"""Every codec under atheris (libFuzzer), coverage-guided, a bounded run each.

libFuzzer owns its process, so each run is a subprocess (atheris_main.py) with a fixed
seed and `-runs`, which makes it deterministic. The seed corpus is the target's own valid
frames; a failure leaves libFuzzer's input in the test's tmp_path and its report in the
assertion message. bench/fuzz.py runs the same harness for as long as asked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS

pytest.importorskip("atheris", reason="atheris has no wheel for this platform")

ROOT = Path(__file__).resolve().parents[2]
# With the Hypothesis runs (test_codecs.py, test_http_router.py): ~20,000 inputs each.
RUNS = 18000


@pytest.mark.parametrize("name", [*sorted(TARGETS), "http"])
def test_atheris_finds_no_failure(name: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fuzz.atheris_main",
            name,
            f"-runs={RUNS}",
            "-seed=1",
            "-timeout=30",  # one input taking longer has hung
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = result.stderr[-4000:]
    assert result.returncode == 0, report
    assert f"Done {RUNS} runs" in result.stderr, report
