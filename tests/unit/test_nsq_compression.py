"""Tests for the NSQ snappy and deflate stream transforms (docs/protocols/nsq.md §9, §16)."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import struct
import zlib

import cramjam
import crc32c
import pytest
import snappy
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocols.nsq.compression import CompressionError, DeflateStream, SnappyStream

OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"  # size 6, frame type 0 (response), b"OK"
STREAM_ID = b"\xff\x06\x00\x00sNaPpY"


def masked_crc(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def chunk(chunk_type: int, payload: bytes) -> bytes:
    return struct.pack("<I", chunk_type | len(payload) << 8) + payload


def data_chunk(data: bytes, *, compressed: bool = False, crc: int | None = None) -> bytes:
    crc = masked_crc(data) if crc is None else crc
    body = bytes(cramjam.snappy.compress_raw(data)) if compressed else data
    return chunk(0x00 if compressed else 0x01, struct.pack("<I", crc) + body)


def parse_chunks(stream: bytes) -> list[tuple[int, int]]:
    """(type, length) of every chunk in a complete framed stream."""
    out = []
    pos = 0
    while pos < len(stream):
        (header,) = struct.unpack_from("<I", stream, pos)
        out.append((header & 0xFF, header >> 8))
        pos += 4 + (header >> 8)
    assert pos == len(stream)
    return out


def decode_in_pieces(decoder: SnappyStream | DeflateStream, data: bytes, cuts: list[int]) -> bytes:
    bounds = [0, *sorted({min(c, len(data)) for c in cuts}), len(data)]
    return b"".join(decoder.decode(data[a:b]) for a, b in itertools.pairwise(bounds))


compressible = st.builds(
    lambda unit, n: (unit * n)[:300_000],
    st.binary(min_size=1, max_size=64),
    st.integers(min_value=1, max_value=20_000),
)
payloads = st.one_of(
    st.binary(max_size=2000),
    compressible,
    # incompressible, and spanning several 64 KiB chunks
    st.builds(
        lambda seed, n: random.Random(seed).randbytes(n),
        st.integers(),
        st.integers(min_value=65_000, max_value=200_000),
    ),
)
cut_points = st.lists(st.integers(min_value=0, max_value=300_000), max_size=8)


# -- snappy: encoding ----------------------------------------------------------------------------


def test_snappy_ok_frame_matches_nsqd_transcript() -> None:
    assert SnappyStream().encode(OK_FRAME) == (
        b"\xff\x06\x00\x00sNaPpY\x01\x0e\x00\x00&\x98+\xcf\x00\x00\x00\x06\x00\x00\x00\x00OK"
    )


def test_snappy_stream_identifier_written_once() -> None:
    stream = SnappyStream()
    first = stream.encode(OK_FRAME)
    second = stream.encode(OK_FRAME)
    assert first.startswith(STREAM_ID)
    assert second == first[len(STREAM_ID) :]


def test_snappy_encode_empty_writes_nothing() -> None:
    stream = SnappyStream()
    assert stream.encode(b"") == b""
    assert stream.encode(OK_FRAME).startswith(STREAM_ID)


def test_snappy_chunking_and_compression_choice() -> None:
    data = b"a" * 65536 + os.urandom(65536) + b"b" * 10
    chunks = parse_chunks(SnappyStream().encode(data))
    assert chunks[0] == (0xFF, 6)
    assert chunks[1][0] == 0x00 and chunks[1][1] < 65536 // 8  # compressible: compressed
    assert chunks[2] == (0x01, 4 + 65536)  # random: stored, at the 64 KiB limit
    assert chunks[3] == (0x01, 4 + 10)  # the b"b" * 10 remainder is too short to gain
    assert len(chunks) == 4


def test_snappy_small_input_is_stored_unless_it_saves_an_eighth() -> None:
    # snappy emits blocks under 17 bytes as one literal (bigger than the input); 17 repeated
    # bytes become 6, a saving, so type 0x00.
    assert parse_chunks(SnappyStream().encode(b"x" * 16))[1] == (0x01, 4 + 16)
    assert parse_chunks(SnappyStream().encode(b"x" * 17))[1] == (0x00, 4 + 6)
    assert parse_chunks(SnappyStream().encode(OK_FRAME))[1] == (0x01, 4 + len(OK_FRAME))


# -- snappy: decoding ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(data=payloads, cuts=cut_points)
def test_snappy_round_trip(data: bytes, cuts: list[int]) -> None:
    encoded = SnappyStream().encode(data)
    assert decode_in_pieces(SnappyStream(), encoded, cuts) == data


@settings(max_examples=30, deadline=None)
@given(batches=st.lists(payloads, min_size=1, max_size=4), cuts=cut_points)
def test_snappy_round_trip_several_flushes(batches: list[bytes], cuts: list[int]) -> None:
    encoder = SnappyStream()
    encoded = b"".join(encoder.encode(batch) for batch in batches)
    assert decode_in_pieces(SnappyStream(), encoded, cuts) == b"".join(batches)


def test_snappy_decode_split_at_every_byte_boundary() -> None:
    plain = OK_FRAME + b"hello " * 20 + OK_FRAME
    encoded = (
        STREAM_ID
        + data_chunk(OK_FRAME)
        + chunk(0xFE, b"\x00" * 3)
        + data_chunk(b"hello " * 20, compressed=True)
        + STREAM_ID
        + chunk(0x80, b"skip me")
        + data_chunk(OK_FRAME)
    )
    for cut in range(len(encoded) + 1):
        decoder = SnappyStream()
        assert decoder.decode(encoded[:cut]) + decoder.decode(encoded[cut:]) == plain
    decoder = SnappyStream()
    assert b"".join(decoder.decode(encoded[i : i + 1]) for i in range(len(encoded))) == plain


def test_snappy_repeated_stream_identifiers_accepted() -> None:
    # pynsq makes a fresh StreamCompressor per send, so every command starts with the identifier.
    commands = [b"NOP\n", b"PUB t\n\x00\x00\x00\x05hello", b"RDY 1\n" * 50]
    wire = b"".join(snappy.StreamCompressor().add_chunk(cmd) for cmd in commands)
    assert wire.count(STREAM_ID) == len(commands)
    assert SnappyStream().decode(wire) == b"".join(commands)


def test_snappy_accepts_empty_data_chunk() -> None:
    assert SnappyStream().decode(STREAM_ID + data_chunk(b"") + data_chunk(b"x")) == b"x"


def test_snappy_skippable_chunk_is_streamed_not_buffered() -> None:
    decoder = SnappyStream()
    big = 2**24 - 1
    assert decoder.decode(STREAM_ID + struct.pack("<I", 0x80 | big << 8)) == b""
    piece = b"\x00" * 65536
    for _ in range(big // len(piece)):
        assert decoder.decode(piece) == b""
        assert len(decoder._pending) < 16  # nothing of the skipped chunk is held
    tail = big % len(piece)
    assert decoder.decode(b"\x00" * tail + data_chunk(OK_FRAME)) == OK_FRAME


def test_snappy_interop_python_snappy_to_gateway() -> None:
    data = b"".join(b"message %d " % i for i in range(20_000)) + os.urandom(70_000)
    wire = snappy.StreamCompressor().add_chunk(data)
    assert {t for t, _ in parse_chunks(wire)} >= {0x00, 0x01}  # both kinds exercised
    assert SnappyStream().decode(wire) == data


def test_snappy_interop_gateway_to_python_snappy() -> None:
    encoder = SnappyStream()
    batches = [OK_FRAME, b"x" * 100_000, os.urandom(70_000), OK_FRAME]
    wire = b"".join(encoder.encode(batch) for batch in batches)
    assert snappy.StreamDecompressor().decompress(wire) == b"".join(batches)


# -- snappy: corrupt input -----------------------------------------------------------------------


def assert_snappy_rejects(wire: bytes) -> None:
    decoder = SnappyStream()
    with pytest.raises(CompressionError):
        decoder.decode(wire)
    with pytest.raises(CompressionError):  # the stream stays dead
        decoder.decode(STREAM_ID + data_chunk(OK_FRAME))


def test_snappy_bad_crc() -> None:
    assert_snappy_rejects(STREAM_ID + data_chunk(OK_FRAME, crc=masked_crc(OK_FRAME) ^ 1))
    assert_snappy_rejects(STREAM_ID + data_chunk(b"y" * 100, compressed=True, crc=0))


@pytest.mark.parametrize("chunk_type", [0x02, 0x03, 0x41, 0x7F])
def test_snappy_reserved_chunk_type(chunk_type: int) -> None:
    assert_snappy_rejects(STREAM_ID + chunk(chunk_type, b"abcd"))


def test_snappy_reserved_chunk_type_rejected_from_header_alone() -> None:
    with pytest.raises(CompressionError):
        SnappyStream().decode(STREAM_ID + struct.pack("<I", 0x02 | 100 << 8))


@pytest.mark.parametrize(
    ("chunk_type", "length"),
    [(0x01, 65536 + 5), (0x00, 76490 + 5), (0x00, 2**24 - 1), (0x01, 3), (0x00, 0)],
)
def test_snappy_bad_chunk_length_rejected_from_header_alone(chunk_type: int, length: int) -> None:
    with pytest.raises(CompressionError):
        SnappyStream().decode(STREAM_ID + struct.pack("<I", chunk_type | length << 8))


def test_snappy_largest_valid_chunks_accepted() -> None:
    data = os.urandom(65536)
    stored = data_chunk(data)
    # A compressed chunk may be bigger than its data; snappy's worst case is legal input.
    forced = data_chunk(data, compressed=True)
    assert len(forced) > len(stored)
    assert SnappyStream().decode(STREAM_ID + stored + forced) == data * 2


def test_snappy_compressed_chunk_larger_than_64k_rejected() -> None:
    assert_snappy_rejects(STREAM_ID + data_chunk(b"z" * 65537, compressed=True))


def test_snappy_forged_block_length_rejected() -> None:
    # Varint length 2**32 - 1 in a tiny block: must fail before any allocation of that size.
    block = b"\xff\xff\xff\xff\x0f" + b"\x00abc"
    assert_snappy_rejects(STREAM_ID + chunk(0x00, struct.pack("<I", 0) + block))


def test_snappy_corrupt_block_rejected() -> None:
    assert_snappy_rejects(STREAM_ID + chunk(0x00, struct.pack("<I", 0) + b"\x05\xff\xff"))


def test_snappy_data_before_stream_identifier_rejected() -> None:
    assert_snappy_rejects(data_chunk(OK_FRAME))
    assert_snappy_rejects(chunk(0xFE, b""))


def test_snappy_bad_stream_identifier_rejected() -> None:
    assert_snappy_rejects(b"\xff\x06\x00\x00sNaPpX")
    assert_snappy_rejects(chunk(0xFF, b"sNaPpY!"))


def test_snappy_output_bound() -> None:
    wire = SnappyStream().encode(b"\x00" * 200_000)
    assert len(SnappyStream(max_buffered=200_000).decode(wire)) == 200_000
    with pytest.raises(CompressionError):
        SnappyStream(max_buffered=199_999).decode(wire)


chunk_types = st.one_of(
    st.sampled_from([0x00, 0x01, 0xFF, 0xFE, 0x80, 0xFD, 0x02, 0x7F]), st.integers(0, 255)
)


@st.composite
def garbage_chunks(draw: st.DrawFn) -> bytes:
    """Chunk-shaped garbage: plausible headers, sometimes valid CRCs, sometimes lying lengths."""
    out = [STREAM_ID] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 6))):
        chunk_type = draw(chunk_types)
        payload = draw(st.binary(max_size=80))
        if draw(st.booleans()):
            payload = struct.pack("<I", masked_crc(payload)) + payload
        if chunk_type == 0x00 and draw(st.booleans()):
            payload = payload[:4] + bytes(cramjam.snappy.compress_raw(payload[4:]))
        length = draw(st.one_of(st.just(len(payload)), st.integers(0, 2**24 - 1)))
        out.append(struct.pack("<I", chunk_type | length << 8) + payload)
    return b"".join(out)


@settings(max_examples=400, deadline=None)
@given(wire=st.one_of(st.binary(max_size=300), garbage_chunks()), cuts=cut_points)
def test_snappy_garbage_only_raises_compression_error(wire: bytes, cuts: list[int]) -> None:
    with contextlib.suppress(CompressionError):
        decode_in_pieces(SnappyStream(), wire, cuts)


# -- deflate -------------------------------------------------------------------------------------

# docs/protocols/nsq.md §16: nsqd v1.3.0 at deflate_level 3, the OK frame after the IDENTIFY
# response.
NSQD_DEFLATED_OK = b"b```c```\xf0\xf7\x06\x00\x00\x00\xff\xff\x00\x00\x00\xff\xff"
SYNC_MARKER = b"\x00\x00\xff\xff"


def test_deflate_decodes_nsqd_transcript() -> None:
    # Go's compress/flate: all literals (its matches start at 4 bytes) and two empty stored
    # blocks (nsqd flushes twice); the gateway must read such streams from Go clients too.
    assert DeflateStream().decode(NSQD_DEFLATED_OK) == OK_FRAME


def test_deflate_ok_frame_at_level_3_is_equivalent_to_nsqd() -> None:
    # Byte equality with Go is not attainable with zlib (zlib uses a 3-byte match for the zeros
    # that Go's encoder cannot); what matters is the same plaintext, flushed and not finished.
    encoded = DeflateStream(level=3).encode(OK_FRAME)
    assert encoded.endswith(SYNC_MARKER)
    assert encoded[:5] == NSQD_DEFLATED_OK[:5]  # same first literals, fixed Huffman block
    peer = zlib.decompressobj(-15)
    assert peer.decompress(encoded) == OK_FRAME
    assert not peer.eof


def test_deflate_each_encode_is_immediately_decodable() -> None:
    encoder = DeflateStream()
    peer = zlib.decompressobj(-15)
    for batch in [OK_FRAME, b"x" * 70_000, os.urandom(5000), OK_FRAME]:
        encoded = encoder.encode(batch)
        assert encoded.endswith(SYNC_MARKER)
        assert peer.decompress(encoded) == batch


def test_deflate_encode_empty_writes_nothing() -> None:
    assert DeflateStream().encode(b"") == b""


@pytest.mark.parametrize("level", [-1, 0, 1, 3, 6, 9, 100])
def test_deflate_level_clamped(level: int) -> None:
    encoded = DeflateStream(level=level).encode(b"abc" * 1000)
    assert zlib.decompressobj(-15).decompress(encoded) == b"abc" * 1000


@pytest.mark.parametrize("level", [1, 3, 6, 9])
def test_deflate_interop_with_zlib(level: int) -> None:
    batches = [b"NOP\n", b"PUB t\n\x00\x00\x00\x05hello" * 300, os.urandom(70_000), b"CLS\n"]
    client = zlib.compressobj(level, zlib.DEFLATED, -15)
    wire = b"".join(client.compress(b) + client.flush(zlib.Z_SYNC_FLUSH) for b in batches)
    assert decode_in_pieces(DeflateStream(), wire, [1, 7, 500, 40_000]) == b"".join(batches)

    encoder = DeflateStream(level=min(level, 6))
    peer = zlib.decompressobj(-15)
    assert b"".join(peer.decompress(encoder.encode(b)) for b in batches) == b"".join(batches)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(payloads, min_size=1, max_size=3), level=st.integers(1, 6), cuts=cut_points)
def test_deflate_round_trip(batches: list[bytes], level: int, cuts: list[int]) -> None:
    encoder = DeflateStream(level=level)
    wire = b"".join(encoder.encode(batch) for batch in batches)
    assert decode_in_pieces(DeflateStream(), wire, cuts) == b"".join(batches)


def test_deflate_bomb_guard() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = compressor.compress(b"\x00" * 50_000_000) + compressor.flush(zlib.Z_SYNC_FLUSH)
    assert len(bomb) < 100_000
    with pytest.raises(CompressionError):
        DeflateStream(max_output=1_000_000).decode(bomb)


def test_deflate_output_bound_is_exact() -> None:
    wire = DeflateStream().encode(b"\x00" * 100_000)
    assert len(DeflateStream(max_output=100_000).decode(wire)) == 100_000
    decoder = DeflateStream(max_output=99_999)
    with pytest.raises(CompressionError):
        decoder.decode(wire)
    with pytest.raises(CompressionError):  # the stream stays dead
        decoder.decode(b"")


def test_deflate_corrupt_input() -> None:
    with pytest.raises(CompressionError):
        DeflateStream().decode(b"\xff\xff\xff\xff")  # BTYPE 11 is invalid


def test_deflate_data_after_final_block_rejected() -> None:
    finished = zlib.compressobj(6, zlib.DEFLATED, -15)
    wire = finished.compress(OK_FRAME) + finished.flush()
    decoder = DeflateStream()
    assert decoder.decode(wire) == OK_FRAME
    with pytest.raises(CompressionError):
        decoder.decode(b"\x00")
    with pytest.raises(CompressionError):
        DeflateStream().decode(wire + b"junk")


@settings(max_examples=300, deadline=None)
@given(wire=st.binary(max_size=400), cuts=cut_points)
def test_deflate_garbage_only_raises_compression_error(wire: bytes, cuts: list[int]) -> None:
    with contextlib.suppress(CompressionError):
        decode_in_pieces(DeflateStream(max_output=10_000), wire, cuts)
