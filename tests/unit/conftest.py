"""Shared by the unit tests: Trio's MockClock, jumping as soon as every task waits."""

from __future__ import annotations

import pytest
import trio.testing


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)
