"""Benchmark of gateways sharing their queues through Redis (not a test).

Three setups, measured in one run on this machine:

* ``memory``  one gateway, ``--store memory://`` (the reference);
* ``redis``   one gateway, ``--store redis://127.0.0.1:PORT/0`` (a redis-server this
              script starts, no persistence: the cost of sharing, not of a disk);
* ``redis x2`` two gateways on that Redis: every workload publishes on A and consumes on B.

Workloads, on a fresh topic each, 200-byte bodies:

* ``mpub``     MPUB batches of 100, 8 outstanding: msgs/s acknowledged.
* ``sub``      fill a channel by MPUB, then SUB with RDY 1000 and FIN every message:
               msgs/s received and finished.
* ``latency``  PUB at a fixed rate (``--rate``, 1,000 msgs/s), a timestamp in each body,
               consumed with SUB + FIN: publish-to-receive p50/p99.

For each, the CPU share of every gateway and of redis-server (CPU seconds over wall time),
Redis's CPU time per message (its share over the rate), and where Redis spent it by its
own account (``INFO commandstats``, µs per message by command; a command a function calls
is counted there as well as inside ``fcall``). For ``sub``, also Redis's CPU time per
message from the fill's first publish to the last FIN: what a message costs Redis
published, delivered and finished.
Targets: one gateway on Redis >= 0.5x memory on MPUB and on SUB + FIN, Redis <= 2 µs of
CPU per message published, delivered and finished; cross-gateway p99 under 10 ms at
1,000 msgs/s.

    .venv/bin/python bench/scaleout.py
    .venv/bin/python bench/scaleout.py -n 50000 --only mpub,latency
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Address,
    GatewayProcess,
    Watchdog,
    format_table,
    make_placement,
    percentiles,
    process_cpu_seconds,
    si,
)
from nsq import (
    FRAME_ERROR,
    STAMP,
    NSQConn,
    be32,
    build_mpub,
    fin_lines,
    make_body,
    scan_frames,
    scan_stamped,
)

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


@dataclass
class Figures:
    setup: str
    workload: str
    rate: float = 0.0  # msgs/s
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # process -> share of wall time
    note: str = ""
    # Redis's own account of its time (INFO commandstats), command -> µs per message
    commands: dict[str, float] = field(default_factory=dict)
    # sub: Redis's CPU time per message from the first publish of the fill to the last
    # FIN (published, delivered and finished), µs
    redis_whole_us: float | None = None

    @property
    def redis_us(self) -> float | None:
        """Redis CPU time per message (its CPU share over the rate), µs."""
        share = self.cpu.get("redis")
        return None if share is None or not self.rate else share / self.rate * 1e6


class CPU:
    """CPU seconds of some processes between start() and stop(), as shares of wall time."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = {k: process_cpu_seconds(p) or 0.0 for k, p in self.pids.items()}

    def stop(self, wall: float | None = None) -> dict[str, float]:
        """`wall`: the workload's own time, when it ended before this call."""
        wall = wall or time.perf_counter() - self.t0
        return {
            k: ((process_cpu_seconds(p) or 0.0) - self.c0[k]) / wall for k, p in self.pids.items()
        }


def command_usec(port: int) -> dict[str, int]:
    """INFO commandstats: command -> µs spent in it so far (the commands a function runs
    are counted under their own names as well as under FCALL)."""
    out = subprocess.run(
        [REDIS_CLI, "-p", str(port), "INFO", "commandstats"], capture_output=True, text=True
    ).stdout
    usec: dict[str, int] = {}
    for line in out.splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line[len("cmdstat_") :].partition(":")
            for item in fields.split(","):
                key, _, value = item.partition("=")
                if key == "usec":
                    usec[name] = int(value)
    return usec


