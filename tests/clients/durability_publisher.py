"""A publisher for the crash tests: publishes distinct binary bodies with a real client library
until the server goes away, and writes down every body it got an acknowledgement for.

    durability_publisher.py MODE --port P --topic T --tag TAG --seed S [--window W] [--batch K]

MODE picks the library and the command:

* ``pub``:  pynsq 0.9.1 ``nsq.Writer.pub``, one message per PUB, up to ``--window`` PUBs
  outstanding (pynsq matches each OK to the oldest outstanding command of the connection);
* ``mpub``: gnsq 1.0.2 ``Producer.multipublish``, ``--batch`` bodies per MPUB, up to
  ``--window`` MPUBs outstanding;
* ``put``:  greenstalk 2.1.1 ``Client.put`` into tube ``--topic``, one at a time (greenstalk
  is synchronous).

Every line on stdout is flushed as soon as it is written, so that a test reading it while the
server is SIGKILLed sees exactly what the client knew:

* ``S <hex>``: this body is about to be sent (written before the bytes leave);
* ``A <hex>``: the server acknowledged this body (OK, or INSERTED);
* ``END <reason>``: the run stopped (``count`` reached, or the first error, e.g. the connection
  closed by a killed server); the exit status is 0 either way.

Bodies are ``TAG:INDEX:`` followed by seeded random bytes (0-150 of them) and always by
``\\x00\\r\\n\\xff``, so every body is distinct, holds bytes no text protocol would pass
unescaped, and can be told apart from any other run's.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

BINARY_TAIL = b"\x00\r\n\xff"


def bodies(tag: str, seed: int) -> Iterator[bytes]:
    rng = random.Random(f"{seed}:{tag}")
    i = 0
    while True:
        yield b"%s:%d:" % (tag.encode(), i) + rng.randbytes(rng.randrange(151)) + BINARY_TAIL
        i += 1


class Journal:
    """The S/A/END lines, each flushed at once (the test reads them while we run)."""

    def __init__(self) -> None:
        self.out = sys.stdout.buffer
        self.acked = 0

    def _write(self, lines: list[bytes]) -> None:
        self.out.write(b"".join(lines))
        self.out.flush()

    def sending(self, batch: list[bytes]) -> None:
        self._write([b"S " + b.hex().encode() + b"\n" for b in batch])

    def acked_bodies(self, batch: list[bytes]) -> None:
        self.acked += len(batch)
        self._write([b"A " + b.hex().encode() + b"\n" for b in batch])

    def end(self, reason: str) -> None:
        self._write([b"END " + reason.replace("\n", " ").encode() + b"\n"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["pub", "mpub", "put"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", required=True, help="NSQ topic or beanstalkd tube")
    p.add_argument("--tag", required=True, help="prefix of every body")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=8, help="commands outstanding (pub, mpub)")
    p.add_argument("--batch", type=int, default=20, help="bodies per MPUB")
    p.add_argument("--count", type=int, default=0, help="stop after N bodies (0: no limit)")
    return p.parse_args(argv)


def limited(args: argparse.Namespace) -> Iterator[bytes]:
    for i, body in enumerate(bodies(args.tag, args.seed)):
        if args.count and i >= args.count:
            return
        yield body


def run_pub(args: argparse.Namespace, journal: Journal) -> str:
    import nsq
    from tornado.ioloop import IOLoop

    loop = IOLoop.current()
    source = limited(args)
    outstanding = 0
    stopped: list[str] = []

    class Writer(nsq.Writer):
        def _on_connection_close(self, conn: Any, **kwargs: Any) -> None:
            super()._on_connection_close(conn, **kwargs)  # fails the outstanding callbacks
            stop("error: connection closed")  # also when it never connected: no retrying

    writer = Writer([f"{args.host}:{args.port}"])

    def stop(reason: str) -> None:
        if not stopped:
            stopped.append(reason)
            loop.stop()

    def send_more() -> None:
        nonlocal outstanding
        while not stopped and outstanding < args.window:
            body = next(source, None)
            if body is None:
                if outstanding == 0:
                    stop("count")
                return
            journal.sending([body])
            outstanding += 1
            writer.pub(args.topic, body, callback=replied(body))

    def replied(body: bytes) -> Callable[[Any, Any], None]:
        def callback(conn: Any, data: Any) -> None:
            nonlocal outstanding
            outstanding -= 1
            if data == b"OK":
                journal.acked_bodies([body])
                send_more()
            else:
                stop(f"error {data!r}")

        return callback

    def start() -> None:
        if not writer.conns:  # not connected yet: pub() would fail with "no open connections"
            loop.call_later(0.005, start)
            return
        send_more()

    loop.add_callback(start)
    loop.start()
    return stopped[0] if stopped else "stopped"


def run_mpub(args: argparse.Namespace, journal: Journal) -> str:
    import gnsq

    producer = gnsq.Producer([f"{args.host}:{args.port}"])
    producer.start()  # connects and IDENTIFYs before returning
    source = limited(args)
    pending: deque[tuple[list[bytes], Any]] = deque()
    try:
        while True:
            while len(pending) < args.window:
                batch = [b for _, b in zip(range(args.batch), source, strict=False)]
                if not batch:
                    break
                journal.sending(batch)
                result = producer.multipublish(args.topic, batch, timeout=2, raise_error=False)
                pending.append((batch, result))
            if not pending:
                return "count"
            batch, result = pending.popleft()
            reply = result.get(timeout=30)
            if reply != b"OK":
                return f"error {reply!r}"
            journal.acked_bodies(batch)
    except Exception as exc:  # the connection closed: gnsq raises NSQException subclasses
        return f"error {exc!r}"
    finally:
        producer.close()


def run_put(args: argparse.Namespace, journal: Journal) -> str:
    import greenstalk

    try:
        with greenstalk.Client((args.host, args.port), encoding=None, use=args.topic) as client:
            for body in limited(args):
                journal.sending([body])
                client.put(body, ttr=120)
                journal.acked_bodies([body])
    except (OSError, greenstalk.Error) as exc:
        return f"error {exc!r}"
    return "count"


def main() -> int:
    args = parse_args()
    journal = Journal()
    runners = {"pub": run_pub, "mpub": run_mpub, "put": run_put}
    reason = runners[args.mode](args, journal)
    journal.end(f"{reason} after {journal.acked} acknowledged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
