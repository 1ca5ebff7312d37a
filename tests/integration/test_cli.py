"""The command-line contract (README.md, Running it), on a real `gateway` process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
import trio
import trustme

from gateway import config
from tests.helpers import be32
from tests.integration.test_tls import issue

REPO = Path(__file__).resolve().parents[2]


def gateway_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway", *args]


def run_gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gateway ARGS...` to its end (a command that fails at start), text output kept."""
    return subprocess.run(
        gateway_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=20, env=env
    )


_WITH_OPEN_FILES = (
    "import os, resource, sys;"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])));"
    "os.execv(sys.argv[3], sys.argv[3:])"
)


async def _start(
    *args: str,
    env: dict[str, str] | None = None,
    marker: bytes = b"listening protocol=",
    seen: list[str] | None = None,
    open_files: tuple[int, int] | None = None,
) -> tuple[trio.Process, str]:
    """Start `gateway serve ...` and return it with the first line holding `marker` (every
    line read until then goes to `seen`). Unless the arguments name a store, the durable
    store goes to a fresh directory, never to the repository's ./data."""
    if "--store" not in args and "--data-dir" not in args:
        args = (*args, "--data-dir", tempfile.mkdtemp(prefix="gateway-cli-"))
    command = gateway_cmd("serve", *args)
    if open_files is not None:
        # the limits set in a Python that then becomes the gateway (exec keeps them)
        command = [sys.executable, "-c", _WITH_OPEN_FILES, *map(str, open_files), *command]
    proc = await trio.lowlevel.open_process(
        command, stderr=subprocess.PIPE, cwd=REPO, env={**os.environ, **(env or {})}
    )
    assert proc.stderr is not None
    buf = b""
    with trio.fail_after(20):
        while marker not in buf or not buf.endswith(b"\n"):
            chunk = await proc.stderr.receive_some(4096)
            assert chunk, f"gateway exited: {buf.decode()}"
            buf += chunk
    line = next(ln for ln in buf.decode().splitlines() if marker.decode() in ln)
    if seen is not None:
        seen.extend(buf.decode().splitlines())
    return proc, line


async def _stop(proc: trio.Process) -> int:
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(20):
        return await proc.wait()


async def test_port_zero_prints_the_real_address_and_sigterm_exits_zero() -> None:
    proc, line = await _start(
        "--nsq",
        "127.0.0.1:0",
        "--http",
        "off",
        "--beanstalk",
        "off",
        "--nats",
        "off",
        "--nats-route",
        "off",
        "--rocketmq",
        "off",
        "--store",
        "memory://",
    )
    try:
        assert line.startswith("listening protocol=nsq address=127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        assert port > 0
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"  V2PUB cli_t\n" + be32(2) + b"hi")
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
        await stream.aclose()
    finally:
        assert await _stop(proc) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    """Issue 27: `GATEWAY_NSQ=127.0.0.1:A gateway serve --nsq 127.0.0.1:B` bound A without a
    word. The flag's port is bound, the environment's message size beats the file's, and
    the log names each setting the sources disagree on."""
    flag_port, env_port, file_port = _free_port(), _free_port(), _free_port()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'nsq = "127.0.0.1:{file_port}"\n[nsqd]\nmax_msg_size = 5\n')
    seen: list[str] = []
    proc, line = await _start(
        "--config",
        str(cfg),
        "--nsq",
        f"127.0.0.1:{flag_port}",
        env={
            "GATEWAY_NSQ": f"127.0.0.1:{env_port}",
            "GATEWAY_NSQD__MAX_MSG_SIZE": "3",
            "GATEWAY_BEANSTALK": "off",
            "GATEWAY_HTTP": "off",
            "GATEWAY_NATS": "off",
            "GATEWAY_NATS_ROUTE": "off",
            "GATEWAY_ROCKETMQ": "off",
        },
        seen=seen,
    )
    try:
        assert line == f"listening protocol=nsq address=127.0.0.1:{flag_port}"
        stream = await trio.open_tcp_stream("127.0.0.1", flag_port)
        await stream.send_all(b"  V2PUB cli_t\n" + be32(4) + b"four")
        with trio.fail_after(5):
            reply = await stream.receive_some(100)
        assert reply.endswith(b"E_BAD_MESSAGE PUB message too big 4 > 3")
        await stream.aclose()
        sources = [ln.split(" gateway.config: ", 1)[1] for ln in seen if " gateway.config: " in ln]
        assert sources == [
            f"nsq = 127.0.0.1:{flag_port} from --nsq (overrides GATEWAY_NSQ=127.0.0.1:{env_port}"
            f" and 127.0.0.1:{file_port} in {cfg})",
            f"nsqd.max_msg_size = 3 from GATEWAY_NSQD__MAX_MSG_SIZE (overrides 5 in {cfg})",
        ], seen
    finally:
        assert await _stop(proc) == 0


