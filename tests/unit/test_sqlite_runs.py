"""The durable store's index keeps a group's messages in runs (gateway/stores/sqlite_sql.py):
a publish is one row per group, finishes set bits in it, a delivery's attempts are noted in
it, any other change to one message splits the run around it. What comes back after a
restart, and what a page-in reads, is exactly the messages still queued, with their
fields, in (priority, id) order."""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.model import Message, Publish
from gateway.stores import SQLiteStore
from gateway.stores.sqlite_runs import Spans


def publish(first: int, n: int) -> Publish:
    bodies = [b"m%d" % i for i in range(first, first + n)]
    return Publish([Message(i, "t", b, 7) for i, b in enumerate(bodies, first)], bodies)


def rows(path: Path) -> list[tuple[int, int, int, int]]:
    """(priority, id, n, left) of every run, read from the closed file."""
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT priority, id, n, left FROM runs ORDER BY priority, id").fetchall()
    finally:
        db.close()


async def opened(path: Path) -> SQLiteStore:
    store = SQLiteStore(path)
    await store.open()
    store.add_topic("t")
    store.add_group("t", "g")
    return store


async def test_a_publish_is_one_run_and_finishes_and_changes_keep_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store = await opened(path)
    msgs = publish(1, 10)
    store.put("t", ["g"], msgs, 0.0)
    await store.caught_up()  # in the index: one run
    store.remove("t", "g", [msgs[2], msgs[3], msgs[6]])  # 3, 4, 7 finished
    msgs[4].attempts = 1  # 5 delivered: its attempts noted in the run
    store.update("t", "g", msgs[4])
    msgs[7].priority = 5  # 8 released more urgent: it moves
    store.update("t", "g", msgs[7], priority_was=1024)
    store.update("t", "g", msgs[8], buried=True)  # 9 buried
    msgs[9].attempts = 2  # 10 delivered twice: noted, and kept when the run is cut at 9
    store.update("t", "g", msgs[9])
    await store.caught_up()
    await store.close()
    assert rows(path) == [
        (5, 8, 1, 1),  # 8, moved to its new priority
        (1024, 1, 7, 4),  # 1, 2, 5 (attempts 1), 6; 3, 4 and 7 finished
        (1024, 9, 1, 1),  # 9, buried
        (1024, 10, 1, 1),  # 10: what was left of the run after 9
    ]
    store = SQLiteStore(path)
    state = await store.open()
    g = state.topics["t"].groups["g"]
    assert [(m.id, m.priority, m.attempts, m.body) for m in g.ready] == [
        (8, 5, 0, b"m8"), (1, 1024, 0, b"m1"), (2, 1024, 0, b"m2"), (5, 1024, 1, b"m5"),
        (6, 1024, 0, b"m6"), (10, 1024, 2, b"m10"),
    ]  # fmt: skip
    assert [m.id for m in g.buried] == [9]
    # a page-in from the middle of a run reads on from there, past the holes
    got = await store.load("t", "g", (1024, 2), 3)
    assert [m.id for m in got] == [2, 5, 6]
    got = await store.load("t", "g", (1024, 7), 10)
    assert [m.id for m in got] == [10]
    await store.close()


async def test_published_changed_and_finished_before_the_index_caught_up(tmp_path: Path) -> None:
    """Within one application of the log: a message finished is never written, a delivered
    one (its run's first) has its attempts noted in the run, a buried one (its run's
    first, the same priority) gets a run of its own beside the rest."""
    path = tmp_path / "gateway.db"
    store = await opened(path)
    msgs = publish(1, 6)
    store.put("t", ["g"], msgs, 0.0)
    msgs[0].attempts = 1
    store.update("t", "g", msgs[0])
    store.remove("t", "g", [msgs[1], msgs[5]])
    store.update("t", "g", msgs[2], buried=True)
    gone = publish(7, 3)
    store.put("t", ["g"], gone, 0.0)
    store.remove("t", "g", list(gone))
    await store.caught_up()
    await store.close()
    # 1-2 (2 finished), 3 buried on its own, 4-6 (6 finished)
    assert sorted(r[1:] for r in rows(path)) == [(1, 2, 1), (3, 1, 1), (4, 3, 2)]
    db = sqlite3.connect(path)
    assert db.execute("SELECT id, refs FROM batches").fetchall() == [(1, 4)]
    db.close()
    store = SQLiteStore(path)
    state = await store.open()
    ready = state.topics["t"].groups["g"].ready
    assert [(m.id, m.attempts) for m in ready] == [(1, 1), (4, 0), (5, 0)]
    assert [m.id for m in state.topics["t"].groups["g"].buried] == [3]
    await store.close()


