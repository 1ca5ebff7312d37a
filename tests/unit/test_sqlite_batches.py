"""The durable store frees a publish's bodies (its `batches` row) with the last entry that
points at it, whichever way entries go: acknowledged, their group or topic deleted, a group
emptied, the backlog handed to groups; and a file whose `refs` an earlier gateway kept with
a trigger counts the same once opened here."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.model import Message
from gateway.stores import SQLiteStore


def msg(i: int) -> Message:
    return Message(i, "t", b"body %d" % i, 1_700_000_000_000_000_000 + i)


def batches(path: Path) -> dict[int, int]:
    """batch id -> refs, read from the closed file."""
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT id, refs FROM batches ORDER BY id").fetchall())
    finally:
        db.close()


async def opened(path: Path) -> SQLiteStore:
    store = SQLiteStore(path)
    await store.open()
    return store


async def published(path: Path, groups: list[str]) -> tuple[SQLiteStore, list[Message]]:
    """A store with topic t, `groups`, and one publish of messages 1-4 in all of them
    (in the backlog when `groups` is empty), written."""
    store = await opened(path)
    store.add_topic("t")
    for g in groups:
        store.add_group("t", g)
    messages = [msg(i) for i in range(1, 5)]
    store.put("t", groups, messages, 0.0)
    await store.flush()
    return store, messages


async def test_a_batch_goes_with_its_last_entry_in_every_group(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store, messages = await published(path, ["a", "b"])
    store.remove("t", "a", messages)
    store.remove("t", "b", messages[:3])
    await store.close()
    assert batches(path) == {1: 1}  # message 4 in group b still holds it
    store = await opened(path)
    store.remove("t", "b", messages[3:])
    await store.close()
    assert batches(path) == {}


async def test_acks_spread_over_commits_count_down_once_each(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store, messages = await published(path, ["a"])
    for m in messages[:3]:
        store.remove("t", "a", [m])
        await store.flush()
    await store.close()
    assert batches(path) == {1: 1}


async def test_dropping_groups_and_topics_and_clearing_free_batches(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store, _ = await published(path, ["a", "b", "c"])
    store.drop_group("t", "a")
    await store.close()
    assert batches(path) == {1: 8}
    store = await opened(path)
    store.clear("t", "b")
    await store.close()
    assert batches(path) == {1: 4}
    store = await opened(path)
    store.drop_topic("t")
    await store.close()
    assert batches(path) == {}


async def test_the_backlog_handed_to_groups_holds_its_batch_once_per_group(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gateway.db"
    store, messages = await published(path, [])
    store.add_group("t", "a")
    store.add_group("t", "b")
    store.fan_out_backlog("t", ["a", "b"])
    await store.close()
    assert batches(path) == {1: 8}
    store = await opened(path)
    store.remove("t", "a", messages)
    store.remove("t", "b", messages)
    await store.close()
    assert batches(path) == {}


async def test_a_file_written_with_the_earlier_trigger_counts_the_same(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store, messages = await published(path, ["a", "b"])
    await store.close()
    # as an earlier gateway left it: refs kept by a trigger per deleted entry
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TRIGGER entries_gone AFTER DELETE ON entries BEGIN"
        " UPDATE batches SET refs = refs - 1 WHERE id = OLD.batch;"
        " DELETE FROM batches WHERE id = OLD.batch AND refs <= 0; END;"
    )
    db.close()
    store = await opened(path)
    store.remove("t", "a", messages)  # counted once, not by the trigger as well
    await store.close()
    assert batches(path) == {1: 4}
    db = sqlite3.connect(path)
    triggers = db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall()
    assert triggers == []
    db.close()
