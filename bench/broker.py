"""The broker's own cost per message, in-process, no sockets (a benchmark, not a test).

What a message costs the broker itself, apart from every protocol and socket, on the
memory store (the protocol sessions' and the store's costs are measured by nsq.py,
beanstalk.py, nats.py and store.py):

* ``publish``        ``broker.publish(topic, [body])`` one message at a time into a topic
                     with one group and no consumer: µs per message;
* ``publish x100``   the same, 100 bodies per call (an MPUB);
* ``deliver + ack``  a consumer with RDY 1000 over a group holding N ready messages:
                     each delivery handed to the sink, then ``finish`` (FIN) for each;
* ``deliver + ack, FIN batches``  the same, but the FINs of what the sink got are
                     applied with ``pump=False`` and the window refilled once per batch
                     (``Group.pump``), as the NSQ session applies a read's FINs;
* ``fan-out x4``     one message at a time into a topic with four groups.

Each figure is the best of ``--repeat`` runs (GC frozen after set-up, as the gateway does
at start), in µs of CPU per message; the same run prints the Python version and the
machine's load, since these are small numbers.

The store is the one ``--store memory://`` makes (``MemoryStore(forgets=True)``: the broker
records its messages nowhere); ``--recording`` runs on the memory store that keeps a
record of every message, as the contract suite and the broker's tests use it (and as
every store did before 2026-11-26).

    .venv/bin/python bench/broker.py
    .venv/bin/python bench/broker.py -n 200000 --repeat 5
    .venv/bin/python bench/broker.py --recording
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gateway.broker import Broker, Consumer
from gateway.model import Message
from gateway.stores import MemoryStore

BODY = b"x" * 200


class Sink:
    """A consumer's connection reduced to a list: what a session's outbox would hold."""

    def __init__(self) -> None:
        self.got: list[Message] = []

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        self.got.append(message)
        return True


RECORDING = False  # --recording


async def fresh() -> Broker:
    b = Broker(MemoryStore(forgets=not RECORDING))
    await b.open()
    return b


def cpu_us_per(n: int, fn: Callable[[], None]) -> float:
    gc.collect()
    gc.freeze()
    t = time.process_time()
    fn()
    return (time.process_time() - t) / n * 1e6


async def publish_one(n: int, groups: int) -> float:
    b = await fresh()
    for i in range(groups):
        b.group("t", f"g{i}")
    publish = b.publish

    def run() -> None:
        for _ in range(n):
            publish("t", [BODY])

    return cpu_us_per(n, run)


async def publish_batch(n: int) -> float:
    b = await fresh()
    b.group("t", "g")
    batch = [BODY] * 100

    def run() -> None:
        for _ in range(n // 100):
            b.publish("t", batch)

    return cpu_us_per(n, run)


async def deliver_ack(n: int, *, batched: bool = False) -> float:
    """`batched`: a batch's FINs finished together (`finish_many`), then one refill (the
    NSQ session's way); otherwise each FIN refills the window by one."""
    b = await fresh()
    g = b.group("t", "g")
    b.publish("t", [BODY] * n)
    sink = Sink()
    consumer = g.attach(sink, 60)
    finish, finish_many, pump = g.finish, g.finish_many, g.pump

    def run() -> None:
        consumer.set_ready(1000)
        done = 0
        while done < n:
            got, sink.got = sink.got, []
            if batched:
                finish_many(consumer, [m.id for m in got])
                pump()
            else:
                for m in got:
                    finish(consumer, m.id)  # each FIN refills the window by one
            done += len(got)
            if not got:
                break

    return cpu_us_per(n, run)


async def main(args: argparse.Namespace) -> None:
    cases: list[tuple[str, Callable[[], Awaitable[float]]]] = [
        ("publish", lambda: publish_one(args.n, 1)),
        ("publish x100", lambda: publish_batch(args.n)),
        ("deliver + ack", lambda: deliver_ack(args.n)),
        ("deliver + ack, FIN batches", lambda: deliver_ack(args.n, batched=True)),
        ("fan-out x4", lambda: publish_one(args.n // 4, 4)),
    ]
    global RECORDING
    RECORDING = args.recording
    store = "MemoryStore() (recording)" if RECORDING else "memory:// (MemoryStore(forgets=True))"
    print(f"# python {sys.version.split()[0]}, load {os.getloadavg()[0]:.2f}, "
          f"n={args.n}, best of {args.repeat}, store {store}")  # fmt: skip
    print(f"{'workload':27s} {'µs/msg':>8s}  runs")
    for name, case in cases:
        runs = [await case() for _ in range(args.repeat)]
        print(f"{name:27s} {min(runs):8.2f}  {', '.join(f'{r:.2f}' for r in runs)}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("-n", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--recording", action="store_true", help="the recording memory store")
    trio.run(main, p.parse_args())
