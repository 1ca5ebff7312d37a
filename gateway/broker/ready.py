"""The ready queue of a group: messages popped in (priority, id) order.

Ids grow with publish order, so nearly every message arrives in order: each priority keeps
a FIFO lane, and appending keeps it sorted. Only a message that comes back with an id
smaller than its lane's tail (a requeue, a promoted deferral, a kick) goes to a small heap.
The common path is then O(1) deque work instead of heapq's O(log n) tuple comparisons on
every publish and every delivery, which at 10^5 messages a second is most of a core.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Iterator
from heapq import heapify, heappop, heappush
from itertools import islice

from gateway.model import Message


class ReadyQueue:
    __slots__ = ("_lanes", "_late", "_priorities", "size")

    def __init__(self) -> None:
        self._lanes: dict[int, deque[Message]] = {}
        self._priorities: list[int] = []  # sorted; the priorities whose lane is not empty
        self._late: list[tuple[int, int, Message]] = []
        # how many messages are queued: a plain attribute, which the group's dispatch
        # loop reads on every delivery (len() and bool() are Python-level calls here)
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def push(self, msg: Message) -> None:
        lane = self._lanes.get(msg.priority)
        if lane is None:
            lane = self._lanes[msg.priority] = deque()
            insort(self._priorities, msg.priority)
        if lane and lane[-1].id > msg.id:
            heappush(self._late, (msg.priority, msg.id, msg))
        else:
            lane.append(msg)
        self.size += 1

    def extend(self, msgs: list[Message]) -> None:
        """Push one publish's messages: one priority, ids ascending. When they come after
        the lane's tail (they nearly always do) that is a single deque.extend."""
        if not msgs:
            return
        first = msgs[0]
        lane = self._lanes.get(first.priority)
        if lane is None or not lane or lane[-1].id < first.id:
            if lane is None:
                lane = self._lanes[first.priority] = deque()
                insort(self._priorities, first.priority)
            lane.extend(msgs)
            self.size += len(msgs)
            return
        for msg in msgs:
            self.push(msg)

    def _best_lane(self) -> tuple[int, deque[Message]] | None:
        if not self._priorities:
            return None
        p = self._priorities[0]
        return p, self._lanes[p]

    def peek(self) -> Message | None:
        best = self._best_lane()
        late = self._late
        if best is None:
            return late[0][2] if late else None
        p, lane = best
        head = lane[0]
        if late and (late[0][0], late[0][1]) < (p, head.id):
            return late[0][2]
        return head

    def pop(self) -> Message:
        """Remove and return the most urgent message; IndexError when empty."""
        late = self._late
        if self._priorities:
            p = self._priorities[0]
            lane = self._lanes[p]
            head = lane[0]
            if not late or (p, head.id) < (late[0][0], late[0][1]):
                lane.popleft()
                if not lane:
                    del self._lanes[p]
                    del self._priorities[0]
                self.size -= 1
                return head
        msg = heappop(late)[2]
        self.size -= 1
        return msg

    def pop_many(self, n: int) -> list[Message]:
        """Remove and return up to `n` of the most urgent messages, most urgent first: a
        slice of the head lane at once while no late message comes before it."""
        out: list[Message] = []
        while len(out) < n and self.size:
            late = self._late
            if not self._priorities or (late and late[0][0] <= self._priorities[0]):
                out.append(self.pop())  # a late one may be next: one at a time
                continue
            p = self._priorities[0]
            lane = self._lanes[p]
            k = min(n - len(out), len(lane))
            # k poplefts run by C (iter(callable, sentinel) calls it until the sentinel,
            # which a Message never is), with no Python-level loop
            out += islice(iter(lane.popleft, None), k)
            if not lane:
                del self._lanes[p]
                del self._priorities[0]
            self.size -= k
        return out

    def max_key(self) -> tuple[int, int] | None:
        """The least urgent (priority, id) in the queue: where a memory window ends."""
        best = None
        if self._priorities:
            tail = self._lanes[self._priorities[-1]][-1]
            best = (tail.priority, tail.id)
        for p, i, _ in self._late:
            if best is None or (p, i) > best:
                best = (p, i)
        return best

    def remove(self, msg: Message) -> bool:
        """Remove one message wherever it is (O(n): admin and beanstalkd delete paths only)."""
        lane = self._lanes.get(msg.priority)
        if lane is not None:
            try:
                lane.remove(msg)
            except ValueError:
                pass
            else:
                if not lane:
                    del self._lanes[msg.priority]
                    self._priorities.remove(msg.priority)
                self.size -= 1
                return True
        for i, entry in enumerate(self._late):
            if entry[2] is msg:
                self._late[i] = self._late[-1]
                self._late.pop()
                heapify(self._late)
                self.size -= 1
                return True
        return False

    def drop_from(self, key: tuple[int, int]) -> int:
        """Remove every message at or after `key` in (priority, id) order; how many (a
        durable store's memory window moved back: they stay on disk)."""
        dropped = 0
        for p in [p for p in self._priorities if p >= key[0]]:
            lane = self._lanes[p]
            if p > key[0]:
                dropped += len(lane)
                lane.clear()
            else:
                while lane and lane[-1].id >= key[1]:
                    lane.pop()
                    dropped += 1
            if not lane:
                del self._lanes[p]
                self._priorities.remove(p)
        late = [entry for entry in self._late if entry[:2] < key]
        if len(late) < len(self._late):
            dropped += len(self._late) - len(late)
            heapify(late)
            self._late = late
        self.size -= dropped
        return dropped

    def clear(self) -> list[Message]:
        out = list(self)
        self._lanes.clear()
        self._priorities.clear()
        self._late.clear()
        self.size = 0
        return out

    def __iter__(self) -> Iterator[Message]:
        """All messages, in no particular order (stats, snapshots)."""
        for lane in self._lanes.values():
            yield from lane
        for entry in self._late:
            yield entry[2]

    def count_below(self, priority: int) -> int:
        """How many ready messages are more urgent than `priority` (beanstalkd's urgent count)."""
        n = sum(len(lane) for p, lane in self._lanes.items() if p < priority)
        return n + sum(1 for entry in self._late if entry[0] < priority)
