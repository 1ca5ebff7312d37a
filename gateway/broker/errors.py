"""What the broker tells the layers above it when something below it fails."""

from __future__ import annotations

from gateway.stores.base import StoreError

# The store could not do what an operation needed (a write failed, a shared store is
# away): the operation did not happen, and the caller answers in its protocol's words.
# Sessions and the HTTP API catch it by this name and never import the stores.
StoreUnavailable = StoreError

__all__ = ["StoreUnavailable"]
