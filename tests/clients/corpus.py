"""Message bodies shared by the tests and the client scripts.

The test writes the bodies to a file; a publisher script reads them and publishes them; a
consumer script reports what it received as (attempts, sha256 of the body). Comparing digests
is comparing the bodies byte for byte.

File format: for each body a 4-byte big-endian length, then the body (nsqjs_client.js reads the
same format). Imported by the tests as ``tests.clients.corpus`` and by the Python client scripts
as ``corpus`` (their own directory is on sys.path), so it uses the standard library only.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Iterable
from pathlib import Path

_LEN = struct.Struct(">I")

# nsqd's default --max-msg-size: the largest body a PUB may carry.
MAX_MSG_SIZE = 1048576

# Bodies that break naive framing: line endings, NULs, things that look like commands and
# frames, invalid UTF-8. Each is sent exactly as written.
AWKWARD = [
    b"\n",
    b"\r\n",
    b"\x00",
    b"\x00\x00\x00\x00",
    b"\r\n\r\n",
    b"\n\n\n",
    b" ",
    b"\xff\xfe\xfd",
    b"\xc3\x28",  # invalid UTF-8
    "h\u00e9llo w\u00f6rld \u2603".encode(),
    b"PUB topic\n\x00\x00\x00\x01x",
    b"FIN 0123456789abcdef\n",
    b"\x00\x00\x00\x06\x00\x00\x00\x00OK",
    b"\x00\x00\x00\x0b\x00\x00\x00\x00_heartbeat_",
    b'{"json": true}\r\n',
    b"\xff\x06\x00\x00sNaPpY",  # the snappy stream identifier
    b"\x00\x00\xff\xff",  # a deflate SYNC_FLUSH marker
]

_NASTY = b"\n\r\x00\xff \x01"


def make_bodies(n: int, *, seed: int = 0, max_size: int = 600, big: int = 0) -> list[bytes]:
    """`n` distinct bodies: the AWKWARD ones, then random binary ones (sizes 1..max_size, dense in
    `\\n`, `\\r`, NUL); with `big`, one body of exactly MAX_MSG_SIZE bytes first and `big - 1`
    just under it last."""
    rng = random.Random(seed)
    bodies = list(AWKWARD[: max(0, n - big)])
    i = 0
    while len(bodies) < n - big:
        size = rng.randint(1, max_size)
        raw = bytearray(rng.randbytes(size))
        for _ in range(size // 8):
            raw[rng.randrange(size)] = rng.choice(_NASTY)
        # A unique tag keeps the bodies distinct, so a duplicate delivery cannot hide.
        tag = b"%d\n" % i
        bodies.append(tag + bytes(raw))
        i += 1
    for j in range(big):
        size = MAX_MSG_SIZE - j * 4099
        body = bytearray(rng.randbytes(size))
        body[: 4 + len(str(j))] = b"big%d\n" % j
        body[-3:] = b"\r\n\x00"
        # the first big body leads (a publisher's PUBs start there), the others trail (MPUB)
        if j == 0:
            bodies.insert(0, bytes(body))
        else:
            bodies.append(bytes(body))
    assert len(set(bodies)) == len(bodies) == n
    return bodies


def digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def write_bodies(path: str | Path, bodies: Iterable[bytes]) -> None:
    with open(path, "wb") as f:
        for body in bodies:
            f.write(_LEN.pack(len(body)))
            f.write(body)


def read_bodies(path: str | Path) -> list[bytes]:
    data = Path(path).read_bytes()
    bodies = []
    pos = 0
    while pos < len(data):
        (size,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        bodies.append(data[pos : pos + size])
        pos += size
    return bodies
