"""Issue 27: flags > GATEWAY_* environment > config file > defaults, key by key, and the
sources of a setting they disagree on named (what check-config and the start-up log print).

The environment used to beat the flags: `GATEWAY_NSQ=...:25180 gateway serve --nsq
...:25181` bound 25180 without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import config


@pytest.fixture
def gw_toml(tmp_path: Path) -> Path:
    path = tmp_path / "gw.toml"
    path.write_text(
        'nsq = "127.0.0.1:25179"\nbeanstalk = "127.0.0.1:25300"\nnats = "off"\n'
        "[nsqd]\nmax_msg_size = 5\nmax_rdy_count = 7\n"
    )
    return path


def test_a_flag_beats_the_environment_which_beats_the_file(gw_toml: Path) -> None:
    environ = {"GATEWAY_NSQ": "127.0.0.1:25180", "GATEWAY_BEANSTALK": "127.0.0.1:25301"}
    settings = config.load(gw_toml, {"nsq": "127.0.0.1:25181"}, environ)
    assert settings.nsq == "127.0.0.1:25181"  # flag > environment > file
    assert settings.beanstalk == "127.0.0.1:25301"  # environment > file
    assert settings.nats == "off"  # the file > the default
    assert settings.http == "127.0.0.1:4151"  # the default, set nowhere


def test_precedence_is_per_key_inside_a_section(gw_toml: Path) -> None:
    environ = {"GATEWAY_NSQD__MAX_MSG_SIZE": "3"}
    settings = config.load(gw_toml, environ=environ)
    # the environment replaces one key of [nsqd], not the table
    assert (settings.nsqd.max_msg_size, settings.nsqd.max_rdy_count) == (3, 7)


def test_a_flag_left_unset_does_not_hide_the_environment(gw_toml: Path) -> None:
    # argparse gives None for every flag not on the command line
    settings = config.load(gw_toml, {"nsq": None}, {"GATEWAY_NSQ": "127.0.0.1:25180"})
    assert settings.nsq == "127.0.0.1:25180"


def test_the_config_flag_beats_gateway_config(gw_toml: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text('nsq = "127.0.0.1:1"\n')
    environ = {"GATEWAY_CONFIG": str(other)}
    settings = config.load(gw_toml, environ=environ)
    assert (settings.nsq, settings.config) == ("127.0.0.1:25179", str(gw_toml))
    # without the flag, the variable names the file (and settings.config says which)
    settings = config.load(None, environ=environ)
    assert (settings.nsq, settings.config) == ("127.0.0.1:1", str(other))


def test_each_disagreement_is_one_line_naming_the_winner_and_the_losers(gw_toml: Path) -> None:
    environ = {
        "GATEWAY_NSQ": "127.0.0.1:25180",
        "GATEWAY_NSQD__MAX_MSG_SIZE": "3",
        "GATEWAY_NSQD__MAX_RDY_COUNT": "7",  # the file's value: no disagreement
    }
    sources = config.gather(gw_toml, {"nsq": "127.0.0.1:25181", "http": "off"}, environ)
    assert [str(o) for o in sources.overrides] == [
        f"nsq = 127.0.0.1:25181 from --nsq (overrides GATEWAY_NSQ=127.0.0.1:25180"
        f" and 127.0.0.1:25179 in {gw_toml})",
        f"nsqd.max_msg_size = 3 from GATEWAY_NSQD__MAX_MSG_SIZE (overrides 5 in {gw_toml})",
    ]
    assert sources.origin[("nsq",)] == "--nsq"
    assert sources.origin[("http",)] == "--http"
    assert sources.origin[("nats",)] == str(gw_toml)


def test_a_flag_over_the_environment_alone_is_named(gw_toml: Path) -> None:
    sources = config.gather(None, {"nsq": "127.0.0.1:25181"}, {"GATEWAY_NSQ": "127.0.0.1:25180"})
    assert [str(o) for o in sources.overrides] == [
        "nsq = 127.0.0.1:25181 from --nsq (overrides GATEWAY_NSQ=127.0.0.1:25180)"
    ]


def test_the_config_flag_over_gateway_config_is_named(gw_toml: Path) -> None:
    sources = config.gather(gw_toml, environ={"GATEWAY_CONFIG": "/etc/image.toml"})
    assert [str(o) for o in sources.overrides] == [
        f"config = {gw_toml} from --config (overrides GATEWAY_CONFIG=/etc/image.toml)"
    ]


def test_secrets_are_never_shown(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(
        'store = "redis://app:s3cret-f@redis:6379/0"\n'
        '[nats_server]\npassword = "s3cret-fp"\n[http]\nauth_token = "s3cret-ft"\n'
    )
    environ = {
        "GATEWAY_STORE": "redis://app:s3cret-e@redis:6379/1",
        "GATEWAY_NATS_SERVER__PASSWORD": "s3cret-ep",
        "GATEWAY_HTTP__AUTH_TOKEN": "s3cret-et",
    }
    lines = [str(o) for o in config.gather(path, environ=environ).overrides]
    assert len(lines) == 3
    text = "\n".join(lines)
    assert "s3cret" not in text, text
    assert "store = redis://app:***@redis:6379/1 from GATEWAY_STORE" in text
    assert "http.auth_token = (hidden) from GATEWAY_HTTP__AUTH_TOKEN" in text


def test_an_error_in_a_value_from_the_environment_names_the_variable(gw_toml: Path) -> None:
    sources = config.gather(gw_toml, {"http": "nowhere"}, {"GATEWAY_NSQD__MAX_RDY_COUNT": "0"})
    with pytest.raises(config.ValidationError) as info:
        sources.settings()
    lines = config.describe_errors(info.value, sources)
    assert "--http: address must be host:port or 'off', got 'nowhere'" in lines
    assert "GATEWAY_NSQD__MAX_RDY_COUNT: must be at least 1, got 0" in lines
