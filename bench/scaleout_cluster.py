"""Consumption spread over gateways and Redis masters (not a test).

Two measurements, in one run, 200-byte bodies, every channel filled by MPUB first and then
consumed with SUB, RDY 1000 and FIN of every message by consumers in their own processes:

* ``shared``   one channel consumed on two gateways at once (one consumer on each), on one
               redis-server: the aggregate rate, and where the time goes (each gateway's
               CPU, Redis's CPU per message and its commands).
* ``topics``   ``--topics`` topics (default 6), each consumed on one of ``--gateways``
               gateways, on one redis-server and then on a Redis Cluster of three masters
               on this machine: the aggregate rate at the same total load, and Redis's CPU
               per message summed over its nodes, with each node's share. A topic's keys
               share one hash tag, so the topics spread over the masters' slots.

    .venv/bin/python bench/scaleout_cluster.py
    .venv/bin/python bench/scaleout_cluster.py -n 50000 --topics 6 --gateways 2 --repeat 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Address, Watchdog, format_table, si
from nsq import FRAME_ERROR, NSQConn, fin_lines, scan_frames
from scaleout import (
    CPU,
    REDIS_CLI,
    REDIS_SERVER,
    command_usec,
    mpub_all,
    start_gateway,
    start_redis,
    subscriber,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster(
    directory: Path, masters: int = 3
) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    """Three masters on loopback, no persistence, joined by `redis-cli --cluster create`."""
    procs, ports = [], []
    for i in range(masters):
        port, bus = free_port(), free_port()
        node = directory / f"node{i}"
        node.mkdir(parents=True)
        procs.append(
            subprocess.Popen(
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
                    str(node),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    str(bus),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        ports.append(port)
    for port in ports:
        deadline = time.monotonic() + 10
        while _cli(port, "PING") != "PONG":
            if time.monotonic() > deadline:
                raise RuntimeError("a cluster node did not start")
            time.sleep(0.05)
    created = subprocess.run(
        [
            REDIS_CLI,
            "--cluster",
            "create",
            *(f"127.0.0.1:{p}" for p in ports),
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if created.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout}{created.stderr}")
    deadline = time.monotonic() + 20
    while not all("cluster_state:ok" in _cli(p, "CLUSTER", "INFO") for p in ports):
        if time.monotonic() > deadline:
            raise RuntimeError("the cluster did not reach cluster_state:ok")
        time.sleep(0.05)
    return procs, ports


def _cli(port: int, *args: str) -> str:
    done = subprocess.run([REDIS_CLI, "-p", str(port), *args], capture_output=True, text=True)
    return done.stdout.strip()


def consume(addr: Address, topic: str, total: Any, n: int, start: Any, timeout: float) -> None:
    """One consumer process: SUB, wait for the start, then FIN every message until the
    channel's consumers together have `n` (`total`, shared with the channel's others)."""
    with Watchdog(timeout) as wd:
        sub = subscriber(addr, wd, topic)
        start.wait()
        sub.send(b"RDY 1000\n")
        while total.value < n:
            sub.sock.settimeout(0.2)
            try:
                sub.fill()
            except TimeoutError:
                continue
            ids: list[bytearray] = []
            others: list[tuple[int, bytes]] = []
            sub.start = scan_frames(sub.buf, sub.start, sub.end, ids, others)
            if ids:
                sub.sock.sendall(fin_lines(ids))
                with total.get_lock():
                    total.value += len(ids)
            for ftype, data in others:
                if not (ftype == FRAME_ERROR and data.startswith(b"E_FIN_FAILED")):
                    sub.handle_other(ftype, data)
        sub.close()


def run(
    plan: Sequence[tuple[Address, Address, str]],
    n: int,
    cpu: CPU,
    ports: list[int],
    timeout: float,
) -> tuple[float, dict[str, float], dict[str, float]]:
    """plan: (publish at, consume at, topic) per consumer; a topic named twice is one
    channel with two consumers. Fills every topic with n, then times the consumption of
    all of them. Returns msgs/s over all topics, CPU shares, Redis µs/msg by command."""
    topics = list(dict.fromkeys(t for _, _, t in plan))
    ctx = mp.get_context("fork")
    start = ctx.Event()
    totals = {t: ctx.Value("q", 0) for t in topics}
    procs = [
        ctx.Process(target=consume, args=(con, t, totals[t], n, start, timeout))
        for _, con, t in plan
    ]
    for p in procs:
        p.start()
    with Watchdog(timeout) as wd:
        for t in topics:
            pub = next(p for p, _, topic in plan if topic == t)
            conn = NSQConn(pub, wd)
            mpub_all(conn, t, n)
            conn.close()
    time.sleep(0.5)  # every consumer subscribed (a bench, not a test)
    before = [command_usec(p) for p in ports]
    cpu.start()
    t0 = time.perf_counter()
    start.set()
    for p in procs:
        p.join(timeout)
    wall = time.perf_counter() - t0
    shares = cpu.stop()
    after = [command_usec(p) for p in ports]
    commands: dict[str, float] = {}
    for b, a in zip(before, after, strict=True):
        for c, u in a.items():
            if u - b.get(c, 0) > 0:
                commands[c] = commands.get(c, 0.0) + (u - b.get(c, 0)) / (n * len(topics))
    return n * len(topics) / wall, shares, commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50_000, help="messages per topic")
    parser.add_argument("--topics", type=int, default=6)
    parser.add_argument("--gateways", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        single, port = start_redis(tmp)
        cluster, cports = start_cluster(tmp / "cluster")
        url = f"redis://127.0.0.1:{port}/0"
        curl = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in cports)
        setups: list[tuple[str, str, str, list[int], list[int]]] = [
            ("shared", "one master", url, [port], [single.pid]),
            ("topics", "one master", url, [port], [single.pid]),
            ("topics", "cluster x3", curl, cports, [p.pid for p in cluster]),
        ]
        try:
            for r in range(args.repeat):
                for workload, where, store, ports, redis_pids in setups:
                    gws = 2 if workload == "shared" else args.gateways
                    gateways = [start_gateway(store, tmp / f"{workload}{r}{i}") for i in range(gws)]
                    try:
                        addrs = [g.addresses["nsq"] for g in gateways]
                        stamp = time.time_ns()
                        if workload == "shared":
                            t = f"shared-{stamp}"
                            plan = [(addrs[0], addrs[0], t), (addrs[0], addrs[1], t)]
                        else:
                            plan = [
                                (addrs[i % gws], addrs[i % gws], f"t{i}-{stamp}")
                                for i in range(args.topics)
                            ]
                        pids = {f"gw{i}": g.proc.pid for i, g in enumerate(gateways) if g.proc}
                        pids |= {f"redis{i}": pid for i, pid in enumerate(redis_pids)}
                        rate, shares, commands = run(plan, args.n, CPU(pids), ports, args.timeout)
                    finally:
                        for g in gateways:
                            g.stop()
                    redis_share = sum(v for k, v in shares.items() if k.startswith("redis"))
                    gw_cpu = " ".join(f"{v:.0%}" for k, v in shares.items() if k.startswith("gw"))
                    nodes = " ".join(f"{v:.0%}" for k, v in shares.items() if k.startswith("redis"))
                    top = sorted(commands.items(), key=lambda kv: -kv[1])[:4]
                    rows.append(
                        [
                            workload,
                            where,
                            str(gws),
                            si(rate),
                            gw_cpu,
                            nodes,
                            f"{redis_share / rate * 1e6:.2f}",
                            ", ".join(f"{c} {u:.2f}" for c, u in top),
                        ]
                    )
                    print("  ".join(rows[-1]), flush=True)
        finally:
            for p in [single, *cluster]:
                p.kill()
                p.wait()
    heading = [
        "workload",
        "redis",
        "gateways",
        "msgs/s",
        "gateway CPU",
        "redis CPU",
        "redis µs/msg",
        "µs/msg by command",
    ]
    print()
    print(format_table(heading, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
