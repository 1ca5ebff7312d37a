"""The bridge of issue 15, measured: beanstalkd producers, one NSQ consumer, the gateway against
beanstalkd + a bridge process + nsqd (not a test).

``--producers`` (4) greenstalk processes put ``--jobs`` (100,000) jobs of ``--size`` (200) bytes
in all, as fast as they can, into tube ``bridge-<n>``; each body starts with the put's
``perf_counter_ns()`` (CLOCK_MONOTONIC, one clock for every process). One NSQ consumer (the
raw-socket client of bench/nsq.py: IDENTIFY, SUB, RDY ``--rdy`` 1000, FIN every message)
takes them from topic ``bridge-<n>``, channel ``beanstalk`` (docs/semantics.md: the NSQ
channel named like ``beanstalkd.group``, ``beanstalk`` by default, is the group the beanstalkd
workers of the tube share, so no second copy waits anywhere).

Systems under test, each pinned to CPU 0 (producers and consumer on CPU 1), one at a time,
in each of two durabilities (``--durability``, both by default), each a table of its own:

* ``memory``: nothing on disk. The gateway with ``--store memory://``, beanstalkd without a
  binlog, nsqd with its default in-memory queue.
* ``durable``: every side keeps what it acknowledged. The gateway on its default store (a
  fresh ``--data-dir``, fsync every 50 ms), ``beanstalkd -b DIR`` (fsync every 50 ms) and
  ``nsqd --mem-queue-size=0`` (every message through its disk queue).

* ``gateway``: ``python -m gateway serve --beanstalk ... --nsq ...``; the producers put on
  its beanstalkd port, the consumer subscribes on its NSQ port.
* ``beanstalkd + bridge + nsqd``: a real beanstalkd, a real nsqd (``--nsqd HOST:PORT``, or
  started here from ``--nsqd-bin PATH``, default ``nsqd`` on PATH) and ``--bridges`` 1 and 4
  bridge processes, each with a raw-socket beanstalkd connection watching the tube and an NSQ
  connection:
  ``single``: reserve, MPUB of 1, wait for OK, delete; ``batch``, the strongest bridge a user
  would write: reserve (waiting up to 1 s for the first), then ``--batch`` - 1 (99)
  ``reserve-with-timeout 0`` sent in one write and their replies read (up to the first
  ``TIMED_OUT``: the tube is empty), one MPUB of the jobs, wait for OK, then the deletes
  pipelined in one write.

Reported per system: throughput (jobs / first put -> last message consumed), publish-to-
consume p50/p99 (the consumer's receive time minus the body's timestamp), and the CPU of the
system under test per message: utime+stime of all its processes (gateway; beanstalkd, nsqd
and the bridges) from /proc over the run, divided by the jobs. Issue 15's acceptance: with 4
producers the gateway >= 0.8x the best alternative's throughput, its p99 <= 1/10 of that
alternative's, and its CPU per message below it.

    PYTHONPATH=. .venv/bin/python bench/bridge.py                  # nsqd from PATH
    PYTHONPATH=. .venv/bin/python bench/bridge.py --nsqd-bin ../nsq/nsqd
    PYTHONPATH=. .venv/bin/python bench/bridge.py --nsqd 127.0.0.1:4150 --repeat 3
    PYTHONPATH=. .venv/bin/python bench/bridge.py --only gateway --jobs 2000   # quick look
    PYTHONPATH=. .venv/bin/python bench/bridge.py --durability durable --nsqd-bin ../nsq/nsqd
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Barrier
from pathlib import Path
from types import FrameType

import greenstalk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Address,
    GatewayProcess,
    Nsqd,
    Placement,
    Watchdog,
    connect,
    format_addr,
    format_table,
    load_bench_module,
    make_placement,
    parse_addr,
    percentiles,
    pid_listening_on,
    process_cpu_seconds,
    si,
)

nsq_bench = load_bench_module("nsq")
beanstalk_bench = load_bench_module("beanstalk")

CHANNEL = "beanstalk"  # the gateway's default beanstalkd.group (docs/semantics.md)
STAMP = nsq_bench.STAMP
GATEWAY_ARGS = [
    *("serve", "--beanstalk", "127.0.0.1:0", "--nsq", "127.0.0.1:0", "--http", "off"),
    *("--nats", "off", "--nats-route", "off", "--rocketmq", "off"),
]
DURABILITIES = ("memory", "durable")
FIRST_RESERVE_S = 1  # a bridge waits this long for the first job of a batch
TARGET_THROUGHPUT = 0.8  # gateway / best alternative, issue 15
TARGET_P99 = 0.1
TARGET_DURABLE = 0.8  # the gateway's default store / its memory store on the bridge


class BridgeError(Exception):
    """A bridge process got an answer it did not expect."""


# -- the producers ---------------------------------------------------------------------------


def producer(
    addr: Address,
    tube: str,
    jobs: int,
    size: int,
    idx: int,
    barrier: Barrier,
    out: multiprocessing.Queue,
) -> None:
    """Put `jobs` jobs, each body starting with its put's perf_counter_ns()."""
    pad = nsq_bench.make_body(size - STAMP.size)
    clock = time.perf_counter_ns
    pack = STAMP.pack
    try:
        with greenstalk.Client(addr, encoding=None, use=tube) as client:
            put = client.put
            barrier.wait()
            t0 = time.perf_counter()
            for _ in range(jobs):
                put(pack(clock()) + pad)
            out.put((t0, time.perf_counter()))
    except Exception as exc:  # reported by the parent
        out.put(f"producer {idx}: {type(exc).__name__}: {exc}")


