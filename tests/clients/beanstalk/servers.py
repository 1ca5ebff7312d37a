"""For the beanstalkd client tests: a real beanstalkd on an ephemeral port, and the command
lines of the client scripts in this directory."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.clients import peer_server

HERE = Path(__file__).resolve().parent
NODE_DIR = HERE.parent / "node"
BEANSTALKD = "/usr/bin/beanstalkd"

Address = peer_server.Address


@asynccontextmanager
async def real_beanstalkd(*flags: str) -> AsyncIterator[Address]:
    """/usr/bin/beanstalkd on 127.0.0.1 and a free port; killed (by pid) afterwards."""
    async with peer_server.running(
        BEANSTALKD, lambda a: ["-l", a[0], "-p", str(a[1]), *flags], "apt-get install beanstalkd"
    ) as address:
        yield address


def python_script(name: str, scenario: str, address: Address, *options: Any) -> list[str]:
    host, port = address
    return [
        sys.executable,
        str(HERE / name),
        scenario,
        "--host",
        host,
        "--port",
        str(port),
        *(str(o) for o in options),
    ]


def greenstalk(scenario: str, address: Address, *options: Any) -> list[str]:
    return python_script("greenstalk_client.py", scenario, address, *options)


def pystalk(scenario: str, address: Address, *options: Any) -> list[str]:
    return python_script("pystalk_client.py", scenario, address, *options)


def fivebeans(scenario: str, address: Address, *options: Any) -> list[str]:
    return peer_server.node_script(
        HERE / "fivebeans_client.js", "fivebeans", scenario, address, options
    )
