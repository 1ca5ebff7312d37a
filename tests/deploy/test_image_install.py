"""What the image runs, without a container engine: the Dockerfile's own commands, read from
the Dockerfile, run in a temporary directory that stands in for the image's filesystem.

* the build context is what .dockerignore lets through;
* stage 1's COPY and RUN lines build the wheels;
* the final stage's RUN lines make a fresh venv from those wheels alone (the user-creation
  line is the one skipped: it needs root and changes this machine);
* `gateway serve` (the ENTRYPOINT, found on the image's PATH) starts with the image's ENV
  and the config file the final stage copies in, every listener answers on the address
  that file gives it, and SIGTERM stops it with exit status 0 within 10 s;
* `docker run IMAGE --nats off` turns the NATS listener off (issue 27: the image's ENV
  used to beat such flags).

The image's paths (/src, /wheels, /opt/gateway, /var/lib/gateway) map to the temporary
directory, and the listeners' fixed ports to port 0 (this machine runs other tests at the
same time): the host part, 0.0.0.0, is kept and checked.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

from tests.deploy.support import copy_build_context, dockerfile_stages, env_pairs, expand

# the image's own directories, each mapped into the test's temporary directory
IMAGE_PATHS = ("/src", "/wheels", "/opt/gateway", "/var/lib/gateway")
# RUN lines that set up the image's user: they need root and change this machine
SKIPPED_RUN = re.compile(r"^(groupadd|useradd) ")
# listener setting -> the protocol name of its `listening` line
LISTENERS = {
    "nsq": "nsq",
    "http": "http",
    "beanstalk": "beanstalk",
    "nats": "nats",
    "nats_route": "nats-route",
    "rocketmq": "rocketmq",
}
STOP_WITHIN = 10.0  # seconds from SIGTERM to exit (issue 13)


class Image:
    """The stand-in filesystem: image paths -> paths under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def map(self, text: str) -> str:
        def one(match: re.Match[str]) -> str:
            path = match[0]
            if not any(path == p or path.startswith(p + "/") for p in IMAGE_PATHS):
                raise AssertionError(f"{path}: an image path this test does not map")
            return str(self.path(path))

        return re.sub(r"(?<![\w.$])/[\w./-]*\w", one, text)


def _python_dir(tmp: Path) -> Path:
    """A directory whose `python` is this interpreter's base (no venv, no project
    packages): what the python:3.x-slim base image puts on the PATH."""
    bin_dir = tmp / "python-bin"
    bin_dir.mkdir()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(sys.base_prefix) / "bin" / version
    assert base.is_file(), base
    (bin_dir / "python").symlink_to(base)
    return bin_dir


def _run(command: str, cwd: Path, env: dict[str, str]) -> None:
    result = subprocess.run(
        ["/bin/sh", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"


def _strip_mounts(args: str, image: Image, stages: set[str]) -> tuple[str, Path | None]:
    """`--mount=type=bind,from=build,source=/wheels,target=/wheels cmd` -> (cmd, where the
    target is). A bind mount from a stage: the stand-in path is shared, so it is there."""
    mounted = None
    while args.startswith("--mount="):
        option, _, args = args.partition(" ")
        fields = dict(kv.split("=", 1) for kv in option[len("--mount=") :].split(","))
        assert fields["type"] == "bind" and fields["from"] in stages, option
        assert fields["source"] == fields["target"], "a mount keeps its path"
        mounted = image.path(fields["target"])
        args = args.lstrip()
    return args, mounted


def _install(tmp: Path) -> tuple[Image, dict[str, str], list[str], str]:
    """Run the Dockerfile's build; return the stand-in image, its environment, the
    entrypoint argv and its working directory."""
    image = Image(tmp / "image")
    context = tmp / "context"
    copy_build_context(context)
    build, final = dockerfile_stages()
    assert build.name
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "VIRTUAL"))}
    base_env["PATH"] = f"{_python_dir(tmp)}:{base_env.get('PATH', '/usr/bin:/bin')}"
    # stage 1: the wheels
    workdir = image.root
    for instruction in build.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = Path(image.map(instruction.args))
            workdir.mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY":
            *sources, dest = shlex.split(instruction.args)
            for source in sources:
                target = workdir / dest
                if dest.endswith("/"):
                    target = target / Path(source).name
                if (context / source).is_dir():
                    shutil.copytree(context / source, target)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(context / source, target)
        elif instruction.keyword == "RUN":
            _run(image.map(instruction.args), workdir, base_env)
        else:
            raise AssertionError(f"stage {build.name}: {instruction.keyword} is not emulated")
    # the final stage: the venv, the environment, the entrypoint
    env = dict(base_env)
    workdir = image.root
    entrypoint: list[str] = []
    cmd: list[str] = []
    ran = 0
    for instruction in final.instructions:
        keyword, args = instruction.keyword, instruction.args
        if keyword == "RUN":
            if SKIPPED_RUN.match(args):
                continue
            command, mounted = _strip_mounts(args, image, {build.name})
            assert mounted is None or mounted.is_dir(), mounted
            _run(image.map(command), workdir, env)
            ran += 1
        elif keyword == "COPY":
            # a file of the build context into the image (the image's config file)
            source, dest = shlex.split(args)
            target = image.path(dest)
            target.parent.mkdir(parents=True, exist_ok=True)  # as COPY makes it
            shutil.copy2(context / source, target)
        elif keyword == "ENV":
            for key, value in env_pairs(args):
                env[key] = expand(image.map(value), env)
        elif keyword == "WORKDIR":
            workdir = Path(image.map(args))
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "VOLUME":
            for volume in json.loads(args):
                image.path(volume).mkdir(parents=True, exist_ok=True)
        elif keyword == "ENTRYPOINT":
            entrypoint = json.loads(args)
        elif keyword == "CMD":
            cmd = json.loads(args)
        else:
            # EXPOSE, USER, STOPSIGNAL, LABEL: nothing to run (test_dockerfile checks them)
            assert keyword in ("EXPOSE", "USER", "STOPSIGNAL", "LABEL"), keyword
    assert ran, "the final stage installed nothing"
    return image, env, entrypoint + cmd, str(workdir)


