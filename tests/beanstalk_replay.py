"""Replay beanstalkd differential transcripts (docs/protocols/beanstalkd.md §14) against a live
server.

The transcripts live in ``tests/data/beanstalkd_differential_cases.json`` (tests/data/README.md;
``tests/record_beanstalk_transcripts.py`` records them again). Each case ran
against a freshly started server; its steps are replayed here the way they were recorded:

* connections (``A``, ``B``, ...) are opened lazily, on the first step that names them;
* ``send``: send the bytes exactly, then collect everything that arrives within ``wait_s``,
  stopping early once data has arrived and then nothing more for 60 ms; ``closed`` records
  whether the server closed the connection (EOF or reset) within that window;
* ``read``: the same collection without sending anything (a blocked reserve being answered);
* ``close``: close that client socket; ``sleep``: wait ``seconds``;
* ``signal_server``: deliver a signal to the server (SIGUSR1 = drain mode) through a callback.

Replies that hold time-derived numbers cannot match byte for byte, so both sides go through
:func:`mask` before they are compared.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

QUIET_S = 0.06  # stop collecting once data has arrived and then nothing for this long
BEANSTALKD = "/usr/bin/beanstalkd"
VERSIONS = ("1.12", "1.13")

Connect = Callable[[str], Awaitable[trio.abc.Stream]]
SignalServer = Callable[[str], Awaitable[None]]


# --- the transcript file ----------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    index: int
    action: str  # send | read | close | sleep | signal_server
    conn: str | None = None
    send: bytes = b""
    wait_s: float = 0.0
    seconds: float = 0.0
    signal: str | None = None
    reply: dict[str, bytes] = field(default_factory=dict)  # version -> recorded bytes
    closed: dict[str, bool] = field(default_factory=dict)  # version -> recorded close

    @property
    def reads(self) -> bool:
        return self.action in ("send", "read")


@dataclass(frozen=True)
class Case:
    name: str
    server_args: tuple[str, ...]
    steps: tuple[Step, ...]

    def recorded(self, version: str) -> list[StepResult]:
        """What the recorded server `version` did, in the shape replay_case returns."""
        return [
            StepResult(
                s.index,
                s.action,
                s.conn,
                s.reply[version] if s.reads else None,
                s.closed[version] if s.reads else None,
            )
            for s in self.steps
        ]

    def differing_steps(self) -> list[int]:
        """Indexes of the steps where the recorded 1.12 and 1.13 replies differ after masking
        and YAML unquoting, i.e. real behaviour differences (not only quoting)."""
        a, b = self.recorded("1.12"), self.recorded("1.13")
        return [x.index for x, y in zip(a, b, strict=True) if normalize(x) != normalize(y)]

    def quoting_steps(self) -> list[int]:
        """Indexes of the steps whose recorded replies differ only in YAML quoting."""
        a, b = self.recorded("1.12"), self.recorded("1.13")
        return [
            x.index for x, y in zip(a, b, strict=True) if x != y and normalize(x) == normalize(y)
        ]


def _bytes(text: str) -> bytes:
    return text.encode("latin-1")  # the file stores bytes as code points 0-255


def parse_case(raw: dict[str, Any]) -> Case:
    steps = []
    for i, s in enumerate(raw["steps"]):
        steps.append(
            Step(
                index=i,
                action=s["action"],
                conn=s.get("conn"),
                send=_bytes(s.get("send", "")),
                wait_s=float(s.get("wait_s", 0.0)),
                seconds=float(s.get("seconds", 0.0)),
                signal=s.get("signal"),
                reply={v: _bytes(r) for v, r in s.get("reply", {}).items()},
                closed=dict(s.get("closed", {})),
            )
        )
    return Case(raw["name"], tuple(raw.get("server_args", ())), tuple(steps))


def load_cases(path: Path) -> list[Case]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [parse_case(c) for c in data["cases"]]


def parse_server_args(args: Sequence[str]) -> dict[str, int]:
    """beanstalkd flags used by the cases, as settings: only ``-z N`` (max job size) so far."""
    out: dict[str, int] = {}
    it = iter(args)
    for arg in it:
        if arg == "-z":
            out["max_job_size"] = int(next(it))
        elif arg.startswith("-z"):
            out["max_job_size"] = int(arg[2:])
        else:
            raise ValueError(f"server argument {arg!r} has no mapping yet")
    return out


# --- replay -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    index: int
    action: str
    conn: str | None
    reply: bytes | None  # None for steps that read nothing (close, sleep, signal_server)
    closed: bool | None


@dataclass
class _Conn:
    stream: trio.abc.Stream
    eof: bool = False


async def _collect(conn: _Conn, wait_s: float) -> tuple[bytes, bool]:
    """Everything that arrives within wait_s (early stop after QUIET_S of silence once data
    arrived), and whether the peer closed the connection."""
    data = bytearray()
    if conn.eof:
        return b"", True
    deadline = trio.current_time() + wait_s
    while True:
        limit = deadline if not data else min(deadline, trio.current_time() + QUIET_S)
        with trio.move_on_at(limit) as scope:
            try:
                chunk = await conn.stream.receive_some(65536)
            except trio.BrokenResourceError:  # reset by the peer
                chunk = b""
        if scope.cancelled_caught:
            return bytes(data), False
        if not chunk:
            conn.eof = True
            return bytes(data), True
        data += chunk


async def replay_case(
    case: Case, connect: Connect, signal_server: SignalServer | None = None
) -> list[StepResult]:
    """Run every step of `case` against the server that `connect` reaches."""
    conns: dict[str, _Conn] = {}
    results: list[StepResult] = []

    async def conn_named(name: str) -> _Conn:
        if name not in conns:
            conns[name] = _Conn(await connect(name))
        return conns[name]

    try:
        for step in case.steps:
            reply: bytes | None = None
            closed: bool | None = None
            if step.action in ("send", "read"):
                assert step.conn is not None, step
                conn = await conn_named(step.conn)
                if step.action == "send" and not conn.eof:
                    try:
                        await conn.stream.send_all(step.send)
                    except trio.BrokenResourceError:
                        conn.eof = True
                reply, closed = await _collect(conn, step.wait_s)
            elif step.action == "close":
                assert step.conn is not None, step
                await (await conn_named(step.conn)).stream.aclose()
                del conns[step.conn]
            elif step.action == "sleep":
                await trio.sleep(step.seconds)
            elif step.action == "signal_server":
                if signal_server is None:
                    raise RuntimeError(f"{case.name}: step {step.index} needs a signal handler")
                await signal_server(step.signal or "")
            else:
                raise ValueError(f"{case.name}: step {step.index}: unknown action {step.action!r}")
            results.append(StepResult(step.index, step.action, step.conn, reply, closed))
    finally:
        for c in conns.values():
            await c.stream.aclose()
    return results


# --- masking ----------------------------------------------------------------------------------

_TIME_FIELD = re.compile(rb"^(age|time-left|pause-time-left): \d+$", re.M)
# Only in a server-wide `stats` body (recognised by its `uptime:` key; stats-job has `id:` too).
_SERVER_FIELD = re.compile(
    rb'^(pid|uptime|rusage-utime|rusage-stime|id|hostname|os|platform): ("?)[^\n]*?\2$', re.M
)
_QUOTED_FIELD = re.compile(rb'^(tube|name|hostname|os|platform): "([^"\n]*)"$', re.M)
_DATA_HEADER = re.compile(rb"^(OK|RESERVED \d+|FOUND \d+) (\d+)$")


def _mask_body(body: bytes) -> bytes:
    body = _TIME_FIELD.sub(rb"\1: #", body)
    if b"\nuptime: " in body:
        body = _SERVER_FIELD.sub(rb"\1: \2#\2", body)
    return body


def _unquote_body(body: bytes) -> bytes:
    return _QUOTED_FIELD.sub(rb"\1: \2", body)


def _map_ok_bodies(reply: bytes, fn: Callable[[bytes], bytes], *, mask_length: bool) -> bytes:
    """Apply fn to the data block of every `OK <n>` reply in a run of replies. When fn changes a
    block, its header's length becomes `#` (mask_length) or the new length. RESERVED/FOUND data
    blocks are copied as they are (a job body may look like anything)."""
    out = bytearray()
    pos = 0
    while pos < len(reply):
        eol = reply.find(b"\r\n", pos)
        if eol < 0:
            out += reply[pos:]
            break
        line = reply[pos:eol]
        m = _DATA_HEADER.match(line)
        if m is None:
            out += reply[pos : eol + 2]
            pos = eol + 2
            continue
        start = eol + 2
        end = min(start + int(m[2]), len(reply))
        body = reply[start:end]
        if m[1] == b"OK":
            new = fn(body)
            if new != body:
                line = b"OK " + (b"#" if mask_length else str(len(new)).encode())
            body = new
        out += line + b"\r\n" + body
        pos = end
    return bytes(out)


def mask(reply: bytes) -> bytes:
    """Replace time-derived numbers (`age`, `time-left`, `pause-time-left`) with `#`, and with
    them the `OK <n>` length of the reply that holds them. In a full `stats` reply, the
    per-process fields (pid, uptime, rusage-*, id, hostname, os, platform) are masked too."""
    return _map_ok_bodies(reply, _mask_body, mask_length=True)


def unquote(reply: bytes) -> bytes:
    """1.13's quoted YAML strings (tube, name, hostname, os, platform) in 1.12's unquoted style,
    with the `OK <n>` length adjusted. Apply it before mask()."""
    return _map_ok_bodies(reply, _unquote_body, mask_length=False)


def normalize(result: StepResult) -> StepResult:
    """Masked and unquoted: what is left is behaviour, not timing or YAML style."""
    if result.reply is None:
        return result
    return StepResult(
        result.index, result.action, result.conn, mask(unquote(result.reply)), result.closed
    )


def masked(result: StepResult) -> StepResult:
    if result.reply is None:
        return result
    return StepResult(result.index, result.action, result.conn, mask(result.reply), result.closed)


# --- comparison -------------------------------------------------------------------------------


def _show(data: bytes | None, limit: int = 400) -> str:
    if data is None:
        return "-"
    text = repr(data)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(data)} bytes)"


def differences(
    case: Case,
    expected: Sequence[StepResult],
    actual: Sequence[StepResult],
    *,
    steps: Sequence[int] | None = None,
    labels: tuple[str, str] = ("expected", "got"),
) -> list[str]:
    """One readable paragraph per step whose reply or close flag differs (exact bytes)."""
    wanted = set(range(len(case.steps))) if steps is None else set(steps)
    out = []
    if len(actual) != len(expected):
        out.append(f"{len(actual)} step results for {len(expected)} steps")
    for exp, got in zip(expected, actual, strict=False):
        if exp.index not in wanted or (exp.reply, exp.closed) == (got.reply, got.closed):
            continue
        step = case.steps[exp.index]
        sent = _show(step.send) if step.action == "send" else f"({step.action})"
        out.append(
            f"step {exp.index} (row {exp.index + 1}) conn {step.conn} sends {sent}\n"
            f"    {labels[0]}: {_show(exp.reply)} closed={exp.closed}\n"
            f"    {labels[1]}: {_show(got.reply)} closed={got.closed}"
        )
    return out


# --- servers ----------------------------------------------------------------------------------


@dataclass
class Target:
    """A server under test: how to open a client connection and how to signal it."""

    connect: Connect
    signal_server: SignalServer | None = None


ServerFactory = Callable[[Case], AbstractAsyncContextManager[Target]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _wait_accepting(proc: trio.Process, port: int, timeout: float = 5.0) -> bool:
    """True once the port accepts a connection; False if the process exited first."""
    with trio.fail_after(timeout):
        while proc.poll() is None:
            try:
                probe = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.01)
                continue
            await probe.aclose()
            # Let the server see the probe's EOF before the case opens its own connections,
            # so that per-tube connection counts are those of the case alone.
            await trio.sleep(0.05)
            return proc.poll() is None
    return False


@asynccontextmanager
async def beanstalkd(
    server_args: Sequence[str], binary: str = BEANSTALKD
) -> AsyncIterator[tuple[trio.Process, int]]:
    """A fresh beanstalkd on 127.0.0.1:<free port>; killed on exit."""
    for _attempt in range(5):
        port = free_port()
        proc = await trio.lowlevel.open_process(
            [binary, "-l", "127.0.0.1", "-p", str(port), *server_args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            if await _wait_accepting(proc, port):
                yield proc, port
                return
        finally:
            if proc.poll() is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
        # exited early: most likely the port was taken between free_port() and bind; retry
    raise RuntimeError(f"{binary} {' '.join(server_args)} did not start")


@asynccontextmanager
async def beanstalkd_target(case: Case) -> AsyncIterator[Target]:
    async with beanstalkd(case.server_args) as (proc, port):

        async def connect(name: str) -> trio.abc.Stream:
            return await trio.open_tcp_stream("127.0.0.1", port)

        async def signal_server(name: str) -> None:
            proc.send_signal(getattr(signal, name))

        yield Target(connect, signal_server)


# --- running many cases at once ---------------------------------------------------------------


@dataclass
class CaseRun:
    results: list[StepResult] | None = None
    error: str | None = None
    elapsed: float = 0.0
    attempts: int = 1


Accept = Callable[[Case, list[StepResult]], bool]


async def run_case(
    case: Case, factory: ServerFactory, *, attempts: int = 1, accept: Accept | None = None
) -> CaseRun:
    """Replay `case` on a fresh server from `factory`. With `accept`, a result it rejects is
    replayed again on another fresh server, up to `attempts` runs in all (for server races)."""
    start = trio.current_time()
    run = CaseRun()
    for attempt in range(1, attempts + 1):
        run = CaseRun(attempts=attempt)
        try:
            async with factory(case) as target:
                run.results = await replay_case(case, target.connect, target.signal_server)
        except Exception as exc:  # reported by the test of that case
            run.error = "".join(traceback.format_exception(exc))
        if run.results is not None and (accept is None or accept(case, run.results)):
            break
    run.elapsed = trio.current_time() - start
    return run


async def run_cases(
    cases: Sequence[Case],
    factory: ServerFactory,
    *,
    concurrency: int = 12,
    attempts: Callable[[Case], int] = lambda case: 1,
    accept: Accept | None = None,
) -> dict[str, CaseRun]:
    """Each case against its own fresh server, up to `concurrency` cases at a time."""
    limiter = trio.CapacityLimiter(concurrency)
    runs: dict[str, CaseRun] = {}

    async def one(case: Case) -> None:
        async with limiter:
            runs[case.name] = await run_case(case, factory, attempts=attempts(case), accept=accept)

    async with trio.open_nursery() as nursery:
        for case in cases:
            nursery.start_soon(one, case)
    return runs
