"""Stream compression for nsqd's TCP protocol: the snappy and deflate upgrades.

After IDENTIFY negotiates ``snappy`` or ``deflate``, both directions of the connection are wrapped
in one long compressed stream. These classes are sans-IO byte transforms: the session feeds
received bytes to ``decode`` and passes outgoing frames through ``encode`` once per flush.

Any ``CompressionError`` leaves the object unusable; the session then drops the connection
without a reply, as nsqd does when its reader fails.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import crc32c

__all__ = ["CompressionError", "DeflateStream", "SnappyStream"]


class CompressionError(Exception):
    """The peer sent bytes that are not a valid compressed stream (or a decompression bomb)."""


# -- snappy framing format ---------------------------------------------------------------------
# https://github.com/google/snappy/blob/main/framing_format.txt, as implemented by golang/snappy
# (nsqd, go-nsq) and python-snappy (pynsq).

_CHUNK_COMPRESSED = 0x00
_CHUNK_UNCOMPRESSED = 0x01
_CHUNK_STREAM_ID = 0xFF
_STREAM_ID_PAYLOAD = b"sNaPpY"
_STREAM_ID_CHUNK = b"\xff\x06\x00\x00" + _STREAM_ID_PAYLOAD

_MAX_BLOCK = 65536  # uncompressed bytes per data chunk, fixed by the format
_CRC_SIZE = 4
# A compressed chunk may legally be larger than its data (snappy's worst case is
# 32 + n + n/6 bytes); golang/snappy's reader accepts up to that, so we do too.
_MAX_COMPRESSED_CHUNK = _CRC_SIZE + cramjam.snappy.compress_raw_max_len(b"\x00" * _MAX_BLOCK)
_MAX_UNCOMPRESSED_CHUNK = _CRC_SIZE + _MAX_BLOCK

_HEADER = struct.Struct("<I")  # type in the low byte, 24-bit length above it
_HEADER_CRC = struct.Struct("<II")

_compress_raw = cramjam.snappy.compress_raw
_decompress_raw = cramjam.snappy.decompress_raw
_decompressed_len = cramjam.snappy.decompress_raw_len
_crc32c = crc32c.crc32c


def _masked_crc(data: bytes | memoryview) -> int:
    # The format masks the CRC so that CRCs of data containing CRCs do not look degenerate.
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class _Stream:
    """What both streams share: once decoding fails, it fails for good."""

    _failed = False
    _name = ""

    def decode(self, data: bytes) -> bytes:
        """Return the plain bytes carried by ``data``; incomplete input waits for more."""
        if self._failed:
            raise CompressionError(f"{self._name} stream already failed")
        try:
            return self._decode(data)
        except CompressionError:
            self._failed = True
            raise

    def _decode(self, data: bytes) -> bytes:
        raise NotImplementedError


class SnappyStream(_Stream):
    """snappy framing (stream) format, both directions."""

    _name = "snappy"

    def __init__(self, max_buffered: int = 16 * 1024 * 1024) -> None:
        # Bounds the plain bytes one decode() call may return. Pending input never exceeds one
        # chunk (chunk lengths are checked before buffering, skippable chunks are streamed past),
        # so the output is the only thing a peer could make large.
        self._max_buffered = max_buffered
        self._pending = bytearray()
        self._skip = 0  # bytes of a skippable chunk still to discard
        self._seen_stream_id = False
        self._failed = False
        self._wrote_stream_id = False

    def encode(self, data: bytes) -> bytes:
        """Frame ``data`` (one flush's worth of frames) as snappy chunks."""
        if not data:
            return b""
        parts: list[bytes | memoryview] = []
        if not self._wrote_stream_id:
            # Once per stream, like nsqd; peers accept it anywhere, so this is all they need.
            parts.append(_STREAM_ID_CHUNK)
            self._wrote_stream_id = True
        view = memoryview(data)
        for start in range(0, len(view), _MAX_BLOCK):
            block = view[start : start + _MAX_BLOCK]
            size = len(block)
            crc = _masked_crc(block)
            compressed = _compress_raw(block)
            # Same rule as golang/snappy's writer: compress only if it saves at least 12.5 %.
            if len(compressed) < size - size // 8:
                header = _CHUNK_COMPRESSED | (_CRC_SIZE + len(compressed)) << 8
                parts.append(_HEADER_CRC.pack(header, crc))
                parts.append(memoryview(compressed))
            else:
                header = _CHUNK_UNCOMPRESSED | (_CRC_SIZE + size) << 8
                parts.append(_HEADER_CRC.pack(header, crc))
                parts.append(block)
        return b"".join(parts)

    def _decode(self, data: bytes) -> bytes:
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = memoryview(data)[skipped:]
        pending = self._pending
        pending += data
        out: list[bytes] = []
        with memoryview(pending) as view:
            consumed = self._parse(view, out)
        del pending[:consumed]
        return b"".join(out)

    def _parse(self, view: memoryview, out: list[bytes]) -> int:
        """Decode whole chunks from ``view`` into ``out``; return how many bytes were used."""
        pos = 0
        end = len(view)
        produced = 0
        while end - pos >= 4:
            (header,) = _HEADER.unpack_from(view, pos)
            chunk_type = header & 0xFF
            length = header >> 8
            body = pos + 4
            if chunk_type == _CHUNK_STREAM_ID:
                if length != len(_STREAM_ID_PAYLOAD):
                    raise CompressionError("bad snappy stream identifier length")
                if end - body < length:
                    break
                if view[body : body + length] != _STREAM_ID_PAYLOAD:
                    raise CompressionError("bad snappy stream identifier")
                self._seen_stream_id = True
                pos = body + length
                continue
            if not self._seen_stream_id:
                # golang/snappy (nsqd) insists on the identifier before any other chunk.
                raise CompressionError("snappy stream does not start with a stream identifier")
            if chunk_type >= 0x80:
                # Padding (0xfe) and skippable chunks: discard without holding them in memory.
                available = end - body
                if available < length:
                    self._skip = length - available
                    return end
                pos = body + length
                continue
            if chunk_type == _CHUNK_COMPRESSED:
                limit = _MAX_COMPRESSED_CHUNK
            elif chunk_type == _CHUNK_UNCOMPRESSED:
                limit = _MAX_UNCOMPRESSED_CHUNK
            else:
                raise CompressionError(f"reserved snappy chunk type {chunk_type:#04x}")
            # Checked before waiting for the body, so a bogus length cannot make us buffer.
            if not _CRC_SIZE <= length <= limit:
                raise CompressionError(f"bad snappy chunk length {length}")
            if end - body < length:
                break
            (expected_crc,) = _HEADER.unpack_from(view, body)
            payload = view[body + _CRC_SIZE : body + length]
            if chunk_type == _CHUNK_COMPRESSED:
                chunk = self._decompress_block(payload)
            else:
                chunk = bytes(payload)
            payload.release()
            if _masked_crc(chunk) != expected_crc:
                raise CompressionError("snappy chunk checksum mismatch")
            produced += len(chunk)
            if produced > self._max_buffered:
                raise CompressionError("snappy input expands beyond max_buffered")
            out.append(chunk)
            pos = body + length
        return pos

    @staticmethod
    def _decompress_block(block: memoryview) -> bytes:
        try:
            # Read the declared size first so a forged header cannot make us allocate 4 GiB.
            if _decompressed_len(block) > _MAX_BLOCK:
                raise CompressionError("snappy chunk decodes to more than 65536 bytes")
            return bytes(_decompress_raw(block))
        except cramjam.DecompressionError as exc:
            raise CompressionError(f"corrupt snappy block: {exc}") from None


# -- raw deflate --------------------------------------------------------------------------------

_DEFLATE_WBITS = -15  # raw DEFLATE (RFC 1951): no zlib or gzip wrapper, as Go's compress/flate


class DeflateStream(_Stream):
    """raw DEFLATE (wbits=-15) both directions; each encode ends with a SYNC_FLUSH."""

    _name = "deflate"

    def __init__(self, level: int = 6, max_output: int = 16 * 1024 * 1024) -> None:
        # nsqd caps deflate_level at 6; stay within 1..6 even if the caller forgot to clamp.
        level = min(max(level, 1), 6)
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, _DEFLATE_WBITS)
        self._decompressor = zlib.decompressobj(_DEFLATE_WBITS)
        self._max_output = max_output
        self._failed = False

    def encode(self, data: bytes) -> bytes:
        """Compress one flush's worth of frames; the SYNC_FLUSH lets the peer decode it all now."""
        if not data:
            return b""
        return self._compressor.compress(data) + self._compressor.flush(zlib.Z_SYNC_FLUSH)

    def _decode(self, data: bytes) -> bytes:
        decompressor = self._decompressor
        if decompressor.eof:
            # The peer ended its stream (final block); nsqd's reader would hit EOF and close.
            raise CompressionError("data after the end of the deflate stream")
        try:
            # max_length caps what we materialise: one byte over the limit proves a bomb.
            out = decompressor.decompress(data, self._max_output + 1)
        except zlib.error as exc:
            raise CompressionError(f"corrupt deflate data: {exc}") from None
        if len(out) > self._max_output:
            raise CompressionError("deflate input expands beyond max_output")
        # Below the cap zlib consumed all input, so unconsumed_tail is empty; unused_data is
        # whatever followed a final block, which no NSQ client sends.
        if decompressor.unused_data:
            raise CompressionError("data after the end of the deflate stream")
        return out
