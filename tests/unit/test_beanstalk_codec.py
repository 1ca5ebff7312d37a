"""The beanstalkd codec alone: the notes' parsing rows, split-anywhere parsing, garbage.

Rows marked "section 14" are the differential transcripts of docs/protocols/beanstalkd.md §14
(tests/data/beanstalkd_differential_cases.json, 1.13 column),
one codec per connection, fed send by send. Rows marked "live" were checked against the
local beanstalkd 1.12 while the codec was written (1.12 and 1.13 parse the same except for
reserve-with-timeout).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocols.beanstalk import events as ev
from gateway.protocols.beanstalk.codec import (
    BAD_FORMAT,
    EXPECTED_CRLF,
    JOB_TOO_BIG,
    LINE_BUF_SIZE,
    UNKNOWN_COMMAND,
    BeanstalkCodec,
    buried_job,
    found,
    inserted,
    kicked,
    ok_yaml,
    quoted,
    reserved,
    using,
    watching,
    yaml_dict,
    yaml_list,
)
from gateway.protocols.beanstalk.names import is_valid_name

CASES_FILE = Path(__file__).resolve().parents[1] / "data" / "beanstalkd_differential_cases.json"

BAD = ev.Reply(BAD_FORMAT)
UNKNOWN = ev.Reply(UNKNOWN_COMMAND)
TOO_BIG = ev.PutRejected(JOB_TOO_BIG, False)
NO_CRLF = ev.PutRejected(EXPECTED_CRLF, True)
USED = ev.ListTubeUsed()


def drain(codec: BeanstalkCodec) -> list[ev.Event]:
    out = []
    while (event := codec.next_event()) is not None:
        out.append(event)
    return out


def feed(data: bytes, max_job_size: int = 65535) -> list[ev.Event]:
    codec = BeanstalkCodec(max_job_size)
    codec.receive_data(data)
    return drain(codec)


def feed_chunks(chunks: list[bytes], max_job_size: int = 65535) -> list[ev.Event]:
    codec = BeanstalkCodec(max_job_size)
    out = []
    for chunk in chunks:
        codec.receive_data(chunk)
        out += drain(codec)
    return out


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# -- section 14, parsing rows ---------------------------------------------------------------

# case name -> (max job size, [(what one send holds, the events it completes)])
TRANSCRIPTS: dict[str, tuple[int, list[tuple[bytes, list[ev.Event]]]]] = {
    "unknown_command": (
        65535,
        [
            (b"foo\r\n", [UNKNOWN]),
            (b"PUT 0 0 1 1\r\n", [UNKNOWN]),
            (b"\r\n", [UNKNOWN]),
            (b"list-tube-used\r\n", [USED]),
        ],
    ),
    "prefix_matching": (
        65535,
        [
            (b"reservex\r\n", [BAD]),
            (b"reserve \r\n", [BAD]),
            (b"statsx\r\n", [BAD]),
            (b"list-tubesx\r\n", [BAD]),
            (b"pause-tubex default 1\r\n", [BAD]),
            (b"peek-readyx\r\n", [BAD]),
            (b"use\r\n", [UNKNOWN]),
            (b"delete\r\n", [UNKNOWN]),
        ],
    ),
    "put_bad_format": (
        65535,
        [
            (b"put 0 0 1\r\n", [BAD]),
            (b"put a 0 1 1\r\n", [BAD]),
            (b"put -1 0 1 1\r\n", [BAD]),
            (b"put 4294967296 0 1 1\r\n", [BAD]),
            (b"put 0 4294967296 1 1\r\n", [BAD]),
            (b"put 0 0 4294967296 1\r\n", [BAD]),
            (b"put +1 0 1 1\r\n", [BAD]),
            (b"put 0 0 1 1 \r\n", [BAD]),
            (b"list-tube-used\r\n", [USED]),
        ],
    ),
    "put_extremes_ok": (
        65535,
        [
            (
                b"put 4294967295 4294967295 4294967295 1\r\nx\r\n",
                [ev.Put(4294967295, 4294967295, 4294967295, b"x")],
            ),
            (b"put 0  0  1  1\r\ny\r\n", [ev.Put(0, 0, 1, b"y")]),
            (b"put 0 0 1 0\r\n\r\n", [ev.Put(0, 0, 1, b"")]),
            (b"reserve-with-timeout 0\r\n", [ev.ReserveWithTimeout(0)]),
            (b"stats-job 1\r\n", [ev.StatsJob(1)]),
        ],
    ),
    "put_wrong_byte_count": (
        65535,
        [
            (b"put 0 0 10 3\r\nhello\r\n", [NO_CRLF, UNKNOWN]),
            (b"put 0 0 10 5\r\nhel\r\n", []),
            (b"lo\r\n", [NO_CRLF, UNKNOWN]),
            (b"put 0 0 10 2\r\nab\n\n", [NO_CRLF]),
            (b"list-tube-used\r\n", [USED]),
        ],
    ),
    "job_too_big_z10": (
        10,
        [
            (b"put 0 0 10 10\r\n0123456789\r\n", [ev.Put(0, 0, 10, b"0123456789")]),
            (b"put 0 0 10 11\r\n", []),
            (b"hello world\r\n", [TOO_BIG]),
            (b"put 0 0 10 11\r\nhello world\r\nlist-tube-used\r\n", [TOO_BIG, USED]),
            (b"put 0 0 10 99999999999\r\n", [BAD]),
        ],
    ),
    "id_not_consumed_by_job_too_big": (
        10,
        [
            (b"put 0 0 10 11\r\nhello world\r\n", [TOO_BIG]),
            (b"put 0 0 10 3\r\nabc\r\n", [ev.Put(0, 0, 10, b"abc")]),
        ],
    ),
    "job_size_default_limit": (
        65535,
        [
            (b"put 0 0 10 65535\r\n" + b"a" * 65535 + b"\r\n", [ev.Put(0, 0, 10, b"a" * 65535)]),
            (b"put 0 0 10 65536\r\n" + b"a" * 65536 + b"\r\n", [TOO_BIG]),
        ],
    ),
    "ttr_zero_becomes_one": (
        65535,
        [(b"put 0 0 0 1\r\na\r\n", [ev.Put(0, 0, 1, b"a")])],
    ),
    "tube_names": (
        65535,
        [
            (b"use " + b"t" * 200 + b"\r\n", [ev.Use("t" * 200)]),
            (b"use " + b"t" * 201 + b"\r\n", [BAD]),
            (b"use -foo\r\n", [BAD]),
            (b"use foo-\r\n", [ev.Use("foo-")]),
            (b"use a+/;.$_()Z9\r\n", [ev.Use("a+/;.$_()Z9")]),
            (b"use foo bar\r\n", [BAD]),
            (b"use foo*\r\n", [BAD]),
            (b"use  foo\r\n", [BAD]),
            (b"use \r\n", [BAD]),
            (b"watch -foo\r\n", [BAD]),
            (b"watch " + b"t" * 201 + b"\r\n", [BAD]),
            (b"ignore -foo\r\n", [BAD]),
            (b"stats-tube -foo\r\n", [BAD]),
            (b"pause-tube -foo 1\r\n", [BAD]),
            (b"list-tube-used\r\n", [USED]),
        ],
    ),
    "line_too_long": (
        65535,
        [
            (b"use " + b"a" * 300 + b"\r\n", [BAD]),
            (b"x" * 221 + b"\r\n", [UNKNOWN]),
            (b"x" * 222 + b"\r\n", [UNKNOWN]),
            (b"list-tube-used\r\n", [USED]),
        ],
    ),
    "line_limits": (
        65535,
        [
            (b"x" * 222 + b"\r\n", [UNKNOWN]),
            (b"x" * 223 + b"\r\n", []),  # CR at byte 224: the line does not end there
            (b"list-tube-used\r\n", [BAD]),  # ... but here, with one BAD_FORMAT for both
        ],
    ),
    "reserve_timeouts": (
        65535,
        [
            (b"reserve-with-timeout 0\r\n", [ev.ReserveWithTimeout(0)]),
            (b"reserve-with-timeout 1\r\n", [ev.ReserveWithTimeout(1)]),
            (b"reserve-with-timeout abc\r\n", [BAD]),
            (b"reserve-with-timeout 0 junk\r\n", [ev.ReserveWithTimeout(0)]),
            (b"reserve-with-timeout 4294967296\r\n", [BAD]),
            (b"reserve-with-timeout 2147483648\r\n", [BAD]),
            (b"reserve-with-timeout -1\r\n", [BAD]),
        ],
    ),
    "delete_other_conn": (
        65535,
        [
            (b"delete 1\r\n", [ev.Delete(1)]),
            (b"delete 99\r\n", [ev.Delete(99)]),
            (b"delete abc\r\n", [BAD]),
            (b"delete 1 \r\n", [BAD]),
            (b"delete  5\r\n", [ev.Delete(5)]),
            (b"delete -1\r\n", [BAD]),
        ],
    ),
    "non_owner_release_bury_touch": (
        65535,
        [
            (b"release 1 0 0\r\n", [ev.Release(1, 0, 0)]),
            (b"bury 1 0\r\n", [ev.Bury(1, 0)]),
            (b"touch 1\r\n", [ev.Touch(1)]),
            (b"release 1 5 0\r\n", [ev.Release(1, 5, 0)]),
            (b"release 1 0\r\n", [BAD]),
            (b"bury 1\r\n", [BAD]),
        ],
    ),
    "bury_kick_flow": (
        65535,
        [
            (b"bury 1 3\r\n", [ev.Bury(1, 3)]),
            (b"peek-buried\r\n", [ev.PeekBuried()]),
            (b"kick 10\r\n", [ev.Kick(10)]),
            (b"peek-ready\r\n", [ev.PeekReady()]),
        ],
    ),
    "kick_variants": (
        65535,
        [
            (b"kick 10\r\n", [ev.Kick(10)]),
            (b"kick 0\r\n", [ev.Kick(0)]),
            (b"kick abc\r\n", [BAD]),
            (b"kick 5x\r\n", [ev.Kick(5)]),
            (b"kick -1\r\n", [ev.Kick(4294967295)]),
            (b"kick\r\n", [UNKNOWN]),
            (b"put 0 5 100 1\r\na\r\n", [ev.Put(0, 5, 100, b"a")]),
            (b"kick 1\r\n", [ev.Kick(1)]),
            (b"kick-job 1\r\n", [ev.KickJob(1)]),
            (b"kick-job 99\r\n", [ev.KickJob(99)]),
        ],
    ),
    "watch_ignore": (
        65535,
        [
            (b"ignore default\r\n", [ev.Ignore("default")]),
            (b"watch foo\r\n", [ev.Watch("foo")]),
            (b"list-tubes-watched\r\n", [ev.ListTubesWatched()]),
            (b"list-tubes\r\n", [ev.ListTubes()]),
            (b"ignore\r\n", [UNKNOWN]),
        ],
    ),
    "pause_tube": (
        65535,
        [
            (b"pause-tube default 2\r\n", [ev.PauseTube("default", 2)]),
            (b"pause-tube nosuch 1\r\n", [ev.PauseTube("nosuch", 1)]),
            (b"pause-tube default\r\n", [BAD]),
            (b"pause-tube default -1\r\n", [BAD]),
            (b"stats-tube default\r\n", [ev.StatsTube("default")]),
            (b"reserve-with-timeout 5\r\n", [ev.ReserveWithTimeout(5)]),
        ],
    ),
    "stats_job_reserved": (
        65535,
        [
            (b"stats-job 2\r\n", [ev.StatsJob(2)]),
            (b"stats-job x\r\n", [BAD]),
            (b"peek 1\r\n", [ev.Peek(1)]),
            (b"peek-delayed\r\n", [ev.PeekDelayed()]),
        ],
    ),
    "reserve_job": (
        65535,
        [
            (b"reserve-job 1\r\n", [ev.ReserveJob(1)]),
            (b"reserve-job x\r\n", [BAD]),
        ],
    ),
    "reserve_blocks_until_put": (65535, [(b"reserve\r\n", [ev.Reserve()])]),
    "quit_prefix": (65535, [(b"quitx\r\n", [ev.Quit()])]),
    "quit": (65535, [(b"quit\r\n", [ev.Quit()])]),
    "fresh_server_listings": (65535, [(b"stats-tube nosuch\r\n", [ev.StatsTube("nosuch")])]),
}


@pytest.mark.parametrize("name", sorted(TRANSCRIPTS))
def test_section_14_rows(name: str) -> None:
    max_job_size, rows = TRANSCRIPTS[name]
    codec = BeanstalkCodec(max_job_size)
    for sent, expected in rows:
        codec.receive_data(sent)
        assert drain(codec) == expected, sent[:80]


# -- more rows, checked live against beanstalkd 1.12 ------------------------------------------

LIVE: list[tuple[bytes, list[ev.Event]]] = [
    # a NUL anywhere: BAD_FORMAT before the command is even looked up
    (b"\x00\r\n", [BAD]),
    (b"use fo\x00o\r\n", [BAD]),
    (b"quit\x00\r\n", [BAD]),
    # tabs are not the space the prefixes end with
    (b"use\tfoo\r\n", [UNKNOWN]),
    (b"delete \t1\r\n", [BAD]),
    (b"delete 18446744073709551615\r\n", [ev.Delete(18446744073709551615)]),
    (b"delete 18446744073709551616\r\n", [BAD]),
    # argument-taking commands written without their space
    (b"stats-job\r\n", [BAD]),  # prefix "stats", which must be the whole line
    (b"reserve-job\r\n", [BAD]),  # prefix "reserve"
    (b"kick-job\r\n", [UNKNOWN]),
    # kick is strtoul into a 32-bit uint (LP64: unsigned long is 64 bits)
    (b"kick \t5\r\n", [ev.Kick(5)]),
    (b"kick +5\r\n", [ev.Kick(5)]),
    (b"kick \n+1x\r\n", [ev.Kick(1)]),
    (b"kick - 5\r\n", [BAD]),
    (b"kick -0\r\n", [ev.Kick(0)]),
    (b"kick 4294967297\r\n", [ev.Kick(1)]),
    (b"kick -4294967295\r\n", [ev.Kick(1)]),
    (b"kick -18446744073709551615\r\n", [ev.Kick(1)]),
    (b"kick 18446744073709551616\r\n", [BAD]),
    (b"kick -18446744073709551616\r\n", [BAD]),
    # pause-tube: spaces before the name and before the delay are skipped
    (b"pause-tubedefault 1\r\n", [ev.PauseTube("default", 1)]),
    (b"pause-tube  default 1\r\n", [ev.PauseTube("default", 1)]),
    (b"pause-tube default  1\r\n", [ev.PauseTube("default", 1)]),
    (b"pause-tube default 0001\r\n", [ev.PauseTube("default", 1)]),
    (b"pause-tube 12 1\r\n", [ev.PauseTube("12", 1)]),
    (b"pause-tube default1\r\n", [BAD]),  # digits belong to the name
    (b"pause-tube default\t1\r\n", [BAD]),
    (b"pause-tube default 1 \r\n", [BAD]),
    # a CR without LF: no line can end in this 224-byte window; it is discarded whole
    (
        b"foo\rbar\r\nlist-tube-used\r\n" + b"x" * 200 + b"\r\nlist-tube-used\r\n",
        [BAD, USED],
    ),
    (
        b"x" * 300 + b"a\rb\r\nlist-tube-used\r\n" + b"y" * 200 + b"\r\nlist-tube-used\r\n",
        [BAD, USED],
    ),
    # a put body is read by count, whatever it holds
    (b"put 0 0 1 3\r\nabc\n\r\r\n", [NO_CRLF, UNKNOWN]),
    (b"put 0 0 1 4\r\na\r\nb\r\n", [ev.Put(0, 0, 1, b"a\r\nb")]),
]


@pytest.mark.parametrize(("data", "expected"), LIVE)
def test_live_checked_rows(data: bytes, expected: list[ev.Event]) -> None:
    assert feed(data) == expected


# -- more rows from prot.c --------------------------------------------------------------------

PROT_C: list[tuple[bytes, list[ev.Event]]] = [
    # which_cmd's order and the argumentless commands
    (b"reserve\r\n", [ev.Reserve()]),
    (b"reserve-with-timeout\r\n", [BAD]),  # matches "reserve", which must be the whole line
    (b"stats\r\n", [ev.Stats()]),
    (b"stats-tube\r\n", [BAD]),
    (b"list-tube-used\r\n", [USED]),
    (b"list-tube-usedx\r\n", [BAD]),
    (b"list-tubes-watchedx\r\n", [BAD]),
    (b"list-tube\r\n", [UNKNOWN]),
    (b"peek-delayedx\r\n", [BAD]),
    (b"peek-buried \r\n", [BAD]),
    (b"peek\r\n", [UNKNOWN]),
    (b"quit\r\nlist-tube-used\r\n", [ev.Quit()]),  # nothing is read after quit
    (b"pause-tube\r\n", [BAD]),
    # numbers: spaces only, at least one between two numbers, decimal digits only
    (b"put 1 2 3 4\r\nbody\r\n", [ev.Put(1, 2, 3, b"body")]),
    (b"put   1 2 3 4\r\nbody\r\n", [ev.Put(1, 2, 3, b"body")]),
    (b"put 00001 2 3 4\r\nbody\r\n", [ev.Put(1, 2, 3, b"body")]),
    (b"put 1\t2 3 4\r\n", [BAD]),
    (b"put 1 2 3 0x4\r\n", [BAD]),  # size 0, then trailing garbage
    (b"put 0 0 1 1\r\n\r\n\r\n", [NO_CRLF]),  # body "\r", then "\n\r" is not CRLF
    (b"release 1 2 3\r\n", [ev.Release(1, 2, 3)]),
    (b"release  1  2  3\r\n", [ev.Release(1, 2, 3)]),
    (
        b"release 18446744073709551615 4294967295 4294967295\r\n",
        [ev.Release(2**64 - 1, 2**32 - 1, 2**32 - 1)],
    ),
    (b"release 1 4294967296 0\r\n", [BAD]),
    (b"release 1 0 4294967296\r\n", [BAD]),
    (b"release 1 0 0 \r\n", [BAD]),
    (b"bury 1 4294967296\r\n", [BAD]),
    (b"touch 7\r\n", [ev.Touch(7)]),
    (b"touch 7x\r\n", [BAD]),
    (b"peek 0\r\n", [ev.Peek(0)]),
    (b"reserve-with-timeout 2147483647\r\n", [ev.ReserveWithTimeout(2147483647)]),
    (b"reserve-with-timeout   3x\r\n", [ev.ReserveWithTimeout(3)]),
    (b"reserve-with-timeout +3\r\n", [BAD]),
    (b"pause-tube default 4294967295\r\n", [ev.PauseTube("default", 4294967295)]),
    (b"pause-tube default 4294967296\r\n", [BAD]),
    (b"pause-tube " + b"p" * 200 + b" 1\r\n", [ev.PauseTube("p" * 200, 1)]),
    (b"pause-tube " + b"p" * 201 + b" 1\r\n", [BAD]),
    # names
    (b"watch foo\r\n", [ev.Watch("foo")]),
    (b"ignore foo\r\n", [ev.Ignore("foo")]),
    (b"stats-tube foo\r\n", [ev.StatsTube("foo")]),
    (b"use caf\xc3\xa9\r\n", [BAD]),
    (b"use foo\n\r\n", [BAD]),  # a bare LF is part of the line
    # line ends: the window is 224 bytes, CRLF included
    (b"use " + b"a" * 200 + b"\r\n", [ev.Use("a" * 200)]),  # 206 bytes
    (b"x" * 222 + b"\r\nstats\r\n", [UNKNOWN, ev.Stats()]),
    (b"x" * 223 + b"\r\nstats\r\nstats\r\n", [BAD, ev.Stats()]),
    (b"x" * 224 + b"\r\nstats\r\n", [BAD, ev.Stats()]),
    # CR at the end of window 2: its LF starts window 3, "\nstats" ends the discarding
    (b"x" * 447 + b"\r\nstats\r\n", [BAD]),
    (b"x" * 448 + b"\r\nstats\r\nstats\r\n", [BAD, ev.Stats(), ev.Stats()]),
    (b"x" * 10000 + b"\r\nstats\r\n", [BAD, ev.Stats()]),
]


@pytest.mark.parametrize(("data", "expected"), PROT_C)
def test_prot_c_rows(data: bytes, expected: list[ev.Event]) -> None:
    assert feed(data) == expected
    assert feed_chunks(bytewise(data)) == expected


def test_nothing_after_quit() -> None:
    codec = BeanstalkCodec()
    codec.receive_data(b"quit\r\nstats\r\n")
    assert drain(codec) == [ev.Quit()]
    assert codec.closed
    codec.receive_data(b"stats\r\n")
    assert drain(codec) == []
    assert codec.buffered == 0


def test_max_job_size_bounds() -> None:
    assert feed(b"put 0 0 1 0\r\n\r\n", max_job_size=0) == [ev.Put(0, 0, 1, b"")]
    assert feed(b"put 0 0 1 1\r\nx\r\n", max_job_size=0) == [TOO_BIG]
    BeanstalkCodec(1073741824)
    with pytest.raises(ValueError):
        BeanstalkCodec(1073741825)
    with pytest.raises(ValueError):
        BeanstalkCodec(-1)


def test_job_too_big_before_trailing_garbage() -> None:
    # docs/protocols/beanstalkd.md §5, put: the size check comes first and drains bytes + 2
    data = b"put 0 0 1 11 junk\r\nhello world\r\nstats\r\n"
    assert feed(data, max_job_size=10) == [TOO_BIG, ev.Stats()]
    # within the limit, the garbage is BAD_FORMAT and the body is read as commands
    assert feed(b"put 0 0 1 5 extra\r\nhello\r\n") == [BAD, UNKNOWN]


# -- every recorded transcript: codec verdicts agree with the replies -------------------------

_PARSE_ERRORS = {BAD_FORMAT, UNKNOWN_COMMAND, EXPECTED_CRLF, JOB_TOO_BIG}


def _split_replies(data: bytes) -> list[bytes]:
    """A reply stream into replies: a line, plus a data block after OK/FOUND/RESERVED."""
    out = []
    while data:
        eol = data.index(b"\r\n") + 2
        words = data[:eol].split()
        if words[0] in (b"OK", b"FOUND", b"RESERVED"):
            eol += int(words[-1]) + 2
        out.append(data[:eol])
        data = data[eol:]
    return out


def _load_cases() -> list[dict]:
    return json.loads(CASES_FILE.read_text("utf-8"))["cases"]


def _server_max_job_size(args: list[str]) -> int:
    return int(args[args.index("-z") + 1]) if "-z" in args else 65535


def test_every_recorded_reply_matches_the_codec_verdict() -> None:
    """For all 36 cases: a codec per connection, fed what the client sent, step by step.

    Each event must line up with one recorded 1.13 reply: Reply/PutRejected with exactly
    that reply, a command with a reply that is not a parsing error. Only a reserve may
    go unanswered within its step (it blocks), and quit never gets a reply.
    """
    cases = _load_cases()
    assert len(cases) == 36
    for case in cases:
        codecs: dict[str, BeanstalkCodec] = {}
        max_job_size = _server_max_job_size(case["server_args"])
        for number, step in enumerate(case["steps"], 1):
            if step["action"] != "send":
                continue
            where = f"{case['name']} step {number}"
            codec = codecs.setdefault(step["conn"], BeanstalkCodec(max_job_size))
            codec.receive_data(step["send"].encode("latin-1"))
            events = drain(codec)
            replies = _split_replies(step["reply"]["1.13"].encode("latin-1"))
            if step["closed"]["1.13"]:
                assert events and isinstance(events[-1], ev.Quit), where
                events.pop()
            if len(replies) == len(events) - 1:
                assert isinstance(events[-1], ev.Reserve | ev.ReserveWithTimeout), where
                events.pop()
            assert len(replies) == len(events), where
            for event, reply in zip(events, replies, strict=True):
                if isinstance(event, ev.Reply):
                    assert reply == event.data, where
                elif isinstance(event, ev.PutRejected):
                    assert reply == event.reply, where
                else:
                    assert reply not in _PARSE_ERRORS, where


def _streams() -> list[tuple[str, int, bytes]]:
    """Each recorded connection's bytes, concatenated."""
    out = []
    for case in _load_cases():
        per_conn: dict[str, bytes] = {}
        for step in case["steps"]:
            if step["action"] == "send":
                conn = step["conn"]
                per_conn[conn] = per_conn.get(conn, b"") + step["send"].encode("latin-1")
        for conn, data in per_conn.items():
            out.append((f"{case['name']}/{conn}", _server_max_job_size(case["server_args"]), data))
    return out