def start_redis(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = subprocess.run([REDIS_CLI, "-p", str(port), "PING"], capture_output=True, text=True)
        if out.stdout.strip() == "PONG":
            return proc, port
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")


def start_gateway(store: str, data: Path) -> GatewayProcess:
    gw = GatewayProcess(
        [
            "serve",
            "--store",
            store,
            "--data-dir",
            str(data),
            "--nsq",
            "127.0.0.1:0",
            "--http",
            "off",
            "--beanstalk",
            "off",
            "--nats",
            "off",
            "--nats-route",
            "off",
            "--rocketmq",
            "off",
            "--log-level",
            "warning",
        ],
        make_placement("none"),
        ["nsq"],
    )
    gw.start()
    return gw


def mpub_all(conn: NSQConn, topic: str, n: int, batch: int = 100, window: int = 8) -> None:
    payload = build_mpub(topic, [make_body(200)] * batch)
    batches = n // batch
    sent = acked = 0
    while acked < batches:
        if sent - acked < window and sent < batches:
            stop = min(batches, acked + window)
            conn.send(payload * (stop - sent))
            sent = stop
        conn.expect_ok("MPUB")
        acked += 1


def subscriber(addr: Address, wd: Watchdog, topic: str, **identify: object) -> NSQConn:
    conn = NSQConn(addr, wd)
    conn.identify({"feature_negotiation": True, "heartbeat_interval": 30_000, **identify})
    conn.subscribe(topic, "bench")
    return conn


def run_mpub(pub: Address, n: int, wd: Watchdog, cpu: CPU, topic: str) -> Figures:
    conn = NSQConn(pub, wd)
    cpu.start()
    t = time.perf_counter()
    mpub_all(conn, topic, n)
    wall = time.perf_counter() - t
    shares = cpu.stop()
    conn.close()
    return Figures("", "mpub", n / wall, cpu=shares)


def run_sub(pub: Address, con: Address, n: int, wd: Watchdog, cpu: CPU, topic: str) -> Figures:
    sub = subscriber(con, wd, topic)
    redis_pid = cpu.pids.get("redis")
    redis_before = process_cpu_seconds(redis_pid) if redis_pid else None
    p = NSQConn(pub, wd)
    mpub_all(p, topic, n)
    p.close()
    cpu.start()
    t = time.perf_counter()
    sub.send(b"RDY 1000\n")
    received = 0
    while received < n:
        sub.fill()
        ids: list[bytearray] = []
        others: list[tuple[int, bytes]] = []
        sub.start = scan_frames(sub.buf, sub.start, sub.end, ids, others)
        if ids:
            sub.sock.sendall(fin_lines(ids))
            received += len(ids)
        for ftype, data in others:
            if not (ftype == FRAME_ERROR and data.startswith(b"E_FIN_FAILED")):
                sub.handle_other(ftype, data)
    wall = time.perf_counter() - t
    shares = cpu.stop()
    sub.close()
    whole = None
    if redis_pid and redis_before is not None:
        whole = ((process_cpu_seconds(redis_pid) or 0.0) - redis_before) / n * 1e6
    return Figures("", "sub", n / wall, cpu=shares, redis_whole_us=whole)


def run_latency(
    pub: Address, con: Address, n: int, rate: float, wd: Watchdog, cpu: CPU, topic: str
) -> Figures:
    sub = subscriber(con, wd, topic, output_buffer_size=-1)
    sub.send(b"RDY 200\n")
    time.sleep(0.3)  # the channel is known to every gateway (registry refresh) before
    pad = make_body(200 - STAMP.size)
    head = b"PUB " + topic.encode() + b"\n" + be32(STAMP.size + len(pad))
    clock = time.perf_counter_ns
    errors: list[BaseException] = []

    def publisher() -> None:
        try:
            conn = NSQConn(pub, wd)
            start = time.perf_counter()
            for i in range(n):
                due = start + i / rate
                lag = due - time.perf_counter()
                if lag > 0:
                    time.sleep(lag)
                conn.send(head + STAMP.pack(clock()) + pad)
                conn.expect_ok("PUB")
            conn.close()
        except BaseException as exc:
            errors.append(exc)

    latencies: list[int] = []
    cpu.start()
    thread = threading.Thread(target=publisher, daemon=True)
    thread.start()
    while len(latencies) < n and not errors:
        sub.fill()
        now = clock()
        ids: list[bytearray] = []
        stamps: list[int] = []
        others: list[tuple[int, bytes]] = []
        sub.start = scan_stamped(sub.buf, sub.start, sub.end, ids, stamps, others)
        if ids:
            sub.sock.sendall(fin_lines(ids))
            latencies += [now - s for s in stamps]
        for ftype, data in others:
            sub.handle_other(ftype, data)
    thread.join(5)
    shares = cpu.stop()
    sub.close()
    if errors:
        raise RuntimeError(f"publisher: {errors[0]}")
    pts = percentiles([x / 1e6 for x in latencies], (50, 99))
    return Figures("", "latency", rate, pts[50], pts[99], shares)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100_000, help="messages for mpub and sub")
    parser.add_argument("--latency-n", type=int, default=5_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--only", default="mpub,sub,latency")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds of every setup, interleaved; medians"
    )
    args = parser.parse_args(argv)
    workloads = args.only.split(",")
    results: list[Figures] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        redis, port = start_redis(tmp)
        url = f"redis://127.0.0.1:{port}/0"
        setups = [("memory", ["memory://"]), ("redis", [url]), ("redis x2", [url, url])]
        rounds = [(r, name, stores) for r in range(args.repeat) for name, stores in setups]
        try:
            for round_, name, stores in rounds:
                gws = [start_gateway(s, tmp / f"{name}-{i}") for i, s in enumerate(stores)]
                try:
                    pids = {f"gw{i}": g.proc.pid for i, g in enumerate(gws) if g.proc}
                    if name != "memory":
                        pids["redis"] = redis.pid
                    cpu = CPU(pids)
                    pub, con = gws[0].addresses["nsq"], gws[-1].addresses["nsq"]
                    with Watchdog(args.timeout) as wd:
                        for w in workloads:
                            topic = f"{w}-{name.replace(' ', '')}-{round_}-{time.time_ns()}"
                            before = command_usec(port)
                            if w == "mpub":
                                f = run_mpub(pub, args.n, wd, cpu, topic)
                            elif w == "sub":
                                f = run_sub(pub, con, args.n, wd, cpu, topic)
                            else:
                                f = run_latency(pub, con, args.latency_n, args.rate, wd, cpu, topic)
                            f.setup = name
                            if name != "memory" and w != "latency":
                                after = command_usec(port)
                                n = args.n
                                f.commands = {
                                    c: (u - before.get(c, 0)) / n
                                    for c, u in after.items()
                                    if u - before.get(c, 0) > 0
                                }
                            results.append(f)
                            print(describe(f), flush=True)
                finally:
                    for g in gws:
                        g.stop()
        finally:
            redis.kill()
            redis.wait()
    print()
    print(summary(results))
    return 0


