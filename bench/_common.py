"""Shared helpers for the bench scripts: CPU placement, starting and stopping the gateway,
loopback-only addresses, a per-workload watchdog, percentiles and a plain-text table.

Nothing here speaks a message protocol; each bench script owns its own raw-socket client.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import ipaddress
import multiprocessing
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Protocol, TypeVar

# CPU accounting lives in _cpu.py; the scripts reach it through this module
from _cpu import process_cpu_seconds, thread_cpu_seconds, wait_cpu_quiet  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parent.parent

# Every bound listener of the gateway writes this line to stderr (the CLI contract).
LISTENING_RE = re.compile(rb"listening protocol=(?P<protocol>\S+) address=(?P<address>\S+)")

# How long the gateway may take to print all its listening lines.
STARTUP_TIMEOUT_S = 30.0
# SIGTERM first, then SIGKILL after this long.
STOP_GRACE_S = 10.0

Address = tuple[str, int]


# -- addresses ---------------------------------------------------------------------------


def parse_addr(text: str) -> Address:
    """Parse ``HOST:PORT`` (or ``[v6]:PORT``); only loopback hosts are accepted."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.strip("[]")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        is_loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        is_loopback = False
    if not is_loopback:
        raise ValueError(f"benchmarks only talk to loopback addresses, not {host!r}")
    return host, int(port_text)


