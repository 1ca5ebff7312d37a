"""Benchmark of the durable store (not a test): what durability costs, side by side in one run.

Sections (``--only``, comma-separated; all by default):

* ``throughput``: the memory store against the durable one (default policy, fsync every
  50 ms), both gateways running, each workload on one then the other: NSQ PUB one at a time
  over 1 and over 16 connections, MPUB x100, SUB + FIN, greenstalk put from 4 processes.
* ``ceiling``: the request/response workloads (NSQ PUB one at a time over 1 and over 16
  connections, greenstalk put from 1 and 4 processes) on the runtime's own ceiling
  (bench/ceiling.py: a Trio server on the gateway's socket pattern with canned replies, no
  queue, no store), the memory gateway and the durable one, in turns. A client that waits
  for each reply is bounded by that ceiling whatever the store does: the durable figure is
  judged as a share of it, next to the memory store's share.
* ``beanstalkd``: the durable gateway against a real beanstalkd with its binlog, greenstalk put
  from 1 and 4 processes, in two pairings: the default policy against ``beanstalkd -b DIR``
  (fsync at most every 50 ms), and ``fsync = "always"`` against ``beanstalkd -b DIR -f 0``
  (fsync on every write).
* ``rss``: peak RSS (VmHWM of the whole process) with 1,000,000 queued 200-byte messages
  (channel created first, then MPUB), memory and durable; then the durable gateway is stopped
  (SIGTERM) and restarted, timing the start to its listening lines and to the first delivery,
  and the peak RSS of the restarted process. Then the same 1,000,000 into a topic without a
  channel (its backlog keeps a memory window too), filled and restarted, durable only.
* ``disk``: the data dir's size (du) after 2,000,000 messages published (MPUB) and finished
  (SUB + FIN, at the same time), live and after a SIGTERM.

The NSQ workloads are bench/nsq.py's raw-socket ones (imported from it); CPU placement is
``--pin`` as in the other benches (``split`` by default: servers on the first CPU, clients on
the second). Data dirs are made under ``--dir`` (default: the system temp dir; its filesystem
is printed, since fsync costs depend on it) and removed at the end. ``--quick`` runs a tenth
of every size (the RSS and disk targets are then not judged). Loopback only.

    .venv/bin/python bench/store.py                    # everything (a few minutes)
    .venv/bin/python bench/store.py --quick            # a quick look
    .venv/bin/python bench/store.py --only rss,disk    # some sections
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass, field, replace
from functools import partial
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import cast

import greenstalk

# bench/ is a folder of scripts: its helpers are found next to this file, however it is run
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nsq as nsq_bench  # bench/nsq.py (not pynsq): its raw-socket NSQ workloads
from _common import (
    Address,
    GatewayProcess,
    Placement,
    Watchdog,
    format_table,
    make_placement,
    run_processes,
    si,
)

# the real server: on PATH (Debian's beanstalkd package), else where Debian puts it
BEANSTALKD = shutil.which("beanstalkd") or "/usr/bin/beanstalkd"
SECTIONS = ("throughput", "ceiling", "beanstalkd", "rss", "disk")
CEILING_SCRIPT = str(Path(__file__).resolve().parent / "ceiling.py")
MiB = 1024 * 1024

# Targets (the storage issue): ratios are durable / reference.
TARGET_DURABLE = 0.8  # every throughput workload: durable >= 0.8x memory
TARGET_PUT = 1.0  # durable greenstalk put x1 and x4 >= 1.0x beanstalkd with binlog, both pairings
TARGET_RSS_DURABLE_MB = 150  # with 1M queued
TARGET_RSS_MEMORY_MB = 600
TARGET_RECOVERY_S = 2.0  # 1M queued, start to first delivery
TARGET_DISK_MB = 50  # after 2M published and finished


@dataclass(frozen=True)
class Scale:
    pub: int = 20_000  # PUB one at a time, 1 connection
    pub16: int = 50_000  # PUB one at a time, 16 connections (in total)
    mpub: int = 500_000
    sub: int = 300_000
    put: int = 20_000  # greenstalk put, per process
    put_always: int = 5_000  # per process, fsync on every write (both servers)
    rss: int = 1_000_000
    disk: int = 2_000_000

    def tenth(self) -> Scale:
        return Scale(*(max(100, v // 10) for v in vars(self).values()))


FULL = Scale()


# -- servers ------------------------------------------------------------------------------------


def gateway_args(store: list[str], config: Path | None = None) -> list[str]:
    args = [
        "serve",
        "--nsq",
        "127.0.0.1:0",
        "--beanstalk",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--nats",
        "off",
        "--nats-route",
        "off",
        "--rocketmq",
        "off",
        *store,
    ]
    return [*args, "--config", str(config)] if config is not None else args


@dataclass
class Server:
    """A gateway (memory or durable) or a beanstalkd, started pinned, stopped at the end."""

    name: str
    gateway: GatewayProcess | None = None
    beanstalkd: subprocess.Popen[bytes] | None = None
    addresses: dict[str, Address] = field(default_factory=dict)
    data_dir: Path | None = None

    @property
    def pid(self) -> int:
        proc = self.gateway.proc if self.gateway is not None else self.beanstalkd
        assert proc is not None
        return proc.pid

    def stop(self) -> int | None:
        if self.gateway is not None:
            return self.gateway.stop()
        if self.beanstalkd is not None and self.beanstalkd.poll() is None:
            self.beanstalkd.terminate()
            try:
                self.beanstalkd.wait(10)
            except subprocess.TimeoutExpired:
                self.beanstalkd.kill()
                self.beanstalkd.wait()
        return None


def start_gateway(
    name: str, placement: Placement, data_dir: Path | None, fsync: str | None = None
) -> Server:
    """The memory gateway (data_dir None) or the durable one in data_dir."""
    config = None
    if data_dir is None:
        store = ["--store", "memory://"]
    else:
        store = ["--data-dir", str(data_dir)]
        if fsync is not None:
            config = data_dir.parent / f"{data_dir.name}.toml"
            value = fsync if fsync.isdigit() else json.dumps(fsync)
            config.write_text(f"[storage]\nfsync = {value}\n")
    gateway = GatewayProcess(gateway_args(store, config), placement, ["nsq", "beanstalk", "http"])
    addresses = gateway.start()
    return Server(name, gateway=gateway, addresses=addresses, data_dir=data_dir)


def start_ceiling(protocol: str, placement: Placement) -> Server:
    """bench/ceiling.py serving `protocol` on an ephemeral port."""
    ceiling = GatewayProcess([protocol], placement, [protocol], program=(CEILING_SCRIPT,))
    addresses = ceiling.start()
    return Server(f"ceiling {protocol}", gateway=ceiling, addresses=addresses)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_beanstalkd(name: str, placement: Placement, binlog: Path, *extra: str) -> Server:
    binlog.mkdir(parents=True, exist_ok=True)
    for _ in range(5):
        addr = ("127.0.0.1", free_port())
        cmd = [BEANSTALKD, "-l", addr[0], "-p", str(addr[1]), "-b", str(binlog), *extra]
        proc = subprocess.Popen(
            [*placement.server_prefix(), *cmd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=placement.server_preexec(),
        )
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(addr, timeout=1.0).close()
                return Server(name, beanstalkd=proc, addresses={"beanstalk": addr})
            except OSError:
                time.sleep(0.01)
        proc.kill()
        proc.wait()
    raise RuntimeError(f"beanstalkd did not start: {' '.join(cmd)}")


def beanstalkd_version() -> str:
    out = subprocess.run([BEANSTALKD, "-v"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip()


def vm_kb(pid: int, key: str) -> int | None:
    """A /proc/PID/status figure in kB (VmHWM: peak resident set, VmRSS: current)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def du_bytes(path: Path) -> tuple[int, int]:
    """(allocated bytes as du counts them, apparent bytes) of every file under path."""
    allocated = apparent = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                allocated += st.st_blocks * 512
                apparent += st.st_size
    return allocated, apparent