def test_recorded_streams_split_anywhere() -> None:
    for name, max_job_size, data in _streams():
        whole = feed(data, max_job_size)
        assert feed_chunks(bytewise(data), max_job_size) == whole, name
        if len(data) <= 4096:
            for cut in range(1, len(data)):
                assert feed_chunks([data[:cut], data[cut:]], max_job_size) == whole, (name, cut)


# -- a literal port of prot.c's line framing, as the oracle for random streams -----------------


def _scan_line_end(cmd: bytes) -> int:
    cr = cmd.find(b"\r", 0, len(cmd) - 1)
    if cr < 0 or cmd[cr + 1] != 0x0A:
        return 0
    return cr + 2


def prot_c_framing(stream: bytes, reads: list[int]) -> list[bytes | None]:
    """conn_process_io + h_conn for lines only: each line's bytes, or None for a
    BAD_FORMAT of the discarding state. `reads` are the sizes read() returns."""
    out: list[bytes | None] = []
    cmd = b""
    discarding = False
    pos = 0
    sizes = iter(reads)
    while True:
        if not discarding:
            while n := _scan_line_end(cmd):
                out.append(cmd[: n - 2])
                cmd = cmd[n:]
        if pos == len(stream):
            return out
        want = min(LINE_BUF_SIZE - len(cmd), next(sizes, LINE_BUF_SIZE))
        chunk = stream[pos : pos + max(want, 1)]
        pos += len(chunk)
        cmd += chunk
        n = _scan_line_end(cmd)
        if discarding and n:
            out.append(None)
            cmd = cmd[n:]
            discarding = False
        elif not n and len(cmd) == LINE_BUF_SIZE:
            cmd = b""
            discarding = True


