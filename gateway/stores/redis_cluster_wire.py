"""The Redis store's ordered writes on a Redis Cluster: one plain-RESP `Wire` per master,
each call sent to the master that holds its key's slot.

Through coredis's cluster pipeline the store could keep only one pipeline in flight, and
every round trip cost what coredis costs (redis_wire.py): consuming through a cluster of
three masters ran at about two thirds of the rate through one Redis, on the same
gateways. Here a pipeline is split by master, each part queued on that master's
connection, and several pipelines are on the wire at once, as on a single Redis.

Order: every key a call touches belongs to one topic, and a topic's keys share one slot
(their hash tag, redis_codec.topic_key), so all calls about a topic go to one master, on
one connection, in the order they were sent. Calls about different topics are
independent, and may be applied in another order on different masters.

Slots that move (MOVED, ASK, a cluster that is down or resharding): the pipeline fails
with SlotsMoved, like one on a lost connection, and the slot map is read again before
the next pipeline. The store sends the failed pipeline again at once, and its callers
see no error unless that keeps failing (its calls are safe to repeat, as after a lost
connection: a call a master refused with MOVED was not applied). The map comes from
`CLUSTER SLOTS` of the first node that answers: the masters of the last map, then the
nodes the URL names.
"""

from __future__ import annotations

import binascii
import dataclasses
from collections.abc import Awaitable, Sequence
from typing import Any

import trio
from coredis.exceptions import RedisClusterError

from gateway.stores.base import StoreError
from gateway.stores.redis_url import RedisTarget
from gateway.stores.redis_wire import Replies, Wire

SLOTS = 16384
Node = tuple[str, int]


def key_slot(key: str | bytes) -> int:
    """The cluster slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key
    when it has none (the algorithm every Redis Cluster client uses)."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return binascii.crc_hqx(raw, 0) % SLOTS


def _key(command: Sequence[Any]) -> Any:
    """The key a call routes by (redis_link._command's shapes: FCALL fn 1 key ...,
    or NAME key ...)."""
    return command[3] if command[0] == "FCALL" else command[1]


class SlotsMoved(StoreError):
    """A master answered that a slot is not, or not yet, its own: the pipeline failed and
    the slot map is read again before the next one."""


class Sent:
    """One pipeline's parts on the masters' connections: (positions, wire, replies)."""

    __slots__ = ("count", "parts")

    def __init__(self, count: int, parts: list[tuple[list[int], Wire, Replies]]) -> None:
        self.count = count
        self.parts = parts


class ClusterWire:
    def __init__(self, target: RedisTarget) -> None:
        self.target = target
        self.where = f"Redis Cluster at {target.address}"
        self._slots: list[Node] | None = None  # slot -> its master
        self._wires: dict[Node, Wire] = {}
        self._known: list[Node] = list(target.nodes)  # where to ask for the map
        self._opening = trio.Lock()

    @property
    def usable(self) -> bool:
        return self._slots is not None and all(w.usable for w in self._wires.values())

    async def open(self) -> None:
        """Read the slot map and connect to every master, unless done and still good;
        callers at the same time share one try."""
        async with self._opening:
            if not self.usable:
                await self._open()

    async def _open(self) -> None:
        self._slots = None
        problem = "no node to ask"
        for node in list(dict.fromkeys(self._known)):
            try:
                wire = await self._wire(node)
                (reply,) = await wire.call([["CLUSTER", "SLOTS"]])
            except StoreError as exc:
                problem = str(exc)
                continue
            if isinstance(reply, BaseException):
                problem = f"{self.where}: CLUSTER SLOTS: {reply}"
                continue
            slots = self._map(reply, node)
            if slots is None:
                problem = f"{self.where}: {node[0]}:{node[1]} serves not every slot"
                continue
            masters = set(slots)
            for gone in set(self._wires) - masters:
                self._wires.pop(gone).drop("not a master in the cluster's slot map")
            for master in masters:
                await self._wire(master)
            self._known = [*masters, *self.target.nodes]
            self._slots = slots
            return
        raise StoreError(problem)

    async def _wire(self, node: Node) -> Wire:
        wire = self._wires.get(node)
        if wire is None:
            # each master's connection: the URL's credentials and TLS, that node's address
            only = dataclasses.replace(self.target, nodes=(node,), cluster=False, db=0)
            wire = self._wires[node] = Wire(only)
        await wire.open()
        return wire

    @staticmethod
    def _map(reply: Any, asked: Node) -> list[Node] | None:
        """CLUSTER SLOTS' ranges as slot -> master; None while a slot has none."""
        slots: list[Node | None] = [None] * SLOTS
        for entry in reply:
            start, end, master = int(entry[0]), int(entry[1]), entry[2]
            host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
            # an empty host or "?" means the address the question went to
            node = (host if host not in ("", "?") else asked[0], int(master[1]))
            slots[start : end + 1] = [node] * (end - start + 1)
        if any(s is None for s in slots):
            return None
        return slots  # type: ignore[return-value]

    def send(self, commands: Sequence[Sequence[Any]]) -> Sent:
        """Queue a pipeline's calls, each on its master's connection behind every call
        queued there before; no await."""
        slots = self._slots
        if slots is None:  # slots moved since the caller's prepare(): sent again
            raise SlotsMoved(f"{self.where}: the slot map is being read again")
        by_node: dict[Node, list[int]] = {}
        for i, command in enumerate(commands):
            by_node.setdefault(slots[key_slot(_key(command))], []).append(i)
        parts = []
        for node, positions in by_node.items():
            wire = self._wires[node]
            parts.append((positions, wire, wire.send([commands[i] for i in positions])))
        return Sent(len(commands), parts)

    async def result(self, sent: Sent) -> list[Any]:
        """The pipeline's replies in the order of its calls (error replies are exceptions
        in the list). Raises StoreError when a connection fails; a reply that says the
        slots moved marks the map for reading again."""
        for _, wire, _ in sent.parts:  # every part on the wire before waiting for one
            await wire.flush()
        out: list[Any] = [None] * sent.count
        failed: StoreError | None = None
        for positions, wire, replies in sent.parts:
            try:
                got = await wire.result(replies)
            except StoreError as exc:  # that master's connection is lost (not usable)
                failed = failed or exc
                continue
            for i, reply in zip(positions, got, strict=True):
                # MOVED, ASK, TRYAGAIN, CLUSTERDOWN, as the parser makes them: the slot
                # map is not what this gateway thinks it is
                if isinstance(reply, RedisClusterError):
                    self._slots = None
                    what = type(reply).__name__
                    failed = failed or SlotsMoved(f"{self.where}: slots moved ({what} {reply})")
                out[i] = reply
        if failed is not None:
            raise failed
        return out

    def submit(self, commands: Sequence[Sequence[Any]]) -> Awaitable[list[Any]]:
        """Queue a pipeline now (`send`); await the result for its replies (`result`)."""
        return self.result(self.send(commands))

    async def close(self) -> None:
        wires, self._wires = self._wires, {}
        self._slots = None
        for wire in wires.values():
            await wire.close()
