"""Archive segments as the writer wrote them in earlier releases, for the readers' tests:
an archive keeps its old segments when the gateway is upgraded."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gateway.archive import events
from gateway.archive.tables import SCHEMA


def earlier_layout_segment(root: Path, ids: list[int]) -> None:
    """A finished segment as the writer wrote them before its columns became REQUIRED and
    its pages v2: every column optional, plain strings, data page v1."""
    rows = [
        dict.fromkeys(SCHEMA.names, None)
        | {"event": events.PUBLISHED, "time_ns": 1_700_000_000_000_000_000 + i, "id": i}
        | {"topic": "orders", "group": "", "producer": "nsq", "consumer": "", "peer": "p"}
        | {"size": 1, "attempts": 0, "priority": 0, "publish_ns": 1, "body": b"x"}
        for i in ids
    ]
    folder = root / "date=2023-11-14"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=SCHEMA),
        folder / "part-1-000001.parquet",
        data_page_version="1.0",
    )