def format_addr(addr: Address) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connect(addr: Address) -> socket.socket:
    """A blocking TCP socket with Nagle off (small request/response frames)."""
    sock = socket.create_connection(addr, timeout=10.0)
    sock.settimeout(None)  # plain blocking: the Watchdog bounds the time, not poll()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# -- CPU placement -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the server and the client processes run (`--pin`: none, same or split).

    On a 2-vCPU machine a request/response client is several times faster when it shares a
    CPU with the server, while a throughput workload needs a core for each side: always say
    which placement a figure used.
    """

    name: str
    server_cpus: frozenset[int] | None
    client_cpus: frozenset[int] | None
    note: str = ""

    def describe(self) -> str:
        def cpus(c: frozenset[int] | None) -> str:
            return "any CPU" if c is None else "CPU " + ",".join(map(str, sorted(c)))

        server, client = cpus(self.server_cpus), cpus(self.client_cpus)
        text = f"pin={self.name} (server on {server}, client on {client})"
        return f"{text}; {self.note}" if self.note else text

    def server_prefix(self) -> list[str]:
        """The taskset prefix for a server command line (empty when not pinned)."""
        if self.server_cpus is None or not shutil.which("taskset"):
            return []
        return ["taskset", "-c", ",".join(map(str, sorted(self.server_cpus)))]

    def server_preexec(self) -> Callable[[], None] | None:
        """Fallback when taskset is missing: the same syscall in the child before exec."""
        if self.server_cpus is None or shutil.which("taskset"):
            return None
        cpus = set(self.server_cpus)
        return lambda: os.sched_setaffinity(0, cpus)

    def apply_to_client(self) -> None:
        """Pin this process; threads and child processes created later inherit it."""
        if self.client_cpus is not None:
            os.sched_setaffinity(0, set(self.client_cpus))


def make_placement(pin: str) -> Placement:
    available = sorted(os.sched_getaffinity(0))
    if pin == "none":
        return Placement("none", None, None, "the scheduler places both; figures vary run to run")
    first = available[0]
    if pin == "same":
        return Placement("same", frozenset({first}), frozenset({first}))
    if pin == "split":
        if len(available) < 2:
            return Placement(
                "same",
                frozenset({first}),
                frozenset({first}),
                "split asked, only one CPU available",
            )
        return Placement("split", frozenset({first}), frozenset({available[1]}))
    raise ValueError(f"--pin must be none, same or split, not {pin!r}")


# -- the gateway process -----------------------------------------------------------------


@dataclass(slots=True)
class GatewayProcess:
    """A gateway started by a bench script, listening on ephemeral loopback ports.

    `args` are the arguments after ``python -m gateway``. The stderr of the gateway is read
    by a thread for the whole run (a full pipe would block the server); its tail is kept for
    error messages. `program` replaces ``-m gateway`` for another Python server that prints
    the same listening lines (bench/compare.py's ceiling servers).
    """

    args: Sequence[str]
    placement: Placement
    expect_protocols: Iterable[str]
    program: Sequence[str] = ("-m", "gateway")
    proc: subprocess.Popen[bytes] | None = None
    addresses: dict[str, Address] = field(default_factory=dict)
    stderr_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=60)
    )
    _lines: queue.Queue[bytes | None] = field(default_factory=queue.Queue)

    @property
    def command(self) -> list[str]:
        return [*self.placement.server_prefix(), sys.executable, *self.program, *self.args]

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> dict[str, Address]:
        self.proc = subprocess.Popen(
            self.command,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # only without taskset; no thread of ours runs yet, so preexec_fn is safe here
            preexec_fn=self.placement.server_preexec(),
        )
        threading.Thread(target=self._drain, name="gateway-stderr", daemon=True).start()
        wanted = set(self.expect_protocols)
        deadline = time.monotonic() + timeout
        while not wanted <= self.addresses.keys():
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                what = f"no listening line within {timeout:.0f}s"
                raise RuntimeError(self._failure(what)) from None
            if line is None:
                self.stop()
                raise RuntimeError(self._failure("the gateway exited during startup"))
            if m := LISTENING_RE.search(line):
                protocol = m["protocol"].decode()
                self.addresses[protocol] = parse_addr(m["address"].decode())
        return self.addresses

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail.append(line.decode(errors="replace").rstrip())
            self._lines.put(line)
        self._lines.put(None)

    def _failure(self, what: str) -> str:
        tail = "\n  ".join(self.stderr_tail) or "(no stderr)"
        return f"{what}: {' '.join(self.command)}\n  {tail}"

    def cpu_seconds(self) -> float | None:
        return None if self.proc is None else process_cpu_seconds(self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# -- bounding each workload in time ------------------------------------------------------


class Watchdog:
    """Bounds a workload without putting a timeout on every blocking call.

    The hot loops use plain blocking sockets (no poll() before each recv); when the time is
    up a timer thread shuts the registered sockets down, which wakes any blocked recv/send
    with EOF or an error. The workload then checks `expired` to report a timeout.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self.deadline = time.monotonic() + seconds

    def watch(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._socks.append(sock)
            if self.expired:
                self._shutdown(sock)
        return sock

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._socks:
                self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Watchdog:
        self.deadline = time.monotonic() + self.seconds
        self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._socks:
                sock.close()
            self._socks.clear()


# -- statistics and output ---------------------------------------------------------------


def percentiles(samples: Sequence[float], points: Iterable[float]) -> dict[float, float]:
    """Nearest-rank percentiles (p100 = max); empty input gives NaN."""
    ordered = sorted(samples)
    out: dict[float, float] = {}
    for p in points:
        if not ordered:
            out[p] = float("nan")
            continue
        rank = max(1, min(len(ordered), round(p / 100.0 * len(ordered) + 0.5)))
        out[p] = ordered[rank - 1]
    return out


def format_latency_us(samples_ns: Sequence[int]) -> str:
    """``p50 … p90 … p99 … max …`` in microseconds (ms above 10 ms)."""
    pct = percentiles(samples_ns, (50, 90, 99, 100))

    def one(ns: float) -> str:
        us = ns / 1000.0
        return f"{us / 1000.0:.1f}ms" if us >= 10_000 else f"{us:.0f}us"

    return " ".join(
        f"{label} {one(pct[p])}"
        for label, p in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
    )


class _Run(Protocol):
    workload: str
    server: str
    rate: float | None


R = TypeVar("R", bound=_Run)


def median_runs(results: list[R]) -> list[tuple[R, list[R]]]:
    """Group repeated runs by (workload, server), in order; pick the median-rate run."""
    groups: dict[tuple[str, str], list[R]] = {}
    for r in results:
        groups.setdefault((r.workload, r.server), []).append(r)
    picked = []
    for runs in groups.values():
        ordered = sorted(runs, key=lambda r: r.rate or 0.0)
        picked.append((ordered[(len(ordered) - 1) // 2], runs))
    return picked


def si(value: float | None) -> str:
    """1234567 -> '1.23M', 15234 -> '15.2k'."""
    if value is None or value != value:
        return "-"
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            scaled = value / limit
            return f"{scaled:.3g}{suffix}" if scaled < 100 else f"{scaled:.0f}{suffix}"
    return f"{value:.0f}"


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    body = [list(map(str, r)) for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(line.rstrip() for line in lines)


def pid_listening_on(port: int) -> int | None:
    """The pid of the local process listening on a TCP port, when /proc lets us see it.

    Used to report a server's CPU time when the bench did not start it (--addr, --nsqd).
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            # cols[1] = local "HEXADDR:HEXPORT", cols[3] = state (0A = LISTEN), cols[9] = inode
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            for fd in (proc_dir / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc_dir.name)
        except OSError:
            continue
    return None


def run_processes(
    target: Callable[..., None], args: tuple[object, ...], procs: int, timeout: float
) -> tuple[list[tuple[float, ...]], str]:
    """Start `procs` forked processes `target(*args, index, barrier, out)` that meet at the
    barrier, and collect what each puts on `out`: a tuple of timestamps, or a string when
    it failed. Returns the tuples and the first error ("" if none); every process is
    joined or killed before it returns."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [
        ctx.Process(target=target, args=(*args, i, barrier, out), daemon=True) for i in range(procs)
    ]
    for p in ps:
        p.start()
    results: list[tuple[float, ...]] = []
    error = ""
    deadline = time.monotonic() + timeout
    try:
        for _ in ps:
            item = out.get(timeout=max(0.1, deadline - time.monotonic()))
            if isinstance(item, str):
                error = error or item
            else:
                results.append(item)
    except queue.Empty:
        error = f"timed out after {timeout:.0f} s"
    finally:
        for p in ps:
            p.join(1.0)
            if p.is_alive():
                p.kill()
                p.join()
    return results, error


# -- other bench scripts as modules, and real servers started by a script ----------------


def load_bench_module(name: str) -> ModuleType:
    """bench/<name>.py as the module ``bench_<name>``, so that a script reuses another's
    workloads instead of copying them. Not a plain import: nsq.py and nats.py share their
    names with client libraries (pynsq's `nsq`, nats-py's `nats`). sys.path is restored
    afterwards (nsq.py puts bench/ first on it, which would hide nats-py)."""
    module_name = f"bench_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, Path(__file__).parent / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load bench/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up here
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_connectable(addr: Address, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Poll until `addr` accepts a TCP connection; False if `proc` exits or time is up."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(addr, timeout=1.0).close()
            return True
        except OSError:
            time.sleep(0.02)
    return False


class Nsqd:
    """A real nsqd started by a bench script (`--nsqd-bin PATH`, nsqd 1.3.0 built from the
    nsqio/nsq source as bench/README.md says, outside the project), pinned like the gateway, on
    free loopback ports with a fresh data directory; stopped by pid."""

    def __init__(self, binary: str, placement: Placement, extra: Sequence[str] = ()) -> None:
        self.binary = binary
        self.placement = placement
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.tcp: Address = ("127.0.0.1", 0)
        self.data_dir = ""

    def version(self) -> str:
        out = subprocess.run(
            [self.binary, "--version"], capture_output=True, text=True, check=False, timeout=10
        )
        return (out.stdout or out.stderr).strip()

    def start(self, timeout: float = 15.0) -> Address:
        self.data_dir = tempfile.mkdtemp(prefix="bench-nsqd-")
        for _ in range(5):
            self.tcp = ("127.0.0.1", free_port())
            cmd = [
                *self.placement.server_prefix(),
                self.binary,
                f"--tcp-address={format_addr(self.tcp)}",
                f"--http-address=127.0.0.1:{free_port()}",
                f"--data-path={self.data_dir}",
                *self.extra,
            ]
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=self.placement.server_preexec(),
            )
            if wait_connectable(self.tcp, self.proc, timeout):
                return self.tcp
            self.stop()
        raise RuntimeError(f"nsqd did not start: {self.binary}")

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def cpu_seconds(self) -> float | None:
        return None if self.proc is None else process_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
