"""The durable store's log (gateway/stores/log.py) and the store's use of it: frames come
back as written, a torn or corrupt tail is cut at the last whole record, a log yields data
only, positions only grow across restarts, and segments the index holds are deleted."""

from __future__ import annotations

import logging
import os
import pickle
import time
from array import array
from itertools import accumulate
from pathlib import Path

import pytest
import trio

from gateway.model import Message
from gateway.stores import SQLiteStore
from gateway.stores import log as store_log
from gateway.stores import sqlite as sqlite_store
from gateway.stores.base import StoreError
from gateway.stores.log import Bodies, Log, decode, encode, replay, segment_path, segments
from gateway.stores.sqlite import FsyncPolicy
from gateway.stores.sqlite_tail import APPLY_AGE


def frames(directory: Path, after: tuple[int, int] = (0, 0)) -> list[list[tuple[object, ...]]]:
    return [records for _, records, _ in replay(directory, after)]


def test_frames_come_back_in_order_with_their_end_positions(tmp_path: Path) -> None:
    log = Log(tmp_path, 1)
    ends = [log.write(encode([("R", i), ("D", 3, [(0, i)])])) for i in range(5)]
    log.close()
    got = list(replay(tmp_path, (0, 0)))
    assert [position for position, _, _ in got] == ends
    assert [records for _, records, _ in got] == [[("R", i), ("D", 3, [(0, i)])] for i in range(5)]
    # from a position on: only what follows it
    assert frames(tmp_path, ends[2]) == [
        [("R", 3), ("D", 3, [(0, 3)])],
        [("R", 4), ("D", 3, [(0, 4)])],
    ]


def test_a_torn_tail_is_cut_at_the_last_whole_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = Log(tmp_path, 1)
    for i in range(3):
        good = log.write(encode([("R", i)]))
    log.write(encode([("P-ish", b"x" * 100)]))
    log.close()
    path = segment_path(tmp_path, 1)
    with open(path, "r+b") as f:  # the last write cut short, then garbage after it
        f.truncate(path.stat().st_size - 30)
        f.seek(0, os.SEEK_END)
        f.write(os.urandom(200))
    with caplog.at_level(logging.WARNING, "gateway.store"):
        assert frames(tmp_path) == [[("R", 0)], [("R", 1)], [("R", 2)]]
    assert path.stat().st_size == good[1]  # the file ends at the last whole record now
    assert "cut at" in caplog.text
    assert frames(tmp_path) == [[("R", 0)], [("R", 1)], [("R", 2)]]  # and reads clean


def test_a_segment_is_allocated_ahead_and_its_unwritten_rest_is_its_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A segment's blocks are allocated when it is made (its fsyncs then change no file
    size). What a killed gateway leaves is a file longer than its frames, zeros after
    them: the replay ends there without a word of damage, and cuts the file to its frames."""
    log = Log(tmp_path, 1)
    ends = [log.write(encode([("R", i)])) for i in range(3)]
    path = segment_path(tmp_path, 1)
    assert path.stat().st_size >= store_log.SEGMENT_BYTES > ends[-1][1]
    assert log.size() == ends[-1][1]  # what was written, not what was allocated
    # killed: nothing closed, the descriptor let go
    os.close(log._fd)
    with caplog.at_level(logging.INFO, "gateway.store"):
        assert frames(tmp_path) == [[("R", 0)], [("R", 1)], [("R", 2)]]
    assert caplog.records == []
    assert path.stat().st_size == ends[-1][1]


def test_a_frame_past_the_allocated_length_grows_the_segment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A segment is closed once it holds SEGMENT_BYTES, so its last frame may run past the
    length allocated for it: the file grows, and the next write starts the next segment."""
    log = Log(tmp_path, 1)
    big = b"b" * (store_log.SEGMENT_BYTES - 1000)
    first = log.write(encode([("P", 1, pickle.PickleBuffer(big))]))
    second = log.write(encode([("P", 2, pickle.PickleBuffer(b"c" * 5000))]))
    assert first[0] == second[0] == 1 and second[1] > store_log.SEGMENT_BYTES
    third = log.write(encode([("R", 3)]))
    assert third[0] == 2
    os.close(log._fd)  # killed
    with caplog.at_level(logging.INFO, "gateway.store"):
        got = [(op[0], op[1]) for records in frames(tmp_path) for op in records]
    assert got == [("P", 1), ("P", 2), ("R", 3)]
    assert caplog.records == []
    assert segment_path(tmp_path, 1).stat().st_size == second[1]