# -- the bridge process (the alternative's third program) ------------------------------------


class BeanstalkConn:
    """A blocking raw-socket beanstalkd client: commands out, replies (and job bodies) in."""

    def __init__(self, addr: Address) -> None:
        self.sock = connect(addr)
        self.buf = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        data = self.sock.recv(1 << 18)
        if not data:
            raise ConnectionError("beanstalkd closed the connection")
        self.buf += data

    def reply(self) -> tuple[bytes, bytes | None]:
        """The next reply line, and the job body after a RESERVED line."""
        while (nl := self.buf.find(b"\r\n")) < 0:
            self._fill()
        line = bytes(self.buf[:nl])
        if not line.startswith(b"RESERVED "):
            del self.buf[: nl + 2]
            return line, None
        size = int(line.rsplit(b" ", 1)[1])
        while len(self.buf) < nl + 2 + size + 2:
            self._fill()
        body = bytes(self.buf[nl + 2 : nl + 2 + size])
        del self.buf[: nl + 2 + size + 2]
        return line, body

    def reserve(self, timeout: int) -> tuple[bytes, bytes] | None:
        self.send(b"reserve-with-timeout %d\r\n" % timeout)
        line, body = self.reply()
        if body is None:
            if line in (b"TIMED_OUT", b"DEADLINE_SOON"):
                return None
            raise BridgeError(f"reserve: {line!r}")
        return line.split(b" ")[1], body


