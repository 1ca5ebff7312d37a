"""The durable store's log records, made on the event loop and held until the next write
(`Pending`; sqlite.py writes them to the log, sqlite_sql.py applies them to the index).
Each call here runs once per publish, delivery or finish: plain data, a few C-level
passes, no I/O.

A record (an `Op`) is a tuple of ints, floats, strings and bytes only (log.py):

* ("P", gids, first_id, n, due, priority, attempts, fields, batch): one publish of n
  messages with consecutive ids into groups `gids`. `fields` is None when every message
  has (priority, attempts), else one (priority, attempts) per message. `batch` is the
  batch row's (ts, ttr, origin, reply_to, headers JSON, header_block, bodies end to end,
  ends or None for one message), and for publishes joined as they were recorded
  (`Joining`) also (stamps, origins): int64 timestamps and a JSON list of origins, one per
  message, each None where one is everyone's. The bodies are a `pickle.PickleBuffer` (the
  log writes them after the pickle); the index turns them into where they are in the log
  once the frame is written (sqlite_segments.locate).
* ("U", (priority, attempts, due, state, gid, priority_was, id)): one message changed.
* ("E", gid, [priority, first, last, ...]): finishes, as runs of ids, flat (logs written
  before runs have ("D", gid, [(priority, id)])).
* ("AR", gid, [priority, first, last, attempts, ...]): deliveries, which change attempts
  only, as runs of ids delivered with the same attempts (logs written before runs have
  ("A", gid, [(priority, id, attempts)])).
* a structural one: topics and groups made, dropped, paused, cleared; ids reserved
  (sqlite_sql._structural).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate
from operator import attrgetter
from pickle import PickleBuffer
from typing import TYPE_CHECKING, Any

import trio

from gateway.model import Message, Publish

if TYPE_CHECKING:
    from gateway.stores.base import Delivery

Op = tuple[Any, ...]


def put_record(gids: tuple[int, ...], messages: Sequence[Message], due: float) -> Op:
    """The record of one publish (a join of the bodies and a few fields; a publish's
    messages share all but their bodies and ids)."""
    first = messages[0]
    n = len(messages)
    fields = None
    if n == 1:  # most publishes: one message, its fields the run's
        bodies = first.body if type(first.body) is bytes else bytes(first.body)
        ends = None
    else:
        if isinstance(messages, Publish):
            raw = messages.bodies
        else:
            fields = [(m.priority, m.attempts) for m in messages]
            if fields.count(fields[0]) == n:
                fields = None
            raw = [m.body for m in messages]
        bodies = b"".join(raw)
        ends = array("I", accumulate(map(len, raw))).tobytes()
    headers = json.dumps(first.headers) if first.headers else None
    block = first.header_block
    if block is not None and type(block) is not bytes:
        block = bytes(block)
    batch = (
        first.timestamp, first.ttr, first.origin, first.reply_to, headers,
        block, PickleBuffer(bodies), ends,
    )  # fmt: skip
    return ("P", gids, first.id, n, due, first.priority, first.attempts, fields, batch)


def shared(head: Op) -> tuple[Any, ...]:
    """What a publish of one message must share with `head`'s (one message too) to join
    it: groups, due time, priority, attempts, ttr, reply-to, header block and headers."""
    batch = head[8]
    return (head[1], head[4], head[5], head[6], batch[1], batch[3], batch[5], batch[4])


def sharing(gids: tuple[int, ...], message: Message, due: float) -> tuple[Any, ...]:
    """`shared` of the record a publish of `message` alone into `gids` would have (the
    headers as put_record writes them)."""
    m = message
    headers = json.dumps(m.headers) if m.headers else None
    return (gids, due, m.priority, m.attempts, m.ttr, m.reply_to, m.header_block, headers)


class Joining:
    """Publishes of one message each, recorded one after another (deliveries, finishes
    and changes of other messages may be between them: a consumer waiting for them
    takes each one as it comes): sixteen connections' PUBs in one pass of the
    scheduler, four producers' puts into one tube. They differ in id (consecutive),
    body, timestamp and origin only, so they are one record, as an MPUB of them would
    be: one tuple in the frame's pickle instead of one each, and one for the index to
    take apart. All of them are in the same frame, written or lost together, so joining
    them promises no more than each promised alone. The record is made as the frame is
    (`record`), in the first one's place: until then the bodies, timestamps and origins
    gather here."""

    __slots__ = ("at", "bodies", "head", "key", "next_id", "origins", "stamps")

    def __init__(self, at: int, head: Op, key: tuple[Any, ...]) -> None:
        self.at = at  # the head's place among the records not yet written
        self.head = head  # the first publish's record
        self.key = key  # shared(head)
        batch = head[8]
        self.bodies: list[Any] = [batch[6].raw()]
        self.stamps = [batch[0]]
        self.origins = [batch[2]]
        self.next_id = head[2] + 1

    def add(self, gids: tuple[int, ...], message: Message, due: float) -> bool:
        """Join `message` (its publish's only one) if it is the next id and shares with
        the first one what `shared` says."""
        if message.id != self.next_id or sharing(gids, message, due) != self.key:
            return False
        self.append(message)
        return True

    def append(self, message: Message) -> None:
        """Join `message`, known to fit."""
        body = message.body
        self.bodies.append(body if type(body) is bytes else bytes(body))
        self.stamps.append(message.timestamp)
        self.origins.append(message.origin)
        self.next_id += 1

    def record(self) -> Op:
        """The one record of the joined publishes."""
        head, bodies = self.head, self.bodies
        n = len(bodies)
        if n == 1:
            return head
        stamps, origins = self.stamps, self.origins
        ends = array("I", accumulate(map(len, bodies))).tobytes()
        ts, ttr, origin, reply_to, headers, block = head[8][:6]
        batch = (
            ts, ttr, origin, reply_to, headers, block, PickleBuffer(b"".join(bodies)), ends,
            array("q", stamps).tobytes() if stamps.count(ts) != n else None,
            json.dumps(origins) if origins.count(origin) != n else None,
        )  # fmt: skip
        return (*head[:3], n, *head[4:8], batch)


# records a publish of one message may be joined past (to the last such publish's)
_BESIDE = frozenset(("AR", "E", "U"))


class Pending:
    """The records made since the last write, in the order they were made: the next
    write's frame. A publish of one message may join the last one's record (Joining),
    and finishes or deliveries the last record of their kind and group (`running`),
    instead of adding one."""

    __slots__ = ("joining", "lone", "ops", "wake")

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.wake = trio.Event()  # set by the first record after a write
        # the last publish of one message, if only deliveries, finishes and changes were
        # recorded after it (its place among `ops`, else -1): the next such publish may
        # join it, and more after that one
        self.lone = -1
        self.joining: Joining | None = None

    def add(self, op: Op) -> None:
        if not self.ops:
            self.wake.set()
        if self.lone >= 0 and op[0] not in _BESIDE:
            self._end_join()
        self.ops.append(op)

    def publish(self, gids: tuple[int, ...], messages: Sequence[Message], due: float) -> None:
        """The record of a publish, or its one message joined to the last one's."""
        if len(messages) > 1:
            self.add(put_record(gids, messages, due))
        elif self.lone < 0 or not self._join(gids, messages[0], due):
            self.add(put_record(gids, messages, due))  # ends the join open, if any
            self.lone = len(self.ops) - 1

    def _join(self, gids: tuple[int, ...], message: Message, due: float) -> bool:
        """Join a publish of one message to the last one (`lone`), if it fits. A
        delivery, finish or change recorded between them concerns other messages (this
        one is new), and the index applies a pass's publishes before them anyway: the
        joined record takes the first one's place."""
        joining = self.joining
        if joining is not None:
            return joining.add(gids, message, due)
        head = self.ops[self.lone]
        if message.id != head[2] + 1 or head[1] != gids:  # puts into tubes in turn
            return False
        key = shared(head)
        if sharing(gids, message, due) != key:
            return False
        self.joining = Joining(self.lone, head, key)
        self.joining.append(message)
        return True

    def _end_join(self) -> None:
        """No publish joins the last one any more: its record is made."""
        joining = self.joining
        if joining is not None:
            self.ops[joining.at] = joining.record()
            self.joining = None
        self.lone = -1

    def running(self, kind: str, gid: int) -> list[int]:
        """The runs of the last record if it is a `kind` record of this group (extended
        in place), else of a new one."""
        ops = self.ops
        if ops and (last := ops[-1])[0] == kind and last[1] == gid:
            extended: list[int] = last[2]
            return extended
        runs: list[int] = []
        self.add((kind, gid, runs))
        return runs

    def frame(self) -> list[Op]:
        """The records, for the next write (a join still open made its record)."""
        self._end_join()
        return self.ops

    def written(self) -> None:
        """The records are in the log."""
        self.ops = []


# -- finishes and deliveries: runs of ids ---------------------------------------------

_ID = attrgetter("id")
_PRIORITY = attrgetter("priority")
_ATTEMPTS = attrgetter("attempts")


def _one_run(messages: Sequence[Message]) -> bool:
    """Whether `messages` (two or more) have ascending consecutive ids and one priority:
    a consumer's window of deliveries, a page of its FINs. Checked with a few passes in
    C rather than a Python step per message."""
    ids = list(map(_ID, messages))
    first = ids[0]
    return ids == list(range(first, first + len(ids))) and len(set(map(_PRIORITY, messages))) == 1


def add_finishes(runs: list[int], messages: Sequence[Message]) -> None:
    """Extend a finish record's runs (flat: priority, first, last, ...) with `messages`:
    an id that follows the last run's, in its priority, extends it."""
    if len(messages) > 1 and _one_run(messages):
        p, first, last = messages[0].priority, messages[0].id, messages[-1].id
        if runs and runs[-1] == first - 1 and runs[-3] == p:
            runs[-1] = last
        else:
            runs += (p, first, last)
        return
    for m in messages:
        p, i = m.priority, m.id
        if runs and runs[-1] == i - 1 and runs[-3] == p:
            runs[-1] = i
        else:
            runs += (p, i, i)


def add_deliveries(runs: list[int], deliveries: Iterable[Delivery]) -> None:
    """Extend a delivery record's runs (flat: priority, first, last, attempts, ...): a run
    is consecutive ids of one priority delivered with the same attempt count, which a
    window of first deliveries is."""
    messages = [d.message for d in deliveries]
    if len(messages) > 1 and _one_run(messages) and len(set(map(_ATTEMPTS, messages))) == 1:
        m = messages[0]
        p, first, last, a = m.priority, m.id, messages[-1].id, m.attempts
        if runs and runs[-2] == first - 1 and runs[-4] == p and runs[-1] == a:
            runs[-2] = last
        else:
            runs += (p, first, last, a)
        return
    for m in messages:
        p, i, a = m.priority, m.id, m.attempts
        if runs and runs[-2] == i - 1 and runs[-4] == p and runs[-1] == a:
            runs[-2] = i
        else:
            runs += (p, i, i, a)