def test_a_clean_close_gives_the_allocated_rest_back(tmp_path: Path) -> None:
    log = Log(tmp_path, 1)
    end = log.write(encode([("R", 1)]))
    log.close()
    assert segment_path(tmp_path, 1).stat().st_size == end[1]


def test_a_new_segments_name_is_fsynced_by_the_sync_not_by_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes run on the event loop, where nothing may wait for the disk: a segment made
    there (at a rotation) has its directory entry fsynced by the next sync, on the fsync
    thread, before that sync reports any of it on disk."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    monkeypatch.setattr(store_log.os, "fsync", fsync)
    log = Log(tmp_path, 1)
    log.write(encode([("R", 1)]))
    log.offset = store_log.SEGMENT_BYTES  # full: the next write starts segment 2
    log.write(encode([("R", 2)]))
    assert log.segment == 2 and synced == []
    assert log.sync() == log.position
    assert synced == ["dir"]  # the data itself: fdatasync
    log.sync()
    assert synced == ["dir"]  # once per new name
    log.close()


def test_a_corrupt_frame_ends_its_segment_and_the_next_segment_is_read(tmp_path: Path) -> None:
    """A writer that could not cut a failed write's partial frame starts a new segment:
    the replay reads on from there."""
    log = Log(tmp_path, 1)
    first = log.write(encode([("R", 1)]))
    log.write(encode([("R", 2)]))
    log.close()
    path = segment_path(tmp_path, 1)
    data = bytearray(path.read_bytes())
    data[first[1] + store_log.HEADER.size + 3] ^= 0xFF  # a flipped byte: the crc fails
    path.write_bytes(bytes(data))
    log = Log(tmp_path, 2)
    log.write(encode([("R", 3)]))
    log.close()
    assert frames(tmp_path) == [[("R", 1)], [("R", 3)]]


