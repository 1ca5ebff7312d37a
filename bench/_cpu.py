"""CPU time of a process and of its threads, from /proc (Linux), and a cap on a process's
CPU (cgroups), for the benches."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User+system CPU seconds of a process (all its threads), from /proc; None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces: the fields start after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User+system CPU seconds of each thread of a process, by thread id, from /proc."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return out


def wait_cpu_quiet(pid: int, quiet: float = 0.2, limit: float = 10.0) -> None:
    """Return once a process has used no CPU for `quiet` seconds (its background threads
    have caught up), or after `limit` seconds."""
    deadline = time.monotonic() + limit
    last = process_cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = process_cpu_seconds(pid)
        if now == last:
            return
        last = now


class CpuCap:
    """Hold processes to a fixed share of one CPU each, through a cgroup of their own (v2
    `cpu.max`, or v1 `cpu.cfs_quota_us`): a server that stands for one small machine of
    its own, so that on a machine with few cores it, not its clients, is the limit.
    Needs root and a cgroup file system with the cpu controller; `CpuCap.problem()` says
    why not when it cannot be had. The groups go with `close()`."""

    PERIOD_US = 100_000

    def __init__(self, share: float) -> None:
        self.share = share
        self._groups: list[Path] = []

    @staticmethod
    def _root() -> tuple[Path, int] | None:
        v2 = Path("/sys/fs/cgroup")
        if "cpu" in _read(v2 / "cgroup.controllers").split():
            return v2, 2
        v1 = v2 / "cpu"
        if (v1 / "cpu.cfs_quota_us").exists():
            return v1, 1
        return None

    @classmethod
    def problem(cls) -> str | None:
        """Why processes cannot be capped here, or None."""
        if cls._root() is None:
            return "no cgroup file system with the cpu controller"
        if os.geteuid() != 0:
            return "capping a process's CPU needs root"
        return None

    def add(self, pid: int) -> None:
        """Cap `pid` (and the threads it has) to `share` of one CPU, in a group of its own."""
        found = self._root()
        assert found is not None, self.problem()
        root, version = found
        group = root / f"gateway-bench-{os.getpid()}-{pid}"
        group.mkdir(exist_ok=True)
        self._groups.append(group)
        quota = max(1000, int(self.share * self.PERIOD_US))
        if version == 2:
            subtree = root / "cgroup.subtree_control"
            if "cpu" not in _read(subtree).split():
                subtree.write_text("+cpu")
            (group / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        """Remove the groups (their processes must have exited, or they are moved back)."""
        for group in self._groups:
            with contextlib.suppress(OSError):
                for pid in _read(group / "cgroup.procs").split():
                    (group.parent / "cgroup.procs").write_text(pid)
                group.rmdir()
        self._groups = []


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
