"""gnsq 1.0.2 (gevent) as a peer: `pub` publishes with gnsq.Producer, `sub` consumes with
gnsq.Consumer. Options and output: see common.py.

gnsq's connections cannot set IDENTIFY msg_timeout (NsqdTCPClient has no such option): a test
that needs a short timeout with gnsq sets the gateway's own `nsqd__msg_timeout`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

import common
import gevent
import gevent.event
import gevent.os
import gnsq


def conn_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.snappy:
        opts["snappy"] = True
    if args.deflate:
        opts["deflate"] = True
    if args.tls_ca:
        import ssl

        opts["tls_v1"] = True
        opts["tls_options"] = {"ca_certs": args.tls_ca, "cert_reqs": ssl.CERT_REQUIRED}
    if args.msg_timeout:
        raise SystemExit("gnsq cannot send IDENTIFY msg_timeout")
    return opts


def publish_http(args: argparse.Namespace) -> int:
    """gnsq.NsqdHTTPClient: each PUB body with /pub, each batch with /mpub?binary=true
    (the bodies hold newlines, which text mode cannot carry)."""
    result = common.PubResult()
    singles, batches = common.split_batches(args)
    client = gnsq.NsqdHTTPClient(args.host, args.http_port, timeout=args.timeout)
    result.commands = len(singles) + len(batches)
    for body in singles:
        try:
            result.reply(client.publish(args.topic, body, defer=args.defer or None))
        except gnsq.errors.NSQException as exc:
            result.errors.append(repr(exc))
    for batch in batches:
        try:
            result.reply(client.multipublish(args.topic, batch, binary=True))
        except gnsq.errors.NSQException as exc:
            result.errors.append(repr(exc))
    result.emit()
    return 0 if not result.errors else 1


def publish(args: argparse.Namespace) -> int:
    if args.http_port:
        return publish_http(args)
    result = common.PubResult()

    class Producer(gnsq.Producer):
        def handle_connection_failure(self, conn: Any) -> None:
            if self.is_running:
                result.closes += 1
            super().handle_connection_failure(conn)

    singles, batches = common.split_batches(args)
    producer = Producer([f"{args.host}:{args.port}"], **conn_options(args))
    producer.start()  # connects and IDENTIFYs before returning
    result.commands = len(singles) + len(batches)
    # raise_error=False: pipelined; gnsq matches each OK to the oldest outstanding publish
    pending = [producer.publish(args.topic, body, raise_error=False) for body in singles]
    pending += [producer.multipublish(args.topic, b, raise_error=False) for b in batches]
    deadline = gevent.Timeout(args.timeout)
    deadline.start()
    try:
        for reply in pending:
            try:
                result.reply(reply.get())
            except gnsq.errors.NSQException as exc:
                result.errors.append(repr(exc))
    except gevent.Timeout:
        result.errors.append("timed out")
    finally:
        deadline.cancel()
    producer.close()
    result.emit()
    return 0 if not result.errors else 1


def consume(args: argparse.Namespace) -> int:
    result = common.SubResult(args.count, no_fin=args.no_fin)
    done = gevent.event.Event()

    class Consumer(gnsq.Consumer):
        def handle_connection_failure(self, conn: Any) -> None:
            if self.is_running:
                result.closes += 1
            super().handle_connection_failure(conn)

    if args.lookupd_port:
        # only lookupd: gnsq asks /lookup at start and parses it only as application/json
        sources: dict[str, Any] = {
            "lookupd_http_addresses": [f"http://{args.host}:{args.lookupd_port}"]
        }
    else:
        sources = {"nsqd_tcp_addresses": [f"{args.host}:{args.port}"]}
    consumer = Consumer(
        args.topic,
        args.channel,
        **sources,
        max_in_flight=args.max_in_flight,
        **conn_options(args),
    )

    @consumer.on_message.connect
    def handle(_consumer: Any, message: gnsq.Message) -> None:
        result.delivered(message.attempts, message.body)
        if args.no_fin:
            message.enable_async()  # never answered
            if result.done:
                result.emit()
                os._exit(0)  # a crash: the kernel closes the socket, nothing else is sent
            return
        if args.req_first and message.attempts == 1:
            result.reqs += 1
            message.requeue(time_ms=0, backoff=False)
            return
        message.finish()  # written to the socket before finish() returns
        result.fins += 1
        if result.done:
            done.set()

    @consumer.on_error.connect
    def error(_consumer: Any, error: Exception) -> None:
        result.errors.append(repr(error))

    if not args.count:

        def watch_stdin() -> None:
            while gevent.os.tp_read(sys.stdin.fileno(), 4096):
                pass
            done.set()

        gevent.spawn(watch_stdin)

    consumer.start(block=False)
    if not done.wait(args.timeout):
        result.timed_out = True
    consumer.close()
    result.emit()
    return 1 if result.timed_out else 0


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = common.parse_args()
    return publish(args) if args.mode == "pub" else consume(args)


if __name__ == "__main__":
    sys.exit(main())
