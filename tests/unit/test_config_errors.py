"""`gateway check-config` and `serve` say what is wrong in the gateway's words: one line
per problem, led by where the value came from (FILE:key, --flag, GATEWAY_VARIABLE)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway import cli


@pytest.fixture(autouse=True)
def _no_gateway_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)


def check(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> tuple[int, list[str]]:
    path = tmp_path / "gw.toml"
    path.write_text(text)
    code = cli.main(["check-config", str(path)])
    return code, capsys.readouterr().out.replace(str(path), "gw.toml").splitlines()


def test_a_misspelt_key_gets_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = '[nsqd]\nmax_msg_sise = 5\n[http]\nadress = "127.0.0.1:0"\n'
    assert check(tmp_path, capsys, text + "bogus = 1\n") == (
        1,
        [
            "gw.toml:nsqd.max_msg_sise: unknown setting; did you mean max_msg_size?",
            "gw.toml:http.adress: unknown setting; did you mean address?",
            "gw.toml:http.bogus: unknown setting",
            "gw.toml: 3 error(s)",
        ],
    )


def test_a_union_is_explained_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = '[storage]\nfsync = "sometimes"\n[archive]\nbody = "x"\n'
    assert check(tmp_path, capsys, text) == (
        1,
        [
            'gw.toml:storage.fsync: expected "always", "never" or milliseconds, got "sometimes"',
            'gw.toml:archive.body: expected "full", "none" or a number of bytes, got "x"',
            "gw.toml: 2 error(s)",
        ],
    )


def test_types_and_bounds_in_plain_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = 'log_level = "loud"\n[nsqd]\nmsg_timeout = 5\nsnappy = "maybe"\n'
    assert check(tmp_path, capsys, text) == (
        1,
        [
            'gw.toml:log_level: expected "debug", "info", "warning" or "error", got "loud"',
            "gw.toml:nsqd.msg_timeout: must be at least 1000, got 5",
            'gw.toml:nsqd.snappy: expected true or false, got "maybe"',
            "gw.toml: 3 error(s)",
        ],
    )


def test_a_relative_sqlite_path_is_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(tmp_path, capsys, 'store = "sqlite://relative.db"\n') == (
        1,
        [
            "gw.toml:store: a SQLite store needs an absolute path, written after three slashes"
            ' (sqlite:///absolute/path/to/relative.db), got "sqlite://relative.db"',
            "gw.toml: 1 error(s)",
        ],
    )


def test_a_bad_value_from_the_environment_names_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_NSQD__MSG_TIMEOUT", "abc")
    assert check(tmp_path, capsys, "") == (
        1,
        ["GATEWAY_NSQD__MSG_TIMEOUT: expected an integer, got abc", "gw.toml: 1 error(s)"],
    )
    monkeypatch.delenv("GATEWAY_NSQD__MSG_TIMEOUT")
    monkeypatch.setenv("GATEWAY_NSQD__MSG_TIMEUOT", "5000")
    assert check(tmp_path, capsys, "") == (
        1,
        [
            "gw.toml: GATEWAY_NSQD__MSG_TIMEUOT: no such setting ([nsqd] msg_timeuot);"
            " did you mean GATEWAY_NSQD__MSG_TIMEOUT?"
        ],
    )


def test_a_certificate_without_its_key_names_the_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert check(tmp_path, capsys, '[tls.nsq]\nkey = "k.pem"\n') == (
        1,
        [
            "gw.toml:tls.nsq.key: given without tls.nsq.cert (a private key needs its certificate)",
            "gw.toml: 1 error(s)",
        ],
    )
    assert cli.main(["serve", "--tls-cert", "c.pem"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "config error: --tls-cert: given without --tls-key (a certificate needs its private key)"
    ]
    monkeypatch.setenv("GATEWAY_TLS_KEY", "k.pem")
    assert cli.main(["serve"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "config error: GATEWAY_TLS_KEY: given without GATEWAY_TLS_CERT"
        " (a private key needs its certificate)"
    ]


def test_lookupd_addresses_are_checked_and_named_as_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = '[nsqd]\nlookupd_tcp_addresses = ["127.0.0.1:4160", "nowhere"]\n'
    assert check(tmp_path, capsys, text) == (
        1,
        [
            "gw.toml:nsqd.lookupd_tcp_addresses: address must be host:port or 'off', got 'nowhere'",
            "gw.toml: 1 error(s)",
        ],
    )
    text = 'http = "off"\n[nsqd]\nlookupd_tcp_addresses = ["127.0.0.1:4160"]\n'
    code, lines = check(tmp_path, capsys, text)
    assert code == 1
    assert lines[0].startswith("gw.toml:nsqd.lookupd_tcp_addresses: needs the NSQ and HTTP")
    assert cli.main(["serve", "--nsq", "off", "--lookupd-tcp-address", "127.0.0.1:4160"]) == 2
    assert capsys.readouterr().err.startswith(
        "config error: --lookupd-tcp-address: needs the NSQ and HTTP listeners"
    )
    monkeypatch.setenv("GATEWAY_NSQD__LOOKUPD_TCP_ADDRESSES", "127.0.0.1:4160,127.0.0.1:0")
    assert cli.main(["serve"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "config error: GATEWAY_NSQD__LOOKUPD_TCP_ADDRESSES: an nsqlookupd address needs its"
        " port, got '127.0.0.1:0'"
    ]
