"""greenstalk 2.1.1 as a beanstalkd peer. Each subcommand runs one scenario against
``--host``/``--port`` and prints one JSON line on stdout with what it observed; the test
decides whether that is right. Every client operation the scenario makes is recorded as
``[step, outcome]`` where outcome is the returned value (a job is ``[id, body_hex]``) or
``"!ErrorClassName"``, so a failure names the exact step.

Subcommands (all take ``--tube``):

* ``priorities --count N --seed S``: put N jobs with mixed priorities, then reserve+delete
  them all with ``reserve-with-timeout 0``; prints ``puts`` ([id, pri]) and ``reserved`` (ids
  in reserve order).
* ``delay``: a delay-1 job next to a ready one; prints the steps and the seconds from the
  put to the moment the delayed job was reserved.
* ``ttr``: a ttr-1 job reserved by connection A and never deleted; B waits in ``reserve`` and
  gets it back; prints the steps, ``stats-job`` and the seconds it took
  (``--holder-keepalive``: see ``wait_holding``).
* ``bury``: reserve, bury, kick, kick-job and the counters in ``stats-job``/``stats-tube``.
* ``touch --ttr T --touch-after S``: A reserves a ttr-T job and touches it after S seconds;
  B waits in ``reserve``; prints when B got it (seconds after the touch).
* ``produce --count N --stops K``: N jobs (unique bodies, binary), then K stop jobs (body
  ``STOP``) at the same priority; prints ``jobs`` ([id, body_hex]) and the ``stops`` ids.
* ``work``: reserve+delete until a ``STOP`` job; prints ``deliveries`` ([id, body_hex]).
* ``put --bodies FILE [--pri P ...]``: put each body of a corpus file (see ../corpus.py);
  priorities cycle through ``--pri``; prints ``ids``. This client uses the tube but does not
  watch it (it is no worker of the tube).
* ``reserve --count N [--timeout S]``: reserve+delete N jobs (``reserve-with-timeout S``);
  prints ``jobs`` ([id, body_hex]), ``reserved_at`` (wall clock of each reserve) and
  ``timed_out`` (a TIMED_OUT stops the run).
* ``binary --bodies FILE``: put every body, peek each by id, then reserve+delete them all;
  prints ids, peeked and reserved bodies (hex).
* ``stats-tube``: prints ``stats`` (greenstalk's parse of ``stats-tube``, or
  ``"!NotFoundError"``) from a fresh connection that neither uses nor watches the tube.

Bodies are bytes (``encoding=None``) everywhere.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import greenstalk

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import corpus

Steps = list[list[Any]]
STOP = b"STOP"


def connect(args: argparse.Namespace, *, watch: bool = True) -> greenstalk.Client[bytes]:
    """A client that uses the tube and, unless `watch` is false, watches only it."""
    return greenstalk.Client(
        (args.host, args.port),
        encoding=None,
        use=args.tube,
        watch=args.tube if watch else "default",
    )


def outcome(value: Any) -> Any:
    if isinstance(value, greenstalk.Job):
        return [value.id, value.body.hex()]
    if isinstance(value, dict):
        return {k: outcome(v) for k, v in value.items()}
    return value


def step(steps: Steps, name: str, call: Callable[[], Any]) -> Any:
    """Run one client call and record what came back (or which error it raised)."""
    try:
        value = call()
    except greenstalk.Error as exc:
        steps.append([name, "!" + type(exc).__name__])
        return None
    steps.append([name, outcome(value)])
    return value


def wait_holding(
    args: argparse.Namespace, holder: greenstalk.Client[bytes], job_id: int, wait: Callable[[], Any]
) -> None:
    """Run `wait` (another connection blocked in reserve) while `holder` keeps the job reserved.

    With ``--holder-keepalive S`` the holder sends ``stats-job`` every S seconds meanwhile.
    That works around a beanstalkd 1.12/1.13 bug: a connection's timer can fire in the same
    microsecond as its job's deadline, ``conn_timeout`` then finds the job not yet expired
    (``deadline_at >= now``) and never reschedules the connection, so the job stays reserved
    (negative time-left) until the holder sends another command. The tests pass it only for
    the real beanstalkd; the gateway must expire the job with an idle holder.
    """
    if args.holder_keepalive <= 0:
        wait()
        return
    waiter = threading.Thread(target=wait)
    waiter.start()
    while waiter.is_alive():
        holder.stats_job(job_id)
        waiter.join(args.holder_keepalive)


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# -- scenarios -------------------------------------------------------------------------


def priorities(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    levels = [0, 1, 1023, 1024, 65536, 2**31, 2**32 - 1]
    puts: list[list[int]] = []
    reserved: list[int] = []
    with connect(args) as c:
        for i in range(args.count):
            pri = rng.choice(levels) if i % 2 else rng.randrange(2**32)
            puts.append([c.put(b"%d" % i, priority=pri), pri])
        steps: Steps = []
        while True:
            job = step(steps, "reserve-with-timeout 0", lambda: c.reserve(timeout=0))
            if job is None:
                break
            reserved.append(job.id)
            c.delete(job)
        return {"puts": puts, "reserved": reserved, "last": steps[-1]}


def delay(args: argparse.Namespace) -> dict[str, Any]:
    steps: Steps = []
    with connect(args) as c:
        t0 = time.monotonic()
        delayed = c.put(b"later", priority=0, delay=1)
        ready = c.put(b"now", priority=100)
        step(steps, "stats-job delayed.state", lambda: c.stats_job(delayed)["state"])
        step(steps, "peek-delayed", lambda: c.peek_delayed().id)
        step(steps, "reserve-with-timeout 0 #1", lambda: c.reserve(timeout=0))
        step(steps, "delete ready", lambda: c.delete(ready))
        step(steps, "reserve-with-timeout 0 #2", lambda: c.reserve(timeout=0))
        before = time.monotonic() - t0
        job = step(steps, "reserve-with-timeout 5", lambda: c.reserve(timeout=5))
        waited = time.monotonic() - t0
        step(steps, "stats-job delayed.state", lambda: c.stats_job(delayed)["state"])
        if job is not None:
            step(steps, "delete delayed", lambda: c.delete(job))
    return {
        "delayed": delayed,
        "ready": ready,
        "steps": steps,
        "checked_before": before,
        "reserved_after": waited,
    }


def ttr(args: argparse.Namespace) -> dict[str, Any]:
    steps: Steps = []
    with connect(args) as a, connect(args) as b:
        job_id = a.put(b"slow", ttr=1)
        t0 = time.monotonic()
        step(steps, "A reserve", lambda: a.reserve(timeout=0))
        step(steps, "A stats-job.state", lambda: a.stats_job(job_id)["state"])
        # ttr 1: the safety margin starts at once, a second reserve is refused
        step(steps, "A reserve-with-timeout 0 again", lambda: a.reserve(timeout=0))
        wait_holding(
            args,
            a,
            job_id,
            lambda: step(steps, "B reserve-with-timeout 5", lambda: b.reserve(timeout=5)),
        )
        back_after = time.monotonic() - t0
        stats = step(steps, "B stats-job", lambda: b.stats_job(job_id))
        step(steps, "A delete", lambda: a.delete(job_id))
        step(steps, "B delete", lambda: b.delete(job_id))
    return {"id": job_id, "steps": steps, "back_after": back_after, "stats": stats}


def bury(args: argparse.Namespace) -> dict[str, Any]:
    steps: Steps = []
    with connect(args) as c:
        first = c.put(b"first", priority=10)
        second = c.put(b"second", priority=20)
        job = step(steps, "reserve #1", lambda: c.reserve(timeout=0))
        step(steps, "bury #1 pri 5", lambda: c.bury(job, priority=5))
        step(steps, "stats-job #1", lambda: c.stats_job(first))
        step(steps, "peek-buried", lambda: c.peek_buried())
        step(steps, "stats-tube", lambda: c.stats_tube(args.tube))
        job2 = step(steps, "reserve #2", lambda: c.reserve(timeout=0))
        step(steps, "delete #2", lambda: c.delete(job2))
        step(steps, "reserve (only buried left)", lambda: c.reserve(timeout=0))
        step(steps, "kick 10", lambda: c.kick(10))
        step(steps, "kick 10 again", lambda: c.kick(10))
        step(steps, "stats-job #1 after kick", lambda: c.stats_job(first))
        job = step(steps, "reserve kicked", lambda: c.reserve(timeout=0))
        step(steps, "bury again", lambda: c.bury(job, priority=7))
        step(steps, "kick-job", lambda: c.kick_job(first))
        step(steps, "kick-job not buried", lambda: c.kick_job(first))
        job = step(steps, "reserve kick-jobbed", lambda: c.reserve(timeout=0))
        step(steps, "stats-job #1 final", lambda: c.stats_job(first))
        step(steps, "delete #1", lambda: c.delete(job))
        step(steps, "stats-tube final", lambda: c.stats_tube(args.tube))
    return {"first": first, "second": second, "steps": steps}


def touch(args: argparse.Namespace) -> dict[str, Any]:
    steps: Steps = []
    with connect(args) as a, connect(args) as b:
        job_id = a.put(b"long", ttr=args.ttr)
        step(steps, "A reserve", lambda: a.reserve(timeout=0))
        time.sleep(args.touch_after)  # time has to pass before the touch: nothing to wait for
        step(steps, "A touch", lambda: a.touch(greenstalk.Job(job_id, b"")))
        touched = time.monotonic()
        step(steps, "stats-job.state", lambda: b.stats_job(job_id)["state"])
        wait_holding(
            args,
            a,
            job_id,
            lambda: step(steps, "B reserve-with-timeout", lambda: b.reserve(timeout=args.ttr + 5)),
        )
        back_after_touch = time.monotonic() - touched
        step(steps, "A touch after expiry", lambda: a.touch(greenstalk.Job(job_id, b"")))
        step(steps, "stats-job.timeouts", lambda: b.stats_job(job_id)["timeouts"])
        step(steps, "B delete", lambda: b.delete(job_id))
    return {"id": job_id, "steps": steps, "back_after_touch": back_after_touch}


def produce(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    jobs: list[list[Any]] = []
    with connect(args) as c:
        for i in range(args.count):
            body = b"%d\r\n" % i + rng.randbytes(rng.randint(0, 40)) + b"\x00"
            jobs.append([c.put(body), body.hex()])
        stops = [c.put(STOP) for _ in range(args.stops)]
    return {"jobs": jobs, "stops": stops}


def work(args: argparse.Namespace) -> dict[str, Any]:
    deliveries: list[list[Any]] = []
    with connect(args) as c:
        while True:
            try:
                job = c.reserve(timeout=args.timeout)
            except greenstalk.TimedOutError:
                return {"deliveries": deliveries, "stop": None, "timed_out": True}
            c.delete(job)
            if job.body == STOP:
                return {"deliveries": deliveries, "stop": job.id, "timed_out": False}
            deliveries.append([job.id, job.body.hex()])


def put(args: argparse.Namespace) -> dict[str, Any]:
    bodies = corpus.read_bodies(args.bodies)
    pris = args.pri or [greenstalk.DEFAULT_PRIORITY]
    with connect(args, watch=False) as c:  # a producer only: it must not join the tube's workers
        ids = [c.put(body, priority=pris[i % len(pris)]) for i, body in enumerate(bodies)]
    return {"ids": ids, "put_at": time.time()}


def reserve(args: argparse.Namespace) -> dict[str, Any]:
    jobs: list[list[Any]] = []
    reserved_at: list[float] = []
    timed_out = False
    with connect(args) as c:
        for _ in range(args.count):
            try:
                job = c.reserve(timeout=args.timeout)
            except greenstalk.TimedOutError:
                timed_out = True
                break
            reserved_at.append(time.time())
            c.delete(job)
            jobs.append([job.id, job.body.hex()])
    return {"jobs": jobs, "reserved_at": reserved_at, "timed_out": timed_out}


def binary(args: argparse.Namespace) -> dict[str, Any]:
    bodies = corpus.read_bodies(args.bodies)
    with connect(args) as c:
        ids = [c.put(body) for body in bodies]
        peeked = [c.peek(i).body.hex() for i in ids]
        reserved: list[list[Any]] = []
        for _ in ids:
            job = c.reserve(timeout=0)
            reserved.append([job.id, job.body.hex()])
            c.delete(job)
    return {"ids": ids, "peeked": peeked, "reserved": reserved}


def stats_tube(args: argparse.Namespace) -> dict[str, Any]:
    with greenstalk.Client((args.host, args.port), encoding=None) as c:
        steps: Steps = []
        return {
            "stats": step(steps, "stats-tube", lambda: dict(c.stats_tube(args.tube))) or steps[0][1]
        }


SCENARIOS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "priorities": priorities,
    "delay": delay,
    "ttr": ttr,
    "bury": bury,
    "touch": touch,
    "produce": produce,
    "work": work,
    "put": put,
    "reserve": reserve,
    "binary": binary,
    "stats-tube": stats_tube,
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tube", default="default")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--stops", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bodies", help="corpus file (length-prefixed bodies)")
    p.add_argument("--pri", type=int, action="append", help="priorities, cycled (put)")
    p.add_argument("--timeout", type=int, default=30, help="reserve-with-timeout seconds")
    p.add_argument("--ttr", type=int, default=2)
    p.add_argument("--touch-after", type=float, default=1.0)
    p.add_argument("--holder-keepalive", type=float, default=0.0, help="see wait_holding()")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    emit(SCENARIOS[args.scenario](args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