def filesystem_of(path: Path) -> str:
    """The mount point and filesystem type holding path, from /proc/mounts."""
    best = ("/", "?")
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            _dev, mount, fstype, *_ = line.split()
            if str(path).startswith(mount) and len(mount) >= len(best[0]):
                best = (mount, fstype)
    return f"{best[1]} (mounted on {best[0]})"


def http_post(server: Server, path: str, **params: str) -> None:
    host, port = server.addresses["http"]
    url = f"http://{host}:{port}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(urllib.request.Request(url, b"", method="POST"), timeout=30):
        pass


def channel_depth(server: Server, topic: str, channel: str) -> int | None:
    host, port = server.addresses["http"]
    query = urllib.parse.urlencode({"format": "json", "topic": topic, "channel": channel})
    with urllib.request.urlopen(f"http://{host}:{port}/stats?{query}", timeout=60) as reply:
        topics = json.load(reply)["topics"]
    if not topics or not topics[0]["channels"]:
        return None
    c = topics[0]["channels"][0]
    return int(c["depth"]) + int(c["in_flight_count"]) + int(c["deferred_count"])


# -- results ------------------------------------------------------------------------------------


@dataclass
class Row:
    section: str
    workload: str
    reference: str  # what the durable figure is compared with
    ref_value: str
    durable: str
    ratio: str
    target: str
    verdict: str