# long runs to cross the 224-byte windows, CRs with and without LF to end or spoil them
_FRAGMENTS = st.sampled_from(
    [
        *(b"a", b"x" * 37, b"x" * 150, b"x" * 222),
        *(b"\r", b"\r", b"\n", b"\r\n", b"\r\n"),
        *(b" ", b"\x00", b"use ", b"stats"),
    ]
)


@settings(max_examples=500, deadline=None)
@given(
    parts=st.lists(_FRAGMENTS, max_size=60),
    reads=st.lists(st.integers(1, LINE_BUF_SIZE), max_size=40),
    cuts=st.lists(st.integers(0, 3000), max_size=8),
)
def test_line_framing_matches_prot_c(parts: list[bytes], reads: list[int], cuts: list[int]) -> None:
    stream = b"".join(parts)
    expected: list[ev.Event] = []
    for line in prot_c_framing(stream, reads):
        expected += [BAD] if line is None else feed(line + b"\r\n")
    chunks = cut(stream, cuts)
    assert feed_chunks(chunks) == expected


# -- round trips and garbage ---------------------------------------------------------------------

_u32 = st.integers(0, 2**32 - 1)
_u64 = st.integers(0, 2**64 - 1)
_names = st.from_regex(rb"\A[A-Za-z0-9+/;.$_()][A-Za-z0-9+/;.$_()-]{0,199}\Z").map(
    lambda raw: raw.decode("ascii")
)


