from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the whole session; each test that uses it starts empty."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    yield server
    server.stop()