def test_check_config_reads_the_environment_and_names_what_it_changes(tmp_path: Path) -> None:
    """What `serve --config FILE` would run: the file with GATEWAY_* over it. A setting the
    environment changes is one line; a bad value from it names the variable."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text('nsq = "127.0.0.1:4150"\n[broker]\nmax_attempts = 5\n')
    env = {**os.environ, "GATEWAY_NSQ": "0.0.0.0:4150", "GATEWAY_BROKER__MAX_ATTEMPTS": "5"}
    result = run_gateway("check-config", str(cfg), env=env)
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines() == [
        f"{cfg}: nsq = 0.0.0.0:4150 from GATEWAY_NSQ (overrides 127.0.0.1:4150 in {cfg})",
        f"{cfg}: ok",
    ]
    result = run_gateway("check-config", str(cfg), env={**env, "GATEWAY_NATS": "nowhere"})
    assert result.returncode == 1
    assert (
        "GATEWAY_NATS: address must be host:port or 'off', got 'nowhere'"
        in result.stdout.splitlines()
    ), result.stdout


async def test_off_disables_a_listener() -> None:
    proc, line = await _start(
        "--nsq",
        "off",
        "--http",
        "off",
        "--beanstalk",
        "off",
        "--nats",
        "off",
        "--nats-route",
        "off",
        "--rocketmq",
        "off",
        "--store",
        "memory://",
        marker=b"ready:",
    )
    try:
        assert line.endswith("ready: no listener")
    finally:
        assert await _stop(proc) == 0


async def test_every_listener_reports_its_port() -> None:
    proc, line = await _start(
        "--nsq",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--beanstalk",
        "127.0.0.1:0",
        "--nats",
        "127.0.0.1:0",
        "--nats-route",
        "127.0.0.1:0",
        "--rocketmq",
        "127.0.0.1:0",
        "--store",
        "memory://",
        marker=b"ready:",
    )
    try:
        for name in ("nsq", "http", "beanstalk", "nats", "nats-route", "rocketmq"):
            assert f"{name}=127.0.0.1:" in line, line
        port = int(line.split("beanstalk=127.0.0.1:")[1].split(",")[0])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"list-tube-used\r\n")
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b"USING default\r\n"
        await stream.aclose()
        port = int(line.split("nats=127.0.0.1:")[1].split(",")[0])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(5):
            assert (await stream.receive_some(4096)).startswith(b"INFO {")
        await stream.aclose()
        port = int(line.split("http=127.0.0.1:")[1].split(",")[0])
        async with httpx.AsyncClient() as client:
            reply = await client.get(f"http://127.0.0.1:{port}/ping")
        assert (reply.status_code, reply.text) == (200, "OK")
    finally:
        assert await _stop(proc) == 0


async def test_connections_past_a_low_open_files_soft_limit_are_served() -> None:
    # nsqd and nats-server do this at start (the Go runtime); with a soft limit of 64 the
    # gateway stopped accepting past about 40 connections while they stayed open
    proc, line = await _start(
        *("--nsq", "off", "--http", "off", "--beanstalk", "off", "--nats", "127.0.0.1:0"),
        *("--nats-route", "off", "--rocketmq", "off", "--store", "memory://"),
        open_files=(64, 1024),  # a soft limit far below the hard one, as services get
    )
    streams: list[trio.SocketStream] = []
    try:
        port = int(line.rsplit(":", 1)[1])
        with trio.fail_after(10):
            for _ in range(150):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                streams.append(stream)
                assert (await stream.receive_some(4096)).startswith(b"INFO {")
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        assert "Max open files            1024                 1024" in limits, limits
    finally:
        for stream in streams:
            await stream.aclose()
        assert await _stop(proc) == 0


async def test_sigusr1_turns_on_beanstalkd_drain_mode() -> None:
    proc, line = await _start(
        "--nsq",
        "off",
        "--http",
        "127.0.0.1:0",
        "--beanstalk",
        "127.0.0.1:0",
        "--nats",
        "off",
        "--nats-route",
        "off",
        "--rocketmq",
        "off",
        "--store",
        "memory://",
        marker=b"ready:",
    )
    try:
        ready = f"http://127.0.0.1:{line.split('http=127.0.0.1:')[1].split(',')[0]}/ready"
        async with httpx.AsyncClient() as client:
            assert (await client.get(ready)).status_code == 200
        port = int(line.split("beanstalk=127.0.0.1:")[1].split(",")[0])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"put 0 0 10 1\r\nx\r\n")
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b"INSERTED 1\r\n"
        proc.send_signal(signal.SIGUSR1)
        with trio.fail_after(5):
            while True:
                await stream.send_all(b"put 0 0 10 1\r\nx\r\n")
                reply = await stream.receive_some(100)
                if reply == b"DRAINING\r\n":
                    break
                assert reply.startswith(b"INSERTED")
        await stream.aclose()
        # a draining sidecar is alive but takes no new work
        async with httpx.AsyncClient() as client:
            reply = await client.get(ready)
            assert (reply.status_code, reply.text) == (503, "NOT READY - draining")
            assert (await client.get(ready.replace("/ready", "/health"))).status_code == 200
    finally:
        assert await _stop(proc) == 0


def test_check_config_reports_every_error_at_once(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'nsq = "nowhere"\nlog_level = "loud"\nunknown_key = 1\n'
        "[nsqd]\nmsg_timeout = 5\nmax_rdy_count = 0\n"
    )
    result = subprocess.run(
        gateway_cmd("check-config", str(bad)), cwd=REPO, capture_output=True, text=True, timeout=20
    )
    assert result.returncode == 1
    out = result.stdout
    for where in ("nsq:", "log_level:", "unknown_key:", "nsqd.msg_timeout:", "nsqd.max_rdy_count:"):
        assert where in out, out
    assert "5 error(s)" in out


def test_the_example_config_is_valid() -> None:
    result = subprocess.run(
        gateway_cmd("check-config", "config/gateway.example.toml"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().endswith(": ok")


def test_a_bad_flag_is_a_config_error() -> None:
    result = subprocess.run(
        gateway_cmd("serve", "--nsq", "127.0.0.1:99999"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2
    assert "config error: --nsq: " in result.stderr


@pytest.mark.parametrize("listener", ["nsq", "http", "nats-route", "rocketmq"])
def test_a_port_in_use_is_one_line_and_exit_1(listener: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        names = ("nsq", "http", "beanstalk", "nats", "nats-route", "rocketmq")
        flags = {name: "off" for name in names}
        flags[listener] = f"127.0.0.1:{port}"
        argv = [item for name, value in flags.items() for item in (f"--{name}", value)]
        result = subprocess.run(
            gateway_cmd("serve", *argv, "--store", "memory://"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=20,
        )
    assert result.returncode == 1
    # one line naming the listener and its address
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {listener} listener 127.0.0.1:{port}: Address already in use"]
    assert "Traceback" not in result.stderr


def test_an_unsupported_store_url_is_one_config_error_naming_the_setting(tmp_path: Path) -> None:
    for argv in (
        gateway_cmd("serve", "--store", "ftp://relative.db"),
        gateway_cmd("serve", "--store", "redis+nope://x"),
    ):
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=20)
        assert result.returncode == 2
        assert result.stderr.startswith("config error: --store: unsupported URL"), result.stderr
        assert "Traceback" not in result.stderr
    config = tmp_path / "bad-store.toml"
    config.write_text('store = "sqlite:x.db"\n')
    result = subprocess.run(
        gateway_cmd("check-config", str(config)), cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert f"{config}:store: unsupported URL 'sqlite:x.db'" in result.stdout


def test_a_missing_tls_file_is_named(tmp_path: Path) -> None:
    result = run_gateway(
        *("serve", "--store", "memory://", "--nsq", "127.0.0.1:0"),
        *("--tls-cert", str(tmp_path / "no.pem"), "--tls-key", str(tmp_path / "no.key")),
    )
    assert result.returncode == 1
    assert f"error: tls_cert {tmp_path / 'no.pem'}: No such file or directory" in result.stderr


def test_a_wrong_flag_after_serve_prints_serves_usage() -> None:
    result = subprocess.run(
        gateway_cmd("serve", "--bogus"), cwd=REPO, capture_output=True, text=True, timeout=20
    )
    assert result.returncode == 2
    assert result.stderr.startswith("usage: gateway serve ")
    assert "unrecognized arguments: --bogus" in result.stderr


def test_settings_check_config_passed_do_not_fail_serve_with_a_traceback(tmp_path: Path) -> None:
    """Found by a review: nats_routing.advertise was checked only when serve built the
    gateway (a traceback), and a bad nats_routing.tls_ca gave an error naming neither."""
    bad_advertise = tmp_path / "advertise.toml"
    bad_advertise.write_text('[nats_routing]\nadvertise = "not-an-address"\n')
    result = subprocess.run(
        gateway_cmd("check-config", str(bad_advertise)), cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 1 and "nats_routing.advertise" in result.stdout, result.stdout
    cert, key = issue(trustme.CA(), tmp_path, "route")  # a pair for the route's TLS
    missing_ca = tmp_path / "nope-ca.pem"
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[nats_routing]\ntls = true\ntls_ca = "{missing_ca}"\n')
    off = [a for name in ("http", "beanstalk", "nats", "rocketmq") for a in (f"--{name}", "off")]
    result = run_gateway(
        *("serve", "--config", str(routes), "--store", "memory://", "--nsq", "127.0.0.1:0"),
        *("--nats-route", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)),
        *off,
    )
    assert result.returncode == 1, result.stderr
    assert f"error: nats_routing.tls_ca {missing_ca}: not a usable CA file" in result.stderr
    assert "Traceback" not in result.stderr


def test_environment_names_read_as_the_files_keys_and_typos_are_errors() -> None:
    """GATEWAY_HTTP__ADDRESS and GATEWAY_TLS__CERT/KEY are [http] address and [tls]
    cert/key, as the README's __ rule says; they were dropped without a word, and so was
    a misspelt GATEWAY_<SECTION>__<KEY> (an error in a file)."""
    settings = config.load(None, environ={"GATEWAY_HTTP__ADDRESS": "127.0.0.1:0"})
    assert settings.http == "127.0.0.1:0"
    tls = {"GATEWAY_TLS__CERT": "c.pem", "GATEWAY_TLS__KEY": "k.pem"}
    settings = config.load(None, environ=tls)
    assert (settings.tls_cert, settings.tls_key) == ("c.pem", "k.pem")
    env = {**os.environ, "GATEWAY_NSQD__MAX_MSG_SIZ": "5"}
    result = run_gateway("serve", "--store", "memory://", env=env)
    assert result.returncode == 2
    assert "config error: GATEWAY_NSQD__MAX_MSG_SIZ: no such setting" in result.stderr


def test_a_file_where_a_directory_belongs_is_named_as_such(tmp_path: Path) -> None:
    """A data dir or an archive.dir that is a file: 'not a directory', naming the
    setting, where it said 'File exists' (and nothing about which setting); and a TOML
    error names its file once."""
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    listeners = ("http", "beanstalk", "nats", "nats-route", "rocketmq")
    off = [a for name in listeners for a in (f"--{name}", "off")]
    result = run_gateway("serve", "--data-dir", str(afile), "--nsq", "127.0.0.1:0", *off)
    assert result.returncode == 1
    assert f"error: data dir {afile}: not a directory" in result.stderr, result.stderr
    archive = tmp_path / "archive.toml"
    archive.write_text(f'[archive]\nenabled = true\ndir = "{afile}"\n')
    result = run_gateway(
        "serve", "--config", str(archive), "--store", "memory://", "--nsq", "127.0.0.1:0", *off
    )
    assert result.returncode == 1
    assert f"error: archive.dir {afile}: not a directory" in result.stderr, result.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("nsq = [\n")
    result = run_gateway("check-config", str(bad))
    assert result.stdout.count(str(bad)) == 1, result.stdout