def verdict(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "MISSED")


def interleaved(repeat: int, *measures: Callable[[], float | str]) -> list[float | str]:
    """Each of `measures` `repeat` times, taking turns (so that a noisy moment of a shared
    machine falls on all of them alike); the median of each (an error, if one ended so)."""
    results: list[list[float | str]] = [[] for _ in measures]
    for _ in range(repeat):
        for runs, measure in zip(results, measures, strict=True):
            runs.append(measure())
    out: list[float | str] = []
    for runs in results:
        errors = [r for r in runs if isinstance(r, str)]
        out.append(errors[0] if errors else statistics.median(runs))  # type: ignore[type-var]
    return out


def rate_row(
    section: str, workload: str, ref_name: str, ref: float | str, dur: float | str, target: float
) -> Row:
    """A throughput pair; a str figure is the error that workload ended with."""
    ratio = None
    if isinstance(ref, float) and isinstance(dur, float) and ref > 0:
        ratio = dur / ref
    return Row(
        section,
        workload,
        ref_name,
        si(ref) + "/s" if isinstance(ref, float) else ref,
        si(dur) + "/s" if isinstance(dur, float) else dur,
        f"{ratio:.2f}x" if ratio is not None else "-",
        f">= {target:.1f}x" if target else "-",
        verdict(ratio >= target if ratio is not None and target else None),
    )


def say(text: str) -> None:
    print(text, flush=True)


# -- NSQ workloads ------------------------------------------------------------------------------


def nsq_options(scale: Scale, timeout: float) -> nsq_bench.Options:
    n = {"pub": scale.pub, "mpub": scale.mpub, "sub": scale.sub, "latency": 0}
    return nsq_bench.Options(n, 200, 100, 8, 1000, timeout, 25)


def nsq_workload(workload: str, server: Server, opts: nsq_bench.Options) -> float | str:
    """One of bench/nsq.py's workloads (pub, mpub, sub) against a server: msgs/s or an error."""
    target = nsq_bench.Target(server.name, server.addresses["nsq"], server.pid)
    result = nsq_bench.run_workload(workload, target, opts)
    nsq_bench.print_result(result)
    if result.status != "ok" or result.rate is None:
        return result.status
    return float(result.rate)


def pub_many(server: Server, n: int, conns: int, size: int, timeout: float) -> float | str:
    """PUB one at a time on each of `conns` connections (one outstanding PUB per connection,
    driven from one thread with a selector): msgs/s over all of them."""
    topic = f"store_pub{conns}_{server.name}_{time.time_ns() % 10**10}"
    command = nsq_bench.build_pub(topic, nsq_bench.make_body(size))
    ok_frame = nsq_bench.HEADER.pack(6, nsq_bench.FRAME_RESPONSE) + nsq_bench.OK
    try:
        with Watchdog(timeout) as wd:
            socks = [nsq_bench.NSQConn(server.addresses["nsq"], wd).sock for _ in range(conns)]
            sel = selectors.DefaultSelector()
            buffers = {s: b"" for s in socks}
            for s in socks:
                sel.register(s, selectors.EVENT_READ)
            sent = acked = 0
            t0 = time.perf_counter()
            for s in socks:
                s.sendall(command)
                sent += 1
            while acked < n:
                for key, _ in sel.select():
                    s = cast(socket.socket, key.fileobj)
                    data = s.recv(65536)
                    if not data:
                        raise ConnectionError("closed by the server")
                    buf = buffers[s] + data
                    while len(buf) >= len(ok_frame):
                        if buf[: len(ok_frame)] != ok_frame:
                            raise nsq_bench.UnexpectedFrame(f"expected OK, got {buf[:60]!r}")
                        buf = buf[len(ok_frame) :]
                        acked += 1
                        if sent < n:
                            s.sendall(command)
                            sent += 1
                    buffers[s] = buf
            seconds = time.perf_counter() - t0
    except (OSError, nsq_bench.UnexpectedFrame) as exc:
        return f"ERROR {exc!r}"
    rate = n / seconds
    say(f"[pub x{conns} conns @ {server.name}] {n} msgs in {seconds:.2f}s = {si(rate)} msgs/s")
    return rate


