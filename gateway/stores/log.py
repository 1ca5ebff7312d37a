"""The durable store's append-only log: what makes an acknowledgement durable, and where
queued bodies stay.

The store encodes the records made since its last write into one frame and writes it to
the log with one system call (`pwritev`, at the segment's offset) on the event loop,
before the replies to what made them leave (docs/storage.md, "The write path"). A write
to the page cache is a memory copy: killing the process loses nothing written. `fsync`
(`fdatasync`) is what survives a power cut, and it runs on a thread of its own
(`Log.sync`), never on the event loop.

A frame is `u32 length, u32 CRC-32C of the payload, payload` (little-endian; CRC-32C as
Kafka's and LevelDB's logs use it, computed by the CPU's instruction). The payload is the
pickled list of the frame's records, tuples of ints, floats, strings and bytes only, read
back by an unpickler that refuses anything else (`decode`), so a log can only ever yield
data. A record's bodies (a publish's, end to end) are not copied into the pickle: they
are pickle's out-of-band buffers, written after it in the same frame, so that their place
in the log is known and the index can point at them instead of holding a copy (bitcask's
layout: the bodies stay where they were first written). Such a payload starts with
`BODIES` and the buffers' lengths: `u8 BODIES, u32 count, u32 length each, u32 pickle
length, pickle, buffers`; a payload without buffers is the pickle alone.

The log is cut into segments, `<dir>/<number>.log`, numbered from 1; a position in the
log is (segment, offset). A segment is closed at `SEGMENT_BYTES` and on every open, so
that positions only grow. A segment's blocks are allocated when it is made, so its file
is longer than what was written until it is closed; the rest reads as zeros. Reading back
(`replay`) stops a segment at its end, or at its first frame that is short or fails its
checksum (a write a crash or a power cut left torn), cuts the file there (saying so for a
torn frame). `Bodies` reads a body range back where it was written.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import struct
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from crc32c import crc32c

log = logging.getLogger("gateway.store")

HEADER = struct.Struct("<II")  # payload length, CRC-32C of the payload
BODIES = 0x01  # the first byte of a payload with out-of-band bodies (a pickle's is 0x80)
_U32 = struct.Struct("<I")
_ONE = struct.Struct("<BIII")  # the prefix of a payload with one body range
SEGMENT_BYTES = 16 * 1024 * 1024  # a segment is closed once it holds this much
_SUFFIX = ".log"

Position = tuple[int, int]  # (segment number, offset in it); (0, 0): before everything


# a frame: its parts, written with one pwritev, not joined; where in the frame each
# out-of-band body starts, in pickle's order; its size
Frame = tuple[list[Any], list[int], int]


_JOIN = 64  # more bodies than this in one frame are joined into one part (IOV_MAX: 1024)


def encode(records: list[tuple[Any, ...]]) -> Frame:
    """One frame holding `records` (a record's `pickle.PickleBuffer` is a body kept out of
    the pickle, written after it)."""
    buffers: list[pickle.PickleBuffer] = []
    pickled = pickle.dumps(records, protocol=5, buffer_callback=buffers.append)
    if not buffers:
        head = HEADER.pack(len(pickled), crc32c(pickled))
        return ([head, pickled], [], HEADER.size + len(pickled))
    if len(buffers) == 1:  # most frames: one publish (a PUB, an MPUB)
        body = buffers[0]
        size = memoryview(body).nbytes
        prefix = _ONE.pack(BODIES, 1, size, len(pickled))
        crc = crc32c(body, crc32c(pickled, crc32c(prefix)))
        at = HEADER.size + _ONE.size + len(pickled)
        return ([HEADER.pack(at + size - HEADER.size, crc), prefix, pickled, body], [at], at + size)
    lengths = [memoryview(b).nbytes for b in buffers]
    count = len(lengths)
    prefix = struct.pack(f"<BI{count}II", BODIES, count, *lengths, len(pickled))
    crc = crc32c(pickled, crc32c(prefix))
    for b in buffers:
        crc = crc32c(b, crc)
    at = HEADER.size + len(prefix) + len(pickled)
    starts = []
    for n in lengths:
        starts.append(at)
        at += n
    parts: list[Any] = buffers if count <= _JOIN else [b"".join(buffers)]
    return ([HEADER.pack(at - HEADER.size, crc), prefix, pickled, *parts], starts, at)


class _DataOnly(pickle.Unpickler):
    """Builds the containers and scalars pickle encodes inline; refuses every global, which
    is what an object, a function or a class would need: a log yields data or an error."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a store log record names {module}.{name}")


