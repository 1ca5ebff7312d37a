"""The durable store frees a publish's bodies (its `batches` row) with the last entry that
points at it, whichever way entries go: acknowledged, their group or topic deleted, a group
emptied, the backlog handed to groups; and a file whose `refs` an earlier gateway kept with
a trigger counts the same once opened here."""

from __future__ import annotations

import sqlite3
from array import array
from itertools import accumulate
from pathlib import Path

from gateway.model import Message
from gateway.stores import SQLiteStore
from gateway.stores import sqlite_sql as sql


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


# format 1, as earlier gateways wrote it: an entry per (group, message), and a trigger
# that kept `refs` per deleted entry in files older still
FORMAT_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE topics (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
    paused INTEGER NOT NULL DEFAULT 0);
CREATE TABLE groups (id INTEGER PRIMARY KEY, topic INTEGER NOT NULL, name TEXT,
    paused INTEGER NOT NULL DEFAULT 0);
CREATE TABLE batches (id INTEGER PRIMARY KEY, last INTEGER NOT NULL, ts INTEGER NOT NULL,
    ttr REAL NOT NULL, origin TEXT NOT NULL, reply_to TEXT, headers TEXT, header_block BLOB,
    bodies BLOB NOT NULL, ends BLOB NOT NULL, refs INTEGER NOT NULL);
CREATE TABLE entries (grp INTEGER NOT NULL, priority INTEGER NOT NULL, id INTEGER NOT NULL,
    batch INTEGER NOT NULL, attempts INTEGER NOT NULL, due REAL NOT NULL,
    state INTEGER NOT NULL, PRIMARY KEY (grp, priority, id)) WITHOUT ROWID;
CREATE TRIGGER entries_gone AFTER DELETE ON entries BEGIN
    UPDATE batches SET refs = refs - 1 WHERE id = OLD.batch;
    DELETE FROM batches WHERE id = OLD.batch AND refs <= 0; END;
INSERT INTO topics VALUES (1, 't', 0);
INSERT INTO groups VALUES (1, 1, NULL, 0), (2, 1, 'a', 0), (3, 1, 'b', 0);
PRAGMA user_version = 1;
"""


async def test_a_format_1_file_is_converted_and_counts_the_same(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    db = sqlite3.connect(path)
    db.executescript(FORMAT_1)
    bodies = [b"body %d" % i for i in range(1, 5)]
    ends = array("I", accumulate(map(len, bodies))).tobytes()
    db.execute(
        "INSERT INTO batches VALUES (1, 4, 1700000000000000001, 60, 'nsq', NULL, NULL, NULL,"
        " ?, ?, 8)",
        (b"".join(bodies), ends),
    )
    db.executemany(
        "INSERT INTO entries VALUES (?, 1024, ?, 1, ?, 0, ?)",
        [(g, i, int(i == 2), int(i == 4)) for g in (2, 3) for i in range(1, 5)],
    )
    db.commit()
    db.close()
    store = SQLiteStore(path)
    state = await store.open()
    groups = state.topics["t"].groups
    for name in ("a", "b"):
        assert [(m.id, m.body, m.attempts) for m in groups[name].ready] == [
            (1, b"body 1", 0), (2, b"body 2", 1), (3, b"body 3", 0)
        ]  # fmt: skip
        assert [m.id for m in groups[name].buried] == [4]
    store.remove("t", "a", [msg(i) for i in range(1, 4)])
    store.remove("t", "a", [msg(4)])
    await store.close()
    assert batches(path) == {1: 4}  # counted once, not by the trigger as well
    db = sqlite3.connect(path)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert "entries" not in tables and "runs" in tables
    assert db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall() == []
    assert db.execute("PRAGMA user_version").fetchone()[0] == 4
    db.close()


async def test_publishes_from_many_origins_share_a_batch_and_keep_their_origin(
    tmp_path: Path,
) -> None:
    """Sixteen connections' PUBs one at a time interleave in the log: they are one batch
    row and one run (not one of each per message), and each message keeps its origin."""
    path = tmp_path / "gateway.db"
    store = await opened(path)
    store.add_topic("t")
    store.add_group("t", "g")
    store.reserve_ids(1 << 16)  # as the broker does, a block at a time
    messages = []
    for i in range(1, 33):
        m = msg(i)
        m.origin = f"nsq 127.0.0.1:{40000 + i % 16}"
        messages.append(m)
        store.put("t", ["g"], [m], 0.0)
    await store.close()
    assert batches(path) == {1: 32}
    store = await opened(path)
    got = await store.load("t", "g", (-(2**62), 0), 100)
    await store.close()
    assert [(m.id, m.origin, m.body) for m in got] == [(m.id, m.origin, m.body) for m in messages]


async def test_a_format_3_file_is_converted_and_reads_back_its_origins(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store, messages = await published(path, ["a"])
    await store.close()
    db = sqlite3.connect(path)  # as a gateway of format 3 left it: no `origins`, `own`
    db.execute("ALTER TABLE batches DROP COLUMN origins")
    db.execute("ALTER TABLE batches DROP COLUMN own")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    store = await opened(path)
    got = await store.load("t", "a", (-(2**62), 0), 100)
    store.put("t", ["a"], [msg(9)], 0.0)
    await store.close()
    assert [(m.id, m.origin) for m in got] == [(m.id, m.origin) for m in messages]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 4
    db.close()


async def interleaved(path: Path, tubes: int, n: int) -> tuple[SQLiteStore, dict[str, list[int]]]:
    """`tubes` topics with a group each, and `n` puts of one message each, one per topic in
    turn (as greenstalk clients into their own tubes): the ids of each topic's."""
    store = await opened(path)
    ids: dict[str, list[int]] = {}
    for k in range(tubes):
        store.add_topic(f"t{k}")
        store.add_group(f"t{k}", "g")
        ids[f"t{k}"] = []
    store.reserve_ids(1 << 16)
    for i in range(1, n + 1):
        topic = f"t{i % tubes}"
        m = Message(i, topic, b"job %d" % i, 1_700_000_000_000_000_000 + i)
        m.origin = f"beanstalk 127.0.0.1:{50000 + i % tubes}"
        store.put(topic, ["g"], [m], 0.0)
        ids[topic].append(i)
    return store, ids