# -- greenstalk put -----------------------------------------------------------------------------


def put_worker(
    addr: Address, n: int, size: int, idx: int, barrier: Barrier, out: multiprocessing.Queue
) -> None:
    tube = f"store-{idx}-{time.time_ns()}"
    body = b"x" * size
    try:
        with greenstalk.Client(addr, encoding=None, use=tube) as c:
            barrier.wait(60)
            t0 = time.perf_counter()
            for _ in range(n):
                c.put(body)
            out.put((t0, time.perf_counter()))
    except Exception as exc:  # reported by the parent
        out.put(repr(exc))


def greenstalk_put(
    server: Server, procs: int, n: int, size: int, timeout: float, label: str
) -> float | str:
    """`procs` processes, each putting n jobs into its own tube at once: jobs/s over the wall
    time from the first start to the last end."""
    addr = server.addresses["beanstalk"]
    spans, error = run_processes(put_worker, (addr, n, size), procs, timeout)
    if error:
        say(f"[put x{procs} @ {label}] {error}")
        return error
    wall = max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans)
    rate = n * procs / wall
    say(f"[put x{procs} @ {label}] {n * procs} jobs in {wall:.2f}s = {si(rate)} jobs/s")
    return rate


# -- sections -----------------------------------------------------------------------------------


@dataclass
class Run:
    placement: Placement
    scale: Scale
    root: Path
    timeout: float
    quick: bool
    repeat: int = 3  # runs of each throughput workload, taking turns; medians reported
    rows: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    servers: list[Server] = field(default_factory=list)

    def data_dir(self, name: str) -> Path:
        path = self.root / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    @contextlib.contextmanager
    def started(self, *servers: Callable[[], Server]) -> Iterator[list[Server]]:
        """Start servers (pinned), pin this process as a client, stop them all at the end."""
        self.placement.apply_to_client()
        up: list[Server] = []
        try:
            for start in servers:
                up.append(start())
                self.servers.append(up[-1])
            yield up
        finally:
            for s in up:
                code = s.stop()
                # bench/ceiling.py has no SIGTERM handler: -15 is its usual way out
                gw = s.gateway
                if gw is not None and gw.program == ("-m", "gateway") and code not in (0, None):
                    tail = list(gw.stderr_tail)[-5:]
                    self.failures.append(f"{s.name} exit status {code}: {tail}")
                self.servers.remove(s)


def section_throughput(run: Run) -> None:
    say("\n## memory store vs durable store (default policy)")
    opts = nsq_options(run.scale, run.timeout)
    durable_dir = run.data_dir("throughput")
    with run.started(
        lambda: start_gateway("memory", run.placement, None),
        lambda: start_gateway("durable", run.placement, durable_dir),
    ) as (memory, durable):
        pairs: list[tuple[str, Callable[[Server], float | str], float]] = [
            (
                "NSQ PUB one at a time, 1 conn",
                lambda s: nsq_workload("pub", s, opts),
                TARGET_DURABLE,
            ),
            (
                "NSQ PUB one at a time, 16 conns",
                lambda s: pub_many(s, run.scale.pub16, 16, 200, run.timeout),
                TARGET_DURABLE,
            ),
            ("NSQ MPUB x100", lambda s: nsq_workload("mpub", s, opts), TARGET_DURABLE),
            ("NSQ SUB + FIN", lambda s: nsq_workload("sub", s, opts), TARGET_DURABLE),
            (
                "greenstalk put, 4 procs",
                lambda s: greenstalk_put(s, 4, run.scale.put, 200, run.timeout, s.name),
                TARGET_DURABLE,
            ),
        ]
        for workload, measure, target in pairs:
            ref, dur = interleaved(run.repeat, partial(measure, memory), partial(measure, durable))
            run.rows.append(rate_row("memory vs durable", workload, "memory", ref, dur, target))


