"""The durable store's figures for /metrics: a commit is counted into the latency
histogram's buckets as it happens, so what the store keeps does not grow with the number
of commits, however long nobody scrapes (a sidecar with no Prometheus, `--http off`)."""

from __future__ import annotations

from pathlib import Path

from gateway.metrics_store import COMMIT_BUCKETS
from gateway.model import Message
from gateway.stores import SQLiteStore


async def test_commit_figures_keep_their_size_and_count_every_commit(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "gateway.db")
    await store.open()
    try:
        store.add_topic("t")
        store.add_group("t", "g")
        before = store.stats().commits
        for i in range(1, 5001):  # a publish acknowledged one at a time: a commit each
            store.put("t", ["g"], [Message(i, "t", b"x", 0)], 0.0)
            assert store.flush_now()
        stats = store.stats()
        assert stats.commits - before == 5000
        # every list the figures hold is the histogram's fixed set of buckets (before, a
        # float per commit waited for the next scrape: 5,000 of them here)
        lists = {k: len(v) for k, v in vars(stats).items() if isinstance(v, list)}
        assert lists == {"commit_buckets": len(COMMIT_BUCKETS) + 1}
        assert sum(stats.commit_buckets) == stats.commits
        assert 0 < stats.commit_sum < 5000 * COMMIT_BUCKETS[-1]
        # read again (a second scrape): cumulative, nothing lost or counted twice
        assert store.stats().commits == stats.commits
        assert sum(store.stats().commit_buckets) == stats.commits
    finally:
        await store.close()
