"""Benchmark of the gateway's NSQ TCP listener with a raw-socket client (not a test).

Workloads, each on a fresh topic, 200-byte bodies by default:

* ``pub``     PUB one message at a time, waiting for each OK: msgs/s and round-trip latency.
* ``mpub``    MPUB batches of ``--batch`` (100), up to ``--window`` (8) commands outstanding
              so that the server, not the client's round trips, sets the pace: msgs/s.
* ``sub``     SUB first (RDY 0), fill the topic with MPUB from a second connection, then
              ``RDY --rdy`` (1000) and time until every message is received and FINed.
* ``latency`` a publisher process PUBs one at a time (a timestamp in each body) while this
              process consumes with SUB + RDY + FIN: publish-to-receive latency.

The reference is real nsqd 1.3.0 on this 2-vCPU machine (bench/README.md, "Anchor figures").
No package registry ships nsqd (bench/README.md, "Real servers", says how to build it), so by
default the anchor figures are printed next to the gateway's, labelled as not measured in
this run. With ``--nsqd ADDR``
(a running nsqd), or ``--nsqd-bin PATH`` (an nsqd binary this script starts pinned like the
gateway, with ``--nsqd-args``), the same workloads also run against it, and the ratio is a
measured one.

The script starts the gateway itself (``python -m gateway serve --nsq 127.0.0.1:0 --http off
--store memory://`` from the repository root, pinned as ``--pin`` says) unless ``--addr`` is
given, and stops it at the end. All traffic stays on loopback.

    .venv/bin/python bench/nsq.py                          # all workloads, default sizes
    .venv/bin/python bench/nsq.py -n 20000 --only pub,sub  # quick look
    .venv/bin/python bench/nsq.py --pin same               # server and client on CPU 0
    .venv/bin/python bench/nsq.py --nsqd 127.0.0.1:4150    # side by side with a real nsqd
    .venv/bin/python bench/nsq.py --nsqd-bin ../nsq/nsqd --nsqd-args=--mem-queue-size=0 \
        --gateway-args "--store sqlite:///tmp/gw-bench/gateway.db"   # both durable
    .venv/bin/python bench/nsq.py --addr 127.0.0.1:4150    # an already running gateway
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

# bench/ is a folder of scripts: its helpers are found next to this file, however it is run
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Address,
    GatewayProcess,
    Nsqd,
    Placement,
    Watchdog,
    connect,
    format_addr,
    format_latency_us,
    format_table,
    make_placement,
    median_runs,
    parse_addr,
    pid_listening_on,
    process_cpu_seconds,
    si,
)

# -- wire constants (docs/protocols/nsq.md §1 and §4) -------------------------------------

MAGIC = b"  V2"
FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2
OK = b"OK"
HEARTBEAT = b"_heartbeat_"
NOP = b"NOP\n"
# A frame is [uint32 size][int32 type][data]; a message's data is
# [int64 timestamp][uint16 attempts][16-byte id][body], so from the start of the frame:
ID_START, ID_END = 18, 34
BODY_START = 34
HEADER = struct.Struct(">Ii")
BE32 = struct.Struct(">I")
STAMP = struct.Struct(">q")
MAX_RDY = 2500  # nsqd's default max-rdy-count

# One big receive buffer: a burst of message frames is parsed and FINed per recv, not per
# message. Compact when less than COMPACT_BELOW bytes are free behind the data.
RECV_BUFFER = 4 << 20
COMPACT_BELOW = 256 << 10

# -- the command-line contract of the gateway ------------------------------------------

GATEWAY_ARGS = [
    "serve",
    "--nsq",
    "127.0.0.1:0",
    "--beanstalk",
    "off",
    "--nats",
    "off",
    "--http",
    "off",
    "--nats-route",
    "off",
    "--store",
    "memory://",
]
# Listeners this build does not have yet; add them with --other-listeners-off.
OTHER_LISTENERS_OFF = [
    "--rocketmq",
    "off",
]

# -- references ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Anchor:
    low: float
    high: float

    def text(self) -> str:
        return si(self.low) if self.low == self.high else f"{si(self.low)}-{si(self.high)}"

    def ratio(self, rate: float) -> str:
        if self.low == self.high:
            return f"{rate / self.low:.2f}"
        return f"{rate / self.high:.2f}-{rate / self.low:.2f}"


# bench/README.md "Anchor figures": nsqd 1.3.0 on this 2-vCPU machine, raw socket, 200 B.
ANCHORS: dict[str, Anchor] = {
    "pub": Anchor(14_000, 16_000),
    "mpub": Anchor(460_000, 530_000),
    "sub": Anchor(200_000, 200_000),
}
ANCHOR_SOURCE = "anchor from bench/README.md (nsqd 1.3.0, 200 B), not measured in this run"
# Targets from the issue (msgs/s).
GOALS: dict[str, float] = {"mpub": 200_000, "sub": 100_000}
DEFAULT_N: dict[str, int] = {"pub": 20_000, "mpub": 1_000_000, "sub": 500_000, "latency": 20_000}
WORKLOADS = ("pub", "mpub", "sub", "latency")

# -- client --------------------------------------------------------------------------


class ServerClosed(ConnectionError):
    """The server closed the connection (or the watchdog shut it down)."""


class NSQError(Exception):
    """The server sent an error frame."""


class UnexpectedFrame(Exception):
    """The server sent something the workload did not ask for."""


def be32(n: int) -> bytes:
    return BE32.pack(n)


def make_body(size: int) -> bytes:
    pattern = b"0123456789abcdefghijklmnopqrstuvwxyz"
    return (pattern * (size // len(pattern) + 1))[:size]


def build_pub(topic: str, body: bytes) -> bytes:
    return b"PUB " + topic.encode() + b"\n" + be32(len(body)) + body


def build_mpub(topic: str, bodies: list[bytes]) -> bytes:
    parts = b"".join(be32(len(b)) + b for b in bodies)
    inner = be32(len(bodies)) + parts
    return b"MPUB " + topic.encode() + b"\n" + be32(len(inner)) + inner


def fin_lines(ids: list[bytearray]) -> bytes:
    return b"FIN " + b"\nFIN ".join(ids) + b"\n"


def scan_frames(
    buf: bytearray, pos: int, end: int, ids: list[bytearray], others: list[tuple[int, bytes]]
) -> int:
    """Parse every complete frame in buf[pos:end]; message ids go to `ids`, other frames to
    `others`. Returns the offset of the first incomplete frame. This is the hot loop of the
    SUB workload: keep it lean."""
    unpack = HEADER.unpack_from
    while end - pos >= 8:
        size, ftype = unpack(buf, pos)
        stop = pos + 4 + size
        if stop > end:
            break
        if ftype == FRAME_MESSAGE:
            ids.append(buf[pos + ID_START : pos + ID_END])
        else:
            others.append((ftype, bytes(buf[pos + 8 : stop])))
        pos = stop
    return pos


def scan_stamped(
    buf: bytearray,
    pos: int,
    end: int,
    ids: list[bytearray],
    stamps: list[int],
    others: list[tuple[int, bytes]],
) -> int:
    """As scan_frames, also collecting the publisher's timestamp from the body's first 8
    bytes (the latency workload)."""
    unpack = HEADER.unpack_from
    stamp = STAMP.unpack_from
    while end - pos >= 8:
        size, ftype = unpack(buf, pos)
        stop = pos + 4 + size
        if stop > end:
            break
        if ftype == FRAME_MESSAGE:
            ids.append(buf[pos + ID_START : pos + ID_END])
            stamps.append(stamp(buf, pos + BODY_START)[0])
        else:
            others.append((ftype, bytes(buf[pos + 8 : stop])))
        pos = stop
    return pos


class NSQConn:
    """A blocking raw-socket NSQ client connection: magic sent, frames read from one large
    buffer, heartbeats answered with NOP wherever they show up."""

    def __init__(self, addr: Address, watchdog: Watchdog) -> None:
        self.sock = watchdog.watch(connect(addr))
        self.buf = bytearray(RECV_BUFFER)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0
        self.heartbeats = 0
        self.sock.sendall(MAGIC)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def fill(self) -> int:
        """One recv into the free tail of the buffer (compacting or growing it first)."""
        if self.start == self.end:
            self.start = self.end = 0
        elif len(self.buf) - self.end < COMPACT_BELOW:
            pending = self.end - self.start
            if self.start:
                self.buf[:pending] = self.buf[self.start : self.end]
                self.start, self.end = 0, pending
            if len(self.buf) - self.end < COMPACT_BELOW:  # one frame larger than the buffer
                self.view.release()
                self.buf = self.buf + bytearray(len(self.buf))
                self.view = memoryview(self.buf)
        n = self.sock.recv_into(self.view[self.end :])
        if n == 0:
            raise ServerClosed("connection closed by the server")
        self.end += n
        return n

    def handle_other(self, ftype: int, data: bytes) -> None:
        """Heartbeats get a NOP; error frames raise; anything else is unexpected here."""
        if ftype == FRAME_RESPONSE and data == HEARTBEAT:
            self.heartbeats += 1
            self.sock.sendall(NOP)
        elif ftype == FRAME_ERROR:
            raise NSQError(data.decode(errors="replace"))
        else:
            raise UnexpectedFrame(f"frame type {ftype}: {data[:80]!r}")

    def next_frame(self) -> tuple[int, bytes]:
        """The next response or message frame (heartbeats answered, errors raised)."""
        while True:
            if self.end - self.start >= 8:
                size, ftype = HEADER.unpack_from(self.buf, self.start)
                if size < 4:
                    raise UnexpectedFrame(f"frame size {size}")
                stop = self.start + 4 + size
                if stop <= self.end:
                    data = bytes(self.buf[self.start + 8 : stop])
                    self.start = stop
                    if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                        self.heartbeats += 1
                        self.sock.sendall(NOP)
                        continue
                    if ftype == FRAME_ERROR:
                        raise NSQError(data.decode(errors="replace"))
                    return ftype, data
            self.fill()

    def expect_ok(self, what: str) -> None:
        ftype, data = self.next_frame()
        if ftype != FRAME_RESPONSE or data != OK:
            raise UnexpectedFrame(f"{what}: expected OK, got type {ftype} {data[:80]!r}")

    def identify(self, params: dict[str, object]) -> dict[str, object]:
        body = json.dumps(params, separators=(",", ":")).encode()
        self.send(b"IDENTIFY\n" + be32(len(body)) + body)
        ftype, data = self.next_frame()
        if ftype != FRAME_RESPONSE:
            raise UnexpectedFrame(f"IDENTIFY: got frame type {ftype}")
        if data == OK:
            return {}
        negotiated = json.loads(data)
        if not isinstance(negotiated, dict):
            raise UnexpectedFrame(f"IDENTIFY: not a JSON object: {data[:80]!r}")
        return negotiated

    def subscribe(self, topic: str, channel: str) -> None:
        self.send(f"SUB {topic} {channel}\n".encode())
        self.expect_ok("SUB")

    def close(self) -> None:
        self.sock.close()


# -- workloads -----------------------------------------------------------------------


@dataclass(slots=True)
class Options:
    n: dict[str, int]
    size: int
    batch: int
    window: int
    rdy: int
    timeout: float
    output_buffer_timeout: int


@dataclass(slots=True)
class Progress:
    """What a workload has done so far; it survives a timeout or an error."""

    server_cpu: Callable[[], float | None]
    done: int = 0
    t0: float | None = None
    t1: float | None = None
    cpu0: float = 0.0
    cpu1: float = 0.0
    server_cpu0: float | None = None
    server_cpu1: float | None = None
    details: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.server_cpu0 = self.server_cpu()
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.t0 is not None and self.t1 is None:
            self.t1 = time.perf_counter()
            self.cpu1 = time.process_time()
            self.server_cpu1 = self.server_cpu()


@dataclass(slots=True)
class Result:
    workload: str
    server: str
    total: int
    msgs: int
    seconds: float
    status: str
    client_cpu: float | None
    server_cpu: float | None
    details: list[str]

    @property
    def rate(self) -> float | None:
        return self.msgs / self.seconds if self.seconds > 0 else None


def publish_mpub(
    conn: NSQConn,
    topic: str,
    n: int,
    opts: Options,
    progress: Progress | None = None,
    keepalive: Callable[[], None] | None = None,
) -> int:
    """MPUB n messages in batches of opts.batch with up to opts.window commands outstanding;
    the payloads are built once. Returns the number of messages acknowledged."""
    body = make_body(opts.size)
    full_batches, rest = divmod(n, opts.batch)
    full = build_mpub(topic, [body] * opts.batch)
    payloads = [full] * full_batches
    if rest:
        payloads.append(build_mpub(topic, [body] * rest))
    sizes = [opts.batch] * full_batches + ([rest] if rest else [])
    sent = acked = done = 0
    while acked < len(payloads):
        if sent - acked < opts.window and sent < len(payloads):
            stop = min(len(payloads), acked + opts.window)
            conn.send(b"".join(payloads[sent:stop]))
            sent = stop
        conn.expect_ok("MPUB")
        done += sizes[acked]
        acked += 1
        if progress is not None:
            progress.done = done
        if keepalive is not None and acked % 256 == 0:
            keepalive()
    return done


def run_pub(addr: Address, topic: str, opts: Options, wd: Watchdog, progress: Progress) -> None:
    n = opts.n["pub"]
    conn = NSQConn(addr, wd)
    command = build_pub(topic, make_body(opts.size))
    latencies = [0] * n
    clock = time.perf_counter_ns
    progress.start()
    for i in range(n):
        t = clock()
        conn.send(command)
        conn.expect_ok("PUB")
        latencies[i] = clock() - t
        progress.done = i + 1
    progress.stop()
    progress.details.append("round trip " + format_latency_us(latencies))


def run_mpub(addr: Address, topic: str, opts: Options, wd: Watchdog, progress: Progress) -> None:
    conn = NSQConn(addr, wd)
    progress.start()
    publish_mpub(conn, topic, opts.n["mpub"], opts, progress)
    progress.stop()
    progress.details.append(
        f"{opts.batch} msgs per MPUB, {opts.window} MPUBs outstanding, "
        f"{len(build_mpub(topic, [make_body(opts.size)] * opts.batch))} B per MPUB"
    )


def _subscriber(
    addr: Address, topic: str, opts: Options, wd: Watchdog, identify: dict[str, object]
) -> tuple[NSQConn, int, list[str]]:
    """IDENTIFY + SUB (RDY stays 0); returns the connection, the RDY to use and notes."""
    conn = NSQConn(addr, wd)
    negotiated = conn.identify(identify)
    rdy = opts.rdy
    notes: list[str] = []
    max_rdy = negotiated.get("max_rdy_count", MAX_RDY)
    if isinstance(max_rdy, int) and rdy > max_rdy:
        notes.append(f"RDY {rdy} lowered to the server's max_rdy_count {max_rdy}")
        rdy = max_rdy
    conn.subscribe(topic, "bench")
    return conn, rdy, notes


def run_sub(addr: Address, topic: str, opts: Options, wd: Watchdog, progress: Progress) -> None:
    n = opts.n["sub"]
    sub, rdy, notes = _subscriber(
        addr,
        topic,
        opts,
        wd,
        {
            "feature_negotiation": True,
            "heartbeat_interval": 30_000,
            "output_buffer_timeout": opts.output_buffer_timeout,
            "user_agent": "mq-gateway-bench/nsq.py",
        },
    )
    progress.details += notes

    # Fill the channel while RDY is 0. The subscriber reads nothing meanwhile, so NOP now
    # and then keeps its read deadline (2 x heartbeat interval) from closing it.
    last_nop = time.monotonic()

    def keepalive() -> None:
        nonlocal last_nop
        if time.monotonic() - last_nop > 5.0:
            sub.send(NOP)
            last_nop = time.monotonic()

    pub = NSQConn(addr, wd)
    t_fill = time.perf_counter()
    publish_mpub(pub, topic, n, opts, keepalive=keepalive)
    fill_s = time.perf_counter() - t_fill
    pub.close()
    progress.details.append(f"filled by MPUB in {fill_s:.2f}s ({si(n / fill_s)} msgs/s)")

    received = 0
    fin_failed = 0
    sock = sub.sock
    progress.start()
    t_rdy = time.perf_counter()
    sub.send(b"RDY %d\n" % rdy)
    while received < n:
        sub.fill()
        ids: list[bytearray] = []
        others: list[tuple[int, bytes]] = []
        sub.start = scan_frames(sub.buf, sub.start, sub.end, ids, others)
        if ids:
            sock.sendall(fin_lines(ids))
            received += len(ids)
            progress.done = received
        for ftype, data in others:
            if ftype == FRAME_ERROR and data.startswith(b"E_FIN_FAILED"):
                fin_failed += 1
            else:
                sub.handle_other(ftype, data)
    progress.stop()
    progress.details.append(
        f"RDY {rdy}, output_buffer_timeout {opts.output_buffer_timeout} ms; {received} "
        f"received and FINed in {time.perf_counter() - t_rdy:.2f}s end to end from RDY"
    )
    extra = _drain_extra(sub, 0.2)
    if extra or fin_failed or received > n:
        progress.details.append(
            f"WARNING: {received - n} more than asked during the run, {extra} after it, "
            f"{fin_failed} FIN failures"
        )


def _drain_extra(conn: NSQConn, seconds: float) -> int:
    """Count message frames that still arrive within `seconds` (duplicates, redeliveries)."""
    conn.sock.settimeout(seconds)
    extra = 0
    try:
        while True:
            conn.fill()
            ids: list[bytearray] = []
            others: list[tuple[int, bytes]] = []
            conn.start = scan_frames(conn.buf, conn.start, conn.end, ids, others)
            extra += len(ids)
            if ids:
                conn.sock.sendall(fin_lines(ids))
    except (TimeoutError, OSError):
        pass
    return extra


def _latency_publisher(
    addr: Address, topic: str, n: int, size: int, timeout: float, report: Connection
) -> None:
    """Child process: PUB one at a time, the body starting with perf_counter_ns()
    (CLOCK_MONOTONIC, the same clock in every process)."""
    try:
        with Watchdog(timeout) as wd:
            conn = NSQConn(addr, wd)
            pad = make_body(max(0, size - STAMP.size))
            head = b"PUB " + topic.encode() + b"\n" + be32(STAMP.size + len(pad))
            clock = time.perf_counter_ns
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            sent = 0
            try:
                for _ in range(n):
                    conn.send(head + STAMP.pack(clock()) + pad)
                    conn.expect_ok("PUB")
                    sent += 1
            finally:
                report.send((sent, time.perf_counter() - t0, time.process_time() - cpu0, None))
    except Exception as exc:
        report.send((0, 0.0, 0.0, f"{type(exc).__name__}: {exc}"))
    finally:
        report.close()


def run_latency(addr: Address, topic: str, opts: Options, wd: Watchdog, progress: Progress) -> None:
    n = opts.n["latency"]
    # No output buffering: the consumer should see each message as soon as the server has
    # it, not when a 25-250 ms flush timer fires (docs/protocols/nsq.md §8).
    sub, rdy, notes = _subscriber(
        addr,
        topic,
        opts,
        wd,
        {
            "feature_negotiation": True,
            "heartbeat_interval": 30_000,
            "output_buffer_size": -1,
            "user_agent": "mq-gateway-bench/nsq.py",
        },
    )
    progress.details += notes
    sub.send(b"RDY %d\n" % rdy)

    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe(duplex=False)
    publisher = ctx.Process(
        target=_latency_publisher,
        args=(addr, topic, n, opts.size, wd.remaining(), theirs),
        daemon=True,
    )
    latencies: list[int] = []
    received = 0
    clock = time.perf_counter_ns
    progress.start()
    publisher.start()
    theirs.close()
    try:
        while received < n:
            sub.fill()
            now = clock()
            ids: list[bytearray] = []
            stamps: list[int] = []
            others: list[tuple[int, bytes]] = []
            sub.start = scan_stamped(sub.buf, sub.start, sub.end, ids, stamps, others)
            if ids:
                sub.sock.sendall(fin_lines(ids))
                received += len(ids)
                progress.done = received
                latencies += [now - s for s in stamps]
            for ftype, data in others:
                sub.handle_other(ftype, data)
        progress.stop()
    finally:
        publisher.join(max(1.0, wd.remaining()))
        if publisher.is_alive():
            publisher.terminate()
            publisher.join()
        if ours.poll(0):
            sent, pub_s, pub_cpu, error = ours.recv()
            if error:
                progress.details.append(f"publisher failed: {error}")
            elif pub_s > 0:
                progress.details.append(
                    f"publisher: {sent} PUBs one at a time, {si(sent / pub_s)} msgs/s, "
                    f"CPU {pub_cpu / pub_s:.0%} of its wall time"
                )
    progress.details.append("publish-to-receive " + format_latency_us(latencies))


RUNNERS: dict[str, Callable[[Address, str, Options, Watchdog, Progress], None]] = {
    "pub": run_pub,
    "mpub": run_mpub,
    "sub": run_sub,
    "latency": run_latency,
}


@dataclass(slots=True)
class Target:
    """A server under test: the gateway or a real nsqd."""

    name: str
    addr: Address
    pid: int | None

    def cpu_seconds(self) -> float | None:
        return None if self.pid is None else process_cpu_seconds(self.pid)


def run_workload(workload: str, target: Target, opts: Options) -> Result:
    topic = f"bench_{workload}_{target.name}_{os.getpid()}_{time.time_ns() % 10**10}"
    progress = Progress(server_cpu=target.cpu_seconds)
    status = "ok"
    with Watchdog(opts.timeout) as wd:
        try:
            RUNNERS[workload](target.addr, topic, opts, wd, progress)
        except (OSError, NSQError, UnexpectedFrame, ValueError) as exc:
            if wd.expired:
                status = f"TIMEOUT after {opts.timeout:.0f}s"
            else:
                status = f"ERROR {type(exc).__name__}: {exc}"
        progress.stop()
    seconds = (progress.t1 or 0.0) - (progress.t0 or 0.0)
    client_cpu = (progress.cpu1 - progress.cpu0) / seconds if seconds > 0 else None
    server_cpu = None
    if progress.server_cpu0 is not None and progress.server_cpu1 is not None and seconds > 0:
        server_cpu = (progress.server_cpu1 - progress.server_cpu0) / seconds
    return Result(
        workload=workload,
        server=target.name,
        total=opts.n[workload],
        msgs=progress.done,
        seconds=seconds,
        status=status,
        client_cpu=client_cpu,
        server_cpu=server_cpu,
        details=progress.details,
    )


# -- output --------------------------------------------------------------------------


def print_result(r: Result) -> None:
    cpu = []
    if r.client_cpu is not None:
        cpu.append(f"client CPU {r.client_cpu:.0%}")
    if r.server_cpu is not None:
        cpu.append(f"server CPU {r.server_cpu:.0%}")
    print(
        f"[{r.workload} @ {r.server}] {r.msgs}/{r.total} msgs in {r.seconds:.2f}s = "
        f"{si(r.rate)} msgs/s; {', '.join(cpu) or 'CPU unknown'}; {r.status}",
        flush=True,
    )
    for line in r.details:
        print(f"    {line}", flush=True)


def summary(results: list[Result], measured_nsqd: bool) -> str:
    picked = median_runs(results)
    nsqd_rate = {r.workload: r.rate for r, _ in picked if r.server == "nsqd"}
    repeated = any(len(runs) > 1 for _, runs in picked)
    rows: list[list[str]] = []
    for r, runs in picked:
        rate = r.rate
        failed = [x.status for x in runs if x.status != "ok"]
        status = failed[0] if failed else "ok"
        goal = GOALS.get(r.workload)
        goal_text = "-"
        if goal is not None and r.server != "nsqd":
            met = rate is not None and rate >= goal and not failed
            goal_text = f">={si(goal)} " + ("met" if met else "MISSED")
        ref, ratio = "-", "-"
        if r.server != "nsqd" and r.workload != "latency":
            if measured_nsqd:
                ref_rate = nsqd_rate.get(r.workload)
                if ref_rate:
                    ref = f"{si(ref_rate)} measured"
                    ratio = f"{rate / ref_rate:.2f}" if rate else "-"
            elif r.workload in ANCHORS:
                ref = ANCHORS[r.workload].text() + " anchor*"
                ratio = ANCHORS[r.workload].ratio(rate) if rate else "-"
        cpu = "/".join("?" if c is None else f"{c:.0%}" for c in (r.client_cpu, r.server_cpu))
        row = [r.workload, r.server, f"{r.msgs}", f"{r.seconds:.2f}", si(rate)]
        if repeated:
            rates = [x.rate or 0.0 for x in runs]
            row.append(f"{si(min(rates))}-{si(max(rates))} ({len(runs)})")
        rows.append([*row, goal_text, ref, ratio, cpu, status])
    headers = ["workload", "server", "msgs", "secs", "msgs/s"]
    if repeated:
        headers.append("range (runs)")
    headers += ["goal", "nsqd", "ratio", "cpu c/s", "status"]
    return format_table(headers, rows)


def bottleneck_notes(results: list[Result]) -> list[str]:
    notes = []
    for r in results:
        if r.client_cpu is not None and r.client_cpu >= 0.9:
            notes.append(
                f"{r.workload} @ {r.server}: the client used {r.client_cpu:.0%} of a CPU; "
                "the figure may be client-bound"
            )
    return notes


def client_scan_ceiling(size: int, frames: int = 200_000) -> float:
    """Messages per second this client can parse and turn into FINs with no socket at all:
    an upper bound on what the sub workload can report."""
    one = bytearray(
        be32(4 + 26 + size)
        + struct.pack(">iqH", FRAME_MESSAGE, time.time_ns(), 1)
        + b"0123456789abcdef"
        + make_body(size)
    )
    chunk = one * 1000
    t0 = time.perf_counter()
    for _ in range(frames // 1000):
        ids: list[bytearray] = []
        others: list[tuple[int, bytes]] = []
        scan_frames(chunk, 0, len(chunk), ids, others)
        fin_lines(ids)
    return frames / (time.perf_counter() - t0)


# -- main ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "-n",
        type=int,
        help="messages per workload (default: "
        + ", ".join(f"{w} {n}" for w, n in DEFAULT_N.items())
        + ")",
    )
    ap.add_argument("--size", type=int, default=200, help="body size in bytes (default 200)")
    ap.add_argument("--batch", type=int, default=100, help="messages per MPUB (default 100)")
    ap.add_argument("--window", type=int, default=8, help="MPUBs outstanding (default 8)")
    ap.add_argument("--rdy", type=int, default=1000, help="RDY of the consumers (default 1000)")
    ap.add_argument(
        "--output-buffer-timeout",
        type=int,
        default=25,
        help="IDENTIFY output_buffer_timeout (ms) of the sub consumer; 25 is nsqd's minimum,\n"
        "250 its default (a partial last buffer waits that long)",
    )
    ap.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"comma-separated workloads (default {','.join(WORKLOADS)})",
    )
    ap.add_argument("--addr", help="HOST:PORT of a running gateway (do not start one)")
    ap.add_argument("--nsqd", help="HOST:PORT of a running nsqd: measure it in the same run")
    ap.add_argument(
        "--nsqd-bin",
        help="an nsqd binary to start here, pinned like the gateway, on free ports with a fresh\n"
        "data directory, and measure in the same run (bench/README.md, Real servers)",
    )
    ap.add_argument(
        "--nsqd-args",
        default="",
        help="extra arguments for --nsqd-bin, e.g. --mem-queue-size=0 (every message through\n"
        "its disk queue)",
    )
    ap.add_argument(
        "--pin",
        choices=("none", "same", "split"),
        default="split",
        help="CPU placement: same = server and client on CPU 0, split = server CPU 0,\n"
        "client CPU 1 (default; each side needs a core), none = unpinned",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each workload; the summary shows the median and the range (default 1)",
    )
    ap.add_argument(
        "--timeout", type=float, default=120.0, help="seconds per workload (default 120)"
    )
    ap.add_argument(
        "--gateway-args",
        default="",
        help="extra arguments for `python -m gateway serve ...`",
    )
    ap.add_argument(
        "--other-listeners-off",
        action="store_true",
        help="also pass " + " ".join(OTHER_LISTENERS_OFF),
    )
    a = ap.parse_args(argv)
    a.workloads = [w.strip() for w in a.only.split(",") if w.strip()]
    unknown = set(a.workloads) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}; choose from {','.join(WORKLOADS)}")
    if min(a.size, a.batch, a.window, a.repeat, a.n or 1) < 1:
        ap.error("-n, --size, --batch, --window and --repeat must be positive")
    if not 1 <= a.rdy <= MAX_RDY:
        ap.error(f"--rdy must be 1..{MAX_RDY}")
    if "latency" in a.workloads and a.size < STAMP.size:
        ap.error(f"the latency workload needs --size >= {STAMP.size} (a timestamp in the body)")
    try:
        a.addr = parse_addr(a.addr) if a.addr else None
        a.nsqd = parse_addr(a.nsqd) if a.nsqd else None
    except ValueError as exc:
        ap.error(str(exc))
    if a.nsqd and a.nsqd_bin:
        ap.error("--nsqd and --nsqd-bin: one nsqd at a time")
    return a


def describe_placement(
    placement: Placement, targets: list[Target], started: bool, nsqd_started: bool = False
) -> str:
    """The placement asked for, plus the CPUs of any server this script did not start
    (its placement is whatever it was started with: use taskset -c 0 for split/same)."""
    text = placement.describe()
    for t in targets:
        if (t.name == "gateway" and started) or (t.name == "nsqd" and nsqd_started):
            continue
        try:
            if t.pid is None:
                raise OSError
            cpus = ",".join(map(str, sorted(os.sched_getaffinity(t.pid))))
            text += f"; {t.name} (not started here) pid {t.pid} on CPU {cpus}"
        except OSError:
            text += f"; {t.name} (not started here) on unknown CPUs"
    return text


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    placement = make_placement(a.pin)
    n = {w: a.n or DEFAULT_N[w] for w in WORKLOADS}
    opts = Options(n, a.size, a.batch, a.window, a.rdy, a.timeout, a.output_buffer_timeout)

    gateway: GatewayProcess | None = None
    targets: list[Target] = []
    if a.addr is None:
        args = [*GATEWAY_ARGS, *shlex.split(a.gateway_args)]
        if a.other_listeners_off:
            args += OTHER_LISTENERS_OFF
        gateway = GatewayProcess(args, placement, ["nsq"])
        print(f"starting: {' '.join(gateway.command)}", flush=True)
        try:
            addresses = gateway.start()
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        assert gateway.proc is not None
        targets.append(Target("gateway", addresses["nsq"], gateway.proc.pid))
    else:
        targets.append(Target("gateway", a.addr, pid_listening_on(a.addr[1])))
    nsqd: Nsqd | None = None
    if a.nsqd_bin:
        nsqd = Nsqd(a.nsqd_bin, placement, shlex.split(a.nsqd_args))
        try:
            a.nsqd = nsqd.start()
        except (OSError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            if gateway is not None:
                gateway.stop()
            return 2
        print(f"started: {nsqd.version()} {' '.join(nsqd.extra)}", flush=True)
    if a.nsqd is not None:
        pid = nsqd.pid if nsqd is not None else pid_listening_on(a.nsqd[1])
        targets.append(Target("nsqd", a.nsqd, pid))
    placement.apply_to_client()

    results: list[Result] = []
    aborted = False
    try:
        print(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} python {sys.version.split()[0]}")
        print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        print("# " + describe_placement(placement, targets, gateway is not None, nsqd is not None))
        for t in targets:
            print(f"# {t.name} at {format_addr(t.addr)} (pid {t.pid or 'unknown'})")
        print(
            f"# body {a.size} B, MPUB batch {a.batch}, window {a.window}, RDY {a.rdy}, "
            f"timeout {a.timeout:.0f}s per workload"
        )
        if "sub" in a.workloads:
            print(
                f"# client ceiling, parse + FIN build without a socket: "
                f"{si(client_scan_ceiling(a.size))} msgs/s"
            )
        print(flush=True)
        for workload in a.workloads:
            for _ in range(a.repeat):
                for target in targets:
                    if gateway is not None and target.name == "gateway" and not gateway.alive():
                        raise RuntimeError("the gateway has exited")
                    result = run_workload(workload, target, opts)
                    results.append(result)
                    print_result(result)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        aborted = True
    finally:
        if nsqd is not None:
            nsqd.stop()
        if gateway is not None:
            code = gateway.stop()
            if code not in (0, -15, None):
                print(f"gateway exit status {code}; its last stderr lines:", file=sys.stderr)
                for line in gateway.stderr_tail:
                    print(f"  {line}", file=sys.stderr)

    print()
    print(summary(results, measured_nsqd=a.nsqd is not None))
    if a.nsqd is None and any(r.workload in ANCHORS for r in results):
        print(f"* {ANCHOR_SOURCE}; ratio = gateway / anchor")
        if a.size != 200:
            print(f"  (the anchors used 200 B bodies; this run used {a.size} B)")
    elif a.nsqd is not None:
        print("ratio = gateway / nsqd, both measured in this run")
    print("cpu c/s = client / server CPU time as a share of the workload's wall time")
    for r in results:
        for line in r.details:
            if "round trip" in line or "publish-to-receive" in line:
                print(f"latency {r.workload} @ {r.server}: {line}")
    print(
        "placement: "
        + describe_placement(placement, targets, gateway is not None, nsqd is not None)
    )
    for note in bottleneck_notes(results):
        print("note: " + note)
    return 0 if not aborted and all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
