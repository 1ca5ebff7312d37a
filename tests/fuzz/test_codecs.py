"""Every codec under Hypothesis: any input parses or gives the codec's own error, and the
same bytes give the same events whole or cut anywhere (the property is in targets.py).

Bounded and derandomized, so CI runs the same examples each time; bench/fuzz.py runs the
long campaigns. The regression corpus (corpus/<codec>/) replays every input a fuzzer
ever failed on, under every variant and several cuttings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.strategies import streams
from tests.fuzz.targets import TARGETS, Target, check, chunkings

CORPUS = Path(__file__).parent / "corpus"
# With the atheris runs (test_atheris.py) about 20,000 inputs per codec in all.
EXAMPLES = 300


def _corpus() -> list[tuple[str, Path]]:
    return [
        (target, path)
        for target in sorted(TARGETS)
        for path in sorted((CORPUS / target).glob("*"))
        if path.is_file()
    ]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_any_input_parses_or_fails_cleanly_however_it_is_cut(name: str) -> None:
    target = TARGETS[name]

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(streams(target))
    def run(case: tuple[list[bytes], int]) -> None:
        chunks, variant = case
        check(target, chunks, variant)

    run()


@pytest.mark.parametrize(("name", "path"), _corpus(), ids=[f"{t}/{p.name}" for t, p in _corpus()])
def test_regression_corpus(name: str, path: Path) -> None:
    target: Target = TARGETS[name]
    data = path.read_bytes()
    for variant in range(target.variants):
        for chunks in chunkings(data, seed=len(data)):
            check(target, chunks, variant)


def test_the_corpus_covers_every_codec_it_names() -> None:
    for directory in CORPUS.iterdir():
        assert directory.name in TARGETS or directory.name == "http", directory