def _wire(event: ev.Event) -> bytes:
    match event:
        case ev.Put(pri, delay, ttr, body):
            return b"put %d %d %d %d\r\n%b\r\n" % (pri, delay, ttr, len(body), body)
        case ev.Release(job_id, pri, delay):
            return b"release %d %d %d\r\n" % (job_id, pri, delay)
        case ev.Bury(job_id, pri):
            return b"bury %d %d\r\n" % (job_id, pri)
        case ev.PauseTube(tube, delay):
            return b"pause-tube %b %d\r\n" % (tube.encode(), delay)
        case ev.ReserveWithTimeout(timeout):
            return b"reserve-with-timeout %d\r\n" % timeout
        case ev.Kick(bound):
            return b"kick %d\r\n" % bound
    simple = {
        ev.Use: b"use",
        ev.Watch: b"watch",
        ev.Ignore: b"ignore",
        ev.StatsTube: b"stats-tube",
        ev.Delete: b"delete",
        ev.Touch: b"touch",
        ev.Peek: b"peek",
        ev.KickJob: b"kick-job",
        ev.StatsJob: b"stats-job",
        ev.ReserveJob: b"reserve-job",
    }
    if type(event) in simple:
        (value,) = (getattr(event, f) for f in event.__slots__)
        arg = value.encode() if isinstance(value, str) else b"%d" % value
        return simple[type(event)] + b" " + arg + b"\r\n"
    bare = {
        ev.Reserve: b"reserve",
        ev.PeekReady: b"peek-ready",
        ev.PeekDelayed: b"peek-delayed",
        ev.PeekBuried: b"peek-buried",
        ev.Stats: b"stats",
        ev.ListTubes: b"list-tubes",
        ev.ListTubeUsed: b"list-tube-used",
        ev.ListTubesWatched: b"list-tubes-watched",
    }
    return bare[type(event)] + b"\r\n"


