"""Subject rules and SubjectIndex, against a naive matcher."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.subjects import (
    CACHE_MAX,
    SubjectIndex,
    is_valid_subject,
    is_valid_subscription,
    matches,
)


def test_is_valid_subject() -> None:
    # nats-server IsValidLiteralSubject (the pedantic PUB check)
    for s in ["foo", "foo.bar", "foo*", "f>o", "_INBOX.abc.1", "a.b.c.d"]:
        assert is_valid_subject(s), s
    for s in ["", "foo.*", "foo.>", "*", ">", "foo..bar", ".foo", "foo."]:
        assert not is_valid_subject(s), s


def test_is_valid_subscription() -> None:
    # verified live: SUB of these gets -ERR 'Invalid Subject' (or not)
    for s in ["foo", "foo.*", "foo.>", ">", "*", "*.>", "foo*", "a.*.c", "f>o.bar"]:
        assert is_valid_subscription(s), s
    for s in ["", "foo..bar", ".foo", "foo.", "foo.>.bar", ">.>", ">.foo"]:
        assert not is_valid_subscription(s), s


def test_matches() -> None:
    def m(p: str, s: str) -> bool:
        return matches(p.split("."), s.split("."))

    assert m("foo", "foo")
    assert not m("foo", "foo.bar")
    assert m("foo.*", "foo.bar")
    assert not m("foo.*", "foo")
    assert not m("foo.*", "foo.bar.baz")
    assert m("foo.>", "foo.bar.baz")
    assert not m("foo.>", "foo")
    assert m(">", "foo")
    assert m("*.bar", "foo.bar")
    assert m("foo*", "foo*")
    assert not m("foo*", "foox")
    # published wildcards are literal tokens; verified: PUB foo.* reaches foo.* and foo.>
    assert m("foo.*", "foo.*")
    assert m("foo.>", "foo.*")
    assert not m("foo.x", "foo.*")


def test_index_basics() -> None:
    idx = SubjectIndex()
    a, b, c, d = object(), object(), object(), object()
    idx.add("foo.bar", a)
    idx.add("foo.*", b)
    idx.add("foo.>", c)
    idx.add(">", d)
    assert len(idx) == 4
    assert {id(x) for x in idx.match("foo.bar")} == {id(a), id(b), id(c), id(d)}
    assert {id(x) for x in idx.match("foo.baz")} == {id(b), id(c), id(d)}
    assert {id(x) for x in idx.match("foo.bar.baz")} == {id(c), id(d)}
    assert {id(x) for x in idx.match("foo")} == {id(d)}
    assert idx.match("foo..bar") == []
    assert idx.match(".foo") == []
    assert {id(x) for x in idx.match("foo.*")} == {id(b), id(c), id(d)}
    assert idx.remove("foo.*", b)
    assert not idx.remove("foo.*", b)
    assert not idx.remove("nope.x", b)
    assert {id(x) for x in idx.match("foo.baz")} == {id(c), id(d)}
    for pattern, item in [("foo.bar", a), ("foo.>", c), (">", d)]:
        assert idx.remove(pattern, item)
    assert len(idx) == 0
    assert idx.match("foo.bar") == []
    assert idx._root.empty()


def test_index_items_by_identity() -> None:
    idx = SubjectIndex()
    x, y = [1], [1]  # equal, unhashable, distinct
    idx.add("a", x)
    idx.add("a", y)
    idx.add("a", x)  # once per pattern
    assert len(idx.match("a")) == 2
    idx.add("*", x)  # another pattern: x appears again
    assert sorted(map(id, idx.match("a"))) == sorted([id(x), id(x), id(y)])
    idx.remove("a", y)
    assert [id(i) for i in idx.match("a")] == [id(x), id(x)]


def test_index_rejects_invalid_patterns() -> None:
    idx = SubjectIndex()
    for bad in ["", "a..b", "a.>.b"]:
        try:
            idx.add(bad, object())
        except ValueError:
            continue
        raise AssertionError(bad)


def test_cache_hit_is_the_same_list_and_invalidated() -> None:
    idx = SubjectIndex()
    a, b = object(), object()
    idx.add("foo.bar", a)
    first = idx.match("foo.bar")
    assert idx.match("foo.bar") is first
    idx.match("other")
    idx.add("foo.*", b)  # drops foo.bar, keeps "other"
    assert "other" in idx._cache
    assert "foo.bar" not in idx._cache
    second = idx.match("foo.bar")
    assert first == [a]  # a returned list is never mutated
    assert {id(x) for x in second} == {id(a), id(b)}
    idx.add("other", b)  # literal: drops only that subject
    assert "foo.bar" in idx._cache
    assert idx.match("other") == [b]


def test_cache_is_bounded() -> None:
    idx = SubjectIndex()
    idx.add(">", 1)
    for i in range(CACHE_MAX * 3):
        assert idx.match(f"s.{i}") == [1]
        assert len(idx._cache) <= CACHE_MAX


# -- against a naive matcher -----------------------------------------------------------

_TOKEN = st.sampled_from(["a", "b", "c", "foo", "x*", "b>"])
_PATTERN_TOKEN = st.sampled_from(["a", "b", "c", "foo", "x*", "b>", "*", "*", ">"])


@st.composite
def patterns(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(_PATTERN_TOKEN, min_size=1, max_size=4))
    # `>` only last
    tokens = [t for t in tokens[:-1] if t != ">"] + tokens[-1:]
    return ".".join(tokens)


subjects = st.lists(st.one_of(_TOKEN, st.sampled_from(["*", ">"])), min_size=1, max_size=5).map(
    ".".join
)


def naive(pattern: str, subject: str) -> bool:
    """A regex translation: independent of matches() and of the index."""
    parts = []
    for token in pattern.split("."):
        if token == "*":
            parts.append(r"[^.]+")
        elif token == ">":
            parts.append(r"[^.]+(?:\.[^.]+)*")
        else:
            parts.append(re.escape(token))
    return re.fullmatch(r"\.".join(parts), subject) is not None


_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "match"]), patterns(), st.integers(0, 5), subjects),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_index_against_naive(ops: list[tuple[str, str, int, str]]) -> None:
    idx = SubjectIndex()
    items = [f"item{i}" for i in range(6)]
    model: set[tuple[str, int]] = set()
    for op, pattern, i, subject in ops:
        assert is_valid_subscription(pattern)
        if op == "add":
            idx.add(pattern, items[i])
            model.add((pattern, i))
        elif op == "remove":
            assert idx.remove(pattern, items[i]) == ((pattern, i) in model)
            model.discard((pattern, i))
        expected = sorted(f"item{j}" for p, j in model if naive(p, subject))
        assert sorted(idx.match(subject)) == expected  # type: ignore[type-var]
        assert matches(pattern.split("."), subject.split(".")) == naive(pattern, subject)
    assert len(idx) == len(model)
