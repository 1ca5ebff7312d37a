"""The store contract (gateway/stores/base.py). Every store runs this suite: add a
factory to STORES when a store is added. `reopen` gives what a restarted gateway would
open: the same object for the memory store, a new one on the same file for a durable one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.model import Message
from gateway.stores import MemoryStore, Store, StoredState

StoreFactory = Callable[[], tuple[Store, Callable[[Store], Store]]]


def _memory() -> tuple[Store, Callable[[Store], Store]]:
    return MemoryStore(), lambda store: store


STORES: dict[str, StoreFactory] = {"memory": _memory}


def msg(i: int, body: bytes = b"", **kw: object) -> Message:
    return Message(i, "t", body or b"m%d" % i, 1_700_000_000_000_000_000 + i, **kw)  # type: ignore[arg-type]


@pytest.fixture(params=sorted(STORES))
async def store_pair(request: pytest.FixtureRequest) -> tuple[Store, Callable[[Store], Store]]:
    store, reopen = STORES[request.param]()
    state = await store.open()
    assert state.topics == {} and state.last_id == 0
    return store, reopen


async def reopened(pair: tuple[Store, Callable[[Store], Store]]) -> StoredState:
    store, reopen = pair
    await store.flush()
    await store.close()
    return await reopen(store).open()


def ids(messages: list[Message]) -> list[int]:
    return [m.id for m in messages]


async def test_put_and_remove(store_pair: tuple[Store, Callable[[Store], Store]]) -> None:
    store, _ = store_pair
    store.add_topic("t")
    store.add_group("t", "g", adopt_backlog=False)
    store.put("t", "g", [msg(1), msg(2), msg(3)])
    store.remove("t", "g", [2])
    state = await reopened(store_pair)
    group = state.topics["t"].groups["g"]
    assert ids(group.ready) == [1, 3]
    assert [m.body for m in group.ready] == [b"m1", b"m3"]
    assert state.last_id == 3


async def test_backlog_is_adopted_by_the_first_group(
    store_pair: tuple[Store, Callable[[Store], Store]],
) -> None:
    store, _ = store_pair
    store.add_topic("t")
    store.put("t", None, [msg(1), msg(2)])
    state = await reopened(store_pair)
    assert ids(state.topics["t"].backlog) == [1, 2]
    store, reopen = store_pair
    store = reopen(store)
    store.add_group("t", "g", adopt_backlog=True)
    state = await reopened((store, reopen))
    assert state.topics["t"].backlog == []
    assert ids(state.topics["t"].groups["g"].ready) == [1, 2]


async def test_update_keeps_attempts_priority_delay_and_burial(
    store_pair: tuple[Store, Callable[[Store], Store]],
) -> None:
    store, _ = store_pair
    store.add_topic("t")
    store.add_group("t", "g", adopt_backlog=False)
    m1, m2 = msg(1), msg(2)
    store.put("t", "g", [m1, m2])
    m1.attempts, m1.priority = 3, 7
    store.update("t", "g", m1)
    m2.attempts = 5
    store.update("t", "g", m2, buried=True)
    state = await reopened(store_pair)
    group = state.topics["t"].groups["g"]
    assert [(m.id, m.attempts, m.priority) for m in group.ready] == [(1, 3, 7)]
    assert [(m.id, m.attempts) for m in group.buried] == [(2, 5)]
    # kicked: buried no more
    store, reopen = store_pair
    store = reopen(store)
    store.update("t", "g", m2)
    state = await reopened((store, reopen))
    assert ids(state.topics["t"].groups["g"].ready) == [1, 2]


async def test_clear_drop_and_pause(store_pair: tuple[Store, Callable[[Store], Store]]) -> None:
    store, _ = store_pair
    for topic in ("t", "u"):
        store.add_topic(topic)
        store.add_group(topic, "g", adopt_backlog=False)
        store.add_group(topic, "h", adopt_backlog=False)
    store.put("t", "g", [msg(1)])
    store.put("t", "h", [msg(1)])
    store.put("u", "g", [msg(2)])
    store.clear("t", "g")
    store.drop_group("t", "h")
    store.drop_topic("u")
    store.set_paused("t", None, True)
    store.set_paused("t", "g", True)
    state = await reopened(store_pair)
    assert set(state.topics) == {"t"}
    topic = state.topics["t"]
    assert topic.paused and set(topic.groups) == {"g"}
    assert topic.groups["g"].paused and topic.groups["g"].ready == []
    assert state.last_id == 2  # ids are never handed out twice, even after deletion


async def test_body_headers_and_fields_round_trip(
    store_pair: tuple[Store, Callable[[Store], Store]],
) -> None:
    store, _ = store_pair
    body = bytes(range(256)) * 4 + b"\r\n\x00"
    headers = [("k", "v"), ("x-y", "z"), ("k", "again")]
    m = msg(9, body, headers=headers, ttr=30.0, reply_to="_INBOX.1", origin="nsq a")
    store.add_topic("t")
    store.add_group("t", "g", adopt_backlog=False)
    store.put("t", "g", [m])
    state = await reopened(store_pair)
    (got,) = state.topics["t"].groups["g"].ready
    assert (got.id, got.body, got.headers, got.ttr, got.reply_to, got.timestamp) == (
        9,
        body,
        headers,
        30.0,
        "_INBOX.1",
        m.timestamp,
    )