def _listening(log: Path, proc: subprocess.Popen[bytes]) -> dict[str, tuple[str, int]]:
    """protocol -> (host, port), from the `listening` lines, once the gateway is ready."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if " ready: " in text or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the gateway exited: {log.read_text()}"
    assert " ready: " in text, text
    found = re.findall(r"^listening protocol=(\S+) address=(\S+):(\d+)$", text, re.M)
    return {protocol: (host, int(port)) for protocol, host, port in found}


def _exchange(port: int, send: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        if send:
            sock.sendall(send)
        return sock.recv(4096)


def test_the_image_install_serves_on_every_listener_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    image, env, argv, workdir = _install(tmp_path)
    executable = shutil.which(argv[0], path=env["PATH"])
    # the entrypoint is the venv's script, not some other `gateway` on this machine's PATH
    assert executable == str(image.path("/opt/gateway/bin") / argv[0]), executable
    # the image's settings are its config file, not its environment (issue 27)
    assert not {k for k in env if k.startswith("GATEWAY_")} - {"GATEWAY_CONFIG"}, env
    image_config = Path(env["GATEWAY_CONFIG"])
    settings = tomllib.loads(image_config.read_text())
    assert settings["data_dir"] == "/var/lib/gateway"  # the image's volume
    expected = {}
    for name, protocol in LISTENERS.items():
        host, _, port = settings[name].rpartition(":")
        assert host == "0.0.0.0", (name, settings[name])
        expected[protocol] = int(port)
        settings[name] = f"{host}:0"
    # the stand-in: paths mapped, ports 0; the file is flat (top-level strings), so it is
    # written back as it was read
    settings["data_dir"] = image.map(settings["data_dir"])
    image_config.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    log = tmp_path / "gateway.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [executable, *argv[1:]], cwd=workdir, env=env, stderr=stderr, stdin=subprocess.DEVNULL
        )
    try:
        listening = _listening(log, proc)
        assert set(listening) == set(expected), listening
        assert {host for host, _ in listening.values()} == {"0.0.0.0"}
        ports = {protocol: port for protocol, (_, port) in listening.items()}
        nsq = _exchange(ports["nsq"], b"  V2PUB image_t\n\x00\x00\x00\x02hi")
        assert nsq == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
        assert _exchange(ports["beanstalk"], b"list-tube-used\r\n") == b"USING default\r\n"
        assert _exchange(ports["nats"], b"").startswith(b"INFO {")
        # a client CONNECT on the route port is refused, in the route protocol's words
        route = _exchange(ports["nats-route"], b'CONNECT {"lang":"python"}\r\n')
        assert route.startswith(b"-ERR"), route
        # RocketMQ remoting: an unknown request code gets REQUEST_CODE_NOT_SUPPORTED (3)
        # with the request's opaque
        header = json.dumps({"code": 99999, "language": "JAVA", "version": 0, "opaque": 7,
                             "flag": 0, "extFields": {}}).encode()  # fmt: skip
        reply = _exchange(ports["rocketmq"], struct.pack(">ii", 4 + len(header), len(header))
                          + header)  # fmt: skip
        answer = json.loads(reply[8 : 8 + (struct.unpack(">i", reply[4:8])[0] & 0xFFFFFF)])
        assert (answer["code"], answer["opaque"]) == (3, 7), answer
        base = f"http://127.0.0.1:{ports['http']}"
        for path in ("/health", "/ready", "/ping"):
            with urllib.request.urlopen(base + path, timeout=5) as reply:
                assert (reply.status, reply.read()) == (200, b"OK"), path
        with urllib.request.urlopen(base + "/metrics", timeout=5) as reply:
            assert b'gateway_messages_published_total{protocol="nsq",topic="image_t"} 1.0' in (
                reply.read()
            )
        # the data dir is the image's volume, not ./data
        assert (image.path("/var/lib/gateway") / "gateway.db").is_file()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=STOP_WITHIN)
        assert time.monotonic() - started < STOP_WITHIN
        assert status == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # `docker run IMAGE --nats off`: the flag beats the image's config file
    log = tmp_path / "gateway-nats-off.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [executable, *argv[1:], "--nats", "off"],
            cwd=workdir,
            env=env,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
    try:
        assert set(_listening(log, proc)) == set(expected) - {"nats"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_WITHIN) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
