"""`nsqd` and `nsqlookupd` as gnsq 1.0.2's own test suite runs them, played by the gateway.

gnsq's tests/integration_server.py starts `nsqd` and `nsqlookupd` from PATH with Go-style
flags, reads `nsqd --version`, and takes the ports from the `PROTO: listening on ADDR` lines
the servers log on stderr. The two executables beside this file are those names; they call
`main` here, which translates the flags into `gateway serve` ones, runs the gateway as a
child, forwards its stderr, and adds nsqd's `listening on` line for each listener the
gateway reports (`listening protocol=nsq address=...`). SIGTERM and SIGINT are passed on.

nsqlookupd: the gateway answers nsqlookupd's HTTP API for the one nsqd it is (see
gateway/http/lookupd.py). The `nsqlookupd` stand-in is therefore a gateway of its own, its
NSQ listener on the lookupd's `--tcp-address` (the address nsqds register at) and its HTTP
listener on the lookupd's `--http-address`, and an `nsqd` started with
`--lookupd-tcp-address` of that address starts no gateway: it is that gateway (every nsqd
registered with one lookupd is the one gateway). It reports the gateway's ports as its own and
waits for its signal. A lookupd that has no producer, as in gnsq's test_lookupd.py::test_basic,
has no stand-in: the gateway is always its own producer.

Go's flag package accepts `-flag value`, `--flag value`, `-flag=value` and `--flag=value`;
so does this. A flag nsqd or nsqlookupd has but the stand-in does not translate is an error
(exit 2), never silently dropped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

# The nsqd version the gateway answers as (gateway/http/stats.py VERSION; a test checks
# that they agree). Not imported: `nsqd --version` is run once per server and stays quick.
NSQD_VERSION = "1.3.0"
GATEWAY_VERSION = "0.1.0"

# flag -> whether it is boolean; only these are accepted
_NSQD_FLAGS = {
    "version": True,
    "tcp-address": False,
    "http-address": False,
    "https-address": False,
    "tls-cert": False,
    "tls-key": False,
    "data-path": False,
    "broadcast-address": False,
    "lookupd-tcp-address": False,  # repeatable
}
_LOOKUPD_FLAGS = {
    "version": True,
    "tcp-address": False,
    "http-address": False,
    "broadcast-address": False,
}
# the gateway's listeners that neither nsqd nor nsqlookupd has
_OTHER_LISTENERS = ("beanstalk", "beanstalk-tls", "nats", "nats-route", "rocketmq")
# gateway listener -> the protocol name nsqd logs
_PROTOCOLS = {"nsq": "TCP", "http": "HTTP", "https": "HTTPS"}
_LISTENING = re.compile(r"^listening protocol=(?P<protocol>\S+) address=(?P<address>\S+)$")


class FlagError(Exception):
    pass


def parse_flags(argv: Sequence[str], known: dict[str, bool]) -> dict[str, list[str]]:
    """Go's flag.Parse over `known` (name -> is boolean): every value a flag was given, in
    order. Parsing stops at `--` or the first argument that is no flag, as in Go; nsqd takes
    no positional argument, so any is an error here."""
    out: dict[str, list[str]] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--":
            break
        if len(arg) < 2 or arg[0] != "-":
            args.insert(0, arg)
            break
        name = arg[2:] if arg.startswith("--") else arg[1:]
        if not name or name[0] in "-=":
            raise FlagError(f"bad flag syntax: {arg}")
        name, eq, value = name.partition("=")
        if name not in known:
            raise FlagError(f"flag provided but not defined: -{name}")
        if known[name]:
            if eq and value.lower() not in ("1", "t", "true", "0", "f", "false"):
                raise FlagError(f'invalid boolean value "{value}" for -{name}')
            value = value if eq else "true"
        elif not eq:
            if not args:
                raise FlagError(f"flag needs an argument: -{name}")
            value = args.pop(0)
        out.setdefault(name, []).append(value)
    if args:
        raise FlagError(f"unexpected arguments: {' '.join(args)}")
    return out


def _last(flags: dict[str, list[str]], name: str, default: str) -> str:
    return flags[name][-1] if name in flags else default


def _true(flags: dict[str, list[str]], name: str) -> bool:
    return _last(flags, name, "false").lower() in ("1", "t", "true")


def registry_dir() -> Path:
    """Where an nsqlookupd stand-in tells nsqds which gateway it is (one JSON file per
    lookupd TCP address)."""
    base = os.environ.get("GNSQ_STANDIN_DIR") or os.path.join(
        tempfile.gettempdir(), "gateway-gnsq-standin"
    )
    return Path(base)


def _registry_file(address: str) -> Path:
    return registry_dir() / (address.replace(":", "_").replace("/", "_") + ".json")


def _log_line(name: str, text: str) -> bytes:
    """One line in nsqd's log format: `[nsqd] 2006/01/02 15:04:05.000000 INFO: text`."""
    now = time.time()
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now))
    micros = int((now % 1) * 1_000_000)
    return f"[{name}] {stamp}.{micros:06d} INFO: {text}\n".encode()


