"""Benchmark of the gateway's beanstalkd listener against a real beanstalkd, in one run (not
a test).

The workload is the one of the beanstalkd anchor (bench/README.md, "Anchor figures"), with
the greenstalk client:
each of ``--procs`` processes uses its own tube, puts ``-n`` jobs of ``--size`` bytes, then
reserves+deletes ``-n`` jobs; all processes start together on a barrier. Reported per server:
put rate and reserve+delete rate (sums of the per-process rates) and the end-to-end rate
(all jobs put, reserved and deleted, over the wall time from the first start to the last end).

Both servers run in this run, with the same CPU placement (``--pin``, as in
the anchor figures: ``same`` = server and clients on one CPU, ``split`` = server on one
CPU, clients on another, ``none`` = the scheduler decides). The script starts the gateway
(``python -m gateway serve --beanstalk 127.0.0.1:0 --nsq off --http off --nats off
--store memory://``) and ``/usr/bin/beanstalkd -l 127.0.0.1 -p <free port>`` itself, pinned,
and stops both (by pid).
Each workload is bounded by ``--timeout`` seconds. Everything stays on 127.0.0.1.

    .venv/bin/python bench/beanstalk.py                       # procs 1 and 4, pin same and split
    .venv/bin/python bench/beanstalk.py -n 5000 --pin same    # quick look
    .venv/bin/python bench/beanstalk.py --procs 4 --repeat 3  # best of 3 per server
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path

import greenstalk

# bench/ is a folder of scripts: its helpers are found next to this file, however it is run
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Address,
    GatewayProcess,
    Placement,
    format_table,
    make_placement,
    run_processes,
    si,
)

# the real server: on PATH (Debian's beanstalkd package), else where Debian puts it
BEANSTALKD = shutil.which("beanstalkd") or "/usr/bin/beanstalkd"
TARGET_RATIO = 0.8  # gateway / beanstalkd, end to end


# -- the workload (one process per tube) ---------------------------------------------------------


def worker(
    addr: Address, n: int, size: int, idx: int, barrier: Barrier, out: multiprocessing.Queue
) -> None:
    tube = f"bench-{idx}-{time.time_ns()}"
    body = b"x" * size
    try:
        with greenstalk.Client(addr, encoding=None, use=tube, watch=tube) as c:
            barrier.wait()
            t0 = time.perf_counter()
            for _ in range(n):
                c.put(body)
            t1 = time.perf_counter()
            for _ in range(n):
                job = c.reserve(timeout=5)
                c.delete(job)
            t2 = time.perf_counter()
        out.put((t0, t1, t2))
    except Exception as exc:  # reported by the parent; the bench goes on
        out.put(repr(exc))


@dataclass
class Rates:
    put: float
    reserve_delete: float
    end_to_end: float
    wall: float


def run_workload(addr: Address, procs: int, n: int, size: int, timeout: float) -> Rates | str:
    results, error = run_processes(worker, (addr, n, size), procs, timeout)
    if error:
        return error
    t0 = min(r[0] for r in results)
    t2 = max(r[2] for r in results)
    return Rates(
        put=sum(n / (r[1] - r[0]) for r in results),
        reserve_delete=sum(n / (r[2] - r[1]) for r in results),
        end_to_end=n * procs / (t2 - t0),
        wall=t2 - t0,
    )


# -- the servers ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Beanstalkd:
    """The real beanstalkd, pinned like the gateway; stopped by pid."""

    def __init__(self, placement: Placement, extra: Sequence[str] = ()) -> None:
        self.placement = placement
        self.extra = list(extra)  # e.g. -b DIR: its binlog
        self.proc: subprocess.Popen[bytes] | None = None
        self.address: Address = ("127.0.0.1", 0)

    def start(self, timeout: float = 10.0) -> Address:
        for _ in range(5):
            self.address = ("127.0.0.1", free_port())
            cmd = [BEANSTALKD, "-l", self.address[0], "-p", str(self.address[1]), *self.extra]
            self.proc = subprocess.Popen(
                [*self.placement.server_prefix(), *cmd],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=self.placement.server_preexec(),
            )
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    socket.create_connection(self.address, timeout=1.0).close()
                    return self.address
                except OSError:
                    time.sleep(0.01)
            self.stop()
        raise RuntimeError("beanstalkd did not start")

    def version(self) -> str:
        out = subprocess.run([BEANSTALKD, "-v"], capture_output=True, text=True, check=False)
        return out.stdout.strip() or out.stderr.strip()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- main ----------------------------------------------------------------------------------------


def best(results: list[Rates | str]) -> Rates | str:
    good = [r for r in results if isinstance(r, Rates)]
    if not good:
        return results[0]
    return max(good, key=lambda r: r.end_to_end)


def cell(r: Rates | str, attr: str) -> str:
    return si(getattr(r, attr)) if isinstance(r, Rates) else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-n", type=int, default=20000, help="jobs per process (default 20000)")
    ap.add_argument("--procs", default="1,4", help="comma-separated process counts (1,4)")
    ap.add_argument("--size", type=int, default=16, help="body bytes (16)")
    ap.add_argument("--pin", default="same,split", help="none|same|split, comma-separated")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell; the best is shown")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per workload")
    a = ap.parse_args()
    procs_list = [int(p) for p in a.procs.split(",")]
    pins = a.pin.split(",")
    if not Path(BEANSTALKD).is_file():
        sys.exit(f"{BEANSTALKD} is missing")
    original = os.sched_getaffinity(0)
    rows: list[list[str]] = []
    failures: list[str] = []
    print(
        f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {os.cpu_count()} cpus "
        f"load={' '.join(Path('/proc/loadavg').read_text().split()[:3])} "
        f"n/proc={a.n} size={a.size}B repeat={a.repeat} greenstalk {greenstalk.__version__}"
    )
    for pin in pins:
        placement = make_placement(pin)
        os.sched_setaffinity(0, original)
        print(f"# {placement.describe()}")
        gateway = GatewayProcess(
            [
                "serve",
                "--beanstalk",
                "127.0.0.1:0",
                "--nsq",
                "off",
                "--http",
                "off",
                "--nats",
                "off",
                "--nats-route",
                "off",
                "--rocketmq",
                "off",
                "--store",
                "memory://",
            ],
            placement,
            ["beanstalk"],
        )
        real = Beanstalkd(placement)
        try:
            gw_addr = gateway.start()["beanstalk"]
            bs_addr = real.start()
            if pin == pins[0]:
                print(
                    f"# {real.version()} at {bs_addr[0]}:{bs_addr[1]}; gateway at "
                    f"{gw_addr[0]}:{gw_addr[1]}"
                )
            placement.apply_to_client()  # the worker processes inherit it
            for procs in procs_list:
                measured: dict[str, Rates | str] = {}
                for name, addr in (("beanstalkd", bs_addr), ("gateway", gw_addr)):
                    runs = [
                        run_workload(addr, procs, a.n, a.size, a.timeout) for _ in range(a.repeat)
                    ]
                    measured[name] = best(runs)
                    if isinstance(measured[name], str):
                        failures.append(
                            f"pin={placement.name} procs={procs} {name}: {measured[name]}"
                        )
                g, b = measured["gateway"], measured["beanstalkd"]
                ratio = (
                    f"{g.end_to_end / b.end_to_end:.2f}x"
                    if isinstance(g, Rates) and isinstance(b, Rates)
                    else "-"
                )
                for name in ("beanstalkd", "gateway"):
                    r = measured[name]
                    rows.append(
                        [
                            placement.name,
                            str(procs),
                            name,
                            cell(r, "put"),
                            cell(r, "reserve_delete"),
                            cell(r, "end_to_end"),
                            f"{r.wall:.2f}s" if isinstance(r, Rates) else "FAILED",
                            ratio if name == "gateway" else "",
                        ]
                    )
                if not gateway.alive():
                    failures.append(f"the gateway exited: {gateway.stderr_tail[-1:]}")
                    break
        finally:
            os.sched_setaffinity(0, original)
            with contextlib.suppress(Exception):
                gateway.stop()
            real.stop()
    print()
    headers = ["pin", "procs", "server", "put/s", "reserve+delete/s", "end-to-end/s", "wall"]
    print(format_table([*headers, f"gw/bs e2e (target >= {TARGET_RATIO}x)"], rows))
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    if shutil.which("taskset") is None:
        print("# taskset not found: placement through sched_setaffinity", file=sys.stderr)
    sys.exit(main())
