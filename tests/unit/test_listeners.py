"""The listener table the app binds: its order (the `listening` lines and the `ready`
line follow it, HTTP last), what is off, and the address helpers it prints with."""

from __future__ import annotations

import pytest

from gateway.addresses import format_address, is_loopback, parse_address
from gateway.app import Gateway
from tests.helpers import settings

ALL_ON = {
    "beanstalk": "127.0.0.1:0",
    "nats": "127.0.0.1:0",
    "nats_route": "127.0.0.1:0",
    "rocketmq": "127.0.0.1:0",
    "http": "127.0.0.1:0",
    "https": "127.0.0.1:0",
}


def test_listeners_are_bound_in_the_order_of_the_listening_lines_http_last() -> None:
    gw = Gateway(settings(**ALL_ON))
    names = [listener.name for listener in gw.listeners]
    assert names == [
        "nsq",
        "beanstalk",
        "beanstalk-tls",
        "nats",
        "nats-route",
        "rocketmq",
        "http",
        "https",
    ]
    on = [listener.name for listener in gw.listeners if listener.address is not None]
    # beanstalkd TLS is off unless set, and HTTPS needs a certificate
    assert on == ["nsq", "beanstalk", "nats", "nats-route", "rocketmq", "http"]


def test_the_cluster_attaches_and_dials_only_when_clustered() -> None:
    alone = Gateway(settings())
    assert all(s.before is None and s.after is None for s in alone.services)
    clustered = Gateway(settings(nats_route="127.0.0.1:0"))
    [cluster] = [s for s in clustered.services if s.server is clustered.cluster]
    assert cluster.before is not None and cluster.after is not None


@pytest.mark.parametrize(
    ("text", "address"),
    [("127.0.0.1:4150", ("127.0.0.1", 4150)), ("[::1]:0", ("::1", 0)), ("host:1", ("host", 1))],
)
def test_an_address_prints_as_it_is_parsed(text: str, address: tuple[str, int]) -> None:
    assert parse_address(text) == address
    assert format_address(*address) == text


def test_loopback_hosts() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.10")
