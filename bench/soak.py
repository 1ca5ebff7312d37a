"""Soak run (not a test): every protocol at once for a long time, then count every message.

For ``--seconds`` (600 by default) a gateway (the durable default store, in a temp data
dir) serves, each in a process of its own:

* producers, each at a fixed rate (``RATES``, ``--rate``): NSQ ``PUB`` and ``MPUB`` on
  topic ``soak.nsq``; beanstalkd ``put`` on tube ``soak.bs``; NATS ``PUB`` on
  ``soak.nats`` (followed by a ``PING`` round trip);
* consumers, cross-protocol: an NSQ consumer (channel ``c``) on ``soak.nsq`` and on
  ``soak.bs``, a beanstalkd worker (``reserve``/``delete``) on ``soak.nsq`` and
  ``soak.bs``; each disconnects at random moments (a reset, with messages in flight,
  which come back); a NATS subscriber on ``soak.nats``;
* trouble: a process that opens connections to every listener and sends garbage, resets
  half-written frames and goes away; a slow NATS subscriber that reads a little now and
  then; a slow NSQ consumer (RDY 1, a pause before each FIN).

Every producer numbers its messages and counts what the gateway acknowledged (NSQ ``OK``,
``INSERTED``); every consumer reports what it received. Every ``--sample`` seconds the
gateway's RSS, open descriptors and Trio task count (``gateway_tasks`` on /metrics) are
recorded. At the end the producers stop, the consumers drain, and the script prints:
acknowledged vs delivered per (topic, consuming group) with the lost ones, the samples'
first and last values after warm-up, and a verdict: zero acknowledged messages lost, RSS
and descriptors flat (within ``--tolerance``), no task leak.

    .venv/bin/python bench/soak.py                      # 10 minutes
    .venv/bin/python bench/soak.py --seconds 60         # a quick look
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import socket
import struct
import sys
import tempfile
import time
import urllib.request
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import Address, GatewayProcess, make_placement

from gateway.stores.log import OPEN_SEGMENTS

Report = Any  # a multiprocessing.Queue of (kind, name, payload)
LIFE = (2.0, 10.0)  # seconds a consumer's connection lives before it resets (--churn)


# -- small blocking clients -------------------------------------------------------------


class Conn:
    def __init__(self, addr: Address) -> None:
        self.sock = socket.create_connection(addr, timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def line(self, marker: bytes = b"\r\n") -> bytes:
        while (i := self.buf.find(marker)) < 0:
            self._more()
        out = bytes(self.buf[: i + len(marker)])
        del self.buf[: i + len(marker)]
        return out

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _more(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("closed by the gateway")
        self.buf += chunk

    def reset(self) -> None:
        """Go away abruptly (RST), as a crashed client does."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def nsq_frame(c: Conn) -> tuple[int, bytes]:
    size = struct.unpack(">i", c.exact(4))[0]
    data = c.exact(size)
    return struct.unpack(">i", data[:4])[0], data[4:]


def body(tag: str, n: int) -> bytes:
    return f"{tag}:{n}:".encode() + b"x" * 150


def key(payload: bytes) -> str:
    """The producer's tag and number of a body: "pub:17"."""
    tag, n, _ = payload.split(b":", 2)
    return f"{tag.decode()}:{n.decode()}"


# -- producers --------------------------------------------------------------------------

# Messages a second each producer offers (--rate scales them all). A fixed rate, not "as
# fast as the replies come": the load is then the same on a faster gateway. Paced only by
# the replies, the producers brought 5.7k msgs/s to the NSQ topic once the NSQ path got
# faster (3.3k before); its beanstalkd worker, a reserve and a delete per job (two round
# trips), drained about 2.7k a second under that load, and the backlog outlived the
# drain. At 3k a second it still fell behind by 300-500 a second; at 2k it keeps up.
RATES = {"pub": 500.0, "mpub": 1_500.0, "put": 250.0, "nats": 700.0}


