"""pynsq 0.9.1 (tornado) as a peer: `pub` publishes with nsq.Writer, `sub` consumes with
nsq.Reader. Options and output: see common.py.

The library is used as shipped. The two subclasses below only observe: they count connection
closes and record errors, then call pynsq's own handler.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

import common
import nsq
from tornado.ioloop import IOLoop


def conn_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.snappy:
        opts["snappy"] = True
    if args.deflate:
        opts["deflate"] = True
    if args.tls_ca:
        # passed to tornado's start_tls as ssl_options; pynsq adds cert_reqs=CERT_REQUIRED
        opts["tls_v1"] = True
        opts["tls_options"] = {"ca_certs": args.tls_ca}
    if args.msg_timeout:
        opts["msg_timeout"] = args.msg_timeout / 1000  # pynsq takes seconds
    return opts


async def publish(args: argparse.Namespace) -> int:
    result = common.PubResult()
    done = asyncio.get_running_loop().create_future()

    class Writer(nsq.Writer):
        def _on_connection_close(self, conn: Any, **kwargs: Any) -> None:
            result.closes += 1  # the script never closes its Writer: every close is a drop
            result.close_reasons.append(repr(getattr(conn.stream, "error", None)))
            super()._on_connection_close(conn, **kwargs)

        def _on_connection_error(self, conn: Any, error: Any, **kwargs: Any) -> None:
            result.errors.append(f"connection error: {error!r}")
            super()._on_connection_error(conn, error, **kwargs)

    def replied(conn: Any, data: Any) -> None:
        result.reply(data)
        if result.done and not done.done():
            done.set_result(None)

    singles, batches = common.split_batches(args)
    writer = Writer([f"{args.host}:{args.port}"], **conn_options(args))
    loop = IOLoop.current()

    def start() -> None:
        if not writer.conns:  # not connected yet: pub() would fail with "no open connections"
            loop.call_later(0.005, start)
            return
        result.commands = len(singles) + len(batches)
        # everything pipelined: the Writer matches the replies to the commands in order
        for body in singles:
            if args.defer:
                writer.dpub(args.topic, args.defer, body, callback=replied)
            else:
                writer.pub(args.topic, body, callback=replied)
        for batch in batches:
            writer.mpub(args.topic, batch, callback=replied)

    start()
    try:
        await asyncio.wait_for(done, args.timeout)
    except TimeoutError:
        result.errors.append("timed out")
    result.emit()
    return 0 if not result.errors else 1


async def consume(args: argparse.Namespace) -> int:
    result = common.SubResult(args.count, no_fin=args.no_fin)
    done = asyncio.get_running_loop().create_future()
    stopping = False

    class Reader(nsq.Reader):
        def _on_connection_close(self, conn: Any, **kwargs: Any) -> None:
            if not stopping:
                result.closes += 1
                # why tornado closed the stream: OSError(11) is pynsq's compressed-socket bug
                result.close_reasons.append(repr(getattr(conn.stream, "error", None)))
            super()._on_connection_close(conn, **kwargs)

        def _on_connection_error(self, conn: Any, error: Any, **kwargs: Any) -> None:
            result.errors.append(f"connection error: {error!r}")
            super()._on_connection_error(conn, error, **kwargs)

    def handle(message: nsq.Message) -> None:
        result.delivered(message.attempts, message.body)
        if args.no_fin:
            message.enable_async()  # never answered
            if result.done:
                result.emit()
                os._exit(0)  # a crash: the kernel closes the socket, nothing else is sent
            return
        if args.req_first and message.attempts == 1:
            result.reqs += 1
            message.requeue(backoff=False, delay=0)
            return
        message.finish()
        result.fins += 1
        if result.done:
            stop()

    loop = IOLoop.current()

    def stop() -> None:
        # Let tornado write out the last FINs before the sockets close.
        if any(c.stream is not None and c.stream.writing() for c in reader.conns.values()):
            loop.call_later(0.005, stop)
            return
        if not done.done():
            done.set_result(None)

    if args.lookupd_port:
        # only lookupd: the Reader asks /lookup at once, then connects to the producers
        # it lists (their broadcast_address and tcp_port)
        sources: dict[str, Any] = {
            "lookupd_http_addresses": [f"http://{args.host}:{args.lookupd_port}"]
        }
    else:
        sources = {"nsqd_tcp_addresses": [f"{args.host}:{args.port}"]}
    reader = Reader(
        topic=args.topic,
        channel=args.channel,
        **sources,
        max_in_flight=args.max_in_flight,
        message_handler=handle,
        **conn_options(args),
    )
    if not args.count:

        def on_stdin(fd: int, events: int) -> None:
            if not os.read(fd, 4096):
                loop.remove_handler(fd)
                stop()

        loop.add_handler(sys.stdin.fileno(), on_stdin, IOLoop.READ)

    try:
        await asyncio.wait_for(done, args.timeout)
    except TimeoutError:
        result.timed_out = True
    stopping = True
    reader.close()
    result.emit()
    return 1 if result.timed_out else 0


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = common.parse_args()
    return asyncio.run(publish(args) if args.mode == "pub" else consume(args))


if __name__ == "__main__":
    sys.exit(main())
