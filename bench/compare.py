"""Every protocol's workloads on the gateway, on the real server and on a no-work Trio server,
in one run, with one placement: one table of rates, ratios and issue 15's targets (not a test).

Workloads (the clients are those of bench/nsq.py, bench/nats.py and bench/beanstalk.py,
imported, not copied):

* ``nsq-pub``       NSQ PUB one at a time, 200 B (nsq.py ``pub``)
* ``nsq-sub``       NSQ SUB, RDY 1000 + FIN, 200 B, channel filled by MPUB first (``sub``)
* ``nsq-mpub``      NSQ MPUB x100, 200 B, 8 outstanding (``mpub``)
* ``nats-pubsub``   nats-py, 1 publisher + 1 subscriber process, 16 B (nats.py ``direct``)
* ``nats-request``  nats-py request/reply, 16 B, sequential (``request``)
* ``beanstalk-1``   greenstalk put N then reserve+delete N, 1 process, 16 B (beanstalk.py)
* ``beanstalk-4``   the same with 4 processes, a tube each

Servers, all pinned to CPU 0 (clients on CPU 1) unless ``--pin`` says otherwise:

* ``gateway``   ``python -m gateway serve --store memory://`` with only that protocol's
                listener on (one gateway per protocol, started and stopped around its block);
* the real one: beanstalkd (``/usr/bin/beanstalkd``), nats-server (``--nats-server-bin``),
                nsqd at ``--nsqd HOST:PORT`` (started elsewhere, pinned like the gateway) or
                started here from ``--nsqd-bin PATH`` (default: ``nsqd`` on PATH); without
                either, the NSQ reference is the anchor figure of bench/README.md (marked
                ``*``, not measured in this run);
* ``ceiling``   bench/ceiling.py: a Trio server with canned replies on the gateway's socket
                pattern, the runtime's own ceiling on this machine.

Each (workload, server) runs ``--repeat`` times, interleaved (every server once, then again);
the table shows medians. Target per row (issue 15): gateway / real server >= the ratio; where
that rate is above the ceiling measured in the same run, the target becomes >= 0.9x the
ceiling, and the table shows both.

    PYTHONPATH=. .venv/bin/python bench/compare.py                       # everything, ~5 min
    PYTHONPATH=. .venv/bin/python bench/compare.py --scale 0.1 --repeat 1   # smoke run
    PYTHONPATH=. .venv/bin/python bench/compare.py --only nsq,beanstalk-4 \
        --nsqd-bin ../nsq/nsqd
    PYTHONPATH=. .venv/bin/python bench/compare.py --repeat 3 --json before.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from _common import (  # noqa: E402
    Address,
    GatewayProcess,
    Nsqd,
    Placement,
    format_addr,
    format_table,
    load_bench_module,
    make_placement,
    parse_addr,
    pid_listening_on,
    process_cpu_seconds,
    si,
)

# the bench modules whose workloads run here (nsq.py and nats.py are loaded under other
# names: a client library owns `nsq` and `nats`)
nsq_bench = load_bench_module("nsq")
nats_bench = load_bench_module("nats")
beanstalk_bench = load_bench_module("beanstalk")

CEILING_SCRIPT = str(BENCH_DIR / "ceiling.py")
NSQ_SIZE = 200
NATS_SIZE = 16
BEANSTALK_SIZE = 16
# when a target is above the ceiling, the gateway must reach this share of the ceiling
CEILING_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    protocol: str  # nsq, nats, beanstalk
    title: str
    default_n: int
    target: float  # gateway / real server, issue 15
    unit: str = "msgs/s"


WORKLOADS = [
    Workload("nsq-pub", "nsq", "NSQ PUB one at a time, 200 B", 20_000, 1.0),
    Workload("nsq-sub", "nsq", "NSQ SUB RDY 1000 + FIN, 200 B", 200_000, 1.0),
    Workload("nsq-mpub", "nsq", "NSQ MPUB x100, 200 B", 500_000, 1.5),
    Workload("nats-pubsub", "nats", "NATS pub/sub 16 B, nats-py 1+1", 200_000, 0.8),
    Workload("nats-request", "nats", "NATS request/reply 16 B", 5_000, 0.9, "req/s"),
    Workload("beanstalk-1", "beanstalk", "greenstalk put+reserve/delete x1", 10_000, 0.8, "jobs/s"),
    Workload("beanstalk-4", "beanstalk", "greenstalk put+reserve/delete x4", 10_000, 0.8, "jobs/s"),
]
BY_NAME = {w.name: w for w in WORKLOADS}
PROTOCOLS = ("nsq", "nats", "beanstalk")
REAL_NAME = {"nsq": "nsqd", "nats": "nats-server", "beanstalk": "beanstalkd"}
GATEWAY_OFF = {
    "nsq": ["--nsq", "off"],
    "nats": ["--nats", "off"],
    "beanstalk": ["--beanstalk", "off"],
}
GATEWAY_COMMON = [
    *("--http", "off", "--nats-route", "off", "--rocketmq", "off", "--store", "memory://"),
]


# -- one measured run ------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    workload: str
    server: str  # gateway, real, ceiling
    done: int
    seconds: float
    status: str
    server_cpu_s: float | None  # CPU seconds of the server over the run
    details: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        return self.done / self.seconds if self.seconds > 0 and self.done else None

    @property
    def cpu_us_per_msg(self) -> float | None:
        if self.server_cpu_s is None or not self.done:
            return None
        return self.server_cpu_s / self.done * 1e6


@dataclass(slots=True)
class Server:
    role: str  # gateway, real, ceiling
    name: str  # what the table calls it
    addr: Address
    pid: int | None

    def cpu_seconds(self) -> float | None:
        return None if self.pid is None else process_cpu_seconds(self.pid)


def run_nsq(workload: Workload, server: Server, n: int, timeout: float) -> Run:
    key = workload.name.removeprefix("nsq-")
    opts = nsq_bench.Options({key: n}, NSQ_SIZE, 100, 8, 1000, timeout, 25)
    target = nsq_bench.Target(server.name, server.addr, server.pid)
    r = nsq_bench.run_workload(key, target, opts)
    cpu = None if r.server_cpu is None else r.server_cpu * r.seconds
    return Run(workload.name, server.role, r.msgs, r.seconds, r.status, cpu, r.details)


def run_nats(workload: Workload, server: Server, n: int, timeout: float) -> Run:
    opts = nats_bench.Options(n, NATS_SIZE, n, timeout, 15.0, 1000, 25)
    target = nats_bench.Server(
        server.name, f"nats://{format_addr(server.addr)}", server.cpu_seconds
    )
    runner = nats_bench.run_request if workload.name == "nats-request" else nats_bench.run_direct
    r = runner(target, opts)
    share = r.cpu.get("server")
    cpu = None if share is None else share * r.seconds
    return Run(workload.name, server.role, r.done, r.seconds, r.status, cpu, r.details)


def run_beanstalk(workload: Workload, server: Server, n: int, timeout: float) -> Run:
    procs = int(workload.name.rsplit("-", 1)[1])
    cpu0 = server.cpu_seconds()
    rates = beanstalk_bench.run_workload(server.addr, procs, n, BEANSTALK_SIZE, timeout)
    cpu1 = server.cpu_seconds()
    if isinstance(rates, str):
        return Run(workload.name, server.role, 0, 0.0, rates, None)
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    details = [f"put {si(rates.put)}/s, reserve+delete {si(rates.reserve_delete)}/s (sums)"]
    return Run(workload.name, server.role, n * procs, rates.wall, "ok", cpu, details)


RUNNERS: dict[str, Callable[[Workload, Server, int, float], Run]] = {
    "nsq": run_nsq,
    "nats": run_nats,
    "beanstalk": run_beanstalk,
}


# -- the servers of one protocol -------------------------------------------------------------


@contextlib.contextmanager
def servers_for(
    protocol: str, a: argparse.Namespace, placement: Placement
) -> Iterator[list[Server]]:
    """Start the gateway, the real server and the ceiling of one protocol; stop them after."""
    started: list[Callable[[], object]] = []
    servers: list[Server] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    try:
        listeners = [arg for p in PROTOCOLS if p != protocol for arg in GATEWAY_OFF[p]]
        gateway = GatewayProcess(
            ["serve", f"--{protocol}", "127.0.0.1:0", *listeners, *GATEWAY_COMMON, *a.extra],
            placement,
            [protocol],
        )
        print(f"# starting: {' '.join(gateway.command)}", flush=True)
        started.append(gateway.stop)
        gateway.start()
        assert gateway.proc is not None
        servers.append(Server("gateway", "gateway", gateway.addresses[protocol], gateway.proc.pid))

        real = start_real(protocol, a, placement, tmp, started)
        if real is not None:
            servers.append(real)

        ceiling = GatewayProcess([protocol], placement, [protocol], program=(CEILING_SCRIPT,))
        started.append(ceiling.stop)
        ceiling.start()
        assert ceiling.proc is not None
        servers.append(Server("ceiling", "ceiling", ceiling.addresses[protocol], ceiling.proc.pid))
        for s in servers:
            print(f"# {protocol}: {s.name} at {format_addr(s.addr)} pid {s.pid}", flush=True)
        placement.apply_to_client()  # this process and the client processes it starts
        yield servers
    finally:
        for stop in reversed(started):
            with contextlib.suppress(Exception):
                stop()
        shutil.rmtree(tmp, ignore_errors=True)


def start_real(
    protocol: str,
    a: argparse.Namespace,
    placement: Placement,
    tmp: Path,
    started: list[Callable[[], object]],
) -> Server | None:
    if protocol == "beanstalk":
        bs = beanstalk_bench.Beanstalkd(placement)
        started.append(bs.stop)
        addr = bs.start()
        print(f"# {bs.version()}", flush=True)
        return Server("real", "beanstalkd", addr, bs.proc.pid if bs.proc else None)
    if protocol == "nats":
        if not Path(a.nats_server_bin).is_file():
            print(f"# no nats-server at {a.nats_server_bin}: NATS has no reference", flush=True)
            return None
        ns = nats_bench.NatsServer(a.nats_server_bin, placement, "C", tmp)
        started.append(ns.stop)
        ns.start()
        print(f"# {ns.version()} ({a.nats_server_bin})", flush=True)
        return Server("real", "nats-server", ns.client, ns.pid)
    if a.nsqd is not None:
        pid = pid_listening_on(a.nsqd[1])
        cpus = "?"
        with contextlib.suppress(OSError, TypeError):
            cpus = ",".join(map(str, sorted(os.sched_getaffinity(pid or -1))))
        print(f"# nsqd at {format_addr(a.nsqd)} (not started here) pid {pid} on CPU {cpus}")
        return Server("real", "nsqd", a.nsqd, pid)
    if a.nsqd_bin:
        nsqd = Nsqd(a.nsqd_bin, placement)
        started.append(nsqd.stop)
        addr = nsqd.start()
        print(f"# {nsqd.version()} ({a.nsqd_bin})", flush=True)
        return Server("real", "nsqd", addr, nsqd.pid)
    return None


# -- the table -------------------------------------------------------------------------------


def medians(runs: list[Run]) -> dict[tuple[str, str], Run]:
    """The median-rate run of each (workload, server)."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.workload, r.server), []).append(r)
    out = {}
    for key, group in groups.items():
        ordered = sorted(group, key=lambda r: r.rate or 0.0)
        out[key] = ordered[(len(ordered) - 1) // 2]
    return out


def anchor_rate(workload: Workload) -> float | None:
    anchor = nsq_bench.ANCHORS.get(workload.name.removeprefix("nsq-"))
    return None if anchor is None else (anchor.low + anchor.high) / 2


def verdict(workload: Workload, gw: float | None, real: float | None, ceil: float | None) -> dict:
    """The row's target and whether it is met (issue 15's rule for targets above the
    ceiling measured in the same run)."""
    out: dict[str, object] = {"target_ratio": workload.target}
    if real is None:
        out["text"], out["met"] = "no reference", None
        return out
    wanted = workload.target * real
    out["target_rate"] = wanted
    met_real = gw is not None and gw >= wanted
    if ceil is not None and wanted > ceil:
        floor = CEILING_SHARE * ceil
        out["ceiling_floor"] = floor
        met = gw is not None and gw >= floor
        out["met"] = met
        out["text"] = (
            f"{si(wanted)} > ceiling: >={CEILING_SHARE}x ceil {si(floor)} "
            f"{'met' if met else 'MISSED'} (vs real {'met' if met_real else 'missed'})"
        )
    else:
        out["met"] = met_real
        out["text"] = f"{si(wanted)} {'met' if met_real else 'MISSED'}"
    return out


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def summary(
    runs: list[Run], workloads: list[Workload], real_names: dict[str, str]
) -> tuple[str, list[dict]]:
    picked = medians(runs)
    rows, records = [], []
    for w in workloads:
        by = {s: picked.get((w.name, s)) for s in ("gateway", "real", "ceiling")}
        rate = {s: (r.rate if r is not None else None) for s, r in by.items()}
        real_rate, real_text = rate["real"], si(rate["real"])
        anchored = False
        if real_rate is None and w.protocol == "nsq" and anchor_rate(w) is not None:
            real_rate, anchored = anchor_rate(w), True
            real_text = f"{si(real_rate)}*"
        v = verdict(w, rate["gateway"], real_rate, rate["ceiling"])
        failed = [
            f"{r.server}: {r.status}" for r in runs if r.workload == w.name and r.status != "ok"
        ]
        cpu = "/".join(
            "-" if r is None or r.cpu_us_per_msg is None else f"{r.cpu_us_per_msg:.1f}"
            for r in by.values()
        )
        spread = [x.rate or 0.0 for x in runs if x.workload == w.name and x.server == "gateway"]
        gw_text = si(rate["gateway"])
        if len(spread) > 1:
            gw_text += f" ({si(min(spread))}-{si(max(spread))})"
        rows.append(
            [
                w.title,
                gw_text,
                f"{real_text} {real_names.get(w.protocol, '')}".strip() if real_rate else "-",
                si(rate["ceiling"]),
                ratio(rate["gateway"], real_rate),
                ratio(rate["gateway"], rate["ceiling"]),
                f">={w.target}x",
                str(v["text"]) + (f"; FAILED {failed[0][:60]}" if failed else ""),
                cpu,
            ]
        )
        records.append(
            {
                "workload": w.name,
                "title": w.title,
                "unit": w.unit,
                "gateway": rate["gateway"],
                "real": real_rate,
                "real_is_anchor": anchored,
                "ceiling": rate["ceiling"],
                "cpu_us_per_msg": {
                    s: (None if r is None else r.cpu_us_per_msg) for s, r in by.items()
                },
                "verdict": v,
                "failures": failed,
            }
        )
    headers = [
        "workload",
        "gateway (range)",
        "real",
        "ceiling",
        "gw/real",
        "gw/ceil",
        "target",
        "target rate: verdict",
        "server us/msg gw/real/ceil",
    ]
    return format_table(headers, rows), records


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    names = ",".join(w.name for w in WORKLOADS)
    ap.add_argument(
        "--only",
        default="",
        help=f"comma-separated workloads or protocols ({names}; nsq, nats, beanstalk)",
    )
    ap.add_argument(
        "-n",
        default="",
        help="messages per workload, WORKLOAD=N[,WORKLOAD=N] (defaults: "
        + ", ".join(f"{w.name} {w.default_n}" for w in WORKLOADS)
        + ";\nbeanstalk-* count jobs per process, nats-request requests)",
    )
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every default n (1.0)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per workload and server (1)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run (120)")
    ap.add_argument(
        "--pin",
        choices=("none", "same", "split"),
        default="split",
        help="split = servers on CPU 0, clients on CPU 1 (default)",
    )
    ap.add_argument("--nsqd", help="HOST:PORT of a running nsqd (pinned like the gateway)")
    ap.add_argument(
        "--nsqd-bin",
        default=shutil.which("nsqd"),
        help="an nsqd binary to start here (default: nsqd on PATH; bench/README.md, Real servers)",
    )
    ap.add_argument(
        "--nats-server-bin",
        default=nats_bench.default_nats_server_bin(),
        help="nats-server binary ($NATS_SERVER_BIN, else <sys.prefix>/bin/nats-server)",
    )
    ap.add_argument("--gateway-args", default="", help="extra arguments for `gateway serve`")
    ap.add_argument("--json", help="write every run and the table's figures to this file")
    a = ap.parse_args(argv)
    chosen = [x.strip() for x in a.only.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in BY_NAME and x not in PROTOCOLS]
    if unknown:
        ap.error(f"unknown workloads {unknown}")
    a.workloads = [w for w in WORKLOADS if not chosen or w.name in chosen or w.protocol in chosen]
    a.counts = {w.name: max(1, round(w.default_n * a.scale)) for w in WORKLOADS}
    for item in (x.strip() for x in a.n.split(",") if x.strip()):
        name, _, value = item.partition("=")
        if name not in BY_NAME or not value.isdigit() or int(value) < 1:
            ap.error(f"-n wants WORKLOAD=N with N >= 1, not {item!r}")
        a.counts[name] = int(value)
    if a.repeat < 1:
        ap.error("--repeat must be positive")
    try:
        a.nsqd = parse_addr(a.nsqd) if a.nsqd else None
    except ValueError as exc:
        ap.error(str(exc))
    a.extra = shlex.split(a.gateway_args)
    return a


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def settle(servers: list[Server]) -> None:
    """Wait until every server is idle, so a run does not pay for the one before."""
    for s in servers:
        if nats_bench.settle(s.cpu_seconds) is None:
            print(f"# note: {s.name} still busy after 30s; measuring anyway", flush=True)


def print_run(r: Run, server: Server, unit: str) -> None:
    cpu = "" if r.cpu_us_per_msg is None else f", server {r.cpu_us_per_msg:.1f} us CPU/msg"
    print(
        f"[{r.workload} @ {server.name}] {r.done} in {r.seconds:.2f}s = {si(r.rate)} {unit}"
        f"{cpu}; {r.status}",
        flush=True,
    )
    for line in r.details:
        print(f"    {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    placement = make_placement(a.pin)
    original = os.sched_getaffinity(0)
    runs: list[Run] = []
    failures: list[str] = []
    real_names: dict[str, str] = {}
    meta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
        "placement": placement.describe(),
        "repeat": a.repeat,
        "counts": {w.name: a.counts[w.name] for w in a.workloads},
    }
    print(
        f"# {meta['started']} python {meta['python']}, {meta['cpus']} CPUs, load {meta['load']:.2f}"
    )
    print(f"# {placement.describe()}; repeat {a.repeat}; timeout {a.timeout:.0f}s per run")
    print("# n: " + ", ".join(f"{k} {v}" for k, v in meta["counts"].items()), flush=True)
    try:
        for protocol in PROTOCOLS:
            chosen = [w for w in a.workloads if w.protocol == protocol]
            if not chosen:
                continue
            print(flush=True)
            os.sched_setaffinity(0, original)  # servers start from an unpinned parent
            with servers_for(protocol, a, placement) as servers:
                for s in servers:
                    if s.role == "real":
                        real_names[protocol] = s.name
                for _ in range(a.repeat):
                    for w in chosen:
                        for server in servers:
                            settle(servers)
                            run = RUNNERS[protocol](w, server, a.counts[w.name], a.timeout)
                            runs.append(run)
                            print_run(run, server, w.unit)
    except (RuntimeError, OSError) as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        failures.append("interrupted")
        print("\ninterrupted: stopping every process started here", file=sys.stderr)
    finally:
        os.sched_setaffinity(0, original)

    print()
    table, records = summary(runs, a.workloads, real_names)
    print(table)
    print(
        "medians of --repeat runs; gateway (range) = min-max of its runs; rates in the unit of "
        "each workload (msgs/s, req/s, jobs/s end to end)"
    )
    if "nsq" not in real_names and any(w.protocol == "nsq" for w in a.workloads):
        print(f"* {nsq_bench.ANCHOR_SOURCE} (midpoint of the range)")
    print(
        f"target: gateway/real >= the ratio; where that rate is above the ceiling of this "
        f"run, >= {CEILING_SHARE}x the ceiling (both shown)"
    )
    print("server us/msg = server CPU time (utime+stime) over the run / messages")
    print(f"placement: {placement.describe()}")
    for f in failures:
        print(f"FAILED: {f}")
    if a.json:
        data = {"meta": meta, "rows": records, "runs": [asdict(r) for r in runs]}
        Path(a.json).write_text(json.dumps(data, indent=1))
        print(f"figures written to {a.json}")
    ok = not failures and all(r.status == "ok" for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