def open_under(directory: Path) -> int:
    """This process's descriptors open on files in `directory`."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed already
            continue
    return sum(t.startswith(str(directory)) for t in targets)


def test_reading_bodies_from_many_segments_keeps_a_bounded_number_open(tmp_path: Path) -> None:
    # a slow group pins every segment after its oldest body; page-ins of the others read
    # from all of them: their descriptors must not grow with the backlog
    for n in range(1, 13):
        segment_path(tmp_path, n).write_bytes(b"%02d" % n * 100)
    bodies = Bodies(tmp_path, most=4)
    for n in range(1, 13):
        assert bodies.read(n, 10, 4) == b"%02d%02d" % (n, n)
        assert open_under(tmp_path) <= 4
    # an open segment is read as it is; one closed since is opened again when asked for
    assert bodies.read(12, 0, 2) == b"12"
    assert bodies.read(1, 198, 2) == b"01"
    assert open_under(tmp_path) == 4
    bodies.forget([1, 12])
    assert open_under(tmp_path) == 2
    bodies.close()
    assert open_under(tmp_path) == 0


def test_a_log_yields_data_only() -> None:
    """A record naming anything (a class, a function) is refused, not called."""
    payload = pickle.dumps([("P", os.system)], protocol=5)
    with pytest.raises(pickle.UnpicklingError, match=r"(posix|os)\.system"):
        decode(payload)
    with pytest.raises(pickle.UnpicklingError):
        decode(pickle.dumps({"not": "a list"}, protocol=5))


def test_a_failed_write_leaves_no_partial_frame(tmp_path: Path) -> None:
    log = Log(tmp_path, 1)
    log.write(encode([("R", 1)]))
    real_pwritev, real_pwrite = os.pwritev, os.pwrite

    def short_pwritev(fd: int, parts: list[bytes], offset: int) -> int:
        return real_pwrite(fd, b"".join(parts)[:10], offset)  # a short write...

    def full(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(28, "No space left on device")  # ...and the disk is full

    store_log.os.pwritev, store_log.os.pwrite = short_pwritev, full  # type: ignore[assignment]
    try:
        with pytest.raises(OSError):
            log.write(encode([("R", 2)]))
    finally:
        store_log.os.pwritev, store_log.os.pwrite = real_pwritev, real_pwrite  # type: ignore[assignment]
    log.write(encode([("R", 3)]))
    log.close()
    assert frames(tmp_path) == [[("R", 1)], [("R", 3)]]


def msg(i: int) -> Message:
    return Message(i, "t", b"body %d" % i, 1_700_000_000_000_000_000 + i)


async def group_store(path: Path, fsync: FsyncPolicy = 50) -> SQLiteStore:
    """An open store with the topic `t` and its group `g`."""
    store = SQLiteStore(path, fsync=fsync)
    await store.open()
    store.add_topic("t")
    store.add_group("t", "g")
    return store


def abandon(store: SQLiteStore) -> None:
    """What kill -9 leaves: nothing closed by the store (the descriptors are let go)."""
    assert store._lock_fd is not None and store._db is not None and store._log is not None
    os.close(store._lock_fd)
    store._db.close()
    store._log.close()
    store._worker.stop()
    store._fsyncs.stop()


async def test_a_store_killed_before_its_index_caught_up_replays_its_log(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store = await group_store(path)
    for i in range(1, 51):
        store.put("t", ["g"], [msg(i)], 0.0)
        await store.flush()  # in the log; the index has not been brought up to date
    store.remove("t", "g", [msg(i) for i in range(1, 11)])
    await store.flush()
    first_segment = store._log.segment if store._log else 0
    abandon(store)

    store = SQLiteStore(path)
    state = await store.open()
    ready = state.topics["t"].groups["g"].ready
    assert [m.id for m in ready] == list(range(11, 51))
    assert ready[0].body == b"body 11"
    # every start writes a new segment past everything before: positions only grow
    assert store._log is not None and store._log.segment > first_segment
    # the index holds every record now; the old segment stays: the queued bodies are in it
    log_dir = path.parent / "gateway.db-log"
    assert segments(log_dir) == [first_segment, store._log.segment]
    store.remove("t", "g", [msg(i) for i in range(11, 51)])
    await store.close()
    assert segments(log_dir) == []  # none queued: nothing left


async def test_a_segment_goes_once_the_index_holds_it_and_none_of_its_bodies_is_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_log, "SEGMENT_BYTES", 4096)
    path = tmp_path / "gateway.db"
    store = await group_store(path, fsync="never")
    log_dir = path.parent / "gateway.db-log"
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for i in range(1, 401):
            store.put("t", ["g"], [Message(i, "t", b"x%d" % i * 50, 1)], 0.0)
            await store.flush()
        assert len(segments(log_dir)) > 10  # 4 KiB segments: many of them
        await store.caught_up()  # the index holds it all now, bodies where they are
        assert len(segments(log_dir)) > 10
        store.remove("t", "g", [Message(i, "t", b"", 1) for i in range(1, 301)])
        await store.caught_up()
        assert store._log is not None
        # the segments of the first 300 went; those of the last 100 stay
        kept = segments(log_dir)
        assert 3 < len(kept) < 10
        nursery.cancel_scope.cancel()
    await store.close()
    assert segments(log_dir) == kept[:-1] or segments(log_dir) == kept
    reopened = SQLiteStore(path)
    state = await reopened.open()
    ready = state.topics["t"].groups["g"].ready
    assert [(m.id, m.body) for m in ready] == [(i, b"x%d" % i * 50) for i in range(301, 401)]
    await reopened.close()


async def test_an_old_segment_mostly_finished_is_compacted_into_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few long-lived messages keep no segment: once the log is large, the bodies still
    queued in an old, mostly finished segment move into the index and the segment goes."""
    monkeypatch.setattr(store_log, "SEGMENT_BYTES", 4096)
    monkeypatch.setattr(sqlite_store, "_COMPACT_FROM", 4 * 4096)
    path = tmp_path / "gateway.db"
    store = await group_store(path, fsync="never")
    log_dir = path.parent / "gateway.db-log"
    kept = list(range(1, 801, 40))  # one message in 40 stays queued: every segment has one
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for i in range(1, 801):
            store.put("t", ["g"], [Message(i, "t", b"y%d" % i * 50, 1)], 0.0)
            await store.flush()
        store.remove("t", "g", [Message(i, "t", b"", 1) for i in range(1, 801) if i not in kept])
        await store.caught_up()
        for _ in range(len(segments(log_dir))):  # a segment per pass (every few seconds)
            await store._worker.run(store._compact)
        assert len(segments(log_dir)) <= 5
        nursery.cancel_scope.cancel()
    await store.close()
    reopened = SQLiteStore(path)
    state = await reopened.open()
    ready = state.topics["t"].groups["g"].ready
    assert [(m.id, m.body) for m in ready] == [(i, b"y%d" % i * 50) for i in kept]
    await reopened.close()


