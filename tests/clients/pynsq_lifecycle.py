"""pynsq 0.9.1 (tornado) driving each NSQ lifecycle event the archive records.

    pynsq_lifecycle.py pub --port P --topic T --body B [--body B ...]
    pynsq_lifecycle.py sub --port P --topic T --channel C --msg-timeout MS --count N

`pub` publishes every B with nsq.Writer's PUB, one after the other. `sub` consumes
with nsq.Reader and answers by the body's first word: `fin` -> FIN; `req` -> REQ on the
first attempt, FIN on the next; `timeout` -> nothing on the first attempt (the gateway
times it out after --msg-timeout), FIN on the next. It stops after N FINs. Both print one
JSON line of what they did; the test compares the archive's report with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

import nsq
from tornado.ioloop import IOLoop


async def publish(args: argparse.Namespace) -> dict[str, Any]:
    writer = nsq.Writer([f"{args.host}:{args.port}"])
    loop = IOLoop.current()
    replies: list[str] = []
    done = asyncio.get_running_loop().create_future()
    bodies = [b.encode() for b in args.bodies]

    def replied(conn: Any, data: Any) -> None:
        replies.append(data.decode() if isinstance(data, bytes) else repr(data))
        if len(replies) < len(bodies):
            writer.pub(args.topic, bodies[len(replies)], callback=replied)
        elif not done.done():
            done.set_result(None)

    def start() -> None:
        if not writer.conns:  # pub() before the connection is up fails
            loop.call_later(0.005, start)
            return
        writer.pub(args.topic, bodies[0], callback=replied)

    start()
    await asyncio.wait_for(done, args.timeout)
    return {"published": len(bodies), "replies": replies}


async def consume(args: argparse.Namespace) -> dict[str, Any]:
    done = asyncio.get_running_loop().create_future()
    did: dict[str, Any] = {"deliveries": [], "fin": 0, "req": 0, "ignored": 0}

    def handle(message: nsq.Message) -> None:
        body = message.body.decode()
        did["deliveries"].append([body, message.attempts])
        kind = body.split("-")[0]
        if message.attempts == 1 and kind == "req":
            did["req"] += 1
            message.requeue(backoff=False, delay=0)
            return
        if message.attempts == 1 and kind == "timeout":
            did["ignored"] += 1
            message.enable_async()  # never answered: the gateway times it out
            return
        message.finish()
        did["fin"] += 1
        if did["fin"] >= args.count and not done.done():
            # let tornado write the last FIN out before the socket closes
            IOLoop.current().call_later(0.2, lambda: done.set_result(None))

    reader = nsq.Reader(
        topic=args.topic,
        channel=args.channel,
        nsqd_tcp_addresses=[f"{args.host}:{args.port}"],
        max_in_flight=10,
        message_handler=handle,
        msg_timeout=args.msg_timeout / 1000,
    )
    await asyncio.wait_for(done, args.timeout)
    reader.close()
    return did


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["pub", "sub"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--channel", default="ch")
    p.add_argument("--msg-timeout", type=int, default=60000)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--body", dest="bodies", action="append", default=[])
    args = p.parse_args()
    result = asyncio.run(publish(args) if args.mode == "pub" else consume(args))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