def section_ceiling(run: Run) -> None:
    say("\n## request/response: Trio's ceiling, the memory store, the durable store")
    opts = nsq_options(run.scale, run.timeout)
    with run.started(
        lambda: start_ceiling("nsq", run.placement),
        lambda: start_ceiling("beanstalk", run.placement),
        lambda: start_gateway("memory", run.placement, None),
        lambda: start_gateway("durable", run.placement, run.data_dir("ceiling")),
    ) as (nsq_ceiling, beanstalk_ceiling, memory, durable):
        workloads: list[tuple[str, Server, Callable[[Server], float | str]]] = [
            ("NSQ PUB one at a time, 1 conn", nsq_ceiling, lambda s: nsq_workload("pub", s, opts)),
            (
                "NSQ PUB one at a time, 16 conns",
                nsq_ceiling,
                lambda s: pub_many(s, run.scale.pub16, 16, 200, run.timeout),
            ),
        ]
        n, timeout = run.scale.put, run.timeout
        for procs in (1, 4):
            workloads.append(
                (
                    f"greenstalk put, {procs} proc{'s' if procs > 1 else ''}",
                    beanstalk_ceiling,
                    lambda s, k=procs: greenstalk_put(s, k, n, 200, timeout, s.name),
                )
            )
        for workload, ceiling, measure in workloads:
            top, mem, dur = interleaved(
                run.repeat, partial(measure, ceiling), partial(measure, memory),
                partial(measure, durable),
            )  # fmt: skip
            run.rows.append(rate_row("vs ceiling", f"{workload}, memory", "ceiling", top, mem, 0))
            run.rows.append(rate_row("vs ceiling", f"{workload}, durable", "ceiling", top, dur, 0))


def section_beanstalkd(run: Run) -> None:
    say(f"\n## durable gateway vs {beanstalkd_version()} with its binlog (greenstalk put)")
    pairings = [
        ("fsync 50 ms", None, (), run.scale.put),
        ('fsync "always" / -f 0', "always", ("-f", "0"), run.scale.put_always),
    ]
    for label, fsync, extra, n in pairings:
        gw_dir, bs_dir = run.data_dir(f"bs-gw-{fsync}"), run.data_dir(f"bs-binlog-{fsync}")
        # The first pairing also runs the memory gateway, which writes nothing at all: the
        # durable store's ratio can at best reach its ratio, so the run shows how much of
        # the gap is the store's and how much the gateway's own per-request cost.
        with_memory = fsync is None
        with run.started(
            lambda: start_beanstalkd("beanstalkd", run.placement, bs_dir, *extra),  # noqa: B023
            lambda: start_gateway("durable", run.placement, gw_dir, fsync),  # noqa: B023
            *([lambda: start_gateway("memory", run.placement, None)] if with_memory else []),
        ) as (real, durable, *memory):
            bs_cmd = f"beanstalkd -b DIR {' '.join(extra)}".strip()
            say(f"# {label}: gateway fsync={fsync or 'default (50)'} vs {bs_cmd}")
            for procs in (1, 4):
                measures = [
                    partial(greenstalk_put, real, procs, n, 200, run.timeout, bs_cmd),
                    partial(
                        greenstalk_put, durable, procs, n, 200, run.timeout, f"durable {label}"
                    ),
                ]
                if memory:
                    measures.append(
                        partial(
                            greenstalk_put,
                            memory[0],
                            procs,
                            n,
                            200,
                            run.timeout,
                            "memory (no disk)",
                        )
                    )
                ref, dur, *mem = interleaved(run.repeat, *measures)
                if mem:
                    run.rows.append(
                        rate_row(
                            "vs beanstalkd",
                            f"put x{procs}, memory store (no disk)",
                            bs_cmd,
                            ref,
                            mem[0],
                            0,
                        )
                    )
                run.rows.append(
                    rate_row(
                        "vs beanstalkd", f"put x{procs}, {label}", bs_cmd, ref, dur, TARGET_PUT
                    )
                )


