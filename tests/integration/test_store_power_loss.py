"""A power cut, simulated: what an fsync put on disk survives, nothing after it.

The gateway runs as a real process with `--log-level debug`, which logs every fsync of its
store's log with the position it covers and when it started. Publishers PUB without pause
over several connections, noting when each OK arrived; the gateway is killed (SIGKILL),
and the log is cut back to the last fsynced position (later segments deleted), which is
what a power cut leaves of writes that were only in the page cache (two rounds per policy,
each its own kill point): zeros where the segment's blocks were allocated ahead, a
shorter file where they were not. The index (SQLite) is
left as the kill left it: it may hold more than the cut log, which the restart must
accept. Then the gateway restarts and the channel is drained:

* with `fsync = "always"`, every acknowledged message is there (an OK waits for the fsync
  that covers it);
* with the interval policy, a message missing was acknowledged after the last fsync
  started (it may have been written after it);
* either way nothing is there twice, nothing that was not published, and the gateway
  starts cleanly every time.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from tests.helpers import MAGIC, RawNSQ, be32, parse_message, written_end

REPO = Path(__file__).resolve().parents[2]
FSYNCED = re.compile(rb"store log fsynced: segment (\d+) offset (\d+) \(started at ([\d.]+)\)")


class Gateway:
    """`gateway serve` on a data dir, its stderr read as it comes."""

    def __init__(self, data_dir: Path, fsync: str) -> None:
        self.data_dir = data_dir
        self.fsync = fsync
        self.err = b""
        self.nsq = ""
        self.proc: trio.Process | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        self.err = b""
        self.proc = await trio.lowlevel.open_process(
            [
                *(sys.executable, "-m", "gateway", "serve", "--data-dir", str(self.data_dir)),
                *("--nsq", "127.0.0.1:0", "--http", "off", "--beanstalk", "off"),
                *("--nats", "off", "--nats-route", "off", "--rocketmq", "off"),
                *("--log-level", "debug"),
            ],
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "GATEWAY_STORAGE__FSYNC": self.fsync},
        )
        ready = trio.Event()
        nursery.start_soon(self._read, ready)
        with trio.fail_after(20):
            await ready.wait()
        assert self.proc.returncode is None, self.err.decode(errors="replace")
        found = re.search(rb"listening protocol=nsq address=(\S+)", self.err)
        assert found, self.err.decode(errors="replace")
        self.nsq = found.group(1).decode()

    async def _read(self, ready: trio.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for chunk in self.proc.stderr:
            self.err += chunk
            if b" ready: " in self.err:
                ready.set()
        ready.set()  # exited before ready: start() says why

    async def connect(self) -> RawNSQ:
        host, port = self.nsq.rsplit(":", 1)
        conn = RawNSQ(await trio.open_tcp_stream(host, int(port)))
        await conn.send(MAGIC)
        return conn

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    def reap(self) -> None:
        """A failed test leaves no gateway behind."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()

    async def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            assert await self.proc.wait() == 0, self.err.decode(errors="replace")


def cut_to_last_fsync(err: bytes, log_dir: Path) -> float:
    """Cut the log back to the last fsynced position in `err`; returns when that fsync
    started (wall clock; 0 when there was none)."""
    synced = FSYNCED.findall(err)
    segment, offset, started = (
        (int(synced[-1][0]), int(synced[-1][1]), float(synced[-1][2])) if synced else (0, 0, 0.0)
    )
    for path in sorted(log_dir.iterdir()):
        number = int(path.name.split(".")[0])
        if number > segment:
            path.unlink()
        elif number == segment and (end := written_end(path)) > offset:
            with open(path, "r+b") as f:
                if path.stat().st_size > end:
                    # its blocks were allocated ahead: a power cut leaves the file's
                    # length, and what was never fsynced reads as zeros
                    f.seek(offset)
                    f.write(bytes(end - offset))
                else:
                    f.truncate(offset)
    return started


async def publisher(
    gw: Gateway, name: str, sent: set[bytes], acked: dict[bytes, float], stop: trio.Event
) -> None:
    conn = await gw.connect()
    i = 0
    try:
        while not stop.is_set():
            body = b"%s-%06d" % (name.encode(), i)
            sent.add(body)
            await conn.send(b"PUB t\n" + be32(len(body)) + body)
            assert await conn.frame() == (0, b"OK")
            acked[body] = time.time()
            i += 1
    except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError, AssertionError):
        pass  # killed under it


async def drain(gw: Gateway) -> list[bytes]:
    conn = await gw.connect()
    await conn.send(b"SUB t c\nRDY 2500\n")
    assert await conn.frame() == (0, b"OK")
    got = []
    while True:
        # drained once nothing more comes for a second (a bound on the quiet, not on the
        # whole drain: a loaded machine may take longer than that to deliver them all)
        with trio.move_on_after(1.0) as quiet:
            _, data = await conn.frame(timeout=10)
        if quiet.cancelled_caught:
            break
        _, _, msg_id, body = parse_message(data)
        got.append(body)
        await conn.send(b"FIN " + msg_id + b"\n")
    await conn.aclose()
    return got


@pytest.mark.parametrize("fsync", ["always", "50"])
async def test_a_power_cut_keeps_what_the_policy_promises(tmp_path: Path, fsync: str) -> None:
    rng = random.Random()
    data_dir = tmp_path / "data"
    log_dir = data_dir / "gateway.db-log"
    gw = Gateway(data_dir, fsync)
    sent: set[bytes] = set()  # a publish killed before its OK may be kept too
    cut_anything = False
    try:
        async with trio.open_nursery() as nursery:
            for round_ in range(2):
                await gw.start(nursery)
                consumer = await gw.connect()  # the channel, before anything is published
                await consumer.send(b"SUB t c\n")
                assert await consumer.frame() == (0, b"OK")
                acked: dict[bytes, float] = {}
                stop = trio.Event()
                async with trio.open_nursery() as publishers:
                    for k in range(4):
                        publishers.start_soon(publisher, gw, f"r{round_}p{k}", sent, acked, stop)
                    want = rng.randrange(200, 800)
                    with trio.fail_after(30):
                        while len(acked) < want:
                            await trio.sleep(0.01)
                    await gw.kill()
                    stop.set()
                await consumer.aclose()
                size_before = sum(written_end(p) for p in log_dir.iterdir())
                started = cut_to_last_fsync(gw.err, log_dir)
                cut_anything |= sum(written_end(p) for p in log_dir.iterdir()) < size_before

                await gw.start(nursery)
                got = await drain(gw)
                assert len(got) == len(set(got)), "a message came back twice"
                assert set(got) <= sent, "a message nobody published"
                missing = {body: at for body, at in acked.items() if body not in set(got)}
                if fsync == "always":
                    assert not missing, f"round {round_}: {len(missing)} acknowledged lost"
                else:
                    early = [body for body, at in missing.items() if at < started]
                    assert not early, (
                        f"round {round_}: {len(early)} acknowledged before the last fsync lost"
                    )
                await gw.stop()
    finally:
        gw.reap()
    # the cut was real at least once (the publishers keep the log ahead of its fsyncs)
    assert cut_anything or fsync == "always"