async def test_puts_into_several_tubes_in_turn_are_one_batch_per_tube(tmp_path: Path) -> None:
    """Four clients' puts into four tubes interleave in the log: each tube's are one batch
    row and one run, whose ids between are the other tubes' (holes, not its own). They
    read back whole, after a restart and after some are finished."""
    path = tmp_path / "gateway.db"
    store, ids = await interleaved(path, 4, 40)
    await store.close()
    assert batches(path) == {1: 10, 2: 10, 3: 10, 4: 10}
    store = await opened(path)
    for topic, mine in ids.items():
        got = await store.load(topic, "g", (-(2**62), 0), 100)
        assert [(m.id, m.body, m.origin) for m in got] == [
            (i, b"job %d" % i, f"beanstalk 127.0.0.1:{50000 + i % 4}") for i in mine
        ]
    store.remove("t1", "g", [Message(i, "t1", b"", 1) for i in ids["t1"][:4]])
    await store.close()
    assert batches(path) == {1: 6, 2: 10, 3: 10, 4: 10}
    reopened = SQLiteStore(path)
    state = await reopened.open()
    for topic, mine in ids.items():
        ready = state.topics[topic].groups["g"].ready
        left = mine[4:] if topic == "t1" else mine
        assert [(m.id, m.body) for m in ready] == [(i, b"job %d" % i) for i in left]
    await reopened.close()


async def test_puts_too_far_apart_are_batches_of_their_own(tmp_path: Path) -> None:
    """More than 64 other ids between two puts of a tube: a new batch (a run's holes stay
    a small bitmap)."""
    path = tmp_path / "gateway.db"
    store, _ = await interleaved(path, 70, 140)
    await store.close()
    assert len(batches(path)) == 140
    store = await opened(path)
    got = await store.load("t5", "g", (-(2**62), 0), 10)
    await store.close()
    assert [(m.id, m.body) for m in got] == [(5, b"job 5"), (75, b"job 75")]


def test_publishes_finished_in_every_group_before_the_index_took_them_are_left_out() -> None:
    """A queue drained as it fills: the index's pass meets most publishes with their
    finishes. Those finished in every group go before any joining (their finishes and
    changes with them); one with a message left, or a group left, stays whole."""

    def put(first: int, n: int, gids: tuple[int, ...]) -> tuple[object, ...]:
        return ("P", gids, first, n, 0.0, 1024, 0, None, ())

    puts = [put(1, 1, (7,)), put(2, 3, (7,)), put(5, 1, (7, 8)), put(6, 2, (7,)), put(8, 1, (7,))]
    done = sql._by_group([(7, i, 1024) for i in (1, 2, 3, 4, 5, 6, 8)] + [(8, 9, 1024)])
    changed = sql._by_group([(7, 1, "u1"), (7, 6, "u6")])
    kept = sql._unfinished(puts, changed, done)  # type: ignore[arg-type]
    # 5 is not finished in group 8; 7 of the publish 6..7 is not finished
    assert [op[2] for op in kept] == [5, 6]
    assert sorted(done[7].items) == [5, 6] and sorted(done[8].items) == [9]
    assert sorted(changed[7].items) == [6]  # the change of 1 went with its publish


async def test_a_page_in_reads_the_batches_of_the_runs_it_reaches_together(
    tmp_path: Path,
) -> None:
    """A page-in asks for the batch rows of the runs its limit reaches in one query per
    500 of them (sqlite_read._Batches.fetch): every message comes back once, in order,
    with its own body and fields, across more batches than one query asks for."""
    path = tmp_path / "gateway.db"
    store = await opened(path)
    store.add_topic("t")
    store.add_group("t", "g")
    for i in range(1, 1201):
        m = msg(i)
        m.ttr = 60.0 + i  # a ttr of its own: a batch of its own
        store.put("t", ["g"], [m], 0.0)
    await store.flush()
    got = await store.load("t", "g", (0, 0), 1100)
    assert [m.id for m in got] == list(range(1, 1101))
    assert all(m.body == b"body %d" % m.id and m.ttr == 60.0 + m.id for m in got)
    rest = await store.load("t", "g", (got[0].priority, 1101), 500)
    assert [(m.id, m.ttr) for m in rest] == [(i, 60.0 + i) for i in range(1101, 1201)]
    await store.close()
    assert len(batches(path)) == 1200
