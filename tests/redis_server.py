"""A real redis-server (Debian's) for the tests: started on a free loopback port in a
temporary directory, killable and restartable on the same port and data."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path, *, aof: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.aof = aof
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--protected-mode",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        args += list(self.extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.cli("PING").strip() == "PONG":
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start: {self.log()}")

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [REDIS_CLI, "-p", str(self.port), *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class RedisCluster:
    """Three masters on loopback, joined by `redis-cli --cluster create`."""

    def __init__(
        self,
        directory: Path,
        masters: int = 3,
        extra: Callable[[int], tuple[str, ...]] = lambda i: (),
    ) -> None:
        # the bus port is the client port + 10000 unless named: past 55535 that is no port
        self.nodes = [
            RedisServer(
                directory / f"node{i}",
                extra=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    str(free_port()),
                    *extra(i),  # node i's own options (its TLS port)
                ),
            )
            for i in range(masters)
        ]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        done = subprocess.run(
            [
                REDIS_CLI,
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in self.nodes):
                return self
            time.sleep(0.05)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")

    def node_id(self, node: RedisServer) -> str:
        return node.cli("CLUSTER", "MYID").strip()

    def owner(self, slot: int) -> RedisServer:
        """The master serving `slot`, by its own account."""
        for node in self.nodes:
            mine = next(ln for ln in node.cli("CLUSTER", "NODES").splitlines() if "myself" in ln)
            for part in mine.split()[8:]:
                lo, _, hi = part.partition("-")
                if not part.startswith("[") and int(lo) <= slot <= int(hi or lo):
                    return node
        raise AssertionError(f"no master serves slot {slot}")

    def move_slot(self, slot: int, to: RedisServer) -> None:
        """Migrate `slot` with its keys to `to`, as `redis-cli --cluster reshard` does:
        IMPORTING, MIGRATING, MIGRATE the keys, then the new owner on every master."""
        source = self.owner(slot)
        src_id, dst_id = self.node_id(source), self.node_id(to)
        assert to.cli("CLUSTER", "SETSLOT", str(slot), "IMPORTING", src_id).strip() == "OK"
        assert source.cli("CLUSTER", "SETSLOT", str(slot), "MIGRATING", dst_id).strip() == "OK"
        while keys := source.cli("CLUSTER", "GETKEYSINSLOT", str(slot), "100").split():
            moved = source.cli("MIGRATE", "127.0.0.1", str(to.port), "", "0", "5000", "KEYS", *keys)
            assert moved.strip() == "OK", moved
        for node in self.nodes:
            assert node.cli("CLUSTER", "SETSLOT", str(slot), "NODE", dst_id).strip() == "OK"

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