def describe(f: Figures) -> str:
    cpu = " ".join(f"{k} {v:.0%}" for k, v in f.cpu.items())
    if f.workload == "latency":
        return (
            f"{f.setup:9} latency at {f.rate:.0f}/s: p50 {f.p50_ms:.2f} ms, "
            f"p99 {f.p99_ms:.2f} ms (CPU {cpu})"
        )
    line = f"{f.setup:9} {f.workload:5} {si(f.rate)} msgs/s (CPU {cpu})"
    if f.redis_whole_us is not None:
        line += f"; redis {f.redis_whole_us:.2f} µs/msg published, delivered and finished"
    if f.commands:
        top = sorted(f.commands.items(), key=lambda kv: -kv[1])[:8]
        line += "\n          redis µs/msg by command: " + ", ".join(
            f"{c} {us:.2f}" for c, us in top
        )
    return line


def summary(results: list[Figures]) -> str:
    """Medians over the rounds (the run with the median rate, for its CPU shares), and
    the range where there was more than one round."""
    runs: dict[tuple[str, str], list[Figures]] = {}
    for f in results:
        runs.setdefault((f.setup, f.workload), []).append(f)
    by = {key: sorted(fs, key=lambda f: f.rate)[(len(fs) - 1) // 2] for key, fs in runs.items()}
    rounds = max(map(len, runs.values()), default=1)
    rows = []
    for w in ("mpub", "sub"):
        base = by.get(("memory", w))
        for setup in ("memory", "redis", "redis x2"):
            f = by.get((setup, w))
            if f is None:
                continue
            rates = [g.rate for g in runs[setup, w]]
            ratio = f"{f.rate / base.rate:.2f}x" if base else "-"
            spread = f"{si(min(rates))}-{si(max(rates))}" if len(rates) > 1 else "-"
            redis_cpu = f"{f.cpu['redis']:.0%}" if "redis" in f.cpu else "-"
            us = f.redis_us
            per_msg = f"{us:.2f}" if us is not None else "-"
            whole = f"{f.redis_whole_us:.2f}" if f.redis_whole_us is not None else "-"
            rows.append([w, setup, si(f.rate), spread, ratio, redis_cpu, per_msg, whole])
    heading = [
        "workload",
        "setup",
        "msgs/s",
        "range",
        "vs memory",
        "redis CPU",
        "redis µs/msg",
        "redis µs/msg, PUB to FIN",
    ]
    table = format_table(heading, rows)
    lat = []
    for setup in ("memory", "redis", "redis x2"):
        fs = runs.get((setup, "latency"))
        if fs:
            f = by[setup, "latency"]
            p50 = statistics.median(g.p50_ms for g in fs)
            p99s = [g.p99_ms for g in fs]
            p99 = f"{statistics.median(p99s):.2f}"
            if len(fs) > 1:
                p99 += f" ({min(p99s):.2f}-{max(p99s):.2f})"
            redis_cpu = f"{f.cpu['redis']:.0%}" if "redis" in f.cpu else "-"
            lat.append([setup, f"{f.rate:.0f}/s", f"{p50:.2f}", p99, redis_cpu])
    latency = format_table(["latency", "rate", "p50 ms", "p99 ms", "redis CPU"], lat)
    return f"medians of {rounds} round(s)\n{table}\n\n{latency}"


if __name__ == "__main__":
    sys.exit(main())
