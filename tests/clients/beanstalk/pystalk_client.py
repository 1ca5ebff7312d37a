"""pystalk 0.9.1 (EasyPost) as a beanstalkd peer: one scenario, ``basic``.

``basic --tube T --bodies FILE``: use/watch T (pystalk then ignores ``default``), put every
body of the corpus file (see ../corpus.py), ``stats-tube`` after the puts, reserve the first
job and ``stats-job`` it while reserved, delete it, then reserve+delete the rest, and finish
with ``stats-tube``, ``stats`` and ``list-tubes``. pystalk parses every YAML reply with
PyYAML (the C safe loader when present), so the dictionaries printed are what PyYAML made of
the server's output. pystalk reads several replies with a single ``recv(1024)``, so a reply
split across TCP segments shows up here as an error.

Prints one JSON line: ``ids``, ``jobs`` ([id, body_hex] in reserve order), ``stats_job``,
``tube_before``, ``tube_after``, ``stats``, ``tubes``, ``timed_out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pystalk import BeanstalkClient, BeanstalkError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import corpus


def jsonable(value: Any) -> Any:
    """YAML gives str/int/float/bool/None; keep the types visible to the test."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def basic(args: argparse.Namespace) -> dict[str, Any]:
    bodies = corpus.read_bodies(args.bodies)
    client = BeanstalkClient(args.host, args.port, socket_timeout=30)
    client.use(args.tube)
    client.watch(args.tube)
    ids = []
    for body in bodies:
        status, job_id = client.put_job(body, pri=100, ttr=60)
        assert status == b"INSERTED", status
        ids.append(job_id)
    out: dict[str, Any] = {"ids": ids, "tube_before": client.stats_tube(args.tube)}
    jobs: list[list[Any]] = []
    timed_out = False
    for i in range(len(bodies)):
        try:
            job = client.reserve_job(timeout=5)
        except BeanstalkError as exc:
            timed_out = True
            out["error"] = repr(exc)
            break
        if i == 0:
            out["stats_job"] = client.stats_job(job.job_id)
        client.delete_job(job.job_id)
        jobs.append([job.job_id, job.job_data.hex()])
    out.update(
        jobs=jobs,
        timed_out=timed_out,
        tube_after=client.stats_tube(args.tube),
        stats=client.stats(),
        tubes=client.list_tubes(),
    )
    client.close()
    return jsonable(out)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["basic"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tube", default="default")
    p.add_argument("--bodies", required=True)
    args = p.parse_args()
    sys.stdout.write(json.dumps(basic(args)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
