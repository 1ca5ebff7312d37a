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
               share one hash tag; the topics are named so that their slots fall on the
               masters in turn.

    .venv/bin/python bench/scaleout_cluster.py
    .venv/bin/python bench/scaleout_cluster.py -n 50000 --topics 6 --gateways 2 --repeat 3
    sudo .venv/bin/python bench/scaleout_cluster.py --only topics --redis-cpu 0.1

``--redis-cpu SHARE`` holds every redis-server (the single one and each master) to that
share of one CPU, through a cgroup of its own (root only). Each node then stands for a
machine of its own whose Redis is the limit: what a user who adds masters has. Without
it, on a machine with few cores the gateways and the consumers use every core, Redis
never is the limit, and a cluster cannot carry more than one master does.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import Address, Watchdog, format_table, si
from _cpu import CpuCap
from nsq import FRAME_ERROR, NSQConn, fin_lines, scan_frames
from scaleout import CPU, command_usec, mpub_all, start_gateway, start_redis, subscriber

from gateway.stores.redis_cluster_wire import key_slot
from gateway.stores.redis_codec import topic_key
from tests.redis_server import RedisCluster  # the suite's three masters on loopback


def consume(
    addr: Address,
    topic: str,
    total: Any,
    n: int,
    start: Any,
    timeout: float,
    used: Any,
    ended: Any,
) -> None:
    """One consumer process: SUB, wait at `start` (a barrier every consumer and the timer
    pass), then FIN every message until the channel's consumers together have `n`
    (`total`, shared with the channel's others). `used`: its CPU seconds from the start;
    `ended`: when the channel's last message arrived (perf_counter, the same clock in
    every process), set by whichever consumer got it: the others notice only after
    their next read times out."""
    with Watchdog(timeout) as wd:
        sub = subscriber(addr, wd, topic)
        start.wait()
        t0 = time.process_time()
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
                    if total.value >= n:
                        ended.value = time.perf_counter()
            for ftype, data in others:
                if not (ftype == FRAME_ERROR and data.startswith(b"E_FIN_FAILED")):
                    sub.handle_other(ftype, data)
        used.value = time.process_time() - t0
        sub.close()


def spread_names(cluster: RedisCluster, count: int, stamp: int) -> list[str]:
    """`count` topic names whose slots fall on the masters in turn (topic i on master
    i % masters), as a user spreads topics by their hash tags: random names would put
    two or three of six on one master in many runs."""
    owned: list[list[tuple[int, int]]] = []
    for node in cluster.nodes:
        me = next(line for line in node.cli("CLUSTER", "NODES").splitlines() if "myself" in line)
        ranges = [r.split("-") for r in me.split()[8:] if not r.startswith("[")]
        owned.append([(int(r[0]), int(r[-1])) for r in ranges])
    names: list[str] = []
    k = 0
    while len(names) < count:
        name = f"t{len(names)}-{stamp}-{k}"
        k += 1
        slot = key_slot(topic_key(name))  # the slot of every key of the topic
        want = owned[len(names) % len(owned)]
        if any(lo <= slot <= hi for lo, hi in want):
            names.append(name)
    return names


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
    start = ctx.Barrier(len(plan) + 1)  # every consumer subscribed, and the timer
    totals = {t: ctx.Value("q", 0) for t in topics}
    ended = {t: ctx.Value("d", 0.0) for t in topics}
    # the consumers' CPU seconds: on a small machine they share its cores with the gateways
    used = [ctx.Value("d", 0.0) for _ in plan]
    procs = [
        ctx.Process(target=consume, args=(con, t, totals[t], n, start, timeout, u, ended[t]))
        for (_, con, t), u in zip(plan, used, strict=True)
    ]
    for p in procs:
        p.start()
    with Watchdog(timeout) as wd:
        for t in topics:
            pub = next(p for p, _, topic in plan if topic == t)
            conn = NSQConn(pub, wd)
            mpub_all(conn, t, n)
            conn.close()
    before = [command_usec(p) for p in ports]
    cpu.start()
    t0 = time.perf_counter()
    start.wait()
    for p in procs:
        p.join(timeout)
    wall = max(e.value for e in ended.values()) - t0
    shares = cpu.stop(wall)
    shares |= {f"consumer{i}": u.value / wall for i, u in enumerate(used)}
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
    parser.add_argument(
        "--only", choices=("shared", "topics"), help="run one of the two measurements"
    )
    parser.add_argument(
        "--redis-cpu",
        type=float,
        metavar="SHARE",
        help="hold each redis-server to this share of one CPU (a cgroup; root only)",
    )
    args = parser.parse_args(argv)
    cap = None
    if args.redis_cpu is not None:
        if not 0 < args.redis_cpu <= 1:
            parser.error("--redis-cpu: a share of one CPU, more than 0 and at most 1")
        problem = CpuCap.problem()
        if problem is not None:
            parser.error(f"--redis-cpu: {problem}")
        cap = CpuCap(args.redis_cpu)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        single, port = start_redis(tmp)
        cluster = RedisCluster(tmp / "cluster").start()
        cports = [node.port for node in cluster.nodes]
        cpids = [node.proc.pid for node in cluster.nodes if node.proc is not None]
        url = f"redis://127.0.0.1:{port}/0"
        curl = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in cports)
        setups: list[tuple[str, str, str, list[int], list[int]]] = [
            ("shared", "one master", url, [port], [single.pid]),
            ("topics", "one master", url, [port], [single.pid]),
            ("topics", "cluster x3", curl, cports, cpids),
        ]
        setups = [s for s in setups if args.only in (None, s[0])]
        if cap is not None:
            for pid in [single.pid, *cpids]:
                cap.add(pid)
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
                            names = spread_names(cluster, args.topics, stamp)
                            plan = [
                                (addrs[i % gws], addrs[i % gws], name)
                                for i, name in enumerate(names)
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
                    consumers = " ".join(
                        f"{v:.0%}" for k, v in shares.items() if k.startswith("consumer")
                    )
                    top = sorted(commands.items(), key=lambda kv: -kv[1])[:4]
                    rows.append(
                        [
                            workload,
                            where,
                            str(gws),
                            si(rate),
                            gw_cpu,
                            consumers,
                            nodes,
                            f"{redis_share / rate * 1e6:.2f}",
                            ", ".join(f"{c} {u:.2f}" for c, u in top),
                        ]
                    )
                    print("  ".join(rows[-1]), flush=True)
        finally:
            single.kill()
            single.wait()
            cluster.stop()
            if cap is not None:
                cap.close()
    heading = [
        "workload",
        "redis",
        "gateways",
        "msgs/s",
        "gateway CPU",
        "consumer CPU",
        "redis CPU",
        "redis µs/msg",
        "µs/msg by command",
    ]
    print()
    if cap is not None:
        print(f"every redis-server held to {cap.share:.0%} of one CPU")
    print(format_table(heading, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
