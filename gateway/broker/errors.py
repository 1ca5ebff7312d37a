"""What the broker tells the layers above it when something below it fails."""

from __future__ import annotations

__all__ = ["StoreUnavailable"]


class StoreUnavailable(Exception):
    """The store could not do what an operation needed (a write failed, a shared store is
    away): the operation did not happen, and the caller answers in its protocol's words.

    Raised by the journal, the broker's one door to the store, in place of the store's own
    exception (chained as `__cause__`): sessions, the HTTP API and the CLI catch it by this
    name and never import the stores."""
