"""NATS message headers (HPUB, HMSG, and the route's HMSG): the `NATS/1.0` block and the
ordered pairs the broker keeps. Sans-IO: shared by the client and the route sessions."""

from __future__ import annotations

_HEADER_LINE = b"NATS/1.0\r\n"


def parse_headers(block: bytes) -> list[tuple[str, str]]:
    """`NATS/1.0[ status]\\r\\nName: value\\r\\n...\\r\\n` -> ordered pairs (names may repeat)."""
    pairs = []
    for line in block.split(b"\r\n")[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if sep:
            pairs.append(
                (name.decode("utf-8", "replace"), value.strip().decode("utf-8", "replace"))
            )
    return pairs


def encode_headers(pairs: list[tuple[str, str]]) -> bytes:
    return _HEADER_LINE + b"".join(f"{k}: {v}\r\n".encode() for k, v in pairs) + b"\r\n"