class Pace:
    """Sleeps so that the n-th message goes at start + n / rate. After a stall it does not
    catch up in a burst: at most a second's worth is owed."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.sent = 0

    def sent_and_wait(self, n: int) -> None:
        self.sent += n
        due = self.start + self.sent / self.rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        elif now - due > 1.0:
            self.start += now - due - 1.0


def nsq_producer(addr: Address, stop: Event, report: Report, mpub: bool, rate: float) -> None:
    tag = "mpub" if mpub else "pub"
    acked = 0
    pace = Pace(rate)
    c = Conn(addr)
    c.sock.sendall(b"  V2")
    while not stop.is_set():
        if mpub:
            bodies = [body(tag, acked + i) for i in range(20)]
            payload = struct.pack(">i", len(bodies)) + b"".join(
                struct.pack(">i", len(b)) + b for b in bodies
            )
            c.sock.sendall(b"MPUB soak.nsq\n" + struct.pack(">i", len(payload)) + payload)
        else:
            b = body(tag, acked)
            c.sock.sendall(b"PUB soak.nsq\n" + struct.pack(">i", len(b)) + b)
        while (frame := nsq_frame(c)) == (0, b"_heartbeat_"):
            c.sock.sendall(b"NOP\n")
        assert frame == (0, b"OK"), frame
        acked += 20 if mpub else 1
        pace.sent_and_wait(20 if mpub else 1)
    report.put(("acked", f"soak.nsq/{tag}", acked))


def beanstalk_producer(addr: Address, stop: Event, report: Report, rate: float) -> None:
    # TTR 3 s: a job's TTR is how long any consumer holds it, an NSQ consumer too, so what a
    # reset leaves in flight comes back within the consumers' 5 s of quiet at the end
    acked = 0
    pace = Pace(rate)
    c = Conn(addr)
    c.sock.sendall(b"use soak.bs\r\n")
    c.line()
    while not stop.is_set():
        b = body("put", acked)
        c.sock.sendall(b"put 100 0 3 %d\r\n%s\r\n" % (len(b), b))
        reply = c.line()
        assert reply.startswith(b"INSERTED"), reply
        acked += 1
        pace.sent_and_wait(1)
    report.put(("acked", "soak.bs/put", acked))


def nats_producer(addr: Address, stop: Event, report: Report, rate: float) -> None:
    sent = 0
    pace = Pace(rate)
    c = Conn(addr)
    c.line()  # INFO
    c.sock.sendall(b'CONNECT {"verbose":false}\r\n')
    while not stop.is_set():
        b = body("nats", sent)
        c.sock.sendall(b"PUB soak.nats %d\r\n%s\r\nPING\r\n" % (len(b), b))
        assert c.line() == b"PONG\r\n"
        sent += 1
        pace.sent_and_wait(1)
    report.put(("acked", "soak.nats/pub", sent))


# -- consumers --------------------------------------------------------------------------


def nsq_consumer(addr: Address, topic: str, drain: Event, report: Report, seed: int) -> None:
    """Consume with FIN; every few seconds reset the connection with messages in flight."""
    rng = random.Random(seed)
    seen: set[str] = set()
    reconnects = 0
    idle_since = None
    while True:
        c = Conn(addr)
        c.sock.settimeout(1.0)
        # a short msg_timeout: what a reset leaves in flight comes back within 2 s (nsqd,
        # and the gateway, requeue it when it times out, not when the client goes)
        identify = json.dumps({"msg_timeout": 2000}).encode()
        c.sock.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", len(identify)) + identify)
        c.sock.sendall(b"SUB %s c\nRDY 50\n" % topic.encode())
        life = time.monotonic() + rng.uniform(*LIFE)
        try:
            while True:
                if not drain.is_set() and time.monotonic() > life:
                    c.reset()  # in-flight messages come back to someone else
                    reconnects += 1
                    break
                try:
                    kind, data = nsq_frame(c)
                except TimeoutError:
                    if drain.is_set():
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since > 5:
                            report.put(("seen", f"{topic}/nsq", sorted(seen)))
                            report.put(("reconnects", f"{topic}/nsq", reconnects))
                            return
                    continue
                idle_since = None
                if kind == 0:
                    if data == b"_heartbeat_":
                        c.sock.sendall(b"NOP\n")
                    continue
                if kind == 2:
                    seen.add(key(data[26:]))
                    c.sock.sendall(b"FIN " + data[10:26] + b"\n")
        except (ConnectionError, OSError):
            reconnects += 1


def beanstalk_worker(addr: Address, tube: str, drain: Event, report: Report, seed: int) -> None:
    rng = random.Random(seed)
    seen: set[str] = set()
    reconnects = 0
    idle = 0
    while True:
        c = Conn(addr)
        c.sock.sendall(b"watch %s\r\nignore default\r\n" % tube.encode())
        c.line()
        c.line()
        life = time.monotonic() + rng.uniform(*LIFE)
        try:
            while True:
                if not drain.is_set() and time.monotonic() > life:
                    c.sock.sendall(b"reserve-with-timeout 0\r\n")  # one held, then a reset
                    c.reset()
                    reconnects += 1
                    break
                c.sock.sendall(b"reserve-with-timeout 1\r\n")
                reply = c.line()
                if reply.startswith(b"TIMED_OUT"):
                    if drain.is_set():
                        idle += 1
                        if idle >= 5:
                            report.put(("seen", f"{tube}/beanstalk", sorted(seen)))
                            report.put(("reconnects", f"{tube}/beanstalk", reconnects))
                            return
                    continue
                idle = 0
                _, job, size = reply.split()
                seen.add(key(c.exact(int(size) + 2)[:-2]))
                c.sock.sendall(b"delete " + job + b"\r\n")
                assert c.line() == b"DELETED\r\n"
        except (ConnectionError, OSError):
            reconnects += 1


def nats_subscriber(addr: Address, drain: Event, report: Report, slow: bool) -> None:
    c = Conn(addr)
    c.line()
    c.sock.sendall(b'CONNECT {"verbose":false}\r\nSUB soak.nats 1\r\nPING\r\n')
    c.sock.settimeout(1.0)
    got = 0
    idle = 0
    try:
        while idle < 5:
            if slow:
                time.sleep(0.05)  # reads a little now and then
            try:
                chunk = c.sock.recv(4096 if slow else 1 << 16)
            except TimeoutError:
                idle += 1 if drain.is_set() else 0
                continue
            if not chunk:
                break
            if b"PING\r\n" in chunk:  # the server's liveness check (a PING can hide in a
                c.sock.sendall(b"PONG\r\n")  # payload too; a spare PONG does no harm)
            got += chunk.count(b"MSG soak.nats")
            idle = 0
    except OSError:
        pass
    report.put(("nats", "slow" if slow else "subscriber", got))


def slow_nsq_consumer(addr: Address, stop: Event) -> None:
    c = Conn(addr)
    c.sock.sendall(b"  V2SUB soak.nsq slow\nRDY 1\n")
    while not stop.is_set():
        kind, data = nsq_frame(c)
        if kind == 2:
            time.sleep(0.2)
            c.sock.sendall(b"FIN " + data[10:26] + b"\n")
        elif data == b"_heartbeat_":
            c.sock.sendall(b"NOP\n")


def troublemaker(addrs: dict[str, Address], stop: Event, seed: int) -> None:
    rng = random.Random(seed)
    junk = [b"\x00\xff" * 100, b"PUB\r\n", b"put 1 2 3 99999999999\r\n", b"  V2" + b"\xff" * 64,
            b"SUB \r\n", b"GET / HTTP/1.1\r\nContent-Length: 999999\r\n\r\n"]  # fmt: skip
    while not stop.is_set():
        addr = rng.choice(list(addrs.values()))
        try:
            c = Conn(addr)
            c.sock.sendall(rng.choice(junk))
            if rng.random() < 0.5:
                c.reset()
            else:
                c.sock.close()
        except OSError:
            pass
        time.sleep(0.02)


# -- sampling --------------------------------------------------------------------------


def sample(pid: int, http: Address) -> dict[str, float]:
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
    # the store's log segments open for reading bodies back are counted apart: they are
    # bounded (OPEN_SEGMENTS, the first opened closed first), and a slow group that
    # pins every segment makes the page-ins of the others read from ever more of them
    fds = segments = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".log"):
            segments += 1
        else:
            fds += 1
    tasks = -1.0
    with urllib.request.urlopen(f"http://{http[0]}:{http[1]}/metrics", timeout=10) as r:
        for raw in r.read().decode().splitlines():
            if raw.startswith("gateway_tasks "):
                tasks = float(raw.split()[1])
    return {"rss_mb": rss, "fds": fds, "segments": segments, "tasks": tasks}


def held_by_groups(http: str) -> dict[str, dict[str, int]]:
    """Per group of the soak's topics but the slow channel: depth, in flight, deferred."""
    with urllib.request.urlopen(f"{http}/stats?format=json", timeout=10) as r:
        stats = json.loads(r.read())
    return {
        f"{t['topic_name']}/{c['channel_name']}": {
            k: c[k] for k in ("depth", "in_flight_count", "deferred_count")
        }
        for t in stats["topics"]
        for c in t["channels"]
        if t["topic_name"].startswith("soak.") and c["channel_name"] != "slow"
    }


