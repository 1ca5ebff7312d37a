"""The durable store's append-only log: what makes an acknowledgement durable.

The store encodes the records made since its last write into one frame and writes it to
the log with one system call (`writev` of its header and payload) on the event loop, before
the replies to what made them leave (docs/storage.md, "The write path"). A write to the
page cache is a memory copy: killing the process loses nothing written. `fsync` is what
survives a power cut, and it runs on a thread of its own (`Log.sync`), never on the event
loop.

A frame is `u32 length, u32 CRC-32C of the payload, payload` (little-endian; CRC-32C as
Kafka's and LevelDB's logs use it, computed by the CPU's instruction); the payload is
the pickled list of the frame's records, tuples of ints, floats, strings and bytes only,
read back by an unpickler that refuses anything else (`decode`), so a log can only ever
yield data. The log is cut into segments, `<dir>/<number>.log`, numbered from 1; a
position in the log is (segment, offset). A segment is closed at `SEGMENT_BYTES` and on
every open, so that positions only grow: an index brought up to a position before a power
cut can be ahead of what the log kept of the same segment, and the log then never writes
at a position the index has already passed.

Reading back (`replay`) stops a segment at its first frame that is short or fails its
checksum (a write a crash or a power cut left torn), cuts the file there and says so.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from crc32c import crc32c

log = logging.getLogger("gateway.store")

HEADER = struct.Struct("<II")  # payload length, CRC-32C of the payload
SEGMENT_BYTES = 16 * 1024 * 1024  # a segment is closed once it holds this much
_SUFFIX = ".log"

Position = tuple[int, int]  # (segment number, offset in it); (0, 0): before everything


Frame = tuple[bytes, bytes]  # header, payload: written with one writev, not joined


def encode(records: list[tuple[Any, ...]]) -> Frame:
    """One frame holding `records`."""
    payload = pickle.dumps(records, protocol=5)
    return HEADER.pack(len(payload), crc32c(payload)), payload


class _DataOnly(pickle.Unpickler):
    """Builds the containers and scalars pickle encodes inline; refuses every global, which
    is what an object, a function or a class would need: a log yields data or an error."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a store log record names {module}.{name}")


def decode(payload: bytes) -> list[tuple[Any, ...]]:
    records = _DataOnly(io.BytesIO(payload)).load()
    if not isinstance(records, list):
        raise pickle.UnpicklingError("a store log frame is not a list of records")
    return records


def segments(directory: Path) -> list[int]:
    """The numbers of the segments in `directory`, ascending."""
    out = []
    for p in directory.glob(f"*{_SUFFIX}"):
        with contextlib.suppress(ValueError):
            out.append(int(p.name[: -len(_SUFFIX)]))
    return sorted(out)


def segment_path(directory: Path, number: int) -> Path:
    return directory / f"{number:016d}{_SUFFIX}"


def replay(directory: Path, after: Position) -> Iterator[tuple[Position, list[tuple[Any, ...]]]]:
    """Every frame after `after`, with the position it ends at, in order. A segment ends at
    its first torn or corrupt frame: the file is cut there (with a log line) and the next
    segment is read, which a writer only ever starts after the last good frame."""
    for number in segments(directory):
        if number < after[0]:
            continue
        path = segment_path(directory, number)
        data = path.read_bytes()
        offset = after[1] if number == after[0] else 0
        end = len(data)
        while offset < end:
            if end - offset < HEADER.size:
                break
            length, crc = HEADER.unpack_from(data, offset)
            start = offset + HEADER.size
            payload = data[start : start + length]
            if len(payload) < length or crc32c(payload) != crc:
                break
            try:
                records = decode(payload)
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
                log.error("store log %s: frame at %d cannot be read: %s", path, offset, exc)
                break
            offset = start + length
            yield (number, offset), records
        if offset < end:
            log.warning(
                "store log %s: cut at %d, the last whole record: %d bytes after it were a"
                " write left unfinished by a crash or a power cut",
                path,
                offset,
                end - offset,
            )
            with open(path, "r+b") as f:
                f.truncate(offset)
                os.fsync(f.fileno())


class Log:
    """The writing end. `write` runs on the event loop (one `writev` per frame); `sync`
    runs on a thread of the caller's (it fsyncs every segment written since the last sync
    and returns the position that is now on disk). Segments the caller's index holds and
    has synced go with `retire`."""

    def __init__(self, directory: Path, first: int) -> None:
        self.directory = directory
        self.segment = first
        self.offset = 0
        self._fd = self._open(first)
        self.oldest = min(segments(directory), default=first)  # the first segment on disk
        # segments written since their last fsync: their descriptors, closed by sync
        self._unsynced: list[int] = []
        self._lock = threading.Lock()
        self._cut_at: int | None = None  # a failed write's torn tail to cut, if any

    def _open(self, number: int) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(segment_path(self.directory, number), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        # the new segment's name must survive a power cut too: fsync the directory
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return fd

    @property
    def position(self) -> Position:
        return (self.segment, self.offset)

    def write(self, frame: Frame) -> Position:
        """Append one frame; returns the position after it. An OSError leaves the log as
        it was before the call (a torn tail is cut, or the next write starts a segment)."""
        if self._cut_at is not None:
            self._repair()
        if self.offset >= SEGMENT_BYTES:
            self._rotate()
        size = len(frame[0]) + len(frame[1])
        written = 0
        try:
            written = os.writev(self._fd, frame)
            if written < size:  # a short write: the rest, as often as it takes
                rest = memoryview(b"".join(frame))
                while written < size:
                    written += os.write(self._fd, rest[written:])
        except OSError:
            # whatever part of the frame reached the file goes (nothing, if none did)
            self._cut_at = self.offset
            self._repair()
            raise
        self.offset += written
        return self.position

    def _repair(self) -> None:
        """Cut a failed write's partial frame; failing that, leave the segment for a new
        one (replay stops at the torn frame and goes on with the next segment)."""
        assert self._cut_at is not None
        try:
            os.ftruncate(self._fd, self._cut_at)
        except OSError:
            self._rotate()
        self._cut_at = None

    def _rotate(self) -> None:
        fd = self._open(self.segment + 1)
        with self._lock:
            self._unsynced.append(self._fd)
        self._fd = fd
        self.segment += 1
        self.offset = 0

    def sync(self) -> Position:
        """fsync what was written before the call (thread side); returns its position."""
        with self._lock:
            position = self.position
            closed, self._unsynced = self._unsynced, []
            fd = self._fd
        for old in closed:
            os.fsync(old)
            os.close(old)
        os.fsync(fd)
        return position

    def retire(self, before: int) -> int:
        """Delete the segments numbered below `before` (never the one being written);
        how many went. Thread side."""
        before = min(before, self.segment)
        gone = 0
        for number in segments(self.directory):
            if number >= before:
                break
            with contextlib.suppress(FileNotFoundError):
                segment_path(self.directory, number).unlink()
                gone += 1
        self.oldest = max(self.oldest, before)
        return gone

    def remove(self) -> None:
        """Delete every segment, once closed (what they held is all in the index)."""
        for number in segments(self.directory):
            with contextlib.suppress(FileNotFoundError):
                segment_path(self.directory, number).unlink()

    def size(self) -> int:
        total = 0
        for number in segments(self.directory):
            with contextlib.suppress(OSError):
                total += segment_path(self.directory, number).stat().st_size
        return total

    def close(self) -> None:
        with self._lock:
            fds, self._unsynced = [*self._unsynced, self._fd], []
            self._fd = -1
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