async def test_a_backlog_of_runs_fans_out_with_its_holes(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    store = SQLiteStore(path)
    await store.open()
    store.add_topic("t")
    msgs = publish(1, 8)
    store.put("t", [], msgs, 0.0)  # no group yet: the topic's backlog
    await store.caught_up()
    store.remove("t", None, [msgs[0], msgs[4]])
    store.fan_out_backlog("t", ["a", "b"])
    await store.caught_up()
    store.remove("t", "a", list(msgs[1:4]))
    await store.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT id, refs FROM batches").fetchall() == [(1, 6 + 3)]
    db.close()
    store = SQLiteStore(path)
    state = await store.open()
    groups = state.topics["t"].groups
    assert [m.id for m in groups["a"].ready] == [6, 7, 8]
    assert [m.id for m in groups["b"].ready] == [2, 3, 4, 6, 7, 8]
    assert state.topics["t"].backlog == []
    await store.close()


async def test_a_delivery_noted_in_a_run_is_kept_when_the_run_is_cut_to_one(
    tmp_path: Path,
) -> None:
    """A run cut down to one message that had a delivery noted, then delivered again: the
    later attempts count is what comes back (the run of one once kept the noted count
    beside its own and read that one back)."""
    path = tmp_path / "gateway.db"
    store = await opened(path)
    msgs = publish(1, 3)
    store.put("t", ["g"], msgs, 0.0)
    await store.caught_up()
    msgs[1].attempts = 1  # 2 delivered: noted in the run
    store.update("t", "g", msgs[1])
    await store.caught_up()
    store.update("t", "g", msgs[0], buried=True)  # 1 and 3 buried: 2 is a run of one
    store.update("t", "g", msgs[2], buried=True)
    await store.caught_up()
    msgs[1].attempts = 2  # 2 delivered again
    store.update("t", "g", msgs[1])
    await store.caught_up()
    await store.close()
    assert rows(path) == [(1024, 1, 1, 1), (1024, 2, 1, 1), (1024, 3, 1, 1)]
    store = SQLiteStore(path)
    state = await store.open()
    g = state.topics["t"].groups["g"]
    assert [(m.id, m.attempts) for m in g.ready] == [(2, 2)]
    await store.close()


# Any sequence of publishes, deliveries, changes and finishes, with the index brought up to
# date at any points between them, reads back after a restart as the queue it describes.
index_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(1, 6)),
        st.tuples(
            st.sampled_from(["deliver", "bury", "kick", "defer", "finish"]), st.integers(0, 99)
        ),
        st.tuples(st.just("priority"), st.integers(0, 99)),
        st.tuples(st.just("apply"), st.just(0)),
        # a batch through the group's recorder (a consumer's window, its page of FINs):
        # `arg` picks the first and how many, the ids in order or reversed
        st.tuples(st.sampled_from(["deliver_all", "finish_all"]), st.integers(0, 999)),
    ),
    max_size=24,
)

Fields = tuple[int, int, float, bool]  # priority, attempts, due, buried


@dataclass
class Sent:
    """A delivery as the broker hands it to a store (its InFlight entry)."""

    message: Message