def fill(server: Server, topic: str, n: int, timeout: float, channel: bool = True) -> float:
    """Create channel `ch` (unless not `channel`: the topic keeps them), then MPUB n
    200-byte messages into it; returns the seconds."""
    http_post(server, "/topic/create", topic=topic)
    if channel:
        http_post(server, "/channel/create", topic=topic, channel="ch")
    opts = replace(nsq_options(FULL, timeout), n={"mpub": n})
    with Watchdog(timeout) as wd:
        conn = nsq_bench.NSQConn(server.addresses["nsq"], wd)
        t0 = time.perf_counter()
        done = nsq_bench.publish_mpub(conn, topic, n, opts)
        seconds = time.perf_counter() - t0
        conn.close()
    if done != n:
        raise RuntimeError(f"only {done} of {n} acknowledged")
    return seconds


def first_delivery(server: Server, topic: str, timeout: float) -> None:
    with Watchdog(timeout) as wd:
        conn = nsq_bench.NSQConn(server.addresses["nsq"], wd)
        conn.subscribe(topic, "ch")
        conn.send(b"RDY 1\n")
        ftype, _ = conn.next_frame()
        if ftype != nsq_bench.FRAME_MESSAGE:
            raise nsq_bench.UnexpectedFrame(f"frame type {ftype}")
        conn.close()


def mb(kb: int | None) -> str:
    return "-" if kb is None else f"{kb / 1024:.0f} MB"


def section_rss(run: Run) -> None:
    n = run.scale.rss
    say(f"\n## peak RSS with {n} queued 200-byte messages, and recovering them")
    topic = "store_rss"
    peaks: dict[str, int | None] = {}
    with run.started(lambda: start_gateway("memory", run.placement, None)) as (memory,):
        seconds = fill(memory, topic, n, run.timeout)
        peaks["memory"] = vm_kb(memory.pid, "VmHWM")
        say(f"[rss @ memory] filled in {seconds:.1f}s; VmHWM {mb(peaks['memory'])}")
    data_dir = run.data_dir("rss")
    durable = start_gateway("durable", run.placement, data_dir)
    run.servers.append(durable)
    recovery: tuple[float, float] | None = None
    recovered_peak: int | None = None
    try:
        seconds = fill(durable, topic, n, run.timeout)
        peaks["durable"] = vm_kb(durable.pid, "VmHWM")
        say(
            f"[rss @ durable] filled in {seconds:.1f}s; VmHWM {mb(peaks['durable'])}, "
            f"data dir {du_bytes(data_dir)[0] / MiB:.0f} MiB"
        )
        t0 = time.perf_counter()
        code = durable.stop()
        say(f"[rss @ durable] SIGTERM: exit {code} after {time.perf_counter() - t0:.2f}s")
        run.servers.remove(durable)
        t0 = time.perf_counter()
        durable = start_gateway("durable", run.placement, data_dir)
        run.servers.append(durable)
        listening = time.perf_counter() - t0
        first_delivery(durable, topic, run.timeout)
        first = time.perf_counter() - t0
        recovery = (listening, first)
        recovered_peak = vm_kb(durable.pid, "VmHWM")
        depth = channel_depth(durable, topic, "ch")
        recovered_peak = max(recovered_peak or 0, vm_kb(durable.pid, "VmHWM") or 0) or None
        say(
            f"[recovery @ durable] listening after {listening:.2f}s, first delivery after "
            f"{first:.2f}s; {depth} messages in the channel; VmHWM {mb(recovered_peak)}"
        )
        if depth != n:
            run.failures.append(f"recovered {depth} messages, not {n}")
    finally:
        durable.stop()
        run.servers.remove(durable)
    judged = not run.quick
    mem, dur = peaks.get("memory"), peaks.get("durable")
    worst = max(dur or 0, recovered_peak or 0) or None
    run.rows.append(
        Row(
            "rss",
            f"peak RSS, {si(n)} queued (durable: max of fill and restart)",
            "memory",
            mb(mem),
            mb(worst),
            f"{worst / mem:.2f}x" if worst and mem else "-",
            f"durable <= {TARGET_RSS_DURABLE_MB} MB, memory <= {TARGET_RSS_MEMORY_MB} MB",
            verdict(
                worst is not None
                and mem is not None
                and worst / 1024 <= TARGET_RSS_DURABLE_MB
                and mem / 1024 <= TARGET_RSS_MEMORY_MB
                if judged
                else None
            ),
        )
    )
    no_channel = rss_without_channel(run, topic, n)
    run.rows.append(
        Row(
            "rss",
            f"peak RSS, {si(n)} queued in a topic without a channel (fill and restart)",
            "-",
            "-",
            mb(no_channel),
            "-",
            f"durable <= {TARGET_RSS_DURABLE_MB} MB",
            verdict(
                no_channel is not None and no_channel / 1024 <= TARGET_RSS_DURABLE_MB
                if judged
                else None
            ),
        )
    )
    run.rows.append(
        Row(
            "rss",
            f"restart with {si(n)} queued: listening / first delivery",
            "-",
            "-",
            f"{recovery[0]:.2f}s / {recovery[1]:.2f}s" if recovery else "-",
            "-",
            f"<= {TARGET_RECOVERY_S:.0f} s",
            verdict(recovery[1] <= TARGET_RECOVERY_S if recovery and judged else None),
        )
    )


