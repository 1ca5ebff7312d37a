"""The durable store joins publishes of one message each, recorded one after another, into
one log record (sqlite_records.Joining): sixteen connections' PUBs in one pass of the
scheduler are one record, as an MPUB of them would be, and every message keeps its own
id, body, timestamp and origin, read back from the index or replayed from the log alone.
Deliveries, finishes and changes of other messages may be recorded between them (a
consumer waiting for them takes each one as it comes); a publish that differs in
anything else, or has any other record between it and the last one, is a record of its
own."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gateway.model import Message
from gateway.stores import SQLiteStore
from gateway.stores.log import decode, segment_path, segments
from tests.helpers import frames

FIRST = (-(2**62), 0)  # before every (priority, id)


def msg(i: int, priority: int = 1024, ttr: float = 0.0) -> Message:
    m = Message(i, "t", b"body %d" % i, 1_700_000_000_000_000_000 + 7 * i, priority=priority)
    m.ttr = ttr
    m.origin = f"nsq 127.0.0.1:{40000 + i}"
    return m


async def opened(path: Path, groups: tuple[str, ...] = ()) -> SQLiteStore:
    store = SQLiteStore(path)
    await store.open()
    if groups:
        store.add_topic("t")
        for g in groups:
            store.add_group("t", g)
        store.reserve_ids(1 << 16)  # as the broker does, a block at a time
    return store


def publishes(store: SQLiteStore) -> list[tuple[Any, ...]]:
    """The publish records in the store's log, in order."""
    return [
        op
        for number in segments(store.log_dir)
        for payload in frames(segment_path(store.log_dir, number))
        for op in decode(payload)[0]
        if op[0] == "P"
    ]


def fields(messages: list[Message]) -> list[tuple[int, bytes, int, str, int]]:
    return [(m.id, bytes(m.body), m.timestamp, m.origin, m.priority) for m in messages]


async def test_publishes_of_one_message_each_with_nothing_between_are_one_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gateway.db"
    store = await opened(path, ("g",))
    messages = [msg(i) for i in range(1, 17)]
    for m in messages:
        store.put("t", ["g"], [m], 0.0)
    store.flush_now()
    (record,) = publishes(store)
    assert record[2:4] == (1, 16)
    # what a killed gateway leaves: the log written, the index not brought up to date
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copy(path, killed / path.name)
    shutil.copytree(store.log_dir, killed / store.log_dir.name)
    await store.close()

    store = await opened(path)  # the index, brought up to date as it closed
    assert fields(await store.load("t", "g", FIRST, 100)) == fields(messages)
    await store.close()
    store = await opened(killed / path.name)  # the log replayed
    assert fields(await store.load("t", "g", FIRST, 100)) == fields(messages)
    await store.close()


async def test_a_publish_joins_the_one_just_before_it_only_if_it_fits(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store = await opened(path, ("g", "h"))
    put = [
        (["g"], msg(1)),
        (["g"], msg(2)),  # joins 1
        (["g"], msg(3, priority=5)),  # another priority
        (["g"], msg(4, priority=5)),  # joins 3
        (["h"], msg(5, priority=5)),  # another group
        (["h"], msg(7, priority=5)),  # not the next id
        (["h"], msg(8, priority=5, ttr=30.0)),  # another ttr
        (["h"], msg(9, priority=5, ttr=30.0)),  # joins 8
    ]
    for groups, m in put:
        store.put("t", groups, [m], 0.0)
    store.add_group("t", "k")  # a record between: not a delivery, finish or change
    store.put("t", ["h"], [msg(10, priority=5, ttr=30.0)], 0.0)
    store.put("t", ["h"], [msg(11, priority=5, ttr=30.0)], 0.0)  # joins 10
    store.flush_now()
    assert [op[2:4] for op in publishes(store)] == [(1, 2), (3, 2), (5, 1), (7, 1), (8, 2), (10, 2)]
    await store.close()
    store = await opened(path)
    # in (priority, id) order: 3 and 4 first
    in_g = [put[2][1], put[3][1], put[0][1], put[1][1]]
    assert fields(await store.load("t", "g", FIRST, 100)) == fields(in_g)
    in_h = [m for groups, m in put if groups == ["h"]] + [
        msg(10, priority=5, ttr=30.0),
        msg(11, priority=5, ttr=30.0),
    ]
    assert fields(await store.load("t", "h", FIRST, 100)) == fields(in_h)
    await store.close()


async def test_deliveries_and_finishes_between_publishes_leave_them_one_record(
    tmp_path: Path,
) -> None:
    """A consumer waiting for the messages: each publish is delivered as it comes, and
    some finished. The publishes are one record, the deliveries one (runs of ids), and
    the index ends with what each record said: 1 finished, 2 and 3 in flight (ready as
    far as the index knows, delivered once), 4 ready."""
    path = tmp_path / "gateway.db"
    store = await opened(path, ("g",))
    recorder = store.recorder("t", "g")
    messages = [msg(i) for i in range(1, 5)]
    for m in messages:
        store.put("t", ["g"], [m], 0.0)
        if m.id < 4:
            m.attempts += 1
            recorder.delivered(SimpleNamespace(message=m))
        if m.id == 1:
            recorder.finished_all([m])
    store.flush_now()
    assert [op[2:4] for op in publishes(store)] == [(1, 4)]
    await store.close()
    store = await opened(path)
    got = await store.load("t", "g", FIRST, 100)
    await store.close()
    assert [(m.id, m.attempts) for m in got] == [(2, 1), (3, 1), (4, 0)]
