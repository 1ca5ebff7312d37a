from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_server import RedisServer


# One redis-server for the whole test session (contract and integration tests alike).
@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the whole session; each test that uses it starts empty."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's redis-server, emptied for this test."""
    redis_server.cli("FLUSHALL")
    return redis_server.url
