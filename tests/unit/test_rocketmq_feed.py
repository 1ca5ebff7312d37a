"""A RocketMQ group feed over a broker group, on Trio's MockClock: offsets assigned on
delivery, pulls that return the same entries until a commit, commits that acknowledge in
the broker, tag filtering, and deliveries that never time out while they wait."""

from __future__ import annotations

import trio
import trio.testing

from gateway.broker import Broker
from gateway.model import Message
from gateway.protocols.rocketmq.feed import GroupFeed
from gateway.protocols.rocketmq.mapping import EVERYTHING, parse_subscription
from gateway.protocols.rocketmq.message import decode_records
from tests.helpers import running_broker as broker

STORE = ("127.0.0.1", 9876)


def one_queue(message: Message) -> int:
    return 0


def make_feed(b: Broker, topic: str = "T", window: int = 100, queues: int = 1) -> GroupFeed:
    return GroupFeed(b.group(topic, "G"), topic, queues, window, STORE, one_queue)


def bodies(records: list[bytes]) -> list[bytes]:
    return [decode_records(r)[0].body for r in records]


async def test_pull_repeats_until_commit_and_commit_acknowledges() -> None:
    async with broker() as b:
        feed = make_feed(b)
        b.publish("T", [b"a", b"b", b"c"])
        log = feed.queues[0]
        start = log.min_offset
        first = feed.pull(0, start, 32, EVERYTHING)
        again = feed.pull(0, start, 32, EVERYTHING)
        assert first.status == again.status == "found"
        assert bodies(first.records) == bodies(again.records) == [b"a", b"b", b"c"]
        assert first.next_offset == start + 3
        group = feed.group
        assert len(group.in_flight) == 3 and group.finish_count == 0
        first_id = log.entries[0].message.id
        assert feed.commit(0, start + 2) == 2
        assert group.finish_count == 2 and log.min_offset == start + 2
        # a send-back may name a message committed meanwhile (a rebalance, a slow handler)
        found = feed.find(first_id)
        assert found is not None and found.body == b"a"
        assert bodies(feed.pull(0, start + 2, 32, EVERYTHING).records) == [b"c"]
        # an offset from another life of the log is ignored, never acknowledging anything
        assert feed.commit(0, start + 10**9) == 0 and group.finish_count == 2


async def test_offsets_are_taken_on_delivery_and_the_window_bounds_them() -> None:
    async with broker() as b:
        feed = make_feed(b, window=2)
        b.publish("T", [b"1", b"2", b"3"])
        log = feed.queues[0]
        start = log.min_offset
        assert len(log.entries) == 2  # the third waits in the broker group
        feed.commit(0, start + 1)
        assert [e.message.body for e in log.entries] == [b"2", b"3"]
        assert [e.offset for e in log.entries] == [start + 1, start + 2]


async def test_tags_not_subscribed_are_finished_at_once() -> None:
    async with broker() as b:
        feed = make_feed(b)
        feed.subscription = parse_subscription("TagA || TagB")
        for tag in ("TagA", "TagC", "TagB"):
            b.publish("T", [tag.encode()], headers=[("TAGS", tag)])
        b.publish("T", [b"untagged"])
        assert [e.message.body for e in feed.queues[0].entries] == [b"TagA", b"TagB"]
        assert feed.group.finish_count == 2


async def test_pull_filters_by_the_request_subscription_and_skips_over() -> None:
    async with broker() as b:
        feed = make_feed(b)
        for tag in ("X", "Y", "X"):
            b.publish("T", [tag.encode()], headers=[("TAGS", tag)])
        start = feed.queues[0].min_offset
        only_y = feed.pull(0, start, 32, parse_subscription("Y"))
        assert bodies(only_y.records) == [b"Y"] and only_y.next_offset == start + 3
        none = feed.pull(0, start + 2, 32, parse_subscription("Z"))
        assert none.status == "retry" and none.next_offset == start + 3
        assert feed.pull(0, start + 3, 32, EVERYTHING).status == "none"
        assert feed.pull(0, start + 4, 32, EVERYTHING).status == "moved"
        assert feed.pull(0, start - 1, 32, EVERYTHING).next_offset == start


async def test_pull_answers_are_bounded_in_count_and_bytes() -> None:
    async with broker() as b:
        feed = make_feed(b)
        b.publish("T", [b"x" * 1000] * 10)
        start = feed.queues[0].min_offset
        assert feed.pull(0, start, 4, EVERYTHING).count == 4
        capped = feed.pull(0, start, 32, EVERYTHING, max_bytes=2500)
        assert capped.count == 2 and capped.next_offset == start + 2
        assert feed.pull(0, start, 32, EVERYTHING, max_bytes=10).count == 1  # at least one


async def test_a_message_with_its_own_ttr_never_times_out_in_the_feed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with broker(max_attempts=2) as b:
        feed = make_feed(b)
        b.publish("T", [b"beanstalk job"], ttr=1.0)
        await trio.sleep(3600)
        group = feed.group
        assert group.timeout_count == 0 and not group.buried
        assert [e.message.attempts for e in feed.queues[0].entries] == [1]


async def test_queues_follow_the_queue_choice() -> None:
    async with broker() as b:
        feed = GroupFeed(b.group("Q", "G"), "Q", 4, 100, STORE, lambda m: int(m.body))
        b.publish("Q", [b"3", b"1", b"5"])
        assert [[e.message.body for e in log.entries] for log in feed.queues] == [
            [],
            [b"1", b"5"],
            [],
            [b"3"],
        ]


async def test_closing_wakes_held_pulls_and_detaches() -> None:
    async with broker() as b:
        feed = make_feed(b)
        wake = feed.queues[0].wake
        feed.close()
        assert wake.is_set() and feed.closed
        assert not feed.group.consumers


async def test_entries_the_group_dropped_are_not_pulled() -> None:
    """An operator empties the group (admin page, nsqd /channel/empty): its queue entries
    are no longer handed out."""
    async with broker() as b:
        feed = make_feed(b)
        b.publish("T", [b"gone", b"gone too"])
        start = feed.queues[0].min_offset
        feed.group.empty()
        result = feed.pull(0, start, 32, EVERYTHING)
        assert result.status == "retry" and result.next_offset == start + 2
        b.publish("T", [b"new"])
        assert bodies(feed.pull(0, start, 32, EVERYTHING).records) == [b"new"]