def decode(payload: memoryview | bytes) -> tuple[list[tuple[Any, ...]], list[int]]:
    """A payload's records, and where in the payload each of its bodies starts (a body
    comes back as a memoryview of `payload`)."""
    view = memoryview(payload)
    buffers: list[memoryview] = []
    starts: list[int] = []
    if view[:1] == bytes((BODIES,)):
        (count,) = _U32.unpack_from(view, 1)
        lengths = struct.unpack_from(f"<{count}II", view, 5)
        pickle_at = 5 + 4 * count + 4
        at = pickle_at + lengths[-1]
        for n in lengths[:-1]:
            starts.append(at)
            buffers.append(view[at : at + n])
            at += n
        if at != len(view):
            raise pickle.UnpicklingError("a store log frame's bodies do not fill it")
        view = view[pickle_at : pickle_at + lengths[-1]]
    records = _DataOnly(io.BytesIO(view), buffers=buffers).load()
    if not isinstance(records, list):
        raise pickle.UnpicklingError("a store log frame is not a list of records")
    return records, starts


def segments(directory: Path) -> list[int]:
    """The numbers of the segments in `directory`, ascending."""
    out = []
    for p in directory.glob(f"*{_SUFFIX}"):
        with contextlib.suppress(ValueError):
            out.append(int(p.name[: -len(_SUFFIX)]))
    return sorted(out)


def segment_path(directory: Path, number: int) -> Path:
    return directory / f"{number:016d}{_SUFFIX}"


def replay(
    directory: Path, after: Position
) -> Iterator[tuple[Position, list[tuple[Any, ...]], list[int]]]:
    """Every frame after `after`, in order: the position it ends at, its records, and the
    offsets in that segment where its bodies start. A segment ends at its first torn or
    corrupt frame: the file is cut there (with a log line) and the next segment is read,
    which a writer only ever starts after the last good frame."""
    for number in segments(directory):
        if number < after[0]:
            continue
        path = segment_path(directory, number)
        data = memoryview(path.read_bytes())
        offset = after[1] if number == after[0] else 0
        end = len(data)
        unwritten = False  # the rest is the segment's allocated, never written part
        while offset < end:
            if end - offset < HEADER.size:
                break
            length, crc = HEADER.unpack_from(data, offset)
            if length == 0:  # no frame is empty: zeros, or a torn write
                unwritten = bytes(data[offset:]) == bytes(end - offset)
                break
            start = offset + HEADER.size
            payload = data[start : start + length]
            if len(payload) < length or crc32c(payload) != crc:
                break
            try:
                records, starts = decode(payload)
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError, struct.error) as exc:
                log.error("store log %s: frame at %d cannot be read: %s", path, offset, exc)
                break
            offset = start + length
            yield (number, offset), records, [start + at for at in starts]
        if offset < end:
            if unwritten:  # the end of what was written: the allocated rest goes quietly
                with open(path, "r+b") as f:
                    f.truncate(offset)
                continue
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


# segments whose descriptors `Bodies` keeps open at once. A queue read slowly while others
# move on pins every segment after its oldest body, and page-ins read from many of them:
# one descriptor each for as long as they stay would grow with the backlog, up to the
# process's limit on open files, past which no connection is accepted any more.
OPEN_SEGMENTS = 32


