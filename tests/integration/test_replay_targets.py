"""Replay's publishing side without Spark: one partition's messages to a real gateway's
beanstalkd port, counted as the target answered them."""

from __future__ import annotations

import trio

from gateway.pipeline.replay import publish_partition
from gateway.pipeline.targets import Target
from tests.helpers import running_gateway


async def test_puts_answered_before_a_refusal_count_as_published() -> None:
    """beanstalkd takes a batch one put at a time: those answered INSERTED before a
    JOB_TOO_BIG are published (and in the tube), the rest of the batch is not. Counting
    the whole batch as failed made a re-run publish the confirmed ones a second time."""
    async with running_gateway(beanstalk="127.0.0.1:0", beanstalkd__max_job_size=10) as gw:
        host, port = gw.addresses["beanstalk"]
        target = Target.parse(f"beanstalk://{host}:{port}/dl")
        rows = [{"body": b, "size": len(b)} for b in (b"one", b"two", b"x" * 11, b"four")]
        ((published, failed, error),) = await trio.to_thread.run_sync(
            lambda: list(publish_partition(target, rows))
        )
        assert (published, failed) == (2, 2)
        assert "JobTooBigError" in error
        assert gw.broker.topics["dl"].depth == 2