def bridge_main(
    beanstalkd: Address, nsqd: Address, tube: str, batch: int, cpus: set[int] | None
) -> None:
    """Child process: move jobs from the beanstalkd tube to the NSQ topic of the same name
    until it is terminated."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler: just end
    if cpus:
        os.sched_setaffinity(0, cpus)
    bs = BeanstalkConn(beanstalkd)
    bs.send(f"watch {tube}\r\nignore default\r\n".encode())
    bs.reply()
    bs.reply()
    with Watchdog(10**6) as wd:
        nsq = nsq_bench.NSQConn(nsqd, wd)
        topic = tube
        while True:
            first = bs.reserve(FIRST_RESERVE_S)
            if first is None:
                continue
            jobs = [first]
            if batch > 1:
                # the rest of the batch asked for in one write; the first TIMED_OUT means
                # the tube is empty (the replies after it are TIMED_OUT too, or jobs put
                # meanwhile, which go in this batch all the same)
                bs.send(b"reserve-with-timeout 0\r\n" * (batch - 1))
                for _ in range(batch - 1):
                    line, body = bs.reply()
                    if line.startswith(b"RESERVED "):
                        assert body is not None
                        jobs.append((line.split()[1], body))
                    elif line != b"TIMED_OUT":
                        raise BridgeError(f"reserve: {line!r}")
            nsq.send(nsq_bench.build_mpub(topic, [body for _, body in jobs]))
            nsq.expect_ok("MPUB")
            bs.send(b"".join(b"delete " + job_id + b"\r\n" for job_id, _ in jobs))
            for _ in jobs:
                line, _ = bs.reply()
                if line != b"DELETED":
                    raise BridgeError(f"delete: {line!r}")


# -- one measured run ------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    system: str
    jobs: int
    received: int = 0
    seconds: float = 0.0
    p50_us: float | None = None
    p99_us: float | None = None
    cpu_s: float | None = None  # system under test, all its processes
    cpu_by_process: dict[str, float] = field(default_factory=dict)
    status: str = "ok"
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        return self.received / self.seconds if self.seconds > 0 and self.received else None

    @property
    def cpu_us_per_msg(self) -> float | None:
        return None if self.cpu_s is None or not self.received else self.cpu_s / self.received * 1e6


def measure(
    system: str,
    put_addr: Address,
    sub_addr: Address,
    pids: dict[str, int | None],
    a: argparse.Namespace,
    topic: str,
) -> Run:
    """Producers -> system under test -> this process's NSQ consumer; `pids` are the
    processes of the system under test, whose CPU time is summed."""
    run = Run(system, a.jobs)
    per_producer, rest = divmod(a.jobs, a.producers)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(a.producers + 1), ctx.Queue()
    producers = [
        ctx.Process(
            target=producer,
            args=(put_addr, topic, per_producer + (i < rest), a.size, i, barrier, out),
            daemon=True,
        )
        for i in range(a.producers)
    ]
    latencies: list[int] = []
    received = 0
    clock = time.perf_counter_ns
    with Watchdog(a.timeout) as wd:
        try:
            sub = nsq_bench.NSQConn(sub_addr, wd)
            negotiated = sub.identify(
                {
                    "feature_negotiation": True,
                    "heartbeat_interval": 30_000,
                    "output_buffer_timeout": a.output_buffer_timeout,
                    "user_agent": "mq-gateway-bench/bridge.py",
                }
            )
            rdy = min(a.rdy, int(negotiated.get("max_rdy_count", a.rdy)))  # type: ignore[call-overload]
            sub.subscribe(topic, CHANNEL)
            sub.send(b"RDY %d\n" % rdy)
            for p in producers:
                p.start()
            cpu0 = {name: process_cpu_seconds(pid) if pid else None for name, pid in pids.items()}
            barrier.wait(timeout=30)  # the producers are connected
            t0 = time.perf_counter()
            while received < a.jobs:
                sub.fill()
                now = clock()
                ids: list[bytearray] = []
                stamps: list[int] = []
                others: list[tuple[int, bytes]] = []
                sub.start = nsq_bench.scan_stamped(sub.buf, sub.start, sub.end, ids, stamps, others)
                if ids:
                    sub.sock.sendall(nsq_bench.fin_lines(ids))
                    received += len(ids)
                    latencies += [now - s for s in stamps]
                for ftype, data in others:
                    sub.handle_other(ftype, data)
            t1 = time.perf_counter()
            cpu1 = {name: process_cpu_seconds(pid) if pid else None for name, pid in pids.items()}
            run.received, run.seconds = received, t1 - t0
            run.cpu_by_process = {
                name: cpu1[name] - cpu0[name]  # type: ignore[operator]
                for name in pids
                if cpu0[name] is not None and cpu1[name] is not None
            }
            if len(run.cpu_by_process) == len(pids):
                run.cpu_s = sum(run.cpu_by_process.values())
            else:
                run.notes.append("CPU of some process unknown: " + ", ".join(pids))
        except Exception as exc:
            run.received = received
            run.status = (
                f"TIMEOUT after {a.timeout:.0f}s ({received}/{a.jobs})"
                if wd.expired
                else f"ERROR {type(exc).__name__}: {exc}"
            )
        finally:
            for p in producers:
                if p.pid is None:  # never started (the consumer failed first)
                    continue
                p.join(max(0.1, wd.remaining()))
                if p.is_alive():
                    p.kill()
                    p.join()
    while not out.empty():
        item = out.get_nowait()
        if isinstance(item, str):
            run.status = item if run.status == "ok" else run.status
    if latencies:
        pct = percentiles(latencies, (50, 99))
        run.p50_us, run.p99_us = pct[50] / 1000, pct[99] / 1000
    return run


# -- the systems under test ------------------------------------------------------------------


def run_gateway(
    a: argparse.Namespace, placement: Placement, original: set[int], durable: bool
) -> Run:
    os.sched_setaffinity(0, original)
    data_dir = tempfile.mkdtemp(prefix="bench-bridge-gateway-")
    store = ["--data-dir", data_dir] if durable else ["--store", "memory://"]
    gateway = GatewayProcess([*GATEWAY_ARGS, *store], placement, ["beanstalk", "nsq"])
    print(f"# starting: {' '.join(gateway.command)}", flush=True)
    try:
        addresses = gateway.start()
        assert gateway.proc is not None
        placement.apply_to_client()
        topic = f"bridge-gw-{time.time_ns() % 10**9}"
        return measure(
            "gateway (default store)" if durable else "gateway (memory store)",
            addresses["beanstalk"],
            addresses["nsq"],
            {"gateway": gateway.proc.pid},
            a,
            topic,
        )
    finally:
        gateway.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
        os.sched_setaffinity(0, original)


def run_alternative(
    a: argparse.Namespace,
    placement: Placement,
    original: set[int],
    mode: str,
    bridges: int,
    nsqd_addr: Address,
    nsqd_pid: int | None,
    durable: bool,
) -> Run:
    os.sched_setaffinity(0, original)
    binlog = tempfile.mkdtemp(prefix="bench-bridge-binlog-")
    beanstalkd = beanstalk_bench.Beanstalkd(placement, ["-b", binlog] if durable else [])
    procs: list[multiprocessing.Process] = []
    try:
        bs_addr = beanstalkd.start()
        assert beanstalkd.proc is not None
        topic = f"bridge-{mode}{bridges}-{time.time_ns() % 10**9}"
        batch = 1 if mode == "single" else a.batch
        ctx = multiprocessing.get_context("fork")
        cpus = None if placement.server_cpus is None else set(placement.server_cpus)
        procs = [
            ctx.Process(
                target=bridge_main, args=(bs_addr, nsqd_addr, topic, batch, cpus), daemon=True
            )
            for _ in range(bridges)
        ]
        for p in procs:
            p.start()
        placement.apply_to_client()
        pids: dict[str, int | None] = {"beanstalkd": beanstalkd.proc.pid, "nsqd": nsqd_pid}
        pids.update({f"bridge{i}": p.pid for i, p in enumerate(procs)})
        name = (
            f"beanstalkd -b + {mode} bridge x{bridges} + nsqd --mem-queue-size=0"
            if durable
            else f"beanstalkd + {mode} bridge x{bridges} + nsqd"
        )
        run = measure(name, bs_addr, nsqd_addr, pids, a, topic)
        dead = [p for p in procs if not p.is_alive()]
        if dead:
            run.notes.append(f"{len(dead)} bridge process(es) exited early")
        return run
    finally:
        for p in procs:
            if p.pid is None:
                continue
            if p.is_alive():
                p.terminate()
            p.join(5)
        beanstalkd.stop()
        shutil.rmtree(binlog, ignore_errors=True)
        os.sched_setaffinity(0, original)


# -- output ----------------------------------------------------------------------------------


def us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f} ms" if value >= 10_000 else f"{value:.0f} us"


def median(runs: list[Run]) -> Run:
    ordered = sorted(runs, key=lambda r: r.rate or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def print_run(r: Run) -> None:
    cpu = ", ".join(f"{k} {v:.2f}s" for k, v in r.cpu_by_process.items())
    print(
        f"[{r.system}] {r.received}/{r.jobs} in {r.seconds:.2f}s = {si(r.rate)} msgs/s; "
        f"p50 {us(r.p50_us)} p99 {us(r.p99_us)}; CPU/msg {us(r.cpu_us_per_msg)} ({cpu}); "
        f"{r.status}",
        flush=True,
    )
    for note in r.notes:
        print(f"    {note}", flush=True)


def summary(by_system: dict[str, list[Run]]) -> tuple[str, list[str]]:
    picked = {name: median(runs) for name, runs in by_system.items()}
    alternatives = [r for name, r in picked.items() if not name.startswith("gateway") and r.rate]
    best = max(alternatives, key=lambda r: r.rate or 0.0, default=None)
    gw = next((r for name, r in picked.items() if name.startswith("gateway")), None)
    rows = []
    for name, r in picked.items():
        rates = [x.rate or 0.0 for x in by_system[name]]
        spread = f" ({si(min(rates))}-{si(max(rates))})" if len(rates) > 1 else ""
        mark = " <- best alternative" if r is best else ""
        rows.append(
            [
                name + mark,
                si(r.rate) + spread,
                us(r.p50_us),
                us(r.p99_us),
                us(r.cpu_us_per_msg),
                r.status[:60],
            ]
        )
    table = format_table(
        ["system under test", "msgs/s", "p50", "p99", "CPU/msg (SUT)", "status"], rows
    )
    verdicts = []
    if gw is not None and best is not None and gw.rate and best.rate:
        ratio = gw.rate / best.rate
        verdicts.append(
            f"throughput gateway / best alternative = {ratio:.2f}x "
            f"(target >= {TARGET_THROUGHPUT}x: {'met' if ratio >= TARGET_THROUGHPUT else 'MISSED'})"
        )
        if gw.p99_us and best.p99_us:
            p99 = gw.p99_us / best.p99_us
            verdicts.append(
                f"p99 gateway / best alternative = {p99:.3f}x "
                f"(target <= {TARGET_P99}x: {'met' if p99 <= TARGET_P99 else 'MISSED'})"
            )
        if gw.cpu_us_per_msg and best.cpu_us_per_msg:
            c = gw.cpu_us_per_msg / best.cpu_us_per_msg
            verdicts.append(
                f"CPU/msg gateway / best alternative = {c:.2f}x "
                f"(target < 1.0x: {'met' if c < 1.0 else 'MISSED'})"
            )
    return table, verdicts


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    # 100,000: a run of 20,000 lasts about a second, where start-up and the first
    # garbage collections swing the gateway's figures by half
    ap.add_argument("--jobs", type=int, default=100_000, help="jobs in all (100000)")
    ap.add_argument("--producers", type=int, default=4, help="greenstalk producer processes (4)")
    ap.add_argument("--size", type=int, default=200, help="job body bytes (200)")
    ap.add_argument("--rdy", type=int, default=1000, help="RDY of the NSQ consumer (1000)")
    ap.add_argument(
        "--output-buffer-timeout",
        type=int,
        default=25,
        help="IDENTIFY output_buffer_timeout (ms) of the consumer (25, nsqd's minimum)",
    )
    ap.add_argument("--batch", type=int, default=100, help="jobs per MPUB of a batching bridge")
    ap.add_argument("--bridges", default="1,4", help="bridge process counts (1,4)")
    ap.add_argument("--modes", default="single,batch", help="bridge kinds (single,batch)")
    ap.add_argument(
        "--only", default="gateway,alternative", help="gateway and/or alternative (both)"
    )
    ap.add_argument("--nsqd", help="HOST:PORT of a running nsqd (pinned like the gateway)")
    ap.add_argument(
        "--nsqd-bin",
        default=shutil.which("nsqd"),
        help="an nsqd binary to start here (default: nsqd on PATH; bench/README.md, Real servers)",
    )
    ap.add_argument(
        "--durability",
        default=",".join(DURABILITIES),
        help="memory (nothing on disk) and/or durable (every side on disk) (both)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per system; median shown (1)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run (120)")
    ap.add_argument(
        "--pin", choices=("none", "same", "split"), default="split", help="CPU placement (split)"
    )
    ap.add_argument("--json", help="write every run to this file")
    a = ap.parse_args(argv)
    a.bridge_counts = [int(x) for x in a.bridges.split(",") if x.strip()]
    a.mode_list = [x.strip() for x in a.modes.split(",") if x.strip()]
    a.parts = {x.strip() for x in a.only.split(",") if x.strip()}
    a.durabilities = [x.strip() for x in a.durability.split(",") if x.strip()]
    if set(a.durabilities) - set(DURABILITIES):
        ap.error("--durability takes memory,durable")
    if set(a.mode_list) - {"single", "batch"} or a.parts - {"gateway", "alternative"}:
        ap.error("--modes takes single,batch; --only takes gateway,alternative")
    if a.size < STAMP.size or min(a.jobs, a.producers, a.batch, a.repeat) < 1:
        ap.error(f"--size >= {STAMP.size}; --jobs, --producers, --batch, --repeat >= 1")
    try:
        a.nsqd = parse_addr(a.nsqd) if a.nsqd else None
    except ValueError as exc:
        ap.error(str(exc))
    if "alternative" in a.parts and a.nsqd is None and not a.nsqd_bin:
        print("# no --nsqd or --nsqd-bin: the alternative is not measured", flush=True)
        a.parts.discard("alternative")
    return a


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    placement = make_placement(a.pin)
    original = os.sched_getaffinity(0)
    failures: list[str] = []
    nsqd: Nsqd | None = None
    print(
        f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.2f}; {placement.describe()}"
    )
    print(
        f"# {a.jobs} jobs of {a.size} B from {a.producers} greenstalk producers; NSQ consumer "
        f"RDY {a.rdy}, output_buffer_timeout {a.output_buffer_timeout} ms, channel {CHANNEL}; "
        f"repeat {a.repeat}",
        flush=True,
    )
    tables: dict[str, dict[str, list[Run]]] = {}
    try:
        for durability in a.durabilities:
            durable = durability == "durable"
            by_system = tables.setdefault(durability, {})
            print(f"\n## {durability}", flush=True)
            nsqd_addr: Address | None = a.nsqd
            nsqd_pid = pid_listening_on(a.nsqd[1]) if a.nsqd else None
            if "alternative" in a.parts and nsqd_addr is None:
                nsqd = Nsqd(a.nsqd_bin, placement, ["--mem-queue-size=0"] if durable else [])
                nsqd_addr = nsqd.start()
                nsqd_pid = nsqd.pid
                print(
                    f"# {nsqd.version()} at {format_addr(nsqd_addr)} pid {nsqd_pid}"
                    + (" --mem-queue-size=0" if durable else ""),
                    flush=True,
                )
            elif nsqd_addr is not None:
                print(f"# nsqd at {format_addr(nsqd_addr)} (not started here) pid {nsqd_pid}")
            for _ in range(a.repeat):
                if "gateway" in a.parts:
                    r = run_gateway(a, placement, original, durable)
                    by_system.setdefault(r.system, []).append(r)
                    print_run(r)
                if "alternative" in a.parts:
                    assert nsqd_addr is not None
                    for mode in a.mode_list:
                        for bridges in a.bridge_counts:
                            r = run_alternative(
                                a, placement, original, mode, bridges, nsqd_addr, nsqd_pid, durable
                            )
                            by_system.setdefault(r.system, []).append(r)
                            print_run(r)
            if nsqd is not None:
                nsqd.stop()
                nsqd = None
    except (RuntimeError, OSError) as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        failures.append("interrupted")
    finally:
        if nsqd is not None:
            nsqd.stop()
        os.sched_setaffinity(0, original)
    gateways: dict[str, float] = {}
    for durability, by_system in tables.items():
        if not by_system:
            continue
        print(f"\n## {durability}")
        table, verdicts = summary(by_system)
        print(table)
        for line in verdicts:
            print(line)
        for name, runs in by_system.items():
            if name.startswith("gateway") and median(runs).rate:
                gateways[durability] = median(runs).rate or 0.0
    if len(gateways) == 2 and gateways["memory"]:
        ratio = gateways["durable"] / gateways["memory"]
        print(
            f"gateway default store / memory store = {ratio:.2f}x "
            f"(target >= {TARGET_DURABLE}x: {'met' if ratio >= TARGET_DURABLE else 'MISSED'})"
        )
    print(
        "msgs/s = jobs / (first put -> last message received); p50/p99 = publish-to-consume; "
        "CPU/msg = utime+stime of every process of the system under test / jobs"
    )
    print(f"placement: {placement.describe()}")
    for f in failures:
        print(f"FAILED: {f}")
    every = [r for by_system in tables.values() for rs in by_system.values() for r in rs]
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": [asdict(r) for r in every]}, indent=1))
    ok = not failures and all(r.status == "ok" for r in every)
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
