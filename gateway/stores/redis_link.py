"""The Redis store's connection: connect with back-off, load the function library, send
recorded calls as one pipeline, listen for notifications, and say whether Redis is up.

coredis clients are async context managers whose connection pool runs its own task group;
the store is opened and closed from whichever task the gateway (or a test) uses, so the
client lives in a system task of its own for as long as the store is open.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from gateway.stores.base import StoreError
from gateway.stores.redis_cluster_wire import ClusterWire, SlotsMoved
from gateway.stores.redis_lua import LIBRARY, OLD_LIBRARIES
from gateway.stores.redis_url import RedisTarget
from gateway.stores.redis_wire import Wire

log = logging.getLogger("gateway.store")
# coredis logs every retry of a command at INFO: the store says what matters itself
logging.getLogger("coredis").setLevel(logging.WARNING)

_BACKOFF_MIN, _BACKOFF_MAX = 0.25, 5.0


class RedisLink:
    def __init__(self, target: RedisTarget, *, wait: float = math.inf) -> None:
        self.target = target
        self.where = f"Redis at {target.address}"
        self.wait = wait  # seconds to keep trying at start (--store-wait); inf: for ever
        self.client: Any = None
        self.up = False
        # why connect() has not succeeded yet (the last attempt's error), for /ready
        self.problem: str | None = None
        self._closed = trio.Event()
        self._done = trio.Event()
        self._started = False
        # the connection of ordered writes: one, or one per master of a Cluster
        self._wire: Wire | ClusterWire = ClusterWire(target) if target.cluster else Wire(target)

    async def connect(self) -> None:
        """Connect and load the library, retrying with back-off for `wait` seconds; raises
        StoreError naming Redis and its address when it cannot."""
        if self.client is not None:
            return
        ready = trio.Event()
        failure: list[BaseException] = []

        async def host() -> None:
            try:
                client = self.target.client()
                async with client:
                    self.client = client
                    ready.set()
                    await self._closed.wait()
            except BaseException as exc:  # a system task must not raise
                failure.append(exc)
                ready.set()
            finally:
                self.client = None
                self._done.set()

        self._started = True
        trio.lowlevel.spawn_system_task(host)
        await ready.wait()
        if failure:
            raise StoreError(f"{self.where}: {failure[0]}")
        deadline = trio.current_time() + self.wait
        backoff = _BACKOFF_MIN
        attempts = 0
        while True:
            try:
                await self.load_library()
                self.up = True
                self.problem = None
                return
            except Exception as exc:
                left = deadline - trio.current_time()
                if left <= 0:
                    await self.close()
                    raise StoreError(f"{self.where}: cannot connect: {_what(exc)}") from None
                attempts += 1
                self.problem = f"{self.where}: cannot connect: {_root(exc)}"
                # one short line per attempt: the root cause, not the client's wrappers
                log.warning(
                    "%s (attempt %d); next in %.2g s, giving up in %.0f s",
                    self.problem,
                    attempts,
                    min(backoff, left),
                    left,
                )
                await trio.sleep(min(backoff, left))
                backoff = min(backoff * 2, _BACKOFF_MAX)

    async def load_library(self) -> None:
        with trio.fail_after(10):
            # {name: details}, names as bytes (decode_responses is off)
            names = {_text(name) for name in await self.client.function_list()}
            for old in OLD_LIBRARIES:
                # an older gateway's library holds functions of the same names
                if old in names:
                    await self.client.function_delete(old)
            await self.client.function_load(LIBRARY, replace=True)

    async def pipeline(self, ops: Sequence[tuple[str, str, list[Any]]]) -> tuple[Any, ...]:
        """Send recorded calls in one pipeline, in order; their replies. Raises StoreError."""
        if not ops:
            return ()
        for attempt in (1, 2):
            try:
                replies = await self._send(ops)
                self.up = True
                return replies
            except Exception as exc:
                if attempt == 1 and "function not found" in str(exc).lower():
                    # Redis restarted without its data (or FUNCTION FLUSH): load it again
                    await self.load_library()
                    continue
                self.up = False
                raise StoreError(f"{self.where}: {_what(exc)}") from None
        raise AssertionError("unreachable")

    async def _send(self, ops: Sequence[tuple[str, str, list[Any]]]) -> tuple[Any, ...]:
        client = self.client
        if client is None:
            raise ConnectionError("not connected")
        async with client.pipeline(transaction=False) as pipe:
            _stack(pipe, ops)
        return tuple(pipe.results or ())

    # -- ordered writes ----------------------------------------------------------
    #
    # The store's writes and claims go through connections of their own (redis_wire.py,
    # plain RESP: a coredis round trip costs several times the CPU), so that several
    # pipelines can be on the wire at once and Redis still applies them in the order they
    # were sent: one connection to a single Redis, one per master of a Cluster
    # (redis_cluster_wire.py: a topic's calls all go to its master).

    async def prepare(self) -> None:
        """Connect the write connections again after a loss (on a Cluster: read the slot
        map again after slots moved)."""
        if not self._wire.usable:
            try:
                await self._wire.open()
            except StoreError:
                self.up = False
                raise

    def send(self, ops: Sequence[tuple[str, str, list[Any]]]) -> Awaitable[tuple[Any, ...]]:
        """Put `ops` on the wire now, after every pipeline sent before (no await between
        the caller's choice of ops and this); await the result for their replies. Raises
        StoreError, at once or from the result."""
        if not ops:
            return self.pipeline(ops)
        return self._replies(self._wire.submit([_command(op) for op in ops]))

    async def _replies(self, pending: Awaitable[list[Any]]) -> tuple[Any, ...]:
        try:
            got = await pending
        except SlotsMoved:
            raise  # Redis is up: the map is read again for the retry
        except StoreError:
            self.up = False
            raise
        for response in got:
            if isinstance(response, BaseException):
                if "function not found" in str(response).lower():
                    # Redis restarted without its data (or FUNCTION FLUSH): load it for
                    # the retry, which the store makes with everything after this in order
                    with contextlib.suppress(Exception):
                        await self.load_library()
                raise StoreError(f"{self.where}: {_what(response)}")
        self.up = True
        return tuple(got)

    async def listen(self, channel: str, on_message: Callable[[bytes], None]) -> None:
        """Call `on_message` with every message on `channel`; resubscribes after a loss."""
        while True:
            client = self.client
            if client is None:
                return
            try:
                async with client.pubsub(channels=[channel], ignore_subscribe_messages=True) as ps:
                    async for m in ps:
                        if m["type"] == "message":
                            on_message(m["data"])
            except Exception as exc:
                log.debug("%s: notifications: %s", self.where, exc)
                await trio.sleep(_BACKOFF_MIN)

    async def ping(self) -> bool:
        try:
            with trio.move_on_after(2):
                await self.client.ping()
                self.up = True
                return True
        except Exception:
            pass
        self.up = False
        return False

    async def close(self) -> None:
        await self._wire.close()
        self._closed.set()
        if self._started:
            with trio.move_on_after(5):
                await self._done.wait()


def _stack(pipe: Any, ops: Sequence[tuple[str, str, list[Any]]]) -> None:
    for fn, key, args in ops:
        if fn == "publish":
            pipe.publish(key, args[0])
        elif fn == "hset":
            pipe.hset(key, {args[0]: args[1]})
        elif fn == "hsetnx":
            pipe.hsetnx(key, args[0], args[1])
        elif fn == "hdel":
            pipe.hdel(key, [args[0]])
        elif fn == "hget":
            pipe.hget(key, args[0])
        elif fn == "hmget":
            pipe.hmget(key, args)
        elif fn == "hgetall":
            pipe.hgetall(key)
        elif fn == "exists":
            pipe.exists([key])
        else:
            pipe.fcall(fn, [key], args)


def _command(op: tuple[str, str, list[Any]]) -> list[Any]:
    fn, key, args = op
    if fn in _PLAIN:
        return [fn.upper(), key, *args]
    return ["FCALL", fn, 1, key, *args]


_PLAIN = frozenset({"publish", "hset", "hsetnx", "hdel", "hget", "hmget", "hgetall", "exists"})


def _text(name: bytes | str) -> str:
    return name.decode() if isinstance(name, bytes) else name


def _root(exc: BaseException) -> str:
    """The innermost cause of a failed connection, in a few words ("Connection refused",
    "Name or service not known"), without the client library's wrappers around it."""
    seen: BaseException = exc
    while (nxt := seen.__cause__ or seen.__context__) is not None:
        seen = nxt
    if isinstance(seen, OSError) and seen.strerror:
        return seen.strerror
    text = (str(seen) or type(seen).__name__).splitlines()[0]
    return text if len(text) <= 120 else text[:117] + "..."


def _what(exc: BaseException) -> str:
    """One line saying what went wrong, with the cause a client library wrapped (such as a
    certificate that failed verification behind "unable to establish a connection")."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 3:
        text = (str(seen) or type(seen).__name__).splitlines()[0]
        if not any(text in p for p in parts):
            parts.append(text)
        seen = seen.__cause__ or seen.__context__
    return ": ".join(parts)
