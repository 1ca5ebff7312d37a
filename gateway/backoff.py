"""The delay between a client's connection attempts (the nsqlookupd registration, the
links to live servers): from `first`, doubling after each failure up to `most`; a
connection that stayed up `stable` seconds starts the next round from `first` again."""

from __future__ import annotations


class Backoff:
    def __init__(self, first: float = 0.1, most: float = 15.0, stable: float = 10.0) -> None:
        self.first = first
        self.most = most
        self.stable = stable
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    def next(self) -> float:
        """The delay before the next attempt; the one after it is doubled."""
        delay = self.delay
        self.delay = min(delay * 2, self.most)
        return delay

    def lasted(self, seconds: float) -> None:
        """An attempt ended after `seconds`: long enough, and the next round starts over."""
        if seconds > self.stable:
            self.reset()
