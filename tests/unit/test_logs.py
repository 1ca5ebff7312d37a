"""The log formats and the throttle that keeps one client from flooding the log."""

from __future__ import annotations

import json
import logging

from gateway.logs import JSONFormatter, LogfmtFormatter, Throttle, Throttles, shown


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("gateway.http", logging.INFO, __file__, 1, msg, args, None)


def test_json_and_logfmt_lines() -> None:
    record = _record('client %s said "%s"', "127.0.0.1:5", "hi\nthere")
    line = JSONFormatter().format(record)
    parsed = json.loads(line)
    assert parsed["level"] == "info" and parsed["logger"] == "gateway.http"
    assert parsed["msg"] == 'client 127.0.0.1:5 said "hi\nthere"'
    assert "\n" not in line  # one record, one line
    logfmt = LogfmtFormatter().format(record)
    assert logfmt.startswith("time=") and " level=info logger=gateway.http " in logfmt
    assert logfmt.endswith(r'msg="client 127.0.0.1:5 said \"hi\nthere\""')
    assert "\n" not in logfmt


def test_throttle_lets_a_burst_through_then_one_line_per_period() -> None:
    now = [0.0]
    throttle = Throttle(burst=3, every=10.0, clock=lambda: now[0])
    assert [throttle.allow() for _ in range(3)] == [0, 0, 0]
    assert [throttle.allow() for _ in range(50)] == [None] * 50
    now[0] = 9.9
    assert throttle.allow() is None
    now[0] = 10.0
    assert throttle.allow() == 51  # the line let through says how many were dropped
    assert throttle.allow() is None
    now[0] = 20.0
    assert throttle.allow() == 1


def test_throttles_keep_a_bounded_number_of_clients() -> None:
    throttles = Throttles(size=2, burst=1, every=60.0)
    assert throttles.allow("a") == 0 and throttles.allow("a") is None
    throttles.allow("b")
    throttles.allow("c")  # "a" is forgotten: memory stays bounded
    assert list(throttles.by_key) == ["b", "c"]
    assert throttles.allow("a") == 0


def test_shown_escapes_control_bytes_and_bounds_length() -> None:
    assert shown(b"E_INVALID bad\x00\x1b[2J") == "E_INVALID bad\\x00\\x1b[2J"
    assert shown("x" * 500).endswith("…") and len(shown("x" * 500)) == 161