_commands = st.one_of(
    st.builds(ev.Put, _u32, _u32, st.integers(1, 2**32 - 1), st.binary(max_size=300)),
    st.builds(ev.Release, _u64, _u32, _u32),
    st.builds(ev.Bury, _u64, _u32),
    st.builds(ev.PauseTube, _names, _u32),
    st.builds(ev.ReserveWithTimeout, st.integers(0, 2**31 - 1)),
    st.builds(ev.Kick, _u32),
    *(st.builds(cls, _names) for cls in (ev.Use, ev.Watch, ev.Ignore, ev.StatsTube)),
    *(
        st.builds(cls, _u64)
        for cls in (ev.Delete, ev.Touch, ev.Peek, ev.KickJob, ev.StatsJob, ev.ReserveJob)
    ),
    *(
        st.builds(cls)
        for cls in (
            ev.Reserve,
            ev.PeekReady,
            ev.PeekDelayed,
            ev.PeekBuried,
            ev.Stats,
            ev.ListTubes,
            ev.ListTubeUsed,
            ev.ListTubesWatched,
        )
    ),
)


@settings(max_examples=300, deadline=None)
@given(commands=st.lists(_commands, max_size=20), cuts=st.lists(st.integers(0, 10000)))
def test_round_trip(commands: list[ev.Event], cuts: list[int]) -> None:
    stream = b"".join(_wire(c) for c in commands)
    chunks = cut(stream, cuts)
    assert feed_chunks(chunks) == commands


