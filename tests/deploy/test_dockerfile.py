"""The Dockerfile: hadolint finds no error, and the image has what issue 13 asks of it
(multi-stage, non-root, every port exposed, listeners on 0.0.0.0, the data dir a volume,
`gateway serve` as the entrypoint), set in its config file so that flags and the
environment override them (issue 27). The image itself is not built here (no container
engine); tests/deploy/test_image_install.py runs what it installs."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from gateway import config
from tests.deploy.support import (
    DOCKERFILE,
    ROOT,
    dockerfile_stages,
    dockerignore_patterns,
    env_pairs,
    in_build_context,
    run_tool,
)

# every default listener port (gateway/config.py): NSQ, HTTP, HTTPS, beanstalkd, NATS, NATS
# route, RocketMQ
DEFAULT_PORTS = {4150, 4151, 4152, 11300, 4222, 6222, 9876}
# the listener settings inside the container and the port each one defaults to
LISTENERS = {
    "nsq": 4150,
    "http": 4151,
    "https": 4152,
    "beanstalk": 11300,
    "nats": 4222,
    "nats_route": 6222,
    "rocketmq": 9876,
}
DATA_DIR = "/var/lib/gateway"


def _image_env() -> dict[str, str]:
    _, final = dockerfile_stages()
    return dict(pair for args in final.all("ENV") for pair in env_pairs(args))


def _image_config() -> Path:
    """The repository file the final stage copies to where GATEWAY_CONFIG points."""
    _, final = dockerfile_stages()
    copies = {shlex.split(args)[-1]: shlex.split(args)[0] for args in final.all("COPY")}
    return ROOT / copies[_image_env()["GATEWAY_CONFIG"]]


def _hadolint(text: str) -> tuple[int, str]:
    result = run_tool("hadolint", "--no-color", "--failure-threshold", "error", "-", stdin=text)
    return result.returncode, result.stdout + result.stderr


def test_hadolint_finds_no_error() -> None:
    status, output = _hadolint(DOCKERFILE.read_text())
    assert status == 0, output


def test_hadolint_is_really_checking() -> None:
    # DL3004 (sudo) is an error-level finding: the same call fails on it
    status, output = _hadolint("FROM debian:12\nRUN sudo true\n")
    assert status != 0 and "DL3004" in output, output


def test_two_stages_and_no_compiler_in_the_final_one() -> None:
    build, final = dockerfile_stages()
    assert build.name == "build"
    assert build.base == final.base and re.fullmatch(r"python:3\.\d+-slim-\w+", final.base)
    assert any("pip wheel" in run for run in build.all("RUN"))
    runs = " ".join(final.all("RUN"))
    assert "from=build" in runs and "--no-index" in runs  # installed from stage 1's wheels only
    for compiler in ("gcc", "build-essential", "apt-get install", "g++", "rustc"):
        assert compiler not in runs
    # nothing but the wheels (a bind mount) and the image's config file
    assert final.all("COPY") == ["config/image.toml /opt/gateway/etc/gateway.toml"]


def test_runs_as_a_non_root_user() -> None:
    _, final = dockerfile_stages()
    (user,) = final.all("USER")
    uid = user.split(":")[0]
    # numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd
    assert uid.isdigit() and int(uid) != 0, user
    assert f"--uid {uid}" in " ".join(final.all("RUN"))


def test_exposes_every_default_port() -> None:
    _, final = dockerfile_stages()
    exposed = {int(port.split("/")[0]) for args in final.all("EXPOSE") for port in args.split()}
    assert exposed == DEFAULT_PORTS


def test_listeners_bind_every_interface() -> None:
    settings = config.load(_image_config(), environ={})
    for name, port in LISTENERS.items():
        assert getattr(settings, name) == f"0.0.0.0:{port}", name


def test_the_image_sets_its_defaults_in_its_config_file_not_its_environment() -> None:
    """Issue 27: GATEWAY_NSQ=... in the image's ENV beat every config file a user mounted
    (and, before flags won over the environment, `docker run IMAGE --nats off` too)."""
    env = _image_env()
    assert sorted(k for k in env if k.startswith("GATEWAY_")) == ["GATEWAY_CONFIG"]
    # the image as it starts: its file, found through GATEWAY_CONFIG (here, the repository's
    # copy), then `docker run -e GATEWAY_NATS_ROUTE=off IMAGE --nats off`
    env = {**env, "GATEWAY_CONFIG": str(_image_config()), "GATEWAY_NATS_ROUTE": "off"}
    settings = config.load(None, {"nats": "off"}, env)
    assert (settings.nats, settings.nats_route) == ("off", "off")
    assert (settings.nsq, settings.data_dir) == ("0.0.0.0:4150", DATA_DIR)


def test_the_data_dir_is_a_volume() -> None:
    _, final = dockerfile_stages()
    assert config.load(_image_config(), environ={}).data_dir == DATA_DIR
    volumes = [v for args in final.all("VOLUME") for v in json.loads(args)]
    assert volumes == [DATA_DIR]
    assert f"chown gateway:gateway {DATA_DIR}" in " ".join(final.all("RUN"))


def test_entrypoint_is_gateway_serve_stopped_by_sigterm() -> None:
    _, final = dockerfile_stages()
    # exec form: the gateway is PID 1 and receives SIGTERM itself (no shell in between)
    assert [json.loads(a) for a in final.all("ENTRYPOINT")] == [["gateway", "serve"]]
    assert final.all("STOPSIGNAL") == ["SIGTERM"]


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    patterns = dockerignore_patterns()
    build, _ = dockerfile_stages()
    for args in build.all("COPY"):
        for source in args.split()[:-1]:
            assert in_build_context(source, patterns), source
    kept_out = (
        ".venv/bin/python",
        ".git/HEAD",
        "data/x",
        "tests/helpers.py",
        "tests/clients/node/node_modules/x",
        "gateway/__pycache__/app.cpython-311.pyc",
    )
    for path in kept_out:
        assert not in_build_context(path, patterns), path
