"""The message archive: lifecycle events written to Parquet segments (docs/archive.md).

`writer.Archive` (the buffer and the writer thread), `tables` and `read.read_archive` import
pyarrow; this package and `events` do not, so the broker can name the events without
loading pyarrow in a gateway whose archive is off.
"""
