"""Record the beanstalkd differential transcripts again, against a real beanstalkd.

Every case of ``tests/data/beanstalkd_differential_cases.json`` is replayed step by step
(``tests.beanstalk_replay.replay_case``: the same waits and the same close detection as the
tests) and the replies of that server's version are written back into the file: the reply
and close flag of every ``send`` and ``read`` step, under the version the server reports in
``stats`` (``1.12`` for Debian's package, ``1.13`` for the upstream tag). The other version's
column and the sent bytes stay as they are.

Two ways to reach a server:

* default: start a fresh ``beanstalkd`` for each case (``--beanstalkd-bin``, by default the
  one on PATH) on a free port of 127.0.0.1, with the case's ``server_args``. This is how the
  file was made; every case expects a fresh server (job ids from 1, only ``default``).
* ``--beanstalkd HOST:PORT --case NAME``: one case against a server you started yourself,
  freshly, with that case's flags. Cases that signal the server (``drain_mode``) need the
  first way.

Run it from the repository root::

    python -m tests.record_beanstalk_transcripts                 # all cases, beanstalkd on PATH
    python -m tests.record_beanstalk_transcripts --case pause_tube --dry-run

After a run, check ``git diff tests/data/``: replies with ``age``/``time-left`` figures move
with timing, and ``deadline_soon_and_timeout`` loses a race in beanstalkd about one run in six
(tests/integration/test_beanstalk_differential.py); record such a case again with ``--case``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.beanstalk_replay import (
    Case,
    Connect,
    StepResult,
    Target,
    beanstalkd,
    differences,
    masked,
    parse_case,
    replay_case,
)

CASES_FILE = Path(__file__).resolve().parent / "data" / "beanstalkd_differential_cases.json"
_VERSION = re.compile(rb'^version: "?([^"\n]+)"?$', re.M)

TargetFactory = Callable[[Case], AbstractAsyncContextManager[Target]]


async def server_version(connect: Connect) -> str:
    """The `version` a beanstalkd reports in `stats`, on a connection of its own."""
    stream = await connect("version")
    try:
        await stream.send_all(b"stats\r\n")
        data = b""
        with trio.fail_after(5):
            while not (m := _VERSION.search(data)):
                chunk = await stream.receive_some(65536)
                if not chunk:
                    raise RuntimeError(f"no version in the stats reply {data!r}")
                data += chunk
        return m[1].decode("ascii")
    finally:
        await stream.aclose()


def spawned(binary: str) -> TargetFactory:
    """Each case on a fresh `binary` started with the case's flags."""

    @asynccontextmanager
    async def factory(case: Case) -> AsyncIterator[Target]:
        async with beanstalkd(case.server_args, binary) as (proc, port):

            async def connect(name: str) -> trio.abc.Stream:
                return await trio.open_tcp_stream("127.0.0.1", port)

            async def signal_server(name: str) -> None:
                proc.send_signal(getattr(signal, name))

            yield Target(connect, signal_server)

    return factory


def external(host: str, port: int) -> TargetFactory:
    """The server at host:port, which cannot be signalled from here."""

    @asynccontextmanager
    async def factory(case: Case) -> AsyncIterator[Target]:
        async def connect(name: str) -> trio.abc.Stream:
            return await trio.open_tcp_stream(host, port)

        yield Target(connect)

    return factory


async def record(case: Case, factory: TargetFactory) -> tuple[str, list[StepResult]]:
    """Replay `case`, then ask the same server its version (after the case, so that the extra
    connection changes nothing the case sees)."""
    async with factory(case) as target:
        results = await replay_case(case, target.connect, target.signal_server)
        return await server_version(target.connect), results


def rewrite(raw: dict[str, Any], version: str, results: list[StepResult]) -> None:
    """Store `results` as the replies of `version` in the raw JSON case."""
    for step, result in zip(raw["steps"], results, strict=True):
        if result.reply is None:
            continue
        step.setdefault("reply", {})[version] = result.reply.decode("latin-1")
        step.setdefault("closed", {})[version] = result.closed


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Record the beanstalkd differential transcripts again (tests/data/README.md)."
    )
    ap.add_argument("--beanstalkd", metavar="HOST:PORT", help="a running, fresh beanstalkd")
    ap.add_argument(
        "--beanstalkd-bin",
        default=shutil.which("beanstalkd"),
        help="the beanstalkd to start for each case (default: the one on PATH)",
    )
    ap.add_argument("--case", action="append", default=[], help="only this case (repeatable)")
    ap.add_argument("--file", type=Path, default=CASES_FILE, help="the transcripts file")
    ap.add_argument("--dry-run", action="store_true", help="show the changes, write nothing")
    args = ap.parse_args(argv)

    data = json.loads(args.file.read_text(encoding="utf-8"))
    raw_cases = {c["name"]: c for c in data["cases"]}
    unknown = [name for name in args.case if name not in raw_cases]
    if unknown:
        ap.error(f"unknown case(s): {', '.join(unknown)}")
    names = args.case or list(raw_cases)

    if args.beanstalkd:
        host, _, port = args.beanstalkd.rpartition(":")
        if not host or not port.isdigit():
            ap.error("--beanstalkd takes HOST:PORT")
        if len(names) != 1:
            ap.error("--beanstalkd records one case (--case NAME) on a freshly started server")
        factory = external(host, int(port))
    elif args.beanstalkd_bin:
        factory = spawned(args.beanstalkd_bin)
    else:
        ap.error("no beanstalkd on PATH: give --beanstalkd-bin PATH or --beanstalkd HOST:PORT")

    failed = 0
    for name in names:
        case = parse_case(raw_cases[name])
        try:
            version, results = await record(case, factory)
        except Exception as exc:
            print(f"{name}: FAILED: {exc!r}", file=sys.stderr)
            failed += 1
            continue
        if version in data["servers"]:
            diffs = differences(
                case,
                [masked(r) for r in case.recorded(version)],
                [masked(r) for r in results],
                labels=("recorded", "now"),
            )
        else:
            data["servers"][version] = f"beanstalkd {version}"
            diffs = ["a version the file did not have yet"]
        print(f"{name}: beanstalkd {version}, {len(diffs)} step(s) changed beyond timing")
        for diff in diffs:
            print("  " + diff.replace("\n", "\n  "))
        rewrite(raw_cases[name], version, results)

    if not args.dry_run:
        args.file.write_text(json.dumps(data, indent=1), encoding="utf-8")
        print(f"wrote {args.file}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