class Bodies:
    """Reads bodies back from the segments they were written to (the index's thread),
    keeping at most `most` descriptors open: the one opened first is closed for a new one.
    First in, first out rather than least recently used: a read that finds its segment
    open costs nothing more (a read per batch, a batch per message for single PUBs), and
    page-ins read forward through the log, so the one opened first is rarely needed
    again; when it is, it is opened again."""

    def __init__(self, directory: Path, most: int = OPEN_SEGMENTS) -> None:
        self.directory = directory
        self._most = most
        self._fds: dict[int, int] = {}

    def read(self, segment: int, offset: int, size: int) -> bytes:
        fds = self._fds
        fd = fds.get(segment)
        if fd is None:
            if len(fds) >= self._most:
                with contextlib.suppress(OSError):
                    os.close(fds.pop(next(iter(fds))))
            fd = fds[segment] = os.open(segment_path(self.directory, segment), os.O_RDONLY)
        data = os.pread(fd, size, offset)
        if len(data) < size:
            raise OSError(f"store log segment {segment}: {size} bytes at {offset} are past its end")
        return data

    def forget(self, numbers: Iterable[int]) -> None:
        """Close the descriptors of these segments (deleted)."""
        for number in numbers:
            fd = self._fds.pop(number, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close(self) -> None:
        self.forget(list(self._fds))


class Log:
    """The writing end. `write` runs on the event loop (one `pwritev` per frame); `sync`
    runs on a thread of the caller's (it fsyncs every segment written since the last sync
    and returns the position that is now on disk). Segments the caller's index holds and
    has synced go with `delete`."""

    def __init__(self, directory: Path, first: int) -> None:
        self.directory = directory
        self.segment = first
        self.offset = 0
        # the segments before the one being written that are on disk (kept here: the
        # index thread asks after every update, and listing the directory costs more)
        self._before = [n for n in segments(directory) if n < first]
        # segments written since their last fsync: their descriptors, closed by sync
        self._unsynced: list[int] = []
        self._lock = threading.Lock()
        self._cut_at: int | None = None  # a failed write's torn tail to cut, if any
        self._new_name = False  # a segment made since the last sync: fsync the directory
        self._fd = self._open(first)

    def _open(self, number: int) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(segment_path(self.directory, number), os.O_WRONLY | os.O_CREAT)
        # The segment's blocks are allocated now, as beanstalkd allocates its binlog
        # files: an fsync then writes the data and no change of the file's size, which
        # took it from about 130 to 70-90 µs here (fsync "always" answers a put once its
        # fsync is done). The unwritten rest reads as zeros, where a reader stops
        # (`replay`). A file system without it, or a full one, grows the file as it is
        # written instead, as it did before.
        with contextlib.suppress(OSError):
            os.posix_fallocate(fd, 0, SEGMENT_BYTES)
        # the new segment's name must survive a power cut too: the next sync fsyncs the
        # directory before it says anything in the segment is on disk
        with self._lock:
            self._new_name = True
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
        parts, _, size = frame
        written = 0
        offset = self.offset
        try:
            # at the offset, not appended: the file's allocated length is past its end
            written = os.pwritev(self._fd, parts, offset)
            if written < size:  # a short write: the rest, as often as it takes
                rest = memoryview(b"".join(parts))
                while written < size:
                    written += os.pwrite(self._fd, rest[written:], offset + written)
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
            self._before.append(self.segment)
        self._fd = fd
        self.segment += 1
        self.offset = 0

    def sync(self) -> Position:
        """fsync what was written before the call (thread side); returns its position.
        fdatasync: the data and what reading it back needs (the blocks it went to, a
        size that grew), not the times of the file."""
        with self._lock:
            position = self.position
            closed, self._unsynced = self._unsynced, []
            fd = self._fd
            new_name, self._new_name = self._new_name, False
        if new_name:
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            except OSError:
                with self._lock:
                    self._new_name = True
                raise
            finally:
                os.close(dfd)
        for old in closed:
            os.fdatasync(old)
            os.close(old)
        os.fdatasync(fd)
        return position

    def on_disk(self) -> list[int]:
        """The segments on disk before the one being written, ascending."""
        with self._lock:
            return list(self._before)

    def delete(self, numbers: Iterable[int]) -> int:
        """Delete these segments (never the one being written); how many went. Thread
        side: a segment goes once the index holds its records and no queued body is in it."""
        gone = 0
        for number in numbers:
            if number >= self.segment:
                continue
            with contextlib.suppress(FileNotFoundError):
                segment_path(self.directory, number).unlink()
                gone += 1
            with self._lock, contextlib.suppress(ValueError):
                self._before.remove(number)
        return gone

    def remove(self, keep: set[int]) -> None:
        """Delete every segment but `keep`, once closed (the index holds every record;
        queued bodies are in `keep`)."""
        for number in segments(self.directory):
            if number not in keep:
                with contextlib.suppress(FileNotFoundError):
                    segment_path(self.directory, number).unlink()

    def size(self) -> int:
        """The bytes the segments hold (the one being written: up to its end, not the
        length allocated for it)."""
        total = 0
        for number in segments(self.directory):
            if number == self.segment and self._fd >= 0:
                total += self.offset
                continue
            with contextlib.suppress(OSError):
                total += segment_path(self.directory, number).stat().st_size
        return total

    def close(self) -> None:
        with self._lock:
            fds, self._unsynced = [*self._unsynced, self._fd], []
            fd, self._fd = self._fd, -1
        if fd >= 0:
            # the blocks allocated past the last frame go back (a clean stop)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self.offset)
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
