"""nats-py 2.16.0 as a NATS peer. Each subcommand runs one scenario against ``--host``/``--port``
and prints JSON lines on stdout: ``{"ready": true}`` when its subscriptions are in place (only the
scenarios that wait for another process), then one result line. The scripts only observe; the
test decides whether that is right. A message is recorded as
``[subject, reply, sha256, size, headers]`` (headers as nats-py parsed them: a dict or null).

nats-py quirk: ``flush()`` may send its PING ahead of a SUB still in the client's buffer, so
``subscribe(); flush()`` does not prove the server has the subscription. Every subscriber here
flushes twice before it calls itself ready.

Subcommands:

* ``sub --subject S [--queue Q] --count N``: subscribe, ready, take N messages, then one more
  round trip; prints ``messages`` and ``in_msgs`` (every MSG/HMSG the connection got).
* ``pub --subject S --bodies FILE [--headers JSON]``: publish every body of a corpus file (see
  ../corpus.py), with the headers (a JSON object, name to value) if given, then one empty
  message on ``--then`` if given, then flush; prints ``published``.
* ``wildcards --spec JSON``: spec ``{"subs": {pattern: last_subject}, "publish": [subject]}``;
  one connection subscribes to every pattern, another publishes each subject (body: the
  subject); each subscription is read until its ``last_subject``; prints ``got``
  (pattern to subjects in arrival order) and ``in_msgs``.
* ``queue --subject S --group Q --members K --bodies FILE``: K connections in queue group Q, one
  plain subscriber, one publisher; waits until the plain one has every body and the members
  have as many between them, then a round trip on each; prints ``members`` (digests per
  member), ``plain`` (digests), ``in_msgs`` (per member).
* ``members --subject S --group Q --members K``: K connections in queue group Q on S, each
  also subscribed (plain) to ``S.end``; ready; each member collects until its ``S.end``
  message arrives, then makes a round trip; prints ``members`` (digests per member).
  A publisher that sends its bodies and then one message on ``S.end`` (``pub --then``)
  ends the run: messages on one path arrive in order, so the sentinel comes last.
* ``reply --subject S --count N``: a responder: ready, answers N requests with ``re:`` + the
  request body, echoing the request's headers; prints ``answered`` (request subjects) and
  ``reply_subjects``.
* ``request --subject S --bodies FILE --concurrency K``: one request per body, K in flight;
  prints ``replies``: ``[sha256 of the reply body, headers]`` or ``"!ErrorClass"`` per body.
* ``unsub-max --subject S --max M --publish P``: subscribe to S, ``unsubscribe(limit=M)``,
  subscribe to ``S.end``; another connection publishes P messages on S then one on S.end,
  then P more on S and one more on S.end; prints ``delivered`` (what nats-py's subscription
  gave), and ``in_msgs_1``/``in_msgs_2`` (MSGs the connection got by each sentinel).
* ``no-responders --subject S``: a request (new style, muxed inbox) and an old-style request
  to a subject nobody serves; prints ``[error class, seconds]`` for each.

``--timeout S`` (default 60) bounds every run: the script then prints what it has with
``"timed_out": true`` and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import corpus

Result = dict[str, Any]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def record(msg: Msg) -> list[Any]:
    return [msg.subject, msg.reply, sha(msg.data), len(msg.data), msg.headers]


async def connect(args: argparse.Namespace, out: Result, name: str) -> Client:
    async def error_cb(exc: Exception) -> None:
        out["async_errors"].append(f"{name}: {type(exc).__name__}: {exc}")

    tls = None
    if args.tls_ca:  # TLS, trusting this CA, showing a client certificate if given
        tls = ssl.create_default_context(cafile=args.tls_ca)
        if args.tls_cert:
            tls.load_cert_chain(args.tls_cert, args.tls_key)
    nc = await nats.connect(
        servers=[f"{'tls' if tls else 'nats'}://{args.host}:{args.port}"],
        name=name,
        allow_reconnect=False,
        connect_timeout=5,
        error_cb=error_cb,
        tls=tls,
    )
    info = nc._server_info
    out.setdefault("server_info", {k: info.get(k) for k in ("proto", "headers", "max_payload")})
    return nc


async def ready(*conns: Client) -> None:
    for nc in conns:
        await nc.flush()
        await nc.flush()
    emit({"ready": True})


async def take(sub: Any, n: int) -> list[Msg]:
    return [await sub.next_msg(timeout=None) for _ in range(n)]


async def sub_scenario(args: argparse.Namespace, out: Result) -> None:
    nc = await connect(args, out, "sub")
    sub = await nc.subscribe(args.subject, queue=args.queue or "")
    await ready(nc)
    out["messages"] = messages = []
    for _ in range(args.count):
        messages.append(record(await sub.next_msg(timeout=None)))
    await nc.flush()
    out["in_msgs"] = nc.stats["in_msgs"]
    await nc.close()


async def pub_scenario(args: argparse.Namespace, out: Result) -> None:
    nc = await connect(args, out, "pub")
    headers = json.loads(args.headers) if args.headers else None
    out["published"] = 0
    for body in corpus.read_bodies(args.bodies):
        await nc.publish(args.subject, body, headers=headers)
        out["published"] += 1
    if args.then:
        await nc.publish(args.then, b"")
    await nc.flush()
    await nc.close()


async def wildcards_scenario(args: argparse.Namespace, out: Result) -> None:
    spec = json.loads(args.spec)
    nc = await connect(args, out, "sub")
    subs = {pattern: await nc.subscribe(pattern) for pattern in spec["subs"]}
    await ready(nc)
    pub = await connect(args, out, "pub")
    for subject in spec["publish"]:
        await pub.publish(subject, subject.encode())
    await pub.flush()
    out["got"] = got = {pattern: [] for pattern in subs}
    for pattern, last in spec["subs"].items():
        while not got[pattern] or got[pattern][-1] != last:
            msg = await subs[pattern].next_msg(timeout=None)
            assert msg.data == msg.subject.encode(), (msg.subject, msg.data)
            got[pattern].append(msg.subject)
    await nc.flush()
    out["in_msgs"] = nc.stats["in_msgs"]
    await asyncio.gather(nc.close(), pub.close())


async def queue_scenario(args: argparse.Namespace, out: Result) -> None:
    bodies = corpus.read_bodies(args.bodies)
    out["members"] = members = [[] for _ in range(args.members)]
    out["plain"] = plain = []
    done = asyncio.Event()

    def check() -> None:
        if len(plain) >= len(bodies) and sum(map(len, members)) >= len(bodies):
            done.set()

    def collector(into: list[str]) -> Any:
        async def cb(msg: Msg) -> None:
            into.append(sha(msg.data))
            check()

        return cb

    conns = []
    for i in range(args.members):
        nc = await connect(args, out, f"member{i}")
        await nc.subscribe(args.subject, queue=args.group, cb=collector(members[i]))
        conns.append(nc)
    plain_nc = await connect(args, out, "plain")
    await plain_nc.subscribe(args.subject, cb=collector(plain))
    await ready(*conns, plain_nc)
    pub = await connect(args, out, "pub")
    for body in bodies:
        await pub.publish(args.subject, body)
    await pub.flush()
    await done.wait()
    for nc in conns:
        await nc.flush()  # a duplicate sent late would arrive before this PONG
    out["in_msgs"] = [nc.stats["in_msgs"] for nc in conns]
    out["plain_in_msgs"] = plain_nc.stats["in_msgs"]
    await asyncio.gather(*(nc.close() for nc in [*conns, plain_nc, pub]))


async def members_scenario(args: argparse.Namespace, out: Result) -> None:
    out["members"] = members = []
    conns = []
    subs = []
    for i in range(args.members):
        nc = await connect(args, out, f"member{i}")
        sub = await nc.subscribe(args.subject, queue=args.group)
        end = await nc.subscribe(args.subject + ".end")
        conns.append(nc)
        subs.append((sub, end))
    await ready(*conns)
    for nc, (sub, end) in zip(conns, subs, strict=True):
        await end.next_msg(timeout=None)
        await nc.flush()  # a duplicate sent late would arrive before this PONG
        # everything before the sentinel is queued in the subscription already
        members.append(
            [sha((await sub.next_msg(timeout=None)).data) for _ in range(sub.pending_msgs)]
        )
    await asyncio.gather(*(nc.close() for nc in conns))


async def reply_scenario(args: argparse.Namespace, out: Result) -> None:
    nc = await connect(args, out, "responder")
    sub = await nc.subscribe(args.subject, queue=args.queue or "")
    await ready(nc)
    out["answered"] = answered = []
    out["reply_subjects"] = replies = []
    for _ in range(args.count):
        msg = await sub.next_msg(timeout=None)
        answered.append(msg.subject)
        replies.append(msg.reply)
        await nc.publish(msg.reply, b"re:" + msg.data, headers=msg.headers)
    await nc.flush()
    await nc.close()


async def request_scenario(args: argparse.Namespace, out: Result) -> None:
    bodies = corpus.read_bodies(args.bodies)
    headers = json.loads(args.headers) if args.headers else None
    nc = await connect(args, out, "requester")
    out["replies"] = replies = [None] * len(bodies)
    limit = asyncio.Semaphore(args.concurrency)

    async def one(i: int, body: bytes) -> None:
        async with limit:
            try:
                msg = await nc.request(args.subject, body, timeout=10, headers=headers)
            except Exception as exc:
                replies[i] = f"!{type(exc).__name__}"
            else:
                replies[i] = [sha(msg.data), msg.headers]

    await asyncio.gather(*(one(i, body) for i, body in enumerate(bodies)))
    await nc.close()


async def unsub_max_scenario(args: argparse.Namespace, out: Result) -> None:
    nc = await connect(args, out, "sub")
    sub = await nc.subscribe(args.subject)
    await sub.unsubscribe(limit=args.max)
    end = await nc.subscribe(args.subject + ".end")
    await ready(nc)
    pub = await connect(args, out, "pub")
    for round_ in (1, 2):
        for i in range(args.publish):
            await pub.publish(args.subject, b"%d.%d" % (round_, i))
        await pub.publish(args.subject + ".end", b"end%d" % round_)
        await pub.flush()
        await end.next_msg(timeout=None)
        out[f"in_msgs_{round_}"] = nc.stats["in_msgs"]
    out["delivered"] = [
        (await sub.next_msg(timeout=None)).data.decode() for _ in range(sub.pending_msgs)
    ]
    out["sub_received"] = sub.delivered
    await asyncio.gather(nc.close(), pub.close())


async def no_responders_scenario(args: argparse.Namespace, out: Result) -> None:
    nc = await connect(args, out, "requester")
    out["requests"] = outcomes = []
    for old_style in (False, True):
        start = time.monotonic()
        try:
            msg = await nc.request(args.subject, b"anyone?", timeout=5, old_style=old_style)
        except Exception as exc:
            outcomes.append([type(exc).__name__, time.monotonic() - start])
        else:
            outcomes.append([f"reply {msg.data!r} {msg.headers}", time.monotonic() - start])
    await nc.close()


SCENARIOS = {
    "sub": sub_scenario,
    "pub": pub_scenario,
    "wildcards": wildcards_scenario,
    "queue": queue_scenario,
    "members": members_scenario,
    "reply": reply_scenario,
    "request": request_scenario,
    "unsub-max": unsub_max_scenario,
    "no-responders": no_responders_scenario,
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4222)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--subject", default="test")
    p.add_argument("--queue", default="")
    p.add_argument("--group", default="workers")
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--bodies")
    p.add_argument("--headers")
    p.add_argument("--then", help="pub: after the bodies, one empty message on this subject")
    p.add_argument("--spec")
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--max", type=int, default=5)
    p.add_argument("--publish", type=int, default=10)
    p.add_argument("--tls-ca", help="connect with TLS, trusting this CA file")
    p.add_argument("--tls-cert", help="a client certificate (with --tls-key)")
    p.add_argument("--tls-key")
    return p.parse_args()


async def main() -> int:
    args = parse_args()
    out: Result = {"async_errors": [], "timed_out": False}
    try:
        await asyncio.wait_for(SCENARIOS[args.scenario](args, out), args.timeout)
    except TimeoutError:
        out["timed_out"] = True
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    emit(out)
    return 1 if out["timed_out"] or "error" in out else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