def test_bodies_are_written_after_the_pickle_where_the_frame_says(tmp_path: Path) -> None:
    log = Log(tmp_path, 1)
    log.write(encode([("R", 1)]))
    bodies = [b"first body", b"", b"third" * 100]
    frame = encode([("P", i, pickle.PickleBuffer(b)) for i, b in enumerate(bodies)])
    end = log.write(frame)
    log.close()
    data = segment_path(tmp_path, 1).read_bytes()
    start = end[1] - frame[2]
    placed = zip(frame[1], bodies, strict=True)
    assert [data[start + at : start + at + len(b)] for at, b in placed] == bodies
    _, (position, records, starts) = replay(tmp_path, (0, 0))
    assert position == end and starts == [start + at for at in frame[1]]
    assert [(op[0], op[1], bytes(op[2])) for op in records] == [
        ("P", i, b) for i, b in enumerate(bodies)
    ]


async def batch_rows(store: SQLiteStore) -> list[tuple[int, int, bool]]:
    """(first id, last id, bodies noted as ranges apart) of each batch in the index."""
    db = store._db
    assert db is not None
    sql = "SELECT id, last, starts IS NOT NULL FROM batches ORDER BY id"
    rows = await store._worker.run(lambda: db.execute(sql).fetchall())
    return [(a, b, bool(c)) for a, b, c in rows]


async def test_publishes_of_one_message_in_separate_writes_are_one_batch(tmp_path: Path) -> None:
    """PUBs one at a time, each written on its own: their bodies lie between other frames'
    bytes, and the index still holds them as one batch that notes where each starts."""
    path = tmp_path / "gateway.db"
    store = await group_store(path, fsync="never")
    store.reserve_ids(1000)  # as the broker does: ids handed out in blocks
    for i in range(1, 101):
        store.put("t", ["g"], [Message(i, "t", b"z%d" % i * (i % 7), 1)], 0.0)
        await store.flush()
    await store.caught_up()
    assert await batch_rows(store) == [(1, 100, True)]
    await store.close()
    reopened = SQLiteStore(path)
    state = await reopened.open()
    ready = state.topics["t"].groups["g"].ready
    assert [(m.id, m.body) for m in ready] == [(i, b"z%d" % i * (i % 7)) for i in range(1, 101)]
    await reopened.close()