class _StderrWriter:
    """stderr written from a thread of its own: gnsq stops reading the pipe once it has the
    ports and drains it only at shutdown, so a full pipe must never stop the reading of the
    gateway's stderr (the gateway would block on its next log line)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            with contextlib.suppress(OSError):
                self._stream.write(chunk)
                self._stream.flush()

    def write(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)


# SIGTERM and SIGINT are passed to the gateway. The stand-in blocks them, and SIGCHLD, and
# its main thread takes them with sigwait: a Python signal handler has to interrupt the
# main thread's read of the gateway's stderr to run, and now and then it did not until the
# gateway's next log line, which an idle gateway never writes (gnsq's shutdown then hung
# until the suite's timeout, about one run of its test_nsqd.py in three under load).
_STOP = frozenset({signal.SIGTERM, signal.SIGINT})
_WAITED = _STOP | {signal.SIGCHLD}


def _child_setup() -> None:
    """In the gateway child, before exec: the stand-in's blocked signals unblocked (a
    signal mask survives exec), and SIGTERM when the stand-in dies, even by SIGKILL, so
    that no gateway outlives a killed test run (Linux prctl PR_SET_PDEATHSIG)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _WAITED)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _take_signals() -> None:
    """From here on SIGTERM, SIGINT and SIGCHLD wait for `signal.sigwait` (in this thread
    and every thread started after). SIGCHLD gets a handler: a blocked signal whose action
    is to be ignored could be discarded instead of kept pending."""
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)


def _relay(
    child: subprocess.Popen[bytes],
    out: _StderrWriter,
    name: str,
    on_listening: Callable[[dict[str, str]], None] | None,
    expected: int,
) -> None:
    """The gateway's stderr, with nsqd's `listening on` lines added (a thread of its own)."""
    addresses: dict[str, str] = {}
    assert child.stderr is not None
    for raw in child.stderr:
        out.write(raw)
        match = _LISTENING.match(raw.decode("utf-8", "replace").strip())
        if match is None:
            continue
        protocol = match["protocol"]
        if protocol in addresses:
            continue  # a listener bound on several addresses: nsqd logs one
        addresses[protocol] = match["address"]
        if protocol in _PROTOCOLS and not (name == "nsqlookupd" and protocol == "https"):
            out.write(_log_line(name, f"{_PROTOCOLS[protocol]}: listening on {match['address']}"))
        if on_listening is not None and len(addresses) == expected:
            on_listening(addresses)


def run_gateway(
    name: str,
    args: list[str],
    env: dict[str, str],
    on_listening: Callable[[dict[str, str]], None] | None = None,
    expected: int = 0,
) -> int:
    """Run `gateway serve ARGS`, forwarding its stderr with nsqd's `listening on` lines
    added; `on_listening(addresses)` once `expected` listeners are up. Its exit code."""
    _take_signals()  # before the child exists: a stop that comes first is kept for it
    cmd = [sys.executable, "-m", "gateway", "serve", *args]
    # started before any thread: preexec_fn runs in the forked child
    child = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, preexec_fn=_child_setup
    )
    out = _StderrWriter(sys.stderr.buffer)
    out.write(_log_line(name, "gateway stand-in: " + " ".join(cmd)))
    relay = threading.Thread(
        target=_relay, args=(child, out, name, on_listening, expected), daemon=True
    )
    relay.start()
    try:
        while child.poll() is None:
            # a timeout too: a SIGCHLD merged with another is not missed for long
            signum = signal.sigtimedwait(_WAITED, 1.0)
            if signum is not None and signum.si_signo in _STOP:
                child.send_signal(signum.si_signo)
        relay.join(timeout=10)
        return child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        out.close()


