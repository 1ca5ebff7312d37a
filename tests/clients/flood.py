"""Healthy clients of each protocol, first alone, then while hostile connections flood.

    flood.py --nsq H:P --beanstalk H:P --nats H:P [--seconds S] [--rounds R]

Healthy clients (one thread each, plain blocking sockets, strict request/response):
NSQ `PUB` one at a time, beanstalkd `put` + `reserve` + `delete`, NATS `PUB` + `PING`.
Each phase runs them for S seconds and counts their round trips.

The flood phase adds, per protocol, one connection that pipelines as fast as the socket
takes them cheap valid commands (NSQ `NOP`, beanstalkd `list-tube-used`, NATS `PING` and
`SUB`) mixed with bad ones that do not end the connection (empty beanstalkd lines, NATS
`SUB` with an invalid subject), reading and dropping whatever comes back, reconnecting
whenever the server closes it.

R rounds alternate the two phases. Prints one JSON line: {"calm": {protocol: round
trips}, "flood": {...}, "attack": {"bytes_sent": n, "reconnects": n}}, summed over the
rounds. The test decides whether that is fair.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def read_until(sock: socket.socket, buf: bytearray, marker: bytes) -> bytes:
    while (i := buf.find(marker)) < 0:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    line = bytes(buf[: i + len(marker)])
    del buf[: i + len(marker)]
    return line


def read_exact(sock: socket.socket, buf: bytearray, n: int) -> bytes:
    while len(buf) < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    data = bytes(buf[:n])
    del buf[:n]
    return data


# -- healthy clients: each returns its round trips until `stop` is set ----------------------


def healthy_nsq(addr: tuple[str, int], stop: threading.Event) -> int:
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"  V2")
    buf = bytearray()
    n = 0
    pub = b"PUB healthy\n" + struct.pack(">i", 16) + b"x" * 16
    while not stop.is_set():
        s.sendall(pub)
        size = struct.unpack(">i", read_exact(s, buf, 4))[0]
        frame = read_exact(s, buf, size)
        assert frame[4:] == b"OK", frame
        n += 1
    s.close()
    return n


def healthy_beanstalk(addr: tuple[str, int], stop: threading.Event) -> int:
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    s.sendall(b"use healthy\r\nwatch healthy\r\n")
    read_until(s, buf, b"\r\n")
    read_until(s, buf, b"\r\n")
    n = 0
    while not stop.is_set():
        s.sendall(b"put 0 0 60 5\r\nhello\r\n")
        assert read_until(s, buf, b"\r\n").startswith(b"INSERTED")
        s.sendall(b"reserve\r\n")
        header = read_until(s, buf, b"\r\n")
        job = header.split()[1]
        read_exact(s, buf, 7)
        s.sendall(b"delete " + job + b"\r\n")
        assert read_until(s, buf, b"\r\n") == b"DELETED\r\n"
        n += 1
    s.close()
    return n


def healthy_nats(addr: tuple[str, int], stop: threading.Event) -> int:
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    read_until(s, buf, b"\r\n")  # INFO
    s.sendall(b'CONNECT {"verbose":false}\r\n')
    n = 0
    while not stop.is_set():
        s.sendall(b"PUB healthy 5\r\nhello\r\nPING\r\n")
        assert read_until(s, buf, b"\r\n") == b"PONG\r\n"
        n += 1
    s.close()
    return n


# -- attackers ---------------------------------------------------------------------------


class Attack:
    def __init__(self) -> None:
        self.bytes_sent = 0
        self.reconnects = 0
        self.lock = threading.Lock()

    def pipeline(
        self, addr: tuple[str, int], hello: bytes, payload: bytes, stop: threading.Event
    ) -> None:
        """Send `payload` over and over on one connection (reconnecting when closed),
        reading and dropping whatever comes back on another thread."""
        while not stop.is_set():
            try:
                s = socket.create_connection(addr)
            except OSError:
                continue
            drain = threading.Thread(target=self._drain, args=(s,), daemon=True)
            drain.start()
            try:
                s.sendall(hello)
                while not stop.is_set():
                    s.sendall(payload)
                    with self.lock:
                        self.bytes_sent += len(payload)
            except OSError:
                with self.lock:
                    self.reconnects += 1
            finally:
                s.close()

    @staticmethod
    def _drain(s: socket.socket) -> None:
        try:
            while s.recv(1 << 20):
                pass
        except OSError:
            pass


def attackers(
    args: argparse.Namespace, attack: Attack, stop: threading.Event
) -> list[Callable[[], None]]:
    # one connection per protocol, mixing commands the server must reject (but that do not
    # end the connection) with cheap valid ones
    out: list[Callable[[], None]] = []
    if args.nsq:
        nsq = address(args.nsq)
        out.append(lambda: attack.pipeline(nsq, b"  V2", b"NOP\n" * 8192, stop))
    if args.beanstalk:
        bs = address(args.beanstalk)
        junk = (b"list-tube-used\r\n" + b"\r\n" * 50) * 400
        out.append(lambda: attack.pipeline(bs, b"", junk, stop))
    if args.nats:
        nats = address(args.nats)
        connect = b'CONNECT {"verbose":false}\r\n'
        cheap = (b"PING\r\nSUB a.b 1\r\n" + b"SUB a..b 2\r\n" * 50) * 200
        out.append(lambda: attack.pipeline(nats, connect, cheap, stop))
    return out


def attack_process(args: argparse.Namespace, stop: Any, out: Any) -> None:
    """The attackers, in a process of their own: in the healthy clients' process they
    would take the GIL from them, and the test would measure that instead."""
    # Lowest CPU priority: the attackers still keep every socket full (the kernel does the
    # copying; they block in sendall), but on a small machine they must not take the CPU
    # from the healthy clients, or the test would measure the client machine's scheduler
    # instead of the server's fairness.
    os.nice(19)
    attack = Attack()
    inner = threading.Event()
    threads = [threading.Thread(target=run, daemon=True) for run in attackers(args, attack, inner)]
    for t in threads:
        t.start()
    stop.wait()
    inner.set()
    out.put({"bytes_sent": attack.bytes_sent, "reconnects": attack.reconnects})


def phase(args: argparse.Namespace, flood: bool, report: dict[str, Any]) -> dict[str, int]:
    stop = threading.Event()
    attack_stop = multiprocessing.Event()
    attack_out: Any = multiprocessing.Queue()
    attacker = None
    if flood:
        attacker = multiprocessing.Process(
            target=attack_process, args=(args, attack_stop, attack_out)
        )
        attacker.start()
        time.sleep(0.5)  # let the flood reach the gateway before measuring
    results: dict[str, int] = {}

    def measure(
        name: str, fn: Callable[[tuple[str, int], threading.Event], int], addr: str
    ) -> None:
        results[name] = fn(address(addr), stop)

    clients = [("nsq", healthy_nsq, args.nsq), ("beanstalk", healthy_beanstalk, args.beanstalk),
               ("nats", healthy_nats, args.nats)]  # fmt: skip
    healthy = [threading.Thread(target=measure, args=c) for c in clients if c[2]]
    for t in healthy:
        t.start()
    time.sleep(args.seconds)  # the measured interval, not a wait for an event
    stop.set()
    for t in healthy:
        t.join(30)
    attack_stop.set()
    if attacker is not None:
        report.update(attack_out.get(timeout=30))
        attacker.join(30)
    return results


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nsq", help="host:port; a protocol without an address is left out")
    p.add_argument("--beanstalk")
    p.add_argument("--nats")
    p.add_argument("--seconds", type=float, default=2.0, help="per phase")
    p.add_argument("--rounds", type=int, default=1, help="calm + flood phases, alternating")
    args = p.parse_args()
    report: dict[str, Any] = {}
    calm: dict[str, int] = {}
    flood: dict[str, int] = {}
    # alternating phases, summed: a slow moment of the machine falls on both alike
    for _ in range(args.rounds):
        for total, flooding in ((calm, False), (flood, True)):
            for name, n in phase(args, flooding, report).items():
                total[name] = total.get(name, 0) + n
    out = {"calm": calm, "flood": flood, "attack": report}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
