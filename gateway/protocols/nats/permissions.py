"""Per-user publish and subscribe permissions, as nats-server's `authorization` block.

A user's `publish` and `subscribe` each hold `allow` and `deny` subject patterns (a bare
list means `allow`). As in nats-server:

* a publish is allowed when some allow pattern matches its subject (or there is no allow
  list) and no deny pattern does; a refused publish gets
  `-ERR 'Permissions Violation for Publish to "<subject>"'`, the message is dropped and the
  connection stays open;
* a subscription is allowed when an allow pattern matches its subject (its wildcards
  taken as plain tokens, so `b.*` admits `b.>` but not `>`), and refused when a deny
  pattern matches it that way (`-ERR 'Permissions Violation for Subscription to
  "<subject>"'`, with `using queue "<q>"` for a queue subscription); a wildcard
  subscription that only overlaps a deny pattern is accepted, and the messages on denied
  subjects are not delivered to it.

Decisions for publish subjects are cached per connection (clients publish to few
subjects over and over), bounded so a client cycling through subjects cannot grow it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.subjects import FWC, PWC, matches

_CACHE_MAX = 1024


def overlaps(a: list[str], b: list[str]) -> bool:
    """Could one subject match both patterns?"""
    for x, y in zip(a, b, strict=False):
        if x == FWC or y == FWC:
            return True  # the other has a token here, and '>' takes it and the rest
        if x != PWC and y != PWC and x != y:
            return False
    return len(a) == len(b)


def _split(patterns: Sequence[str]) -> list[list[str]]:
    return [p.split(".") for p in patterns]


@dataclass
class Permissions:
    publish_allow: list[list[str]] | None = None  # None: every subject
    publish_deny: list[list[str]] = field(default_factory=list)
    subscribe_allow: list[list[str]] | None = None
    subscribe_deny: list[list[str]] = field(default_factory=list)
    _published: dict[str, bool] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls,
        publish_allow: Sequence[str] | None,
        publish_deny: Sequence[str],
        subscribe_allow: Sequence[str] | None,
        subscribe_deny: Sequence[str],
    ) -> Permissions:
        return cls(
            None if publish_allow is None else _split(publish_allow),
            _split(publish_deny),
            None if subscribe_allow is None else _split(subscribe_allow),
            _split(subscribe_deny),
        )

    def fresh(self) -> Permissions:
        """A copy with its own cache, for one connection."""
        return Permissions(
            self.publish_allow, self.publish_deny, self.subscribe_allow, self.subscribe_deny
        )

    def can_publish(self, subject: str) -> bool:
        known = self._published.get(subject)
        if known is not None:
            return known
        tokens = subject.split(".")
        allowed = (
            self.publish_allow is None or any(matches(p, tokens) for p in self.publish_allow)
        ) and not any(matches(p, tokens) for p in self.publish_deny)
        if len(self._published) >= _CACHE_MAX:
            self._published.clear()
        self._published[subject] = allowed
        return allowed

    def can_subscribe(self, subject: str) -> bool:
        # nats-server matches the subscription's own subject against the patterns, its
        # wildcards taken as plain tokens: allow `b.*` admits `b.>` but not `>` or `*.b`
        tokens = subject.split(".")
        if self.subscribe_allow is not None and not any(
            matches(p, tokens) for p in self.subscribe_allow
        ):
            return False
        return not any(matches(p, tokens) for p in self.subscribe_deny)

    def filters_delivery(self, subject: str) -> bool:
        """Whether messages to a subscription on `subject` must be checked one by one: it
        overlaps a deny pattern without being covered by it."""
        tokens = subject.split(".")
        return any(overlaps(p, tokens) for p in self.subscribe_deny)

    def can_receive(self, subject: str) -> bool:
        tokens = subject.split(".")
        return not any(matches(p, tokens) for p in self.subscribe_deny)


def violation(kind: str, subject: str, queue: str | None = None) -> str:
    """nats-server's text (Go's %q quoting of a subject: subjects have no quotes or
    backslashes worth escaping, since the parser splits on whitespace)."""
    text = f'Permissions Violation for {kind} to "{_quote(subject)}"'
    if queue is not None:
        text += f' using queue "{_quote(queue)}"'
    return text


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
