"""`gateway serve | check-config | pipeline | import`: the command-line contract (README.md,
Running it)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import resource
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import trio
from pydantic import ValidationError

from gateway import __version__, config, logs
from gateway.app import Gateway
from gateway.broker.errors import StoreUnavailable
from gateway.links import beanstalk_cli as import_cli
from gateway.pipeline import cli as pipeline_cli

_LISTENER_FLAGS = (
    "nsq",
    "http",
    "https",
    "beanstalk",
    "beanstalk-tls",
    "nats",
    "nats-route",
    "rocketmq",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description="Protocol-translating message gateway"
    )
    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", metavar="FILE", help="TOML configuration file")
    serve.add_argument(
        "--data-dir",
        metavar="DIR",
        help="where the durable store keeps its data (default ./data; created if missing)",
    )
    serve.add_argument(
        "--store",
        metavar="URL",
        help="memory:// (nothing survives a restart), sqlite:///abs/path.db, "
        "redis://[user:pass@]host:port/db or redis+cluster://host:port[,host:port] "
        "(several gateways share the queues); default: the durable store in --data-dir",
    )
    serve.add_argument(
        "--store-wait",
        metavar="SECONDS",
        type=float,
        help="how long to keep trying to reach a Redis store at start, then exit 1 "
        "(0: at once; default: 60)",
    )
    for name in _LISTENER_FLAGS:
        serve.add_argument(
            f"--{name}", metavar="ADDR", help="host:port, port 0 = any free port, 'off' = disabled"
        )
    serve.add_argument(
        "--lookupd-tcp-address",
        metavar="ADDR",
        action="append",
        help="nsqlookupd TCP address (host:port) to register with, as nsqd; repeatable",
    )
    serve.add_argument(
        "--broadcast-address",
        metavar="HOST",
        help="the address NSQ clients and nsqlookupd are told to reach the gateway at "
        "(default: the NSQ listener's host, or the hostname)",
    )
    serve.add_argument("--nats-routes", metavar="URL[,URL...]")
    serve.add_argument("--nats-cluster", metavar="NAME")
    serve.add_argument("--tls-cert", metavar="FILE")
    serve.add_argument("--tls-key", metavar="FILE")
    serve.add_argument("--log-level", metavar="LEVEL")
    serve.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default="text",
        help="text (default), json (one object a line) or logfmt (key=value)",
    )
    serve.add_argument(
        "--access-log", action="store_true", help="log every HTTP request (gateway.http.access)"
    )
    check = sub.add_parser(
        "check-config",
        help="validate a configuration file, with the GATEWAY_* environment over it as serve "
        "reads it, and print every error and every setting the environment changes",
    )
    check.add_argument("file")
    pipeline_cli.add_parser(sub)
    import_cli.add_parser(sub)
    return parser


def _flags(args: argparse.Namespace) -> dict[str, object]:
    flags: dict[str, object] = {
        "data_dir": args.data_dir,
        "store": args.store,
        "store_wait": args.store_wait,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "log_level": args.log_level,
        "nats_cluster": args.nats_cluster,
    }
    for name in _LISTENER_FLAGS:
        flags[name.replace("-", "_")] = getattr(args, name.replace("-", "_"))
    nsqd: dict[str, object] = {}
    if args.lookupd_tcp_address:
        nsqd["lookupd_tcp_addresses"] = args.lookupd_tcp_address
    if args.broadcast_address:
        nsqd["broadcast_address"] = args.broadcast_address
    if nsqd:
        flags["nsqd"] = nsqd
    if args.nats_routes:
        flags["nats_routes"] = [u.strip() for u in args.nats_routes.split(",") if u.strip()]
    return flags


# A SIGTERM that arrives before the signal receiver below is open. In a container the
# gateway is PID 1, and PID 1 ignores a signal it has no handler for: without this, a stop
# during start-up would wait for the orchestrator's kill.
_early_stop: list[int] = []


def _stop_early(signum: int, frame: object) -> None:
    _early_stop.append(signum)


async def _serve(gateway: Gateway) -> None:
    log = logging.getLogger("gateway")
    with trio.open_signal_receiver(
        signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP
    ) as signals:
        if _early_stop:
            log.info("signal %s during start-up: not starting", signal.Signals(_early_stop[0]).name)
            return
        async with trio.open_nursery() as nursery:
            # heard from the start: a stop while the store opens (a Redis that does not
            # answer is waited for without end) or a long recovery runs stops that too
            nursery.start_soon(_on_signals, gateway, signals, nursery.cancel_scope)
            await nursery.start(gateway.serve)


async def _on_signals(
    gateway: Gateway, signals: AsyncIterator[int], scope: trio.CancelScope
) -> None:
    log = logging.getLogger("gateway")
    async for signum in signals:
        if signum == signal.SIGHUP:
            # a renewed certificate: new connections get it, open ones keep theirs. On
            # the event loop, not a thread: an SSLContext must not change while a
            # handshake reads it, and two small files are read at once.
            if gateway.certificates is not None or gateway.listener_certificates:
                gateway.reload_certificates()
            else:
                log.info("signal SIGHUP: no TLS certificate to reload")
            continue
        if signum == signal.SIGUSR1:
            # beanstalkd's drain mode: every later put answers DRAINING
            gateway.beanstalk.draining = True
            log.info("signal SIGUSR1: beanstalkd drain mode on")
            continue
        log.info("signal %s: shutting down", signal.Signals(signum).name)
        scope.cancel()
        return


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    if argv is None:  # the real process, not a test calling main() in-process
        signal.signal(signal.SIGTERM, _stop_early)
    args, extra = parser.parse_known_args(argv)
    if extra:
        # the subcommand's own usage, not the top level's, names what it takes
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
            args.command
        ]
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "check-config":
        return _check_config(args.file)
    if args.command == "pipeline":
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # no gateway to stop cleanly here
        return pipeline_cli.main(args)
    if args.command == "import":
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # heard by the command itself
        return import_cli.main(args)
    try:
        sources = config.gather(args.config, _flags(args))
    except (OSError, ValueError) as exc:  # an unreadable file, an unknown GATEWAY_ name
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    try:
        settings = sources.settings()
    except ValidationError as exc:
        for line in config.describe_errors(exc, sources):
            print(f"config error: {line}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, args.log_format)
    # A setting two sources disagree on: which one won, so that a value nobody remembers
    # setting (an image's or a pod's environment, a forgotten file) is found in the log.
    for override in sources.overrides:
        logging.getLogger("gateway.config").info("%s", override)
    _tune_gc()
    _raise_open_files()
    failed: list[BaseException] = []
    try:
        gateway = Gateway(settings, config_file=sources.file, access_log=args.access_log)
        trio.run(_serve, gateway)
    except* (OSError, StoreUnavailable) as group:
        # a port in use, an unreadable certificate, a data dir that cannot be used: one
        # line each, not a traceback (the listeners bind inside nurseries, so the error
        # arrives in a group)
        failed.extend(_leaves(group))
    for exc in failed:
        print(f"error: {exc}", file=sys.stderr)
    return 1 if failed else 0


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for exc in group.exceptions for leaf in _leaves(exc)]
    return [group]


def _raise_open_files() -> None:
    """The soft limit on open descriptors raised to the hard one, as the Go runtime does
    for nsqd and nats-server at start (Go 1.19 on). A connection is a descriptor, and the
    soft limit most systems start a service with (1024) is far below `max_connections`
    (65536): past it, accepting stops until a connection closes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:  # a hard limit the kernel does not allow as soft
        logging.getLogger("gateway").debug("open files: the soft limit stays %d (%s)", soft, exc)


