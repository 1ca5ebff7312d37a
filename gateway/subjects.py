"""NATS subjects: validity rules and a wildcard index, as nats-server's sublist.go has them.

Subjects are dot-separated tokens. In a subscription, a token that is exactly `*` matches
any one token, and a token that is exactly `>` matches one or more tokens and must be the
last. `*` or `>` inside a longer token (`foo*`) is an ordinary character.

A published subject is not checked by nats-server unless the client asked for pedantic
mode (then `-ERR 'Invalid Publish Subject'`, and the message is still delivered). Its
tokens are matched literally: verified live (2.9.10 and 2.15.1), a PUB to `foo.*` reaches
subscriptions `foo.*` and `foo.>` but not `foo.x`, and a PUB to `foo..bar` or `.foo`
reaches nobody, not even `>`. SubjectIndex.match does the same.
"""

from __future__ import annotations

from itertools import islice
from typing import Final

# sublist.go slCacheMax / slCacheSweep: nats-server caches up to 1024 match results per
# account and, past that, sweeps the cache down to 256 entries.
CACHE_MAX: Final = 1024
CACHE_SWEEP: Final = 256

PWC: Final = "*"
FWC: Final = ">"


def is_valid_subject(subject: str) -> bool:
    """A literal subject: nats-server's IsValidLiteralSubject, its pedantic PUB check.

    Tokens are non-empty and none is exactly `*` or `>`.
    """
    return all(token and token != PWC and token != FWC for token in subject.split("."))


def is_valid_subscription(subject: str) -> bool:
    """What sublist Insert accepts (else SUB gets `-ERR 'Invalid Subject'`).

    Tokens are non-empty and nothing follows a `>` token. Insert checks nothing else: a
    token may hold any byte but the separators the parser already split on.
    """
    tokens = subject.split(".")
    last = len(tokens) - 1
    return all(token and (token != FWC or i == last) for i, token in enumerate(tokens))


def matches(pattern_tokens: list[str], subject_tokens: list[str]) -> bool:
    """Does the subscription pattern match the subject (its tokens taken literally)?"""
    n = len(subject_tokens)
    for i, p in enumerate(pattern_tokens):
        if p == FWC:
            return n > i
        if i >= n:
            return False
        if p != PWC and p != subject_tokens[i]:
            return False
    return len(pattern_tokens) == n


class _Node:
    __slots__ = ("items", "next")

    def __init__(self) -> None:
        # keyed by id(): items need not be hashable, and equal-but-distinct items
        # (two dataclass subscriptions with the same fields) stay distinct
        self.items: dict[int, object] = {}
        self.next: _Level | None = None


class _Level:
    __slots__ = ("fwc", "nodes", "pwc")

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}
        self.pwc: _Node | None = None
        self.fwc: _Node | None = None

    def empty(self) -> bool:
        return not self.nodes and self.pwc is None and self.fwc is None


def _match_level(level: _Level, tokens: list[str], i: int, out: list[object]) -> None:
    # sublist.go's matchLevel: at each level a `>` node matches the rest, a `*` node and
    # the literal node for this token continue one level down. The `*` branches wait on
    # a stack, not in recursion: a subscription of 1,500 `*` tokens fits in a control
    # line, and one level of Python recursion per token would end in RecursionError.
    n = len(tokens)
    pending: list[tuple[_Level, int]] = []
    while True:
        fwc = level.fwc
        if fwc is not None:
            out.extend(fwc.items.values())
        pwc = level.pwc
        node = level.nodes.get(tokens[i])
        i += 1
        if i == n:
            if pwc is not None:
                out.extend(pwc.items.values())
            if node is not None:
                out.extend(node.items.values())
        else:
            if pwc is not None and pwc.next is not None:
                pending.append((pwc.next, i))
            if node is not None and node.next is not None:
                level = node.next
                continue
        if not pending:
            return
        level, i = pending.pop()


class SubjectIndex:
    """Patterns → items, with a per-subject result cache (a hit is one dict lookup).

    An item is stored once per pattern (by identity); an item added under two patterns
    that both match a subject appears twice in that subject's result. The order of a
    result is unspecified. match() returns the cached list itself: do not mutate it.
    add() and remove() never mutate a list already returned, they drop cache entries.
    """

    __slots__ = ("_cache", "_root", "count")

    def __init__(self) -> None:
        self._root = _Level()
        self._cache: dict[str, list[object]] = {}
        self.count = 0  # items under all patterns (read it, don't set it)

    def __len__(self) -> int:
        return self.count

    def add(self, pattern: str, item: object) -> None:
        if not is_valid_subscription(pattern):
            raise ValueError(f"invalid subscription subject {pattern!r}")
        tokens = pattern.split(".")
        level = self._root
        node: _Node | None = None
        for token in tokens:
            if token == PWC:
                node = level.pwc
                if node is None:
                    node = level.pwc = _Node()
            elif token == FWC:
                node = level.fwc
                if node is None:
                    node = level.fwc = _Node()
            else:
                node = level.nodes.get(token)
                if node is None:
                    node = level.nodes[token] = _Node()
            if node.next is None:
                node.next = _Level()
            level = node.next
        assert node is not None
        key = id(item)
        if key not in node.items:
            node.items[key] = item
            self.count += 1
            self._invalidate(pattern, tokens)

    def remove(self, pattern: str, item: object) -> bool:
        """Forget item under pattern; False if it was not there."""
        tokens = pattern.split(".")
        path: list[tuple[_Level, str, _Node]] = []
        level: _Level | None = self._root
        node: _Node | None = None
        for token in tokens:
            if level is None:
                return False
            if token == PWC:
                node = level.pwc
            elif token == FWC:
                node = level.fwc
            else:
                node = level.nodes.get(token)
            if node is None:
                return False
            path.append((level, token, node))
            level = node.next
        if node is None or node.items.pop(id(item), None) is None:
            return False
        self.count -= 1
        # prune nodes left with no items and no children, leaf first
        for parent, token, child in reversed(path):
            if child.items or (child.next is not None and not child.next.empty()):
                break
            if token == PWC:
                parent.pwc = None
            elif token == FWC:
                parent.fwc = None
            else:
                del parent.nodes[token]
        self._invalidate(pattern, tokens)
        return True

    def _invalidate(self, pattern: str, tokens: list[str]) -> None:
        cache = self._cache
        if not cache:
            return
        if PWC not in tokens and FWC not in tokens:
            # a literal pattern matches one subject only
            cache.pop(pattern, None)
            return
        stale = [s for s in cache if matches(tokens, s.split("."))]
        for subject in stale:
            del cache[subject]

    def match(self, subject: str) -> list[object]:
        result = self._cache.get(subject)
        if result is not None:
            return result
        tokens = subject.split(".")
        if "" in tokens:
            # sublist.go match(): an empty token matches nothing, and is not cached
            return []
        result = []
        _match_level(self._root, tokens, 0, result)
        cache = self._cache
        if len(cache) >= CACHE_MAX:
            # drop the oldest entries; nats-server drops random ones
            for old in list(islice(cache, len(cache) - CACHE_SWEEP)):
                del cache[old]
        cache[subject] = result
        return result
