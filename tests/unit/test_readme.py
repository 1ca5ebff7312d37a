"""README.md says what the gateway does today: the usage block names every `serve` flag,
the store row every URL form, the exit statuses are the ones the CLI returns, the
benchmarks live in bench/README.md, and the package description names every protocol."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from gateway import cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n{title}\n")
    level = title.split(" ", 1)[0]
    end = README.find(f"\n{level} ", start + len(title) + 2)
    return README[start : end if end >= 0 else None]


def test_the_front_page_is_short_and_has_the_two_commands() -> None:
    front = README[: README.index("\n## The two commands\n")]
    assert len(front.splitlines()) <= 30
    commands = _section("## The two commands")
    assert re.findall(r"```sh\n(.*?)\n```", commands, re.S) == [
        "./scripts/serve.sh",
        "./scripts/test.sh",
    ]


def test_the_usage_block_names_every_serve_flag() -> None:
    usage = re.search(r"```\n(gateway serve .*?)```", README, re.S)
    assert usage is not None
    sub = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {o for a in sub.choices["serve"]._actions for o in a.option_strings} - {"-h", "--help"}
    assert flags == set(re.findall(r"--[a-z-]+", usage[1])), usage[1]


def test_the_store_row_names_every_url_form() -> None:
    (row,) = [line for line in README.splitlines() if line.startswith("| `store` |")]
    for form in ("memory://", "sqlite:///", "redis://", "rediss://", "redis+cluster://"):
        assert form in row, form


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["serve", "--nsq", "nowhere"], 2),  # a configuration error
        (["serve", "--tls-cert", "c.pem"], 2),
        (["check-config", "/nonexistent/gw.toml"], 1),
    ],
)
def test_the_exit_statuses_are_the_documented_ones(
    argv: list[str], status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    table = _section("### Running it")
    command = f"`gateway {argv[0]}`"
    assert re.search(rf"\| {re.escape(command)} \| {status} \|", table), (command, status)
    assert cli.main(argv) == status


def test_the_benchmarks_live_in_the_bench_readme() -> None:
    assert "msgs/s |" not in README and "jobs/s |" not in README
    bench = (ROOT / "bench" / "README.md").read_text()
    assert "| NSQ PUB one at a time, 200 B | 10.5k msgs/s |" in bench


def test_the_operating_section_links_logging_and_shows_the_admin_page() -> None:
    assert "(docs/operating.md)" in _section("## Operating")
    admin = _section("### Admin page")
    for image in ("admin-overview", "admin-node", "admin-confirm"):
        assert f"(docs/images/{image}.png)" in admin, image


def test_the_package_description_names_every_protocol() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for protocol in ("NSQ", "beanstalkd", "NATS", "RocketMQ"):
        assert protocol in project["description"], protocol
