"""Pluggable persistence behind the broker (see base.py for the contract)."""

from __future__ import annotations

from gateway.stores.base import Store, StoredGroup, StoredState, StoredTopic
from gateway.stores.memory import MemoryStore

__all__ = ["MemoryStore", "Store", "StoredGroup", "StoredState", "StoredTopic", "open_store"]


class StoreURLError(ValueError):
    pass


def open_store(url: str) -> Store:
    """Make the store a `--store` URL names."""
    scheme, _, _rest = url.partition("://")
    if scheme == "memory":
        return MemoryStore()
    raise StoreURLError(f"unsupported store URL {url!r}: this build supports memory://")
