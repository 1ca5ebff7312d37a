"""config/*.toml: every example passes `gateway check-config`; a broken one fails naming the
key's path; the environment overrides an example, and a flag both, as the files' comments
say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway import config
from tests.deploy.support import ROOT

EXAMPLES = sorted((ROOT / "config").glob("*.toml"))


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_the_deployment_shapes_have_examples() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"sidecar.toml", "bridge.toml", "nats-cluster.toml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_check_config(path: Path) -> None:
    result = _check_config(path)
    assert (result.returncode, result.stdout) == (0, f"{path}: ok\n"), result.stderr


def test_a_broken_example_fails_with_each_key_path(tmp_path: Path) -> None:
    text = (ROOT / "config" / "bridge.toml").read_text()
    text = text.replace("max_attempts = 5 ", "max_attempts = -1 ")
    text = text.replace("max_rdy_count = 2500", "max_rdy_count = 2500\nmax_rdy_cont = 1")
    text = text.replace('beanstalk = "0.0.0.0:11300"', 'beanstalk = "0.0.0.0"')
    broken = tmp_path / "bridge.toml"
    broken.write_text(text)
    result = _check_config(broken)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    for key in ("broker.max_attempts", "nsqd.max_rdy_cont", "beanstalk"):
        # one line per error, starting with the key's path
        assert any(line.startswith(f"{broken}:{key}: ") for line in lines), (key, lines)
    assert lines[-1] == f"{broken}: 3 error(s)"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_environment_overrides_the_example(path: Path) -> None:
    environ = {
        "GATEWAY_NSQ": "0.0.0.0:14150",  # a top-level key
        "GATEWAY_BROKER__MAX_ATTEMPTS": "7",  # a key in a section: two underscores
        "GATEWAY_NATS_ROUTING__IMPORTS": "a.>,b",  # a list: comma-separated
        "GATEWAY_DATA_DIR": "/var/lib/gateway",
    }
    settings = config.load(path, environ=environ)
    assert settings.nsq == "0.0.0.0:14150"
    assert settings.broker.max_attempts == 7
    assert settings.nats_routing.imports == ["a.>", "b"]
    assert settings.data_dir == "/var/lib/gateway"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_a_flag_overrides_the_environment_and_the_example(path: Path) -> None:
    environ = {"GATEWAY_NSQ": "0.0.0.0:14150", "GATEWAY_NATS": "off"}
    flags = {"nsq": "127.0.0.1:24150", "data_dir": "/srv/gateway"}
    settings = config.load(path, flags=flags, environ=environ)
    assert (settings.nsq, settings.data_dir, settings.nats) == (
        "127.0.0.1:24150",
        "/srv/gateway",
        "off",
    )
    # every example that states a precedence states this one
    text = path.read_text()
    if "Precedence:" in text:
        stated = " ".join(text.split("Precedence:", 1)[1].split("#")).split(".")[0]
        assert stated.index("flags") < stated.index("environment") < stated.index("this file"), (
            stated
        )
