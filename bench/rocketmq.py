"""Benchmark of the RocketMQ listener with real clients: ali-ons (npm) and the C++ client
(PyPI rocketmq 0.4.4), and RocketMQ -> NSQ through the gateway.

    .venv/bin/python bench/rocketmq.py                 # every workload, default sizes
    .venv/bin/python bench/rocketmq.py -n 5000 --only send,consume

Workloads (fresh topic names, bodies of --size bytes, memory store):

* `send`: one ali-ons producer, `--window` sends in flight (1 = send and wait): msgs/s.
* `send-cpp`: one C++ client producer, send_sync one at a time (its only sync mode).
* `send-raw`: SEND_MESSAGE_V2 from a raw socket, 64 outstanding: the gateway's ceiling
  with no client library in the way (the clients above are slower than the gateway).
* `consume`: the topic is filled first (ali-ons, window 64), then one ali-ons push consumer
  (pullBatchSize 32, 4 queues) handles every message: msgs/s from its first message.
* `r2n`: a raw NSQ consumer (RDY 1000, FIN in batches) subscribed, then one ali-ons
  producer (window 64) sends: end to end msgs/s, from the first send to the last message
  received over NSQ; and the NSQ side on its own, from its first message to its last.

There is no real RocketMQ broker to compare with on this machine (it needs a JVM), so the
figures are the gateway's own; ratios between workloads of one run are what to compare.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import GatewayProcess, connect, format_addr, format_table, make_placement

REPO = Path(__file__).resolve().parent.parent
ALIONS = REPO / "tests" / "clients" / "node" / "rocketmq_client.js"
CPP = REPO / "tests" / "clients" / "rocketmq_cpp_client.py"
WORKLOADS = ("send", "send-cpp", "send-raw", "consume", "r2n")


def _json_lines(output: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.decode().splitlines() if line.startswith("{")]


def _run(cmd: list[str], timeout: float) -> list[dict[str, Any]]:
    done = subprocess.run(cmd, capture_output=True, timeout=timeout, cwd=REPO, check=False)
    lines = _json_lines(done.stdout)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[1]} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return lines


def alions_send(name_srv: str, topic: str, n: int, size: int, window: int, timeout: float) -> float:
    """Seconds ali-ons took to send n messages (its own clock, after ready())."""
    options = {
        "nameSrv": name_srv,
        "topic": topic,
        "messages": [{"body": base64.b64encode(b"x" * size).decode(), "tag": "bench"}],
        "repeat": n,
        "window": window,
        "quiet": True,
    }
    lines = _run(["node", str(ALIONS), "produce", json.dumps(options)], timeout)
    return float(next(e for e in lines if e["event"] == "done")["seconds"])


def cpp_send(name_srv: str, topic: str, n: int, size: int, timeout: float) -> float:
    options = {
        "nameSrv": name_srv,
        "topic": topic,
        "messages": [{"body": (b"x" * size).hex(), "tag": "bench"}],
        "repeat": n,
        "quiet": True,
    }
    cmd = [sys.executable, str(CPP), "produce", json.dumps(options)]
    # the C++ client logs under ~/logs/rocketmq-cpp: a HOME of its own, removed after
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, HOME=home)
        done = subprocess.run(
            cmd, capture_output=True, timeout=timeout, cwd=REPO, check=False, env=env
        )
    if done.returncode != 0:
        raise RuntimeError(
            f"the C++ client exited {done.returncode}: {done.stderr.decode()[-2000:]}"
        )
    return float(next(e for e in _json_lines(done.stdout) if e["event"] == "done")["seconds"])


def alions_consume(name_srv: str, topic: str, n: int, timeout: float) -> float:
    options = {
        "nameSrv": name_srv,
        "topic": topic,
        "group": f"GID_{topic}",
        "count": n,
        "timeoutMs": int(timeout * 1000),
        "quiet": True,
    }
    lines = _run(["node", str(ALIONS), "consume", json.dumps(options)], timeout + 30)
    closed = next(e for e in lines if e["event"] == "closed")
    if closed["count"] < n:
        raise RuntimeError(f"the consumer handled {closed['count']} of {n}")
    return float(closed["seconds"]) - 0.2  # it closes 0.2 s after its last message


def raw_send(addr: tuple[str, int], topic: str, n: int, size: int, window: int) -> float:
    """SEND_MESSAGE_V2 frames from a raw socket, `window` outstanding: the gateway's own
    ceiling, with no client library in the way. Seconds for n answers."""
    sys.path.insert(0, str(REPO))
    from gateway.protocols.rocketmq.codec import RemotingCodec, encode_request

    body = b"x" * size
    ext = {"a": "PID_bench", "b": topic, "e": 0, "f": 0, "i": "TAGS\x01bench\x02"}
    sock = connect(addr)
    codec = RemotingCodec()
    started = time.perf_counter()
    sent = answered = 0
    while answered < n:
        burst = min(window - (sent - answered), n - sent)
        if burst > 0:
            frames = [
                encode_request(310, sent + i, ext_fields=ext, body=body) for i in range(burst)
            ]
            sock.sendall(b"".join(frames))
            sent += burst
        data = sock.recv(1 << 20)
        if not data:
            raise RuntimeError("the gateway closed the connection")
        codec.receive_data(data)
        for event in codec.events():
            if getattr(event, "code", 1) != 0:
                raise RuntimeError(f"send failed: {event}")
            answered += 1
    sock.close()
    return time.perf_counter() - started


class NSQConsumer(threading.Thread):
    """A raw NSQ V2 consumer: SUB, RDY 1000, FIN every message (in one write per read)."""

    def __init__(self, addr: tuple[str, int], topic: str, n: int) -> None:
        super().__init__(daemon=True)
        self.sock = connect(addr)
        self.n = n
        self.first = self.last = 0.0
        self.got = 0
        self.error = ""
        self.sock.sendall(b"  V2" + f"SUB {topic} bench\n".encode())
        self._read_frame()  # OK
        self.sock.sendall(b"RDY 1000\n")

    def _read_exact(self, size: int) -> bytes:
        buf = b""
        while len(buf) < size:
            chunk = self.sock.recv(size - len(buf))
            if not chunk:
                raise ConnectionError("the gateway closed the NSQ connection")
            buf += chunk
        return buf

    def _read_frame(self) -> tuple[int, bytes]:
        size, kind = struct.unpack(">ii", self._read_exact(8))
        return kind, self._read_exact(size - 4)

    def run(self) -> None:
        buf = b""
        try:
            while self.got < self.n:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("the gateway closed the NSQ connection")
                buf += chunk
                fins = []
                pos = 0
                while len(buf) - pos >= 8:
                    size, kind = struct.unpack_from(">ii", buf, pos)
                    if len(buf) - pos < 4 + size:
                        break
                    if kind == 2:
                        fins.append(b"FIN " + buf[pos + 18 : pos + 34] + b"\n")
                    elif buf[pos + 8 : pos + 4 + size] == b"_heartbeat_":
                        fins.append(b"NOP\n")
                    pos += 4 + size
                buf = buf[pos:]
                if fins:
                    now = time.perf_counter()
                    self.first = self.first or now
                    self.last = now
                    self.got += sum(1 for f in fins if f.startswith(b"FIN"))
                    self.sock.sendall(b"".join(fins))
        except OSError as exc:
            self.error = str(exc)
        finally:
            self.sock.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-n", type=int, default=20000, help="messages per workload")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--window", type=int, default=1, help="ali-ons sends in flight for `send`")
    p.add_argument("--only", default=",".join(WORKLOADS))
    p.add_argument("--pin", default="split", choices=["none", "same", "split"])
    p.add_argument("--timeout", type=float, default=300.0)
    a = p.parse_args()
    only = [w.strip() for w in a.only.split(",") if w.strip()]
    if shutil.which("node") is None or not (ALIONS.parent / "node_modules" / "ali-ons").is_dir():
        print("ali-ons is not installed: npm ci --prefix tests/clients/node", file=sys.stderr)
        return 2
    placement = make_placement(a.pin)
    gateway = GatewayProcess(
        [
            "serve",
            *("--nsq", "127.0.0.1:0", "--rocketmq", "127.0.0.1:0", "--http", "off"),
            *("--beanstalk", "off", "--nats", "off", "--nats-route", "off"),
            *("--store", "memory://"),
        ],
        placement,
        ["nsq", "rocketmq"],
    )
    try:
        addresses = gateway.start()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    name_srv = format_addr(addresses["rocketmq"])
    print(f"gateway {name_srv}, n={a.n}, {a.size}-byte bodies, placement {placement.describe()}")
    rows: list[list[str]] = []
    status = 0
    stamp = int(time.time())
    try:
        for workload in only:
            topic = f"bench_{workload.replace('-', '_')}_{stamp}"
            cpu_before, wall_before = gateway.cpu_seconds() or 0.0, time.perf_counter()
            try:
                if workload == "send":
                    seconds = alions_send(name_srv, topic, a.n, a.size, a.window, a.timeout)
                    rows.append([f"send (ali-ons, window {a.window})", f"{a.n / seconds:,.0f}"])
                elif workload == "send-cpp":
                    seconds = cpp_send(name_srv, topic, a.n, a.size, a.timeout)
                    rows.append(["send (C++ client, send_sync)", f"{a.n / seconds:,.0f}"])
                elif workload == "send-raw":
                    seconds = raw_send(addresses["rocketmq"], topic, a.n, a.size, 64)
                    rows.append(["send (raw socket, window 64)", f"{a.n / seconds:,.0f}"])
                elif workload == "consume":
                    alions_send(name_srv, topic, a.n, a.size, 64, a.timeout)
                    seconds = alions_consume(name_srv, topic, a.n, a.timeout)
                    rows.append(["push consume (ali-ons)", f"{a.n / seconds:,.0f}"])
                elif workload == "r2n":
                    nsq = NSQConsumer(addresses["nsq"], topic, a.n)
                    nsq.start()
                    started = time.perf_counter()
                    alions_send(name_srv, topic, a.n, a.size, 64, a.timeout)
                    nsq.join(a.timeout)
                    if nsq.got < a.n:
                        raise RuntimeError(f"NSQ got {nsq.got} of {a.n} {nsq.error}")
                    nsq_alone = a.n / (nsq.last - nsq.first)
                    rows.append(["  NSQ delivery alone", f"{nsq_alone:,.0f}", ""])
                    end_to_end = a.n / (nsq.last - started)
                    rows.append(["RocketMQ -> NSQ, end to end", f"{end_to_end:,.0f}"])
                else:
                    raise RuntimeError(f"unknown workload {workload}")
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
                rows.append([workload, f"failed: {str(exc)[:200]}", ""])
                status = 1
            else:
                # the gateway's CPU over the whole workload (node start-up included): near
                # 100% means the gateway sets the pace, far below it the client does
                cpu = (gateway.cpu_seconds() or 0.0) - cpu_before
                rows[-1].append(f"{100 * cpu / (time.perf_counter() - wall_before):.0f}%")
    finally:
        gateway.stop()
    print(format_table(["workload", "msgs/s", "gateway cpu"], rows))
    return status


if __name__ == "__main__":
    sys.exit(main())
