"""The HTTP router under Hypothesis: every request is answered well-formed and never
with a 500, the same with its body in one piece or cut into many receive events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.http_target import HTTPCase, RouterRig, check
from tests.fuzz.strategies import http_cases

EXAMPLES = 300


@pytest.fixture(scope="module")
def rigs() -> Iterator[tuple[RouterRig, RouterRig]]:
    with RouterRig() as whole, RouterRig() as split:
        yield whole, split


def test_any_request_is_answered_the_same_however_its_body_is_cut(
    rigs: tuple[RouterRig, RouterRig],
) -> None:
    whole, split = rigs

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        case: HTTPCase = data.draw(http_cases(whole.methods))
        check(whole, split, case)

    run()


def _corpus() -> list[Path]:
    return sorted((Path(__file__).parent / "corpus" / "http").glob("*.json"))


@pytest.mark.parametrize("path", _corpus(), ids=[p.name for p in _corpus()])
def test_regression_corpus(rigs: tuple[RouterRig, RouterRig], path: Path) -> None:
    """Each request a fuzzer (or a reader) once broke the router with, body cut in two."""
    doc = json.loads(path.read_text())
    body = doc["body"].encode("utf-8", "surrogateescape")
    case = HTTPCase(
        doc["method"],
        doc["path"],
        doc["query"].encode("utf-8", "surrogateescape"),
        ((b"host", b"127.0.0.1"),),
        (body[:1], body[1:]),
        False,
    )
    check(*rigs, case)
