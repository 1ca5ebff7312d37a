"""Pluggable persistence behind the broker (see base.py for the contract)."""

from __future__ import annotations

from pathlib import Path

from gateway.stores.base import Store, StoredGroup, StoredState, StoredTopic, StoreError
from gateway.stores.memory import MemoryStore
from gateway.stores.sqlite import FsyncPolicy, SQLiteStore

__all__ = [
    "MemoryStore",
    "SQLiteStore",
    "Store",
    "StoreError",
    "StoreURLError",
    "StoredGroup",
    "StoredState",
    "StoredTopic",
    "open_store",
]

DB_FILE = "gateway.db"


class StoreURLError(ValueError):
    pass


def open_store(
    url: str | None,
    data_dir: str | Path,
    *,
    fsync: FsyncPolicy = 50,
    wait: float = float("inf"),
) -> Store:
    """Make the store a `--store` URL names; none: the durable store in `data_dir`.
    `wait`: seconds a Redis store keeps trying to connect at start."""
    if url is None:
        return SQLiteStore(Path(data_dir) / DB_FILE, fsync=fsync)
    check_store_url(url)
    scheme, _, rest = url.partition("://")
    if scheme == "memory":
        return MemoryStore(forgets=True)
    if scheme.startswith("redis"):
        from gateway.stores.redis import RedisStore
        from gateway.stores.redis_url import parse_redis_url

        return RedisStore(parse_redis_url(url), wait=wait)
    return SQLiteStore(Path(rest), fsync=fsync)


def check_store_url(url: str) -> None:
    """Raise StoreURLError naming the setting unless this build can open `url`."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme == "memory":
        return
    if sep and scheme == "sqlite" and rest.startswith("/") and len(rest) > 1:
        return
    if sep and scheme.startswith("redis"):
        from gateway.stores.redis_url import RedisURLError, parse_redis_url

        try:
            parse_redis_url(url)
        except RedisURLError as exc:
            raise StoreURLError(str(exc)) from None
        return
    raise StoreURLError(
        f"unsupported URL {url!r}: use memory://, sqlite:///absolute/path.db, "
        "redis://host:port/db or redis+cluster://host:port[,host:port] "
        "(or no --store: the durable store in --data-dir)"
    )