@settings(max_examples=200, deadline=None)
@given(index_ops)
# found by this test: a run of one cut from a run with a delivery noted, delivered again
@example([("put", 4), ("put", 6), ("deliver", 89), ("priority", 8), ("put", 1), ("deliver", 9)])
# found by this test: deliveries with two attempts counts in one run of records, applied
# per run of ids, the second note of a run's tries replacing the first
@example([("put", 1)] * 5 + [("put", 6), ("apply", 0), ("deliver_all", 5), ("deliver_all", 26)])
def test_any_sequence_of_changes_reads_back_as_the_queue_it_made(
    ops: list[tuple[str, int]],
) -> None:
    model: dict[int, Fields] = {}
    live: dict[int, Message] = {}

    async def run(path: Path) -> None:
        store = await opened(path)
        next_id = 1
        for op, arg in ops:
            if op == "put":
                msgs = publish(next_id, arg)
                next_id += arg
                store.put("t", ["g"], msgs, 0.0)
                for m in msgs:
                    live[m.id] = m
                    model[m.id] = (m.priority, 0, 0.0, False)
                continue
            if op == "apply":
                await store.caught_up()
                continue
            if not live:
                continue
            ids = sorted(live)
            if op in ("deliver_all", "finish_all"):
                start, many = arg % len(ids), 1 + arg // 10 % 5
                batch = [live[i] for i in ids[start : start + many]]
                if arg % 2:
                    batch.reverse()
                recorder = store.recorder("t", "g")
                if op == "finish_all":
                    recorder.finished_all(batch)
                    for m in batch:
                        del live[m.id], model[m.id]
                    continue
                for m in batch:  # a delivery makes the message ready as far as the store knows
                    priority, attempts, due, buried = model[m.id]
                    m.attempts = attempts + 1
                    model[m.id] = (priority, m.attempts, 0.0, False)
                recorder.delivered_all([Sent(m) for m in batch])
                continue
            m = live[ids[arg % len(ids)]]
            priority, attempts, due, buried = model[m.id]
            if op == "finish":
                store.remove("t", "g", [m])
                del live[m.id], model[m.id]
            elif op == "deliver":
                m.attempts = attempts + 1
                store.update("t", "g", m, due, buried=buried)
                model[m.id] = (priority, m.attempts, due, buried)
            elif op == "bury":
                store.update("t", "g", m, buried=True)
                model[m.id] = (priority, attempts, 0.0, True)
            elif op == "kick":
                store.update("t", "g", m)
                model[m.id] = (priority, attempts, 0.0, False)
            elif op == "defer":
                store.update("t", "g", m, 1e12 + arg)
                model[m.id] = (priority, attempts, 1e12 + arg, False)
            elif op == "priority":
                m.priority = 1 + arg % 3
                store.update("t", "g", m, due, buried=buried, priority_was=priority)
                model[m.id] = (m.priority, attempts, due, buried)
        await store.close()
        store = SQLiteStore(path)
        state = await store.open()
        g = state.topics["t"].groups["g"]
        got = {m.id: (m.priority, m.attempts, m.deliver_at, False) for m in g.ready}
        got |= {m.id: (m.priority, m.attempts, m.deliver_at, True) for m in g.buried}
        assert got == model
        ready = [(m.priority, m.id) for m in g.ready if not m.deliver_at]
        assert ready == sorted(ready)
        await store.close()

    with tempfile.TemporaryDirectory() as d:
        trio.run(run, Path(d) / "gateway.db")


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 60), st.integers(0, 6)), max_size=8),
    st.integers(1, 70),
    st.integers(0, 20),
)
def test_finished_spans_are_the_ids_of_their_runs(
    runs: list[tuple[int, int, int]], first: int, length: int
) -> None:
    """The index sees which deliveries were finished in the same pass through the
    finishes' runs, merged into spans: the same answer as a set of every id."""
    flat = [v for p, a, n in runs for v in (p, a, a + n)]
    ids = {i for _p, a, n in runs for i in range(a, a + n + 1)}
    spans = Spans(flat)
    assert [i for i in range(80) if i in spans] == sorted(ids)
    last = first + length
    assert spans.outside(first, last) == [i for i in range(first, last + 1) if i not in ids]