def _tune_gc() -> None:
    """Fewer, larger young-generation collections.

    Every queued message is a GC-tracked object. With CPython's default threshold (700
    allocations) a burst of MPUBs runs a young collection every few commands, and each
    older-generation pass walks the whole backlog. The messages form no cycles, so
    collecting less often loses nothing; GATEWAY_GC_THRESHOLD overrides the first value.
    """
    raw = os.environ.get("GATEWAY_GC_THRESHOLD", "50000")
    # 0 would turn automatic collection off altogether: not what a threshold means
    first = int(raw) if raw.isascii() and raw.isdigit() and int(raw) > 0 else 50000
    if str(first) != raw:
        logging.getLogger("gateway").warning(
            "GATEWAY_GC_THRESHOLD %r is no positive number: 50000 is used", raw
        )
    gc.set_threshold(first, 50, 100)
    gc.freeze()  # what startup allocated is never garbage: keep it out of every pass


def _check_config(path: str) -> int:
    """The file as `serve --config FILE` would run it: with this environment's GATEWAY_*
    variables over it, each one that changes a setting of the file named."""
    try:
        sources = config.gather(path, file_flag="check-config's FILE")
    except (OSError, ValueError) as exc:
        text = str(exc)  # a TOML error names the file already
        print(text if text.startswith(f"{path}:") else f"{path}: {text}")
        return 1
    for override in sources.overrides:
        print(f"{path}: {override}")
    try:
        sources.settings()
    except ValidationError as exc:
        errors = config.describe_errors(exc, sources)
        for line in errors:
            print(line)  # each led by its source: FILE:key, or the GATEWAY_ variable
        print(f"{path}: {len(errors)} error(s)")
        return 1
    print(f"{path}: ok")
    return 0
