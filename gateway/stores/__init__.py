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


def open_store(url: str | None, data_dir: str | Path, *, fsync: FsyncPolicy = 50) -> Store:
    """Make the store a `--store` URL names; none: the durable store in `data_dir`."""
    if url is None:
        return SQLiteStore(Path(data_dir) / DB_FILE, fsync=fsync)
    check_store_url(url)
    scheme, _, rest = url.partition("://")
    if scheme == "memory":
        return MemoryStore()
    return SQLiteStore(Path(rest), fsync=fsync)


def check_store_url(url: str) -> None:
    """Raise StoreURLError naming the setting unless this build can open `url`."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme == "memory":
        return
    if sep and scheme == "sqlite" and rest.startswith("/") and len(rest) > 1:
        return
    raise StoreURLError(
        f"unsupported URL {url!r}: use memory:// or sqlite:///absolute/path.db "
        "(or no --store: the durable store in --data-dir)"
    )