async def test_bodies_a_power_cut_took_are_dropped_with_their_messages(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The index is brought up to date without waiting for the log's fsync. If a power cut
    then leaves the index but not the bodies it points at, recovery finds them missing
    (past the last fsync the index noted), drops those messages and starts cleanly."""
    path = tmp_path / "gateway.db"
    store = await group_store(path, fsync="never")
    for i in range(1, 11):
        store.put("t", ["g"], [Message(i, "t", b"kept %d" % i, 1)], 0.0)
    await store.flush()
    await store._fsyncs.sync()  # the first ten are on disk
    for i in range(11, 21):
        store.put("t", ["g"], [Message(i, "t", b"lost %d" % i, 1)], 0.0)
    await store.caught_up()  # the index points at all twenty
    assert store._log is not None
    segment, synced = store._fsyncs.synced
    abandon(store)
    with open(segment_path(path.parent / "gateway.db-log", segment), "r+b") as f:
        f.truncate(synced)  # what the power cut left: the log up to its last fsync
    reopened = SQLiteStore(path)
    with caplog.at_level(logging.WARNING, "gateway.store"):
        state = await reopened.open()
    ready = state.topics["t"].groups["g"].ready
    assert [(m.id, m.body) for m in ready] == [(i, b"kept %d" % i) for i in range(1, 11)]
    assert "10 messages whose bodies were written after the log's last fsync" in caplog.text
    await reopened.close()


async def test_a_body_that_fails_its_crc_is_an_error_not_a_wrong_message(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store = await group_store(path)
    store.put("t", ["g"], [Message(1, "t", b"the body", 1)], 0.0)
    await store.caught_up()
    assert store._log is not None
    segment = store._log.segment
    await store.close()
    log_path = segment_path(path.parent / "gateway.db-log", segment)
    data = bytearray(log_path.read_bytes())
    at = data.find(b"the body")
    data[at] ^= 0xFF
    log_path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="fail their CRC"):
        await SQLiteStore(path).open()


async def test_a_log_written_before_bodies_stayed_in_it_is_replayed(tmp_path: Path) -> None:
    """An earlier gateway's log: bodies inside the pickle, finishes as (priority, id)
    pairs, deliveries as (priority, id, attempts). A restart replays it into the index,
    which then holds those bodies itself."""
    path = tmp_path / "gateway.db"
    log = Log(path.parent / "gateway.db-log", 1)
    bodies = [b"one", b"two", b"three"]
    ends = array("I", accumulate(map(len, bodies))).tobytes()
    batch = (1_700_000_000_000_000_000, 60.0, "nsq", None, None, None, b"".join(bodies), ends)
    log.write(
        encode(
            [
                ("T+", 1, "t", 1),
                ("G+", 2, 1, "g"),
                ("R", 100),
                ("P", (2,), 1, 3, 0.0, 0, 0, None, batch),
                ("D", 2, [(0, 2)]),
                ("A", 2, [(0, 3, 1)]),
            ]
        )
    )
    log.close()
    store = SQLiteStore(path)
    state = await store.open()
    ready = state.topics["t"].groups["g"].ready
    assert [(m.id, m.body, m.attempts) for m in ready] == [(1, b"one", 0), (3, b"three", 1)]
    assert await batch_rows(store) == [(1, 3, False)]
    await store.close()
    assert segments(path.parent / "gateway.db-log") == []  # the index holds those bodies


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock()


async def test_records_nobody_flushes_are_written_within_5_ms_or_50_while_flushes_carry_them(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """A finish nobody awaits is written by the background task 5 ms later. While
    publishes' flushes keep writing such records first, that task looks every 50 ms only
    (a timer every 5 ms was a tenth of the event loop's time on PUBs one at a time)."""
    store = await group_store(tmp_path / "gateway.db")
    for i in range(1, 11):
        store.put("t", ["g"], [msg(i)], 0.0)
    await store.flush()

    async def written_after(seconds: float) -> bool:
        await trio.testing.wait_all_tasks_blocked()  # the background task's timer set
        mock_clock.jump(seconds)
        await trio.testing.wait_all_tasks_blocked()
        return not store._pending.ops

    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.remove("t", "g", [msg(1)])  # nobody awaits it
        assert not await written_after(0.004)
        assert await written_after(0.001)  # 5 ms: the background task wrote it
        # a stream of publishes, each flushed: they write the records made meanwhile
        for i in range(11, 21):
            store.remove("t", "g", [msg(i - 9)])
            store.put("t", ["g"], [msg(i)], 0.0)
            await store.flush()
            assert await written_after(0.001)
        store.remove("t", "g", [msg(11)])  # then a finish, and no flush after it
        assert not await written_after(0.005)
        assert await written_after(0.045)  # within 50 ms
        store.remove("t", "g", [msg(12)])  # the task wrote last time: 5 ms again
        assert await written_after(0.005)
        nursery.cancel_scope.cancel()
    await store.close()


async def test_the_interval_fsyncs_what_a_write_left_though_the_write_woke_nobody(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """A write may be made at the end of a scheduler pass, where no task may be woken
    (broker/pass_end.py): the interval policy's fsync is a timer that looks, and syncs what
    it finds within the interval; idle, it finds nothing and syncs nothing."""
    store = await group_store(tmp_path / "gateway.db")  # fsync every 50 ms
    store.put("t", ["g"], [msg(1)], 0.0)
    await store.flush()

    async def synced_after(seconds: float) -> bool:
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(seconds)
        await trio.testing.wait_all_tasks_blocked()
        while store._fsyncs._running:  # the fsync's thread, in real time
            await trio.sleep(0)
        return store._fsyncs.all_synced

    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        assert await synced_after(0.05)
        count = store._fsyncs.count
        for _ in range(4):  # idle: the timer looks, nothing to sync
            assert await synced_after(0.05)
        assert store._fsyncs.count == count
        store.put("t", ["g"], [msg(2)], 0.0)
        assert store.flush_now()  # written, as the end of a pass writes: no task woken
        assert not store._fsyncs.all_synced
        assert await synced_after(0.05)  # within the interval all the same
        assert store._fsyncs.count == count + 1
        nursery.cancel_scope.cancel()
    await store.close()


async def small_segments_store(
    path: Path, monkeypatch: pytest.MonkeyPatch, topics: tuple[str, ...]
) -> SQLiteStore:
    """A store of 4 KB segments that compacts from 16 KB of log, with a group `g` in each
    of `topics` and ids reserved as the broker reserves them, a block at a time."""
    monkeypatch.setattr(store_log, "SEGMENT_BYTES", 4096)
    monkeypatch.setattr(sqlite_store, "_COMPACT_FROM", 4 * 4096)
    store = SQLiteStore(path, fsync="never")
    await store.open()
    for topic in topics:
        store.add_topic(topic)
        store.add_group(topic, "g")
    store.reserve_ids(1 << 16)
    return store


async def compacted(store: SQLiteStore) -> int:
    """Bring the index up to date, compact a segment per pass as long as there are any
    (every few seconds when running), and count the segments left."""
    log_dir = store.log_dir
    await store.caught_up()
    for _ in range(len(segments(log_dir))):
        await store._worker.run(store._compact)
    return len(segments(log_dir))


async def test_interleaved_tubes_batches_are_compacted_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of puts into two tubes in turn (each with the other's ids as holes) move
    into the index with the rest of a compacted segment, and read back whole."""
    path = tmp_path / "gateway.db"
    store = await small_segments_store(path, monkeypatch, ("a", "b"))
    kept = list(range(1, 801, 40))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for i in range(1, 801, 2):  # a and b in turn, both in one write
            store.put("a", ["g"], [Message(i, "a", b"a%d" % i * 50, 1)], 0.0)
            store.put("b", ["g"], [Message(i + 1, "b", b"b%d" % (i + 1) * 50, 1)], 0.0)
            await store.flush()
        for topic, first in (("a", 1), ("b", 2)):
            gone = [Message(i, topic, b"", 1) for i in range(first, 801, 2) if i not in kept]
            store.remove(topic, "g", gone)
        assert await compacted(store) <= 5
        nursery.cancel_scope.cancel()
    await store.close()
    reopened = SQLiteStore(path)
    state = await reopened.open()
    for topic, first in (("a", 1), ("b", 2)):
        ready = state.topics[topic].groups["g"].ready
        want = [i for i in range(first, 801, 2) if i in kept]
        assert [(m.id, m.body) for m in ready] == [
            (i, b"%s%d" % (topic.encode(), i) * 50) for i in want
        ]
    await reopened.close()


async def test_a_long_lived_tube_between_busy_ones_does_not_keep_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small jobs nobody takes in one tube, large ones finished in the other, put in turn:
    the small ones' batches span the large ones' bytes (holes), but only their own bytes
    count as live, so their segments are compacted and the log does not grow with them."""
    path = tmp_path / "gateway.db"
    store = await small_segments_store(path, monkeypatch, ("slow", "busy"))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for i in range(1, 801, 2):
            store.put("slow", ["g"], [Message(i, "slow", b"s%d" % i, 1)], 0.0)
            store.put("busy", ["g"], [Message(i + 1, "busy", b"b" * 400, 1)], 0.0)
            await store.flush()  # a frame each: the log has many segments
        store.remove("busy", "g", [Message(i, "busy", b"", 1) for i in range(2, 801, 2)])
        assert await compacted(store) <= 5
        nursery.cancel_scope.cancel()
    await store.close()
    reopened = SQLiteStore(path)
    state = await reopened.open()
    ready = state.topics["slow"].groups["g"].ready
    assert [(m.id, m.body) for m in ready] == [(i, b"s%d" % i) for i in range(1, 801, 2)]
    await reopened.close()


async def test_only_fsynced_publishes_join_into_a_batch(tmp_path: Path) -> None:
    """After a power cut, recovery drops a batch whose bodies past the fsynced position it
    finds noted are gone; that position moves on after the batch is made, so a batch that
    joined fsynced (acknowledged) publishes with unsynced ones could take the first with
    the second. Publishes not yet fsynced when the index takes them stay batches of their
    own; those fsynced join."""
    store = await group_store(tmp_path / "gateway.db")  # the interval policy
    store.reserve_ids(1000)
    for i in range(1, 11):
        store.put("t", ["g"], [Message(i, "t", b"u%d" % i, 1)], 0.0)
        await store.flush()
    await store.caught_up()  # written, not fsynced: nothing joins
    assert len(await batch_rows(store)) == 10
    for i in range(11, 21):
        store.put("t", ["g"], [Message(i, "t", b"s%d" % i, 1)], 0.0)
        await store.flush()
    await store._fsyncs.sync()
    await store.caught_up()  # fsynced first: they join
    rows = await batch_rows(store)
    assert len(rows) == 11 and rows[-1][:2] == (11, 20)
    await store.close()


async def test_the_index_s_regular_pass_takes_what_is_fsynced_and_the_rest_joins_later(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """Under the interval policy the index's pass takes the frames fsynced by then and
    leaves the newer ones for the next pass, fsynced by that time: they join into one
    batch too, instead of a batch (one row, one run) each. And the first write after the
    index's task went idle gets its pass APPLY_AGE later, not at the next maintenance."""
    store = await group_store(tmp_path / "gateway.db", fsync=10_000)  # no fsync unasked

    async def after(seconds: float, *, a_pass: bool = True) -> None:
        """`seconds` later; with `a_pass`, once the index's pass then due is done."""
        applied = store._applied_event
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(seconds)
        await trio.testing.wait_all_tasks_blocked()
        give_up = time.monotonic() + 10
        while a_pass and not applied.is_set():  # the index's thread, in real time
            assert time.monotonic() < give_up, "no pass of the index"
            await trio.sleep(0)

    async def put(ids: range) -> None:
        for i in ids:
            store.put("t", ["g"], [Message(i, "t", b"m%d" % i, 1)], 0.0)
            await store.flush()

    store.reserve_ids(1000)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await trio.testing.wait_all_tasks_blocked()  # the index's task idle: nothing to do
        await put(range(1, 11))
        await store._fsyncs.sync()
        await after(APPLY_AGE / 2, a_pass=False)
        await put(range(11, 21))  # written, not fsynced when the pass comes
        await after(APPLY_AGE / 2)  # the pass, APPLY_AGE after the first write
        assert await batch_rows(store) == [(1, 10, True)]
        assert len(store._unapplied.frames) == 10  # left for the next pass
        await store._fsyncs.sync()
        await after(APPLY_AGE / 2)  # the next, APPLY_AGE after they were written
        assert await batch_rows(store) == [(1, 10, True), (11, 20, True)]
        assert not store._unapplied
        nursery.cancel_scope.cancel()
    await store.close()
