"""The links' settings: what a file may say, what it is refused for, and the warning for
an import that would loop through the cluster the gateway is registered in."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
from pydantic import ValidationError

from gateway.config import Settings, load
from gateway.links import cluster_warnings
from tests.helpers import running_gateway


def test_links_are_arrays_of_tables_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        "[[nsq_import]]\ntopic = 'orders'\nchannel = 'gw'\n"
        "lookupd_http_addresses = ['http://lookupd-1:4161/', 'lookupd-2:4161']\n"
        "[[nsq_export]]\ntopic = 'jobs'\nnsqd_tcp_addresses = ['nsqd-1:4150']\n"
        "[[beanstalk_import]]\nurl = 'beanstalk://old:11301'\n"
        "[[beanstalk_import]]\nurl = 'beanstalk://older'\ntubes = ['a', 'b']\nfollow = false\n"
    )
    s = load(path, environ={})
    [nsq_import] = s.nsq_import
    assert nsq_import.lookupd_http_addresses == ["lookupd-1:4161", "lookupd-2:4161"]
    assert (nsq_import.max_in_flight, nsq_import.lookupd_poll_interval) == (200, 60.0)
    [export] = s.nsq_export
    assert (export.group, export.batch, export.to_topic) == ("nsq_export", 100, None)
    assert [(b.address, b.tubes, b.follow) for b in s.beanstalk_import] == [
        (("old", 11301), ["*"], True),
        (("older", 11300), ["a", "b"], False),
    ]


@pytest.mark.parametrize(
    ("link", "why"),
    [
        ({"nsq_import": [{"topic": "t", "channel": "c"}]}, "needs nsqd_tcp_addresses"),
        ({"nsq_export": [{"topic": "t", "nsqd_tcp_addresses": ["nsqd"]}]}, "port"),
        ({"beanstalk_import": [{"url": "http://old:11300"}]}, "beanstalk://host"),
        ({"nsq_export": [{"topic": "t", "nsqd_tcp_addresses": ["n:1"], "batch": 0}]}, "batch"),
    ],
)
def test_a_link_without_what_it_needs_is_refused(link: dict, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        Settings(**link)


def test_an_import_into_its_own_topic_name_while_registered_is_warned_about() -> None:
    link = {"topic": "orders", "channel": "gw", "lookupd_http_addresses": ["lookupd:4161"]}
    registered = {"nsqd": {"lookupd_tcp_addresses": ["lookupd:4160"]}}
    assert cluster_warnings(Settings(nsq_import=[link])) == []  # not registered
    renamed = {**link, "to_topic": "orders_in"}
    assert cluster_warnings(Settings(nsq_import=[renamed], **registered)) == []
    [warning] = cluster_warnings(Settings(nsq_import=[link], **registered))
    assert "orders/gw" in warning and "to_topic" in warning


async def test_the_warning_is_logged_at_start(caplog: pytest.LogCaptureFixture) -> None:
    link = {"topic": "orders", "channel": "gw", "lookupd_http_addresses": ["127.0.0.1:1"]}
    with caplog.at_level(logging.WARNING, logger="gateway"):
        async with running_gateway(
            nsq="127.0.0.1:0",
            http="127.0.0.1:0",
            nsq_import=[link],
            nsqd={"lookupd_tcp_addresses": ["127.0.0.1:1"]},
        ):
            await trio.lowlevel.checkpoint()
    assert any("set to_topic" in r.getMessage() for r in caplog.records)