def _gateway_env(broadcast: str | None) -> dict[str, str]:
    # the caller's GATEWAY_* settings are not nsqd's flags: none of them applies here
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    if broadcast:
        env["GATEWAY_NSQD__BROADCAST_ADDRESS"] = broadcast
    return env


def _off() -> list[str]:
    return [arg for listener in _OTHER_LISTENERS for arg in (f"--{listener}", "off")]


def nsqd(flags: dict[str, list[str]]) -> int:
    lookupds = sorted(set(flags.get("lookupd-tcp-address", [])))
    if len(lookupds) > 1:
        print(f"nsqd stand-in: one gateway cannot register with {lookupds}", file=sys.stderr)
        return 1
    if lookupds:
        return _registered_nsqd(lookupds[0])
    cert, key = _last(flags, "tls-cert", ""), _last(flags, "tls-key", "")
    args = [
        "--nsq",
        _last(flags, "tcp-address", "0.0.0.0:4150"),
        "--http",
        _last(flags, "http-address", "0.0.0.0:4151"),
        # nsqd serves --https-address only with a certificate
        "--https",
        _last(flags, "https-address", "0.0.0.0:4152") if cert else "off",
        "--data-dir",
        _last(flags, "data-path", "") or os.getcwd(),
        *_off(),
    ]
    if cert or key:
        args += ["--tls-cert", cert, "--tls-key", key]
    return run_gateway("nsqd", args, _gateway_env(_last(flags, "broadcast-address", "")))


def _registered_nsqd(lookupd: str) -> int:
    """An nsqd registered with an nsqlookupd stand-in: that stand-in's gateway."""
    _take_signals()
    path = _registry_file(lookupd)
    try:
        addresses = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"nsqd stand-in: no nsqlookupd stand-in at {lookupd} ({e})", file=sys.stderr)
        return 1
    print(f"nsqd stand-in: registered with {lookupd}: its gateway", file=sys.stderr)
    for listener in ("nsq", "http", "https"):
        if listener in addresses:
            line = f"{_PROTOCOLS[listener]}: listening on {addresses[listener]}"
            sys.stderr.buffer.write(_log_line("nsqd", line))
    sys.stderr.flush()
    while signal.sigtimedwait(_STOP, 1.0) is None:
        if not path.exists():  # the lookupd (and so this nsqd) is gone
            return 1
    return 0


def nsqlookupd(flags: dict[str, list[str]]) -> int:
    import trustme  # the gateway's NSQ listener offers TLS, as an nsqd registered here would

    tcp = _last(flags, "tcp-address", "0.0.0.0:4160")
    http = _last(flags, "http-address", "0.0.0.0:4161")
    host = tcp.rpartition(":")[0] or "127.0.0.1"
    work = Path(tempfile.mkdtemp(prefix="gnsq-lookupd-"))
    ca = trustme.CA()
    ca.issue_cert(host, "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(work / "server.pem")
    )
    args = [
        "--nsq",
        tcp,
        "--http",
        http,
        "--https",
        f"{host}:0",
        "--store",
        "memory://",
        "--tls-cert",
        str(work / "server.pem"),
        "--tls-key",
        str(work / "server.pem"),
        *_off(),
    ]
    registered: list[Path] = []

    def register(addresses: dict[str, str]) -> None:
        # keyed by the address gnsq gives nsqd: the TCP address this lookupd logged
        path = _registry_file(addresses["nsq"])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(addresses))
        tmp.rename(path)
        registered.append(path)

    try:
        env = _gateway_env(_last(flags, "broadcast-address", ""))
        return run_gateway("nsqlookupd", args, env, on_listening=register, expected=3)
    finally:
        for path in registered:
            path.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def main(name: str, argv: Sequence[str]) -> int:
    known = _NSQD_FLAGS if name == "nsqd" else _LOOKUPD_FLAGS
    try:
        flags = parse_flags(argv, known)
    except FlagError as e:
        print(f"{name} stand-in: {e}", file=sys.stderr)
        print(f"flags: {', '.join('-' + f for f in known)}", file=sys.stderr)
        return 2
    if _true(flags, "version"):
        # the form gnsq parses: NAME vX.Y.Z (built w/GO_VERSION)
        print(f"{name} v{NSQD_VERSION} (built w/mq-gateway-{GATEWAY_VERSION})")
        return 0
    return nsqd(flags) if name == "nsqd" else nsqlookupd(flags)
