"""Per-operation cost of the NATS client codec and the subject index, in-process.

These were timed assertions in the unit tests; a timing belongs here, where a reader
compares it with the figure below instead of a busy CI machine failing on it.

    .venv/bin/python bench/codecs.py [--ops N]

Prints the best of five runs per operation, in microseconds. On this 2-vCPU machine each
codec parse was about 1 µs and a cached subject match well under 1 µs.
"""

from __future__ import annotations

import argparse
import time

from gateway.protocols.nats.client_codec import NATSClientCodec
from gateway.subjects import SubjectIndex

PARSES = {
    "PUB": b"PUB foo 16\r\n0123456789abcdef\r\n",
    "PUB (nats-py's double space)": b"PUB foo  16\r\n0123456789abcdef\r\n",
    "PUB with a reply subject": b"PUB foo.bar _INBOX.abc.1 16\r\n0123456789abcdef\r\n",
    "HPUB": b"HPUB foo 12 28\r\nNATS/1.0\r\n\r\n0123456789abcdef\r\n",
}


def parse_cost(frame: bytes, n: int) -> float:
    """Seconds per frame to parse `n` copies arriving in one read (best of five)."""
    data = frame * n
    best = float("inf")
    for _ in range(5):
        codec = NATSClientCodec()
        codec.headers = True  # as after a CONNECT with headers:true
        start = time.perf_counter()
        codec.receive_data(data)
        while codec.next_event() is not None:
            pass
        best = min(best, time.perf_counter() - start)
    return best / n


def match_cost(n: int) -> float:
    """Seconds per cached match of one subject among 2,001 patterns (best of five)."""
    index = SubjectIndex()
    for i in range(1000):
        index.add(f"foo.{i}", i)
        index.add(f"foo.{i}.*", i)
    index.add("foo.>", "all")
    index.match("foo.500")  # the first match fills the cache
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            index.match("foo.500")
        best = min(best, time.perf_counter() - start)
    return best / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=20000, help="operations per run")
    args = parser.parse_args()
    for name, frame in PARSES.items():
        print(f"parse {name}: {parse_cost(frame, args.ops) * 1e6:.2f} µs")
    print(f"subject match, cached: {match_cost(args.ops * 5) * 1e6:.3f} µs")


if __name__ == "__main__":
    main()