SLOW_NATS_PENDING = 4 * 1024 * 1024  # bytes a slow NATS subscriber may fall behind (main)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before the baseline")
    ap.add_argument("--tolerance", type=float, default=0.2, help="RSS/fd growth allowed")
    ap.add_argument("--pin", default="none", help="CPU placement, as the other benches")
    ap.add_argument("--churn", type=float, default=1.0, help="consumer resets x this often")
    ap.add_argument("--rate", type=float, default=1.0, help="every producer's rate x this")
    args = ap.parse_args(argv)
    warmup = min(args.warmup, args.seconds / 4)
    global LIFE
    LIFE = (LIFE[0] / args.churn, LIFE[1] / args.churn)
    data = Path(tempfile.mkdtemp(prefix="gateway-soak-"))
    # The slow NATS subscriber falls behind the publisher, and what waits for it is held up
    # to nats_server.max_pending (64 MB, nats-server's default) before it is cut off as a
    # slow consumer: a bounded buffer, but one that fills for most of a 10-minute run and
    # would read as growth. A small bound fills within the warm-up, so that the RSS
    # verdict measures leaks, not that buffer.
    os.environ.setdefault("GATEWAY_NATS_SERVER__MAX_PENDING", str(SLOW_NATS_PENDING))
    gw = GatewayProcess(
        ["serve", "--data-dir", str(data / "data"), "--nsq", "127.0.0.1:0",
         "--beanstalk", "127.0.0.1:0", "--nats", "127.0.0.1:0", "--http", "127.0.0.1:0",
         "--nats-route", "off", "--rocketmq", "off"],
        make_placement(args.pin), ["nsq", "beanstalk", "nats", "http"],
    )  # fmt: skip
    addrs = gw.start()
    try:
        return run(args, gw, addrs, data, warmup)
    finally:
        gw.stop()
        shutil.rmtree(data, ignore_errors=True)