def rss_without_channel(run: Run, topic: str, n: int) -> int | None:
    """Peak RSS of the durable gateway with n published before any channel exists (the
    topic's backlog keeps a memory window too), filled and then restarted; the first
    channel must then hold all n."""
    data_dir = run.data_dir("rss-topic")
    durable = start_gateway("durable", run.placement, data_dir)
    run.servers.append(durable)
    try:
        seconds = fill(durable, topic, n, run.timeout, channel=False)
        peak = vm_kb(durable.pid, "VmHWM")
        durable.stop()
        run.servers.remove(durable)
        durable = start_gateway("durable", run.placement, data_dir)
        run.servers.append(durable)
        first_delivery(durable, topic, run.timeout)  # its SUB makes the first channel
        depth = channel_depth(durable, topic, "ch")
        restarted = vm_kb(durable.pid, "VmHWM")
        say(
            f"[rss @ durable, no channel] filled in {seconds:.1f}s; VmHWM {mb(peak)}; "
            f"restarted: VmHWM {mb(restarted)}, {depth} messages in the first channel"
        )
        if depth != n:
            run.failures.append(f"the first channel got {depth} messages, not {n}")
        return max(peak or 0, restarted or 0) or None
    finally:
        durable.stop()
        run.servers.remove(durable)


def disk_consumer(
    addr: Address, topic: str, n: int, timeout: float, out: multiprocessing.Queue
) -> None:
    """Child process: SUB + RDY 2500, FIN everything until n are finished."""
    try:
        with Watchdog(timeout) as wd:
            conn = nsq_bench.NSQConn(addr, wd)
            conn.subscribe(topic, "ch")
            conn.send(b"RDY 2500\n")
            received = 0
            while received < n:
                conn.fill()
                ids: list[bytearray] = []
                others: list[tuple[int, bytes]] = []
                conn.start = nsq_bench.scan_frames(conn.buf, conn.start, conn.end, ids, others)
                if ids:
                    conn.sock.sendall(nsq_bench.fin_lines(ids))
                    received += len(ids)
                for ftype, data in others:
                    conn.handle_other(ftype, data)
            conn.close()
            out.put(received)
    except Exception as exc:
        out.put(repr(exc))


