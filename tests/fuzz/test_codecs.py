"""Every codec under Hypothesis: any input parses or gives the codec's own error, and the
same bytes give the same events whole or cut anywhere (the property is in targets.py).

Bounded and derandomized, so CI runs the same examples each time; bench/fuzz.py runs the
long campaigns. The regression corpus (corpus/<codec>/) replays every input a fuzzer
ever failed on, under every variant and several cuttings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from gateway.protocols.beanstalk import codec as bs
from gateway.protocols.nats import client_codec as nc
from gateway.protocols.nats import route_codec as rc
from gateway.protocols.nsq import codec as nsq
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


def _nsq_codec() -> tuple[Any, Any]:
    codec = nsq.NSQServerCodec()
    codec.receive_data(nsq.MAGIC_V2)
    return codec, codec.next_event


def _nats_client_codec() -> tuple[Any, Any]:
    codec = nc.NATSClientCodec()
    return codec, codec.next_event


def _route_codec() -> tuple[Any, Any]:
    codec = rc.RouteCodec()
    return codec, codec.next_event


def _beanstalk_codec() -> tuple[Any, Any]:
    codec = bs.BeanstalkCodec()
    return codec, codec.next_event


@pytest.mark.parametrize(
    ("make", "frame"),
    [
        (_nsq_codec, b"PUB t\n\x00\x00\x00\x64" + b"x" * 100),
        (_beanstalk_codec, b"put 0 0 1 100\r\n" + b"x" * 100 + b"\r\n"),
        (_nats_client_codec, b"PUB t 100\r\n" + b"x" * 100 + b"\r\n"),
        (_route_codec, b"RMSG $G t 100\r\n" + b"x" * 100 + b"\r\n"),
    ],
    ids=["nsq", "beanstalk", "nats-client", "nats-route"],
)
def test_a_publisher_whose_reads_end_mid_frame_does_not_pile_up(make: Any, frame: bytes) -> None:
    """The sessions pull with next_event; what is parsed must not stay buffered."""
    codec, next_event = make()
    stream = frame * 20000  # 2+ MB in 64 KiB reads that almost never end on a frame
    events = 0
    for start in range(0, len(stream), 65536):
        codec.receive_data(stream[start : start + 65536])
        while next_event() is not None:
            events += 1
        assert len(codec._buf) <= 2 * 65536 + len(frame), len(codec._buf)
    assert events == 20000