_GARBAGE = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from(
            [
                b"put ",
                b"put 0 0 1 3\r\n",
                b"put 1 2 3 40\r\n",
                b"reserve",
                b"reserve-with-timeout ",
                b"kick ",
                b"kick-job ",
                b"pause-tube",
                b"peek",
                b"-ready",
                b"stats",
                b"use ",
                b"delete ",
                b"release ",
                b"list-tube",
                b"s-watched",
                b" ",
                b"\r\n",
                b"\r",
                b"\n",
                b"\x00",
                b"-",
                b"+",
                b"4294967296",
                b"18446744073709551616",
                b"7",
                b"x" * 200,
            ]
        ),
    ),
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(
    parts=_GARBAGE,
    cuts=st.lists(st.integers(0, 5000), max_size=10),
    max_job_size=st.sampled_from([0, 5, 65535]),
)
def test_garbage_yields_events_only(parts: list[bytes], cuts: list[int], max_job_size: int) -> None:
    stream = b"".join(parts).replace(b"quit", b"qu!t")  # quit would stop everything early
    whole = feed(stream, max_job_size)
    assert all(isinstance(e, ev.Event) for e in whole)
    chunks = cut(stream, cuts)
    assert feed_chunks(chunks, max_job_size) == whole


# -- memory --------------------------------------------------------------------------------------


