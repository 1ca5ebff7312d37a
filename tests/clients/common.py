"""Command line and result bookkeeping shared by the Python client scripts.

Every script takes the same options and prints one JSON line on stdout when it is done:

* publisher (``pub``): ``{"commands": k, "ok": n, "errors": [...], "closes": c}`` - one entry
  per PUB/MPUB sent; ``ok`` counts the ``OK`` replies.
* consumer (``sub``): ``{"deliveries": [[attempts, sha256], ...], "fins": n, "reqs": n,
  "closes": c, "errors": [...], "timed_out": false}`` - every delivery in arrival order.

A consumer stops by itself after ``--count`` FINs (or, with ``--no-fin``, after ``--count``
deliveries, exiting at once without answering them: a crash). With ``--count 0`` it runs until
its stdin closes. ``--timeout`` bounds every run: the script then prints what it has and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import corpus


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["pub", "sub"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--channel", default="ch")
    # publisher
    p.add_argument("--bodies", help="file of length-prefixed bodies to publish")
    p.add_argument("--pub", type=int, default=0, help="publish the first N bodies with PUB")
    p.add_argument("--batch", type=int, default=100, help="MPUB batch size for the rest")
    p.add_argument("--defer", type=int, default=0, help="publish the PUB bodies with DPUB (ms)")
    p.add_argument(
        "--http-port",
        type=int,
        default=0,
        help="gnsq: publish over nsqd's HTTP API at this port (/pub, binary /mpub)",
    )
    # consumer
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--max-in-flight", type=int, default=1)
    p.add_argument("--req-first", action="store_true", help="REQ 0 every first attempt")
    p.add_argument("--no-fin", action="store_true")
    p.add_argument("--msg-timeout", type=int, default=0, help="IDENTIFY msg_timeout (ms)")
    p.add_argument(
        "--lookupd-port",
        type=int,
        default=0,
        help="pynsq, gnsq: find nsqd only through nsqlookupd's /lookup at this HTTP port",
    )
    # transport
    p.add_argument("--snappy", action="store_true")
    p.add_argument("--deflate", action="store_true")
    p.add_argument("--tls-ca", help="negotiate TLS and verify the server against this CA")
    p.add_argument("--timeout", type=float, default=60.0)
    return p.parse_args(argv)


def split_batches(args: argparse.Namespace) -> tuple[list[bytes], list[list[bytes]]]:
    """The bodies to PUB one by one, and the MPUB batches for the rest."""
    bodies = corpus.read_bodies(args.bodies)
    singles = bodies[: args.pub]
    rest = bodies[args.pub :]
    batches = [rest[i : i + args.batch] for i in range(0, len(rest), args.batch)]
    if len(batches) > 1 and len(batches[-1]) == 1:
        # ansq sends a one-message MPUB without the count prefix (E_BAD_BODY): avoid it
        batches[-2] += batches.pop()
    return singles, batches


@dataclass
class PubResult:
    commands: int = 0
    ok: int = 0
    errors: list[str] = field(default_factory=list)
    closes: int = 0
    close_reasons: list[str] = field(default_factory=list)

    def reply(self, data: Any) -> None:
        if data == b"OK" or data == "OK":
            self.ok += 1
        else:
            self.errors.append(repr(data))

    @property
    def done(self) -> bool:
        return self.ok + len(self.errors) >= self.commands

    def emit(self) -> None:
        _emit(
            {
                "commands": self.commands,
                "ok": self.ok,
                "errors": self.errors,
                "closes": self.closes,
                "close_reasons": self.close_reasons,
            }
        )


@dataclass
class SubResult:
    count: int
    no_fin: bool = False
    deliveries: list[tuple[int, str]] = field(default_factory=list)
    fins: int = 0
    reqs: int = 0
    closes: int = 0
    close_reasons: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    timed_out: bool = False

    def delivered(self, attempts: int, body: bytes) -> None:
        self.deliveries.append((attempts, corpus.digest(body)))

    @property
    def done(self) -> bool:
        if not self.count:
            return False
        return (len(self.deliveries) if self.no_fin else self.fins) >= self.count

    def emit(self) -> None:
        _emit(
            {
                "deliveries": self.deliveries,
                "fins": self.fins,
                "reqs": self.reqs,
                "closes": self.closes,
                "close_reasons": self.close_reasons,
                "errors": self.errors,
                "timed_out": self.timed_out,
            }
        )


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
