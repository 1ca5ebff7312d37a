"""What the shared Redis store answers about single messages and queue heads, for the
broker's query API (beanstalkd peek, stats-job, kick-job and peek-*, the admin page's
lists) when the message may be held, deferred or buried by another gateway; and the
registry of topics and groups every gateway shares (the broker's refresh).

RedisStore owns one and hands it the connection and its own flush: every read of a
message first flushes what this gateway recorded, so that it sees its own changes, then
asks Redis in one round trip (gw_find, gw_peek in redis_lua_claims.py). Claims, even of
one particular message, are writes: they stay in RedisStore, on the ordered write path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from gateway.stores.base import Found
from gateway.stores.redis_codec import TOPICS_KEY, hex_id, topic_key, unpack_flat
from gateway.stores.redis_link import RedisLink


class SharedReads:
    def __init__(self, link: RedisLink, *, flush: Callable[[], Awaitable[None]]) -> None:
        self.link = link
        self.flush = flush  # the store's: a read sees what this gateway recorded before it

    async def registry(self) -> dict[str, tuple[bool, dict[str, bool]]]:
        """Every topic, its pause, and its groups with theirs (the broker's refresh)."""
        topics = await self.link.client.hgetall(TOPICS_KEY)
        names = [raw.decode() for raw in topics]
        replies = await self.link.pipeline(
            [("hgetall", topic_key(n) + "groups", []) for n in names]
        )
        return {
            name: _entry(topics[name.encode()], groups)
            for name, groups in zip(names, replies, strict=True)
        }

    async def registered(self, name: str) -> tuple[bool, dict[str, bool]] | None:
        """One topic's entry of the registry, as `registry` has it (None: no gateway made
        it), read after what this gateway recorded."""
        await self.flush()
        paused, groups = await self.link.pipeline(
            [("hget", TOPICS_KEY, [name]), ("hgetall", topic_key(name) + "groups", [])]
        )
        return None if paused is None else _entry(paused, groups)

    async def holding(self, topics: Sequence[str]) -> set[str]:
        """Those of `topics` whose messages are in Redis (a topic no longer registered,
        yet published to since: its publish made it anew)."""
        replies = await self.link.pipeline([("exists", topic_key(t) + "m", []) for t in topics])
        return {t for t, n in zip(topics, replies, strict=True) if n}

    async def find(self, where: Sequence[tuple[str, Sequence[str]]], msg_id: int) -> Found | None:
        """Message `msg_id` in the first of `where`'s (topic, groups) that holds it."""
        await self.flush()
        hid = hex_id(msg_id)
        ops = [("gw_find", topic_key(t), [hid, *groups]) for t, groups in where if groups]
        replies = await self.link.pipeline(ops)
        for (topic, _), reply in zip(where, replies, strict=False):
            if reply:
                group, state, score, owner, *entry = reply
                (msg,) = unpack_flat(topic, entry)
                return Found(
                    topic, _text(group), _text(state), float(score) / 1000.0, _text(owner), msg
                )
        return None

    async def peek(self, topic: str, group: str, state: str, limit: int) -> list[Found]:
        """The first `limit` messages of a group in `state`, in the order they leave it."""
        await self.flush()
        (flat,) = await self.link.pipeline([("gw_peek", topic_key(topic), [group, state, limit])])
        out = []
        for i in range(0, len(flat), 5):
            (msg,) = unpack_flat(topic, flat[i : i + 4])
            out.append(Found(topic, group, state, float(flat[i + 4]) / 1000.0, "", msg))
        return out


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


__all__ = ["SharedReads"]


def _entry(paused: bytes, groups: dict[bytes, bytes]) -> tuple[bool, dict[str, bool]]:
    """A registry entry as Redis holds it: the topic's pause flag, its groups' hash."""
    return paused == b"1", {g.decode(): v == b"1" for g, v in groups.items()}
