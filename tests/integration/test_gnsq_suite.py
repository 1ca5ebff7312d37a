"""gnsq 1.0.2's own test suite, run against the gateway.

gnsq's sdist ships its tests: tests/integration_server.py starts `nsqd` and `nsqlookupd` from
PATH with nsqd's Go-style flags (`--tcp-address`, `--https-address`, `--tls-cert`, ...) and
TLS. Here the sdist is fetched from PyPI with pip (cached, its sha256 pinned), unpacked, and
its suite is run in a subprocess with tests/clients/gnsq_suite first on PATH: `nsqd` and
`nsqlookupd` there translate the flags and start the gateway (see standin.py there).

Against nsqd 1.3.0 all 108 tests pass. Against the gateway every one passes except
test_lookupd.py::test_basic, which asks a lookupd with no nsqd for its producers and wants
none: the gateway is nsqlookupd and nsqd at once, so it always lists itself.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import gateway
from gateway.http import stats
from tests.clients.gnsq_suite import standin

STANDIN_DIR = Path(standin.__file__).resolve().parent
SDIST = "gnsq-1.0.2.tar.gz"
SDIST_SHA256 = "f2bb8cc816ffc449865ab1729eeec8b7524f7a416161cc99db2f44782a002c13"
TOTAL = 108  # tests in gnsq 1.0.2's suite
SERVER_BACKED = 23  # of them, those that start nsqd or nsqlookupd
# (junit classname, test name) -> what its failure must show
EXPECTED_FAILURES = {
    ("tests.test_lookupd", "test_basic"): "assert len(lookupd.nodes()['producers']) == 0",
}


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mq-gateway-tests"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sdist() -> Path:
    """gnsq 1.0.2's sdist from PyPI (pip download), kept in a cache directory. A failed
    download fails the test."""
    cache = _cache_dir()
    path = cache / SDIST
    if path.is_file() and _sha256(path) == SDIST_SHA256:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps"]
    cmd += ["--no-binary", ":all:", "gnsq==1.0.2", "-d", str(cache)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not path.is_file():
        pytest.fail(f"pip download of gnsq 1.0.2's sdist failed:\n{done.stdout}\n{done.stderr}")
    digest = _sha256(path)
    if digest != SDIST_SHA256:
        pytest.fail(f"{path}: sha256 {digest}, expected {SDIST_SHA256}")
    return path


def _unpack(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)  # the sdist is the one whose sha256 is pinned above
    return into / "gnsq-1.0.2"


def _results(junit: Path) -> dict[tuple[str, str], tuple[str, str, str]]:
    """(classname, name) -> (outcome, failure text, captured stderr) from pytest's junit XML."""
    out: dict[tuple[str, str], tuple[str, str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        outcome, text = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = "failed" if kind == "failure" else kind
                text = (element.get("message") or "") + "\n" + (element.text or "")
                break
        stderr = "".join(e.text or "" for e in case.iter("system-err"))
        out[key] = (outcome, text, stderr)
    return out


def test_the_standin_answers_as_the_gateway_nsqd_version() -> None:
    """gnsq reads `nsqd --version`; the stand-in's is the gateway's nsqd version."""
    assert standin.NSQD_VERSION == stats.VERSION
    assert gateway.__version__ == standin.GATEWAY_VERSION
    done = subprocess.run(
        [sys.executable, str(STANDIN_DIR / "nsqd"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == f"nsqd v{stats.VERSION} (built w/mq-gateway-{gateway.__version__})\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--tcp-address", "127.0.0.1:0", "--tls-cert", "c.pem"],
        ["-tcp-address", "127.0.0.1:0", "-tls-cert", "c.pem"],
        ["--tcp-address=127.0.0.1:0", "-tls-cert=c.pem"],
    ],
)
def test_the_standin_parses_flags_as_go_does(argv: list[str]) -> None:
    flags = standin.parse_flags([*argv, "-version"], standin._NSQD_FLAGS)
    assert flags == {"tcp-address": ["127.0.0.1:0"], "tls-cert": ["c.pem"], "version": ["true"]}


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--mem-queue-size", "0"], "flag provided but not defined: -mem-queue-size"),
        (["--tcp-address"], "flag needs an argument: -tcp-address"),
        (["-version=maybe"], 'invalid boolean value "maybe" for -version'),
        (["serve"], "unexpected arguments: serve"),
    ],
)
def test_the_standin_refuses_what_it_does_not_translate(argv: list[str], error: str) -> None:
    with pytest.raises(standin.FlagError, match=error):
        standin.parse_flags(argv, standin._NSQD_FLAGS)


@pytest.mark.clients
def test_gnsq_suite_passes_against_the_gateway(tmp_path: Path) -> None:
    root = _unpack(_sdist(), tmp_path)
    junit = tmp_path / "gnsq.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PYTEST_"))}
    env["PATH"] = os.pathsep.join(
        [str(STANDIN_DIR), str(Path(sys.executable).parent), env.get("PATH", "")]
    )
    env["GNSQ_STANDIN_DIR"] = str(tmp_path / "lookupds")
    assert shutil.which("nsqd", path=env["PATH"]) == str(STANDIN_DIR / "nsqd")
    assert shutil.which("nsqlookupd", path=env["PATH"]) == str(STANDIN_DIR / "nsqlookupd")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"]
    # junit_logging: each test's stderr, where gnsq's harness logs the servers it runs
    cmd += ["--junitxml", str(junit), "-o", "junit_logging=system-err"]
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its gateways are killed with it on a timeout
    )
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"gnsq's suite did not finish in 300 s:\n{output[-20000:]}")
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    print(f"gnsq 1.0.2's suite against the gateway: {summary}")  # shown by -rA
    assert junit.is_file(), output[-20000:]
    results = _results(junit)
    assert len(results) == TOTAL, f"{len(results)} tests ran, not {TOTAL}\n{output[-20000:]}"
    not_passed = {key: value for key, value in results.items() if value[0] != "passed"}
    assert set(not_passed) == set(EXPECTED_FAILURES), output[-20000:]
    for key, shown in EXPECTED_FAILURES.items():
        outcome, text, _ = not_passed[key]
        assert outcome == "failed" and shown in text, text
    # The servers were the stand-ins: every test that ran one ran the gateway, and an nsqd
    # given a lookupd was that lookupd's gateway.
    backed = {key: value[2] for key, value in results.items() if "running: nsq" in value[2]}
    assert len(backed) == SERVER_BACKED, sorted(backed)
    for key, stderr in backed.items():
        assert "gateway stand-in: " in stderr, (key, stderr)
        if "--lookupd-tcp-address" in stderr:
            assert "registered with" in stderr, (key, stderr)
