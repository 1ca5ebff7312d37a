"""How a gateway sharing its queues through Redis claims and delivers (gateway/broker/
claims.py), in one process against the session's redis-server: what it writes to Redis
per message is what the throughput through Redis depends on."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from gateway.stores.redis import RedisStore
from tests.helpers import RawNSQ, be32, parse_message, running_gateway
from tests.integration.test_durability import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE


@pytest.fixture
def url(redis_url: str) -> str:  # the session's redis-server (tests/conftest.py), emptied
    return redis_url


async def test_a_delivery_within_its_claims_lease_writes_nothing_of_its_own(url: str) -> None:
    """An NSQ consumer's deliveries have the claim's own timeout: the claim, which lasts
    that long and a little more, covers them, and no per-message write of their deadline
    follows (one gw_touch per delivery before). A TOUCH still writes its new deadline."""
    async with running_gateway(store=url) as gw:
        store = gw.store
        assert isinstance(store, RedisStore)
        record = store._record
        calls: list[tuple[str, list[Any]]] = []

        def counted(fn: str, topic: str, args: list[Any]) -> None:
            calls.append((fn, list(args)))
            record(fn, topic, args)

        store._record = counted  # type: ignore[method-assign]
        consumer = await RawNSQ.connect(gw)
        await consumer.send(b"SUB orders work\n")
        assert await consumer.frame() == (FRAME_RESPONSE, b"OK")
        producer = await RawNSQ.connect(gw)
        bodies = [b"m%02d" % i for i in range(50)]
        payload = be32(len(bodies)) + b"".join(be32(len(b)) + b for b in bodies)
        await producer.send(b"MPUB orders\n" + be32(len(payload)) + payload)
        assert await producer.frame() == (FRAME_RESPONSE, b"OK")
        await consumer.send(b"RDY 100\n")
        ids = []
        with trio.fail_after(10):
            while len(ids) < len(bodies):
                ftype, data = await consumer.frame()
                assert ftype == FRAME_MESSAGE, (ftype, data)
                ids.append(parse_message(data)[2])
        assert [fn for fn, _ in calls if fn == "gw_touch"] == []
        await consumer.send(b"TOUCH " + ids[0] + b"\n")
        # then a FIN of an id nobody holds: its error says every command before it was
        # handled (and recorded)
        await consumer.send(b"".join(b"FIN " + i + b"\n" for i in [*ids, b"0" * 16]))
        ftype, data = await consumer.frame()
        assert ftype == FRAME_ERROR and data.startswith(b"E_FIN_FAILED"), (ftype, data)
        touches = [args for fn, args in calls if fn == "gw_touch"]
        assert len(touches) == 1 and touches[0][2] == ids[0].decode()
        await consumer.aclose()
        await producer.aclose()