def section_disk(run: Run) -> None:
    n = run.scale.disk
    say(f"\n## data dir after {n} messages published and finished")
    topic = "store_disk"
    data_dir = run.data_dir("disk")
    sizes: dict[str, tuple[int, int]] = {}
    with run.started(lambda: start_gateway("durable", run.placement, data_dir)) as (durable,):
        http_post(durable, "/topic/create", topic=topic)
        http_post(durable, "/channel/create", topic=topic, channel="ch")
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        consumer = ctx.Process(
            target=disk_consumer,
            args=(durable.addresses["nsq"], topic, n, run.timeout, out),
            daemon=True,
        )
        consumer.start()
        t0 = time.perf_counter()
        opts = replace(nsq_options(FULL, run.timeout), n={"mpub": n})
        with Watchdog(run.timeout) as wd:
            conn = nsq_bench.NSQConn(durable.addresses["nsq"], wd)
            nsq_bench.publish_mpub(conn, topic, n, opts)
            conn.close()
        published = time.perf_counter() - t0
        try:
            got = out.get(timeout=run.timeout)
        except queue.Empty:
            got = "TIMEOUT"
        consumer.join(5)
        finished = time.perf_counter() - t0
        if got != n:
            run.failures.append(f"disk: the consumer finished {got!r}, not {n}")
        depth = channel_depth(durable, topic, "ch")
        sizes["live"] = du_bytes(data_dir)
        say(
            f"[disk @ durable] published in {published:.1f}s, all finished after "
            f"{finished:.1f}s ({si(n / finished)} msgs/s); left in the channel: {depth}; "
            f"data dir {sizes['live'][0] / MiB:.1f} MiB (apparent {sizes['live'][1] / MiB:.1f})"
        )
    sizes["stopped"] = du_bytes(data_dir)
    say(f"[disk @ durable] after SIGTERM: {sizes['stopped'][0] / MiB:.1f} MiB")
    live, stopped = sizes["live"][0] / MiB, sizes["stopped"][0] / MiB
    run.rows.append(
        Row(
            "disk",
            f"data dir (du) after {si(n)} published + FINed: live / after SIGTERM",
            "-",
            "-",
            f"{live:.1f} / {stopped:.1f} MiB",
            "-",
            f"< {TARGET_DISK_MB} MB",
            verdict(max(live, stopped) < TARGET_DISK_MB if not run.quick else None),
        )
    )


SECTION_RUNNERS: dict[str, Callable[[Run], None]] = {
    "throughput": section_throughput,
    "ceiling": section_ceiling,
    "beanstalkd": section_beanstalkd,
    "rss": section_rss,
    "disk": section_disk,
}


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}"
    )
    ap.add_argument("--quick", action="store_true", help="a tenth of every size")
    ap.add_argument(
        "--pin",
        choices=("none", "same", "split"),
        default="split",
        help="CPU placement (as bench/nsq.py; default split: servers CPU 0, clients CPU 1)",
    )
    ap.add_argument("--dir", help="where to make the data dirs (default: the temp dir)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per workload")
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs of each throughput workload; medians (3)"
    )
    a = ap.parse_args(argv)
    a.sections = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = set(a.sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if "beanstalkd" in a.sections and not Path(BEANSTALKD).is_file():
        sys.exit(f"{BEANSTALKD} is missing (needed by --only beanstalkd)")
    placement = make_placement(a.pin)
    scale = FULL.tenth() if a.quick else FULL
    original = os.sched_getaffinity(0)
    root = Path(tempfile.mkdtemp(prefix="gateway-store-bench-", dir=a.dir))
    run = Run(placement, scale, root, a.timeout, a.quick, a.repeat)
    say(
        f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    say(f"# {placement.describe()}")
    say(f"# data dirs under {root}: {filesystem_of(root)}")
    say(f"# scale: {vars(scale)}{' (--quick)' if a.quick else ''}; 200-byte bodies")
    try:
        for name in a.sections:
            try:
                SECTION_RUNNERS[name](run)
            except (RuntimeError, OSError) as exc:
                run.failures.append(f"{name}: {exc}")
                say(f"{name}: FAILED: {exc}")
            finally:
                os.sched_setaffinity(0, original)
    finally:
        for s in list(run.servers):
            s.stop()
        shutil.rmtree(root, ignore_errors=True)
    say("")
    say(
        format_table(
            ["section", "workload", "reference", "ref", "durable", "ratio", "target", "verdict"],
            [list(astuple(r)) for r in run.rows],
        )
    )
    say(
        "ratio = durable (or the memory store, where the workload says so) / reference; "
        "placement: " + placement.describe()
    )
    for f in run.failures:
        say(f"FAILED: {f}")
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
