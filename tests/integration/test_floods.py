"""Fairness under floods: while one connection per protocol pipelines cheap and bad
commands as fast as it can, healthy NSQ, beanstalkd and NATS clients keep at least half
of their calm throughput, and the gateway logs no traceback.

The gateway runs in its own process, the healthy clients in another and the attackers
in a third (tests/clients/flood.py), so that none of them takes the others' GIL; calm and
flood phases alternate and are summed, so a slow moment of the machine falls on both.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.clients

ROOT = Path(__file__).resolve().parents[2]
FLOOD = ROOT / "tests" / "clients" / "flood.py"


def test_healthy_clients_keep_half_their_throughput_under_a_flood() -> None:
    argv = [sys.executable, "-m", "gateway", "serve", "--store", "memory://",
            "--nsq", "127.0.0.1:0", "--beanstalk", "127.0.0.1:0", "--nats", "127.0.0.1:0",
            "--http", "off", "--nats-route", "off", "--rocketmq", "off"]  # fmt: skip
    gateway = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert gateway.stderr is not None
    log: list[str] = []
    try:
        addresses: dict[str, str] = {}
        while len(addresses) < 3:
            line = gateway.stderr.readline()
            assert line, "".join(log)
            log.append(line)
            if m := re.search(r"listening protocol=(\w+) address=(\S+)", line):
                addresses[m.group(1)] = m.group(2)
        done = subprocess.run(
            [sys.executable, str(FLOOD), "--nsq", addresses["nsq"],
             "--beanstalk", addresses["beanstalk"], "--nats", addresses["nats"],
             "--seconds", "1.5", "--rounds", "3"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        gateway.terminate()
        _, rest = gateway.communicate(timeout=30)
        log.append(rest)
    calm, flood = result["calm"], result["flood"]
    for protocol in ("nsq", "beanstalk", "nats"):
        assert calm[protocol] > 100, result  # the healthy client really ran
        ratio = flood[protocol] / calm[protocol]
        assert ratio >= 0.5, f"{protocol}: {ratio:.2f} of its calm throughput: {result}"
    assert result["attack"]["bytes_sent"] > 1_000_000, result  # the flood really flowed
    text = "".join(log)
    assert "Traceback" not in text, text[-3000:]
