"""The subject logic behind NATS user permissions (the transcripts against a real
nats-server are in tests/integration/test_nats_permissions.py)."""

from __future__ import annotations

import pytest

from gateway.protocols.nats.permissions import Permissions, overlaps, violation


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("b.secret", "b.*", True),
        ("b.secret", "b.>", True),
        ("b.secret", "c.*", False),
        ("a.b.c", "a.*", False),
        ("a.>", "*.b.c", True),
        (">", "x", True),
        ("a.*", "a", False),
        ("a.b", "a.b", True),
    ],
)
def test_overlaps(a: str, b: str, expected: bool) -> None:
    assert overlaps(a.split("."), b.split(".")) is expected
    assert overlaps(b.split("."), a.split(".")) is expected


def test_publish_decisions_are_cached_and_bounded() -> None:
    perms = Permissions.of(["a.>"], ["a.secret"], None, []).fresh()
    assert perms.can_publish("a.b") and not perms.can_publish("a.secret")
    assert not perms.can_publish("b")
    for i in range(5000):  # a client cycling through subjects cannot grow the cache
        perms.can_publish(f"a.{i}")
    assert len(perms._published) <= 1024


def test_delivery_filter_only_where_a_deny_overlaps() -> None:
    perms = Permissions.of(None, [], ["b.*", "c.>"], ["b.secret"])
    assert perms.can_subscribe("b.*") and perms.filters_delivery("b.*")
    assert not perms.filters_delivery("c.x")
    assert not perms.can_receive("b.secret") and perms.can_receive("b.open")


def test_violation_text_is_go_quoted() -> None:
    assert violation("Publish", 'x"y') == 'Permissions Violation for Publish to "x\\"y"'
    assert violation("Subscription", "a", "q") == (
        'Permissions Violation for Subscription to "a" using queue "q"'
    )
