"""ansq 0.3.0 (asyncio) as a peer: `pub` publishes with ansq.create_writer, `sub` consumes with
ansq.create_reader. Options and output: see common.py.

ansq has no TLS, snappy or deflate (they raise NotImplementedError), and its reader keeps RDY 1
per connection whatever --max-in-flight says. Auto-reconnect is off so that a dropped connection
shows up as a close instead of being papered over.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

import ansq
import common
from ansq.tcp.types import NSQMessage


def options(args: argparse.Namespace, result: Any) -> ansq.ConnectionOptions:
    if args.snappy or args.deflate or args.tls_ca:
        raise SystemExit("ansq supports neither TLS nor compression")
    features = ansq.ConnectionFeatures()
    if args.msg_timeout:
        features = ansq.ConnectionFeatures(msg_timeout=args.msg_timeout)

    def on_close(_conn: Any) -> None:
        result.closes += 1

    return ansq.ConnectionOptions(features=features, auto_reconnect=False, on_close=on_close)


async def publish(args: argparse.Namespace) -> int:
    result = common.PubResult()
    singles, batches = common.split_batches(args)
    writer = await ansq.create_writer(
        nsqd_tcp_addresses=[f"{args.host}:{args.port}"], connection_options=options(args, result)
    )
    result.commands = len(singles) + len(batches)
    # All pipelined: ansq matches replies to its commands first in, first out.
    calls = [writer.pub(args.topic, body) for body in singles]
    calls += [writer.mpub(args.topic, *batch) for batch in batches]
    try:
        replies = await asyncio.wait_for(asyncio.gather(*calls), args.timeout)
    except TimeoutError:
        result.errors.append("timed out")
    else:
        for reply in replies:
            result.reply(b"OK" if reply.is_ok else reply)
    closes = result.closes
    await writer.close()
    result.closes = closes
    result.emit()
    return 0 if not result.errors else 1


async def consume(args: argparse.Namespace) -> int:
    result = common.SubResult(args.count, no_fin=args.no_fin)
    reader = await ansq.create_reader(
        topic=args.topic,
        channel=args.channel,
        nsqd_tcp_addresses=[f"{args.host}:{args.port}"],
        connection_options=options(args, result),
    )
    loop = asyncio.get_running_loop()
    stdin_closed = loop.create_future()
    if not args.count:

        def on_stdin() -> None:
            if not os.read(sys.stdin.fileno(), 4096):
                loop.remove_reader(sys.stdin.fileno())
                stdin_closed.set_result(None)

        loop.add_reader(sys.stdin.fileno(), on_stdin)

    async def handle(message: NSQMessage) -> bool:
        result.delivered(message.attempts, message.body)
        if args.no_fin:
            if result.done:
                result.emit()
                os._exit(0)  # a crash: the kernel closes the socket, nothing else is sent
            return False
        if args.req_first and message.attempts == 1:
            result.reqs += 1
            await message.req(0)
            return False
        await message.fin()
        result.fins += 1
        return result.done

    async def run() -> None:
        async for message in reader.messages():
            if await handle(message):
                return

    runner = asyncio.ensure_future(run())
    try:
        await asyncio.wait_for(
            asyncio.wait([runner, stdin_closed], return_when=asyncio.FIRST_COMPLETED),
            args.timeout,
        )
    except TimeoutError:
        result.timed_out = True
    if args.count and not result.done and not result.timed_out:
        result.errors.append("the message stream ended early (connection closed)")
        result.timed_out = True
    runner.cancel()
    closes = result.closes
    await reader.close()  # the transport writes out the last FINs before it closes
    result.closes = closes
    result.emit()
    return 1 if result.timed_out else 0


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = common.parse_args()
    return asyncio.run(publish(args) if args.mode == "pub" else consume(args))


if __name__ == "__main__":
    sys.exit(main())