def run(
    args: argparse.Namespace,
    gw: GatewayProcess,
    addrs: dict[str, Address],
    data: Path,
    warmup: float,
) -> int:
    assert gw.proc is not None
    print(f"# soak: {args.seconds:.0f} s, gateway pid {gw.proc.pid}, data in {data}", flush=True)
    stop, drain = multiprocessing.Event(), multiprocessing.Event()
    report: Report = multiprocessing.Queue()
    nsq, bs, nats = addrs["nsq"], addrs["beanstalk"], addrs["nats"]
    # the consumers' groups first, so that every acknowledged message has them to reach
    http = f"http://{addrs['http'][0]}:{addrs['http'][1]}"
    for path in (
        "/topic/create?topic=soak.nsq",
        "/channel/create?topic=soak.nsq&channel=c",
        "/topic/create?topic=soak.bs",
        "/channel/create?topic=soak.bs&channel=c",
    ):
        urllib.request.urlopen(urllib.request.Request(http + path, method="POST"), timeout=10)
    # a beanstalkd worker group on each topic, kept for the whole run by a connection that
    # watches both: a tube's group goes when nobody watches it and it is empty
    # (docs/semantics.md), and the workers below reset their connections on purpose
    keeper = Conn(bs)
    keeper.sock.sendall(b"watch soak.nsq\r\nwatch soak.bs\r\n")
    keeper.line()
    keeper.line()
    rate = {name: r * args.rate for name, r in RATES.items()}
    producers = [
        multiprocessing.Process(target=nsq_producer, args=(nsq, stop, report, False, rate["pub"])),
        multiprocessing.Process(target=nsq_producer, args=(nsq, stop, report, True, rate["mpub"])),
        multiprocessing.Process(target=beanstalk_producer, args=(bs, stop, report, rate["put"])),
        multiprocessing.Process(target=nats_producer, args=(nats, stop, report, rate["nats"])),
    ]
    consumers = [
        multiprocessing.Process(target=nsq_consumer, args=(nsq, "soak.nsq", drain, report, 1)),
        multiprocessing.Process(target=nsq_consumer, args=(nsq, "soak.bs", drain, report, 2)),
        multiprocessing.Process(target=beanstalk_worker, args=(bs, "soak.nsq", drain, report, 3)),
        multiprocessing.Process(target=beanstalk_worker, args=(bs, "soak.bs", drain, report, 4)),
        multiprocessing.Process(target=nats_subscriber, args=(nats, drain, report, False)),
        multiprocessing.Process(target=nats_subscriber, args=(nats, drain, report, True)),
    ]
    extras = [
        multiprocessing.Process(target=slow_nsq_consumer, args=(nsq, stop), daemon=True),
        multiprocessing.Process(target=troublemaker, args=(addrs, stop, 5), daemon=True),
    ]
    for p in consumers + extras + producers:
        p.start()
    samples: list[tuple[float, dict[str, float]]] = []
    t0 = time.monotonic()
    while (now := time.monotonic() - t0) < args.seconds:
        samples.append((now, sample(gw.proc.pid, addrs["http"])))
        s = samples[-1][1]
        print(f"t={now:6.0f}s rss={s['rss_mb']} MB fds={s['fds']} log segments open="
              f"{s['segments']} tasks={s['tasks']:.0f}", flush=True)  # fmt: skip
        time.sleep(min(args.sample, max(0.0, args.seconds - now)))
    stop.set()
    for p in producers:
        p.join(60)
    # how far behind the consumers were when the load stopped: the drain's work
    print(f"held by the groups when the producers stopped: {held_by_groups(http)}", flush=True)
    drain.set()
    results: dict[str, dict[str, Any]] = {"acked": {}, "seen": {}, "reconnects": {}, "nats": {}}
    for _ in range(len(producers) + 2 * 4 + 2):
        kind, name, payload = report.get(timeout=300)
        results[kind][name] = payload
    for p in consumers:
        p.join(60)
    final = sample(gw.proc.pid, addrs["http"])
    # what the groups still hold (all zero when every message was delivered and finished)
    held = held_by_groups(http)
    code = gw.stop()
    # every acknowledged message reached every group of its topic
    lost_total = 0
    print("\n## messages")
    for topic, tags in (("soak.nsq", ("pub", "mpub")), ("soak.bs", ("put",))):
        want = {f"{tag}:{n}" for tag in tags for n in range(results["acked"][f"{topic}/{tag}"])}
        for group in ("nsq", "beanstalk"):
            got = set(results["seen"][f"{topic}/{group}"])
            lost = want - got
            lost_total += len(lost)
            reconnects = results["reconnects"][f"{topic}/{group}"]
            example = " e.g. " + ", ".join(sorted(lost)[:5]) if lost else ""
            print(
                f"{topic} -> {group:9s} acknowledged {len(want):7d}"
                f" delivered {len(got & want):7d} lost {len(lost)}{example}"
                f" (consumer reconnects {reconnects})"
            )
    print(f"still held by the groups at the end: {held}")
    print(f"soak.nats: published {results['acked']['soak.nats/pub']}, subscriber got "
          f"{results['nats'].get('subscriber')}, slow subscriber got {results['nats'].get('slow')}"
          " (NATS is at most once; not counted as loss)")  # fmt: skip
    base = next((s for t, s in samples if t >= warmup), samples[-1][1])
    last = samples[-1][1]
    print("\n## resources: after warm-up -> last sample under load (-> after the drain)")
    verdicts = {"nothing_lost": lost_total == 0, "exit_0": code == 0}
    for key in ("rss_mb", "fds", "tasks"):
        start, end = base[key], last[key]
        slack = 5 if key != "rss_mb" else 10  # a few descriptors or MB of noise
        flat = end <= start * (1 + args.tolerance) + slack
        # and nothing held once the clients are gone (the drain pages the consumers'
        # backlog in and out again: a megabyte or so of the allocator's is not a leak)
        flat = flat and final[key] <= end + slack
        verdicts[key] = flat
        print(f"{key:7s} {start:8.0f} -> {end:8.0f} (-> {final[key]:.0f})"
              f"  {'flat' if flat else 'GREW'}")  # fmt: skip
    # the log segments open for reading: within their bound (and the one being written)
    most = max([s["segments"] for _, s in samples] + [final["segments"]])
    verdicts["segments"] = most <= OPEN_SEGMENTS + 1
    print(f"log segments open: at most {most} (bound {OPEN_SEGMENTS} + the one written)")
    print(json.dumps({"samples": [(round(t), s) for t, s in samples], "final": final}))
    print(f"\nverdict: {'PASS' if all(verdicts.values()) else 'FAIL'} {verdicts}")
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
