"""The message archive's cost and the pipeline report's speed, in one run.

    .venv/bin/python bench/archive.py                       # both parts, default sizes
    .venv/bin/python bench/archive.py --only throughput -n 500000 --repeat 3
    .venv/bin/python bench/archive.py --only report --events 10000000 --master 'local[2]'

* `throughput`: the gateway (memory store) started twice per round, archive off and on
  (`body = "full"`, a fresh directory), NSQ MPUB and PUB workloads of bench/nsq.py against
  each; the table gives msgs/s and the on/off ratio per workload, the gateway's CPU time
  per message from ready to stopped (the archive's last flush included, start-up not)
  and how many of the events the archive was sent it wrote (the rest were dropped:
  buffer full).
* `report`: `--events` synthetic archived events (bodies not kept, as `body = "none"`)
  written as Parquet segments, then the report job on `--master` (default local[2]):
  the JVM start, the job's time and events/s.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(c.REPO_ROOT))


def _nsq_bench() -> Any:
    # bench/nsq.py, loaded under another name: `nsq` is also pynsq's package
    spec = importlib.util.spec_from_file_location("nsq_bench", BENCH / "nsq.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["nsq_bench"] = module
    spec.loader.exec_module(module)
    return module


# -- throughput: archive on vs off ---------------------------------------------------------


_ARCHIVE_ENV = ("ENABLED", "DIR", "BODY", "COMPRESSION")


def _gateway(
    archive: Path | None, placement: c.Placement, args: argparse.Namespace
) -> c.GatewayProcess:
    argv = ["serve", "--nsq", "127.0.0.1:0", "--store", "memory://", "--rocketmq", "off"]
    argv += ["--http", "off", "--beanstalk", "off", "--nats", "off", "--nats-route", "off"]
    for key in _ARCHIVE_ENV:
        os.environ.pop(f"GATEWAY_ARCHIVE__{key}", None)
    if archive is not None:
        os.environ["GATEWAY_ARCHIVE__ENABLED"] = "true"
        os.environ["GATEWAY_ARCHIVE__DIR"] = str(archive)
        os.environ["GATEWAY_ARCHIVE__BODY"] = args.body
        os.environ["GATEWAY_ARCHIVE__COMPRESSION"] = args.compression
    return c.GatewayProcess(argv, placement, ["nsq"])


def _archived(archive: Path) -> int:
    from gateway.archive.read import read_archive

    return read_archive(archive).num_rows if archive.exists() else 0


def throughput(args: argparse.Namespace) -> list[str]:
    nsq = _nsq_bench()
    placement = c.make_placement(args.pin)
    opts = nsq.Options(
        n={"mpub": args.n, "pub": args.pub_n},
        size=args.size,
        batch=args.batch,
        window=args.window,
        rdy=1000,
        timeout=args.timeout,
        output_buffer_timeout=25,
    )
    rates: dict[tuple[str, str], list[float]] = {}
    cpu: dict[str, list[float]] = {}  # the gateway's CPU per message from ready to stopped
    # per MPUB message, during the workload and until the process is quiet again (the
    # writer caught up): (the event loop's thread, every other thread)
    mpub_cpu: dict[str, list[tuple[float, float]]] = {}
    kept: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    try:
        for round_ in range(args.repeat):
            for mode in ("off", "on"):
                archive = root / f"archive-{round_}" if mode == "on" else None
                gateway = _gateway(archive, placement, args)
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                addresses = gateway.start()
                # its start-up (imports, the store, the listeners), left out of the cost
                started = c.process_cpu_seconds(gateway.proc.pid) or 0.0
                target = nsq.Target(f"archive-{mode}", addresses["nsq"], gateway.proc.pid)
                try:
                    for workload in ("mpub", "pub"):
                        threads = c.thread_cpu_seconds(gateway.proc.pid)
                        result = nsq.run_workload(workload, target, opts)
                        if workload == "mpub":
                            c.wait_cpu_quiet(gateway.proc.pid)
                            mpub_cpu.setdefault(mode, []).append(
                                _split_cpu(gateway.proc.pid, threads, args.n, mode == "on")
                            )
                        if result.status != "ok" or not result.rate:
                            raise SystemExit(f"{workload} archive {mode}: {result.status}")
                        rates.setdefault((workload, mode), []).append(result.rate)
                        print(f"round {round_ + 1} {workload:5} archive {mode:3}: "
                              f"{c.si(result.rate)} msgs/s", flush=True)  # fmt: skip
                finally:
                    gateway.stop()
                # waited for: its CPU, the archive's last flush on SIGTERM included
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
                cpu.setdefault(mode, []).append((seconds - started) / (args.n + args.pub_n))
                if archive is not None:
                    written = _archived(archive)
                    kept.append(f"round {round_ + 1}: {written:,} of {args.n + args.pub_n:,}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for workload in ("mpub", "pub"):
        off = statistics.median(rates[workload, "off"])
        on = statistics.median(rates[workload, "on"])
        rows.append([workload, c.si(off), c.si(on), f"{on / off:.2f}x"])
    table = c.format_table(["workload", "off msgs/s", "on msgs/s", "on/off"], rows)
    off_cpu, on_cpu = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    # the MPUB phase alone, loop and other threads apart: CPU time is what contention
    # from other processes disturbs least, and on one pinned CPU it sets the pace
    loop_off, rest_off = (statistics.median(x) for x in zip(*mpub_cpu["off"], strict=True))
    loop_on, rest_on = (statistics.median(x) for x in zip(*mpub_cpu["on"], strict=True))
    mpub_off, mpub_on = loop_off + rest_off, loop_on + rest_on
    return [
        f"archive on (body {args.body}, {args.compression}) vs off, {placement.describe()}, "
        f"median of {args.repeat}:",
        table,
        # CPU time is what contention from other processes disturbs least
        f"gateway CPU per message, from ready to stopped (the archive's last flush "
        f"included, start-up not): off {off_cpu * 1e6:.2f} us, on {on_cpu * 1e6:.2f} us: "
        f"CPU-bound throughput on/off {off_cpu / on_cpu:.2f}x",
        f"MPUB alone, CPU per message (medians): off {mpub_off * 1e6:.2f} us; on "
        f"{mpub_on * 1e6:.2f} us = event loop {loop_on * 1e6:.2f} + archive writer and "
        f"other threads {rest_on * 1e6:.2f} (off: loop {loop_off * 1e6:.2f}): "
        f"CPU-bound MPUB on/off {mpub_off / mpub_on:.2f}x",
        "published events archived (the rest dropped, buffer full): " + "; ".join(kept),
    ]


def _split_cpu(pid: int, before: dict[int, float], n: int, archived: bool) -> tuple[float, float]:
    """CPU seconds per message since `before` (thread_cpu_seconds): the main thread's
    (the event loop), and every other thread's together. The writer leaves the last
    partial row group for the stop, so with the archive on the other threads' time is
    per event written so far."""
    from gateway.archive.writer import ROW_GROUP_ROWS

    after = c.thread_cpu_seconds(pid)
    loop = after.get(pid, 0.0) - before.get(pid, 0.0)
    rest = sum(t - before.get(tid, 0.0) for tid, t in after.items() if tid != pid)
    written = n - n % ROW_GROUP_ROWS if archived and n >= ROW_GROUP_ROWS else n
    return loop / n, rest / written


# -- report: 10M events on local[2] --------------------------------------------------------


def synthetic_archive(root: Path, events: int, chunk: int = 1_000_000) -> int:
    """About `events` archived events: per message published, delivered, then acknowledged
    (one in 50 buried instead; one in 10 requeued and delivered again first), over 20
    topics, 2 groups and 3 producer protocols, spread over a day."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gateway.archive.writer import SCHEMA

    # as the writer's segments (tables.FILE_SCHEMA): every column but the body REQUIRED
    LAYOUT = pa.schema([f.with_nullable(f.name == "body") for f in SCHEMA])
    rng = np.random.default_rng(7)
    day0 = 1_795_000_000 * 10**9
    written = 0
    next_id = 0
    seq = 0
    while written < events:
        n = min(chunk, events - written) // 3 or 1
        ids = np.arange(next_id, next_id + n)
        next_id += n
        pub = day0 + rng.integers(0, 86_400 * 10**9, n)
        lat = rng.exponential(20e6, n).astype(np.int64) + 100_000
        requeued = rng.random(n) < 0.1
        buried = rng.random(n) < 0.02
        parts = {
            "published": (ids, pub, np.zeros(n, np.int32), ""),
            "delivered": (ids, pub + lat // 3, np.ones(n, np.int32), "g"),
            "requeued": (
                ids[requeued],
                (pub + lat // 2)[requeued],
                np.ones(requeued.sum(), np.int32),
                "g",
            ),
            "redelivered": (
                ids[requeued],
                (pub + lat * 2 // 3)[requeued],
                np.full(requeued.sum(), 2, np.int32),
                "g",
            ),
            "last": (ids, pub + lat, np.where(requeued, 2, 1).astype(np.int32), "g"),
        }
        columns: dict[str, list[Any]] = {k: [] for k in SCHEMA.names}
        for name, (pid, times, attempts, group) in parts.items():
            k = len(pid)
            event = {"redelivered": "delivered"}.get(name, name)
            events_col = np.full(k, event, dtype=object)
            if name == "last":
                events_col = np.where(buried, "buried", "acknowledged").astype(object)
            topic_no = pid % 20
            columns["event"].append(events_col)
            columns["time_ns"].append(times)
            columns["id"].append(pid)
            columns["topic"].append(np.char.add("topic-", topic_no.astype(str)).astype(object))
            columns["group"].append(np.full(k, group, dtype=object))
            producer = np.array(["nsq", "beanstalk", "nats"], dtype=object)[pid % 3]
            consumer = np.array(["nsq", "beanstalk", "nsq"], dtype=object)[pid % 3]
            columns["producer"].append(producer)
            columns["consumer"].append(np.full(k, "", dtype=object) if not group else consumer)
            columns["peer"].append(np.full(k, "127.0.0.1:40000", dtype=object))
            columns["size"].append(np.full(k, 200, np.int64))
            columns["attempts"].append(attempts)
            columns["priority"].append(np.full(k, 1024, np.int64))
            columns["publish_ns"].append(pub[pid - ids[0]])
        arrays = {
            name: np.concatenate(parts_) for name, parts_ in columns.items() if name != "body"
        }
        total = len(arrays["event"])
        table = pa.table({**arrays, "body": pa.nulls(total, pa.binary())}, schema=LAYOUT)
        folder = root / "date=2026-11-18"
        folder.mkdir(parents=True, exist_ok=True)
        seq += 1
        # the gateway's own file layout and default codec (archive.md)
        pq.write_table(
            table,
            folder / f"part-{seq:06d}.parquet",
            compression="lz4",
            data_page_version="2.0",
        )
        written += total
    return written


def report(args: argparse.Namespace) -> list[str]:
    from gateway.pipeline import report as job
    from gateway.pipeline.session import start_session

    root = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        t0 = time.perf_counter()
        events = synthetic_archive(root / "archive", args.events)
        size = sum(p.stat().st_size for p in (root / "archive").rglob("*.parquet"))
        t1 = time.perf_counter()
        print(f"wrote {events:,} synthetic events ({size / 1e6:.0f} MB) in {t1 - t0:.1f}s",
              flush=True)  # fmt: skip
        spark = start_session("bench archive report", args.master, root / "spark.log")
        t2 = time.perf_counter()
        try:
            result, _ = job.run(spark, job.Options(root / "archive", root / "out"))
        finally:
            spark.stop()
        t3 = time.perf_counter()
        assert result.events == events, (result.events, events)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [
        f"report of {events:,} events on {args.master}: Spark start {t2 - t1:.1f}s, "
        f"job {t3 - t2:.1f}s ({events / (t3 - t2):,.0f} events/s), "
        f"total {t3 - t1:.1f}s"
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="throughput,report")
    p.add_argument("-n", type=int, default=500_000, help="MPUB messages per run")
    p.add_argument("--pub-n", type=int, default=20_000, help="PUB messages per run")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--pin", default="split", choices=["split", "same", "none"])
    p.add_argument("--body", default="full", help='[archive] body: "full", "none" or N bytes')
    p.add_argument("--compression", default="lz4", help="[archive] compression")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    lines: list[str] = []
    parts = args.only.split(",")
    if "throughput" in parts:
        lines += throughput(args)
    if "report" in parts:
        lines += report(args)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
