"""ReadyQueue against the obvious reference: a heap ordered by (priority, id)."""

from __future__ import annotations

import heapq

from hypothesis import given
from hypothesis import strategies as st

from gateway.broker.ready import ReadyQueue
from gateway.model import Message

ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 3), st.integers(1, 60)),
        st.tuples(st.just("extend"), st.integers(0, 3), st.integers(1, 5)),
        st.tuples(st.just("pop"), st.just(0), st.just(0)),
        st.tuples(st.just("remove"), st.just(0), st.integers(1, 60)),
        st.tuples(st.just("pop_many"), st.just(0), st.integers(1, 8)),
        # a memory window moved back: everything at or after (priority, id) leaves
        st.tuples(st.just("drop_from"), st.integers(0, 3), st.integers(1, 160)),
    ),
    max_size=80,
)


@given(ops)
def test_matches_a_heap(operations: list[tuple[str, int, int]]) -> None:
    queue = ReadyQueue()
    reference: list[tuple[int, int]] = []
    live: dict[int, Message] = {}
    next_id = 100
    for op, priority, arg in operations:
        if op == "push" and arg not in live:
            m = Message(arg, "t", b"", 0, priority=priority)
            live[arg] = m
            queue.push(m)
            heapq.heappush(reference, (priority, arg))
        elif op == "extend":
            batch = [Message(next_id + i, "t", b"", 0, priority=priority) for i in range(arg)]
            next_id += arg
            for m in batch:
                live[m.id] = m
                heapq.heappush(reference, (priority, m.id))
            queue.extend(batch)
        elif op == "pop" and reference:
            expected = heapq.heappop(reference)
            got = queue.pop()
            assert (got.priority, got.id) == expected
            del live[got.id]
        elif op == "pop_many":
            # the `arg` most urgent, most urgent first, whatever lanes and late ones hold
            expected_many = [heapq.heappop(reference) for _ in range(min(arg, len(reference)))]
            got_many = queue.pop_many(arg)
            assert [(m.priority, m.id) for m in got_many] == expected_many
            for m in got_many:
                del live[m.id]
        elif op == "drop_from":
            key = (priority, arg)
            gone = [k for k in reference if k >= key]
            assert queue.drop_from(key) == len(gone)
            reference = [k for k in reference if k < key]
            heapq.heapify(reference)
            for _, i in gone:
                del live[i]
        elif op == "remove" and arg in live:
            m = live.pop(arg)
            assert queue.remove(m)
            reference.remove((m.priority, m.id))
            heapq.heapify(reference)
        assert len(queue) == len(reference)
        peeked = queue.peek()
        assert (peeked.priority, peeked.id) == reference[0] if reference else peeked is None
    assert sorted((m.priority, m.id) for m in queue) == sorted(reference)
