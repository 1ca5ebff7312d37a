"""Reading the archive back: every finished segment under a directory as one table.

Segments still being written (or cut short by kill -9) carry a name starting with "." and
are skipped here, as Spark and pyarrow's dataset discovery skip them.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from gateway.archive.writer import SCHEMA

PARTITION = pa.schema([("date", pa.string())])


def read_archive(directory: str | Path) -> pa.Table:
    """Every event in the finished segments under `directory` (hive partitions `date=...`
    become a `date` string column). An empty or missing directory gives an empty table."""
    root = Path(directory)
    schema = SCHEMA.append(pa.field("date", pa.string()))
    if not root.is_dir():
        return schema.empty_table()
    dataset = ds.dataset(
        root,
        format="parquet",
        schema=schema,
        partitioning=ds.partitioning(PARTITION, flavor="hive"),
        ignore_prefixes=[".", "_"],
    )
    return dataset.to_table()
