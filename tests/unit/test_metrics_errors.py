"""Error replies are counted by protocol and code: counted in a dict on the hot path,
handed to the Prometheus counter whenever it is collected, so every way of reading it (a
scrape, the registry, the counter itself) sees every error so far, each counted once."""

from __future__ import annotations

from prometheus_client import generate_latest

from gateway.metrics import Metrics


def value(m: Metrics, protocol: str, code: str) -> float | None:
    return m.registry.get_sample_value(
        "gateway_protocol_errors_total", {"protocol": protocol, "code": code}
    )


def test_errors_are_counted_by_their_first_word_whenever_read() -> None:
    m = Metrics()
    m.protocol_error("nsq", b"E_BAD_TOPIC PUB topic name 'a b' is not valid")
    m.protocol_error("nsq", b"E_BAD_TOPIC PUB topic name 'c d' is not valid")
    m.protocol_error("nats", "'Invalid Subject'")
    assert value(m, "nsq", "E_BAD_TOPIC") == 2
    assert value(m, "nats", "'Invalid") == 1
    m.protocol_error("nsq", b"E_BAD_TOPIC again")
    m.protocol_error("beanstalk", b"")
    text = generate_latest(m.registry).decode()
    assert 'gateway_protocol_errors_total{code="E_BAD_TOPIC",protocol="nsq"} 3.0' in text
    assert 'gateway_protocol_errors_total{code="unknown",protocol="beanstalk"} 1.0' in text
    # read again with nothing new: the same counts, nothing handed over twice
    assert value(m, "nsq", "E_BAD_TOPIC") == 3
    samples = m.protocol_errors.collect()[0].samples
    assert sum(s.value for s in samples if s.name.endswith("_total")) == 5


def test_a_long_first_word_is_cut_to_forty_characters() -> None:
    m = Metrics()
    m.protocol_error("beanstalk", b"X" * 1000)
    m.protocol_error("beanstalk", b"X" * 999)
    assert value(m, "beanstalk", "X" * 40) == 2
    assert len(m._errors) == 0  # handed over by the read