def test_job_too_big_is_not_buffered() -> None:
    codec = BeanstalkCodec()
    size = 100 * 1024 * 1024
    codec.receive_data(b"put 0 0 1 %d\r\n" % size)
    assert drain(codec) == []
    chunk = b"z" * (1024 * 1024)
    for _ in range(size // len(chunk)):
        codec.receive_data(chunk)
        assert codec.buffered == 0
        assert drain(codec) == []
    codec.receive_data(b"\r\nstats\r\n")
    assert drain(codec) == [TOO_BIG, ev.Stats()]
    assert codec.buffered == 0


def test_job_too_big_drained_without_pulling() -> None:
    # the session may feed several chunks before it pulls events again
    codec = BeanstalkCodec(10)
    codec.receive_data(b"put 0 0 1 1000\r\n")
    assert drain(codec) == []
    for _ in range(10):
        codec.receive_data(b"z" * 100)
    assert codec.buffered == 0
    codec.receive_data(b"\r\nstats\r\n")
    assert drain(codec) == [TOO_BIG, ev.Stats()]


def test_overlong_line_is_not_buffered() -> None:
    codec = BeanstalkCodec()
    for _ in range(1000):
        codec.receive_data(b"y" * 1000)
        assert drain(codec) == []
        assert codec.buffered < LINE_BUF_SIZE
    codec.receive_data(b"\r\nstats\r\n")
    assert drain(codec) == [BAD, ev.Stats()]


def test_partial_put_body_waits() -> None:
    codec = BeanstalkCodec()
    codec.receive_data(b"put 0 0 1 10\r\n01234")
    assert drain(codec) == []
    assert codec.buffered == 5
    codec.receive_data(b"56789\r")
    assert drain(codec) == []
    codec.receive_data(b"\nstats\r\n")
    assert drain(codec) == [ev.Put(0, 0, 1, b"0123456789"), ev.Stats()]


# -- names and replies ----------------------------------------------------------------------------


def test_names() -> None:
    assert is_valid_name(b"a+/;.$_()Z9-")
    assert is_valid_name(b"x" * 200)
    assert not is_valid_name(b"x" * 201)
    assert not is_valid_name(b"")
    assert not is_valid_name(b"-a")
    for bad in b" *#:\"'\\\x00\x80\r\n\t,!?@%^&=[]{}<>|~`":
        assert not is_valid_name(b"a" + bytes([bad])), bad


def test_reply_bytes() -> None:
    assert inserted(7) == b"INSERTED 7\r\n"
    assert buried_job(7) == b"BURIED 7\r\n"
    assert reserved(2, b"hi") == b"RESERVED 2 2\r\nhi\r\n"
    assert reserved(3, b"") == b"RESERVED 3 0\r\n\r\n"
    assert found(1, b"a") == b"FOUND 1 1\r\na\r\n"
    assert using("a+/;.$_()Z9") == b"USING a+/;.$_()Z9\r\n"
    assert watching(2) == b"WATCHING 2\r\n"
    assert kicked(0) == b"KICKED 0\r\n"


def test_yaml_lists_exact() -> None:
    # docs/protocols/beanstalkd.md §10 / fresh_server_listings, watch_ignore
    assert ok_yaml(yaml_list(["default"])) == b"OK 14\r\n---\n- default\n\r\n"
    assert ok_yaml(yaml_list(["default", "foo"])) == b"OK 20\r\n---\n- default\n- foo\n\r\n"
    assert ok_yaml(yaml_list(["foo"])) == b"OK 10\r\n---\n- foo\n\r\n"


def test_yaml_dict_exact() -> None:
    # stats_job_reserved step 3, 1.13
    pairs: list[tuple[str, object]] = [
        ("id", 1),
        ("tube", quoted("default")),
        ("state", "reserved"),
        ("pri", 5),
        ("age", 0),
        ("delay", 0),
        ("ttr", 100),
        ("time-left", 99),
        ("file", 0),
        ("reserves", 1),
        ("timeouts", 0),
        ("releases", 0),
        ("buries", 0),
        ("kicks", 0),
    ]
    assert ok_yaml(yaml_dict(pairs)) == (
        b'OK 151\r\n---\nid: 1\ntube: "default"\nstate: reserved\npri: 5\nage: 0\n'
        b"delay: 0\nttr: 100\ntime-left: 99\nfile: 0\nreserves: 1\ntimeouts: 0\n"
        b"releases: 0\nburies: 0\nkicks: 0\n\r\n"
    )
    assert yaml_dict([("draining", False), ("version", quoted("1.13"))]) == (
        b'---\ndraining: false\nversion: "1.13"\n'
    )
    assert yaml_dict([("draining", True), ("rusage-utime", "0.000847")]) == (
        b"---\ndraining: true\nrusage-utime: 0.000847\n"
    )
