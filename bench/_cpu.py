"""CPU time of a process and of its threads, from /proc (Linux), for the benches."""

from __future__ import annotations

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
