"""Hypothesis strategies for codec input: valid frames, mutated, concatenated, then cut.

Mutations are the ones that found bugs in codecs before: a byte changed, dropped or
inserted, the stream cut short, and long runs of one byte (digits for number parsers,
brackets for JSON nesting, spaces and line ends for framing) that no short random
string reaches.
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from tests.fuzz.http_target import HTTPCase
from tests.fuzz.targets import Target

_RUN_BYTES = (b"9", b"0", b"[", b"{", b" ", b"\t", b"\r", b"\n", b"\r\n", b"\x00", b"\xff", b"-")
_RUN_LENGTHS = (2, 225, 1100, 4097, 5000, 70000)


@st.composite
def _edit(draw: st.DrawFn) -> tuple[str, int, bytes]:
    kind = draw(st.sampled_from(("replace", "delete", "insert", "truncate", "run")))
    where = draw(st.integers(0, 1 << 16))
    if kind == "run":
        data = draw(st.sampled_from(_RUN_BYTES)) * draw(st.sampled_from(_RUN_LENGTHS))
    else:
        data = draw(st.binary(min_size=1, max_size=4))
    return kind, where, data


def _apply(data: bytearray, edit: tuple[str, int, bytes]) -> None:
    kind, where, insert = edit
    at = where % (len(data) + 1)
    if kind == "replace":
        data[at : at + len(insert)] = insert
    elif kind == "delete":
        del data[at : at + len(insert)]
    elif kind == "truncate":
        del data[at:]
    else:
        data[at:at] = insert


@st.composite
def streams(draw: st.DrawFn, target: Target) -> tuple[list[bytes], int]:
    """(chunks, variant): frames of `target`, mutated, cut at random points."""
    run = st.builds(
        bytes.__mul__,
        st.sampled_from(_RUN_BYTES),
        st.one_of(st.sampled_from(_RUN_LENGTHS), st.integers(1, 4500)),
    )
    built = st.builds(
        lambda build, content: build(content),
        st.sampled_from(target.builders),
        st.one_of(run, run, st.binary(max_size=24), st.sampled_from(target.seeds)),
    )
    # the first command decides most (state, upgrades): make it a built one
    frames = [draw(st.one_of(built, st.sampled_from(target.seeds)))]
    frames += draw(
        st.lists(
            st.one_of(built, st.sampled_from(target.seeds), st.binary(max_size=24)),
            max_size=5,
        )
    )
    data = bytearray(b"".join(frames))
    if target.prefix and draw(st.integers(0, 3)):
        data[:0] = target.prefix
    for edit in draw(st.lists(_edit(), max_size=4)):
        _apply(data, edit)
    whole = bytes(data)
    if draw(st.booleans()) and len(whole) <= 2048:
        chunks = [whole[i : i + 1] for i in range(len(whole))]
    else:
        cuts = sorted({c % (len(whole) + 1) for c in draw(st.lists(st.integers(0, 1 << 20)))})
        chunks = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]
    variant = draw(st.integers(0, target.variants - 1))
    return chunks, variant


# -- HTTP requests -------------------------------------------------------------------------

HTTP_METHODS = ("GET", "POST", "PUT", "HEAD", "OPTIONS", "DELETE", "CONNECT", "get")
HTTP_QUERY_KEYS = (b"topic", b"channel", b"defer", b"binary", b"format", b"bound", b"group")
HTTP_QUERY_KEYS += (b"include_clients", b"include_mem", b"id", b"offset", b"limit", b"state")
HTTP_QUERY_VALUES = (b"t", b"c", b"t#ephemeral", b"100", b"-1", b"+5", b"9" * 5000, b"1e3")
HTTP_QUERY_VALUES += (b"true", b"false", b"json", b"%zz", b"%41", b"a;b", b"", b"\xff", b"default")
HTTP_LENGTHS = (None, b"-1", b"abc", b"99999999999999", b"9" * 5000, b" 3", b"0")


def mpub_binary(bodies: list[bytes]) -> bytes:
    out = [struct.pack(">i", len(bodies))]
    out += [struct.pack(">i", len(b)) + b for b in bodies]
    return b"".join(out)


@st.composite
def http_cases(draw: st.DrawFn, methods: dict[str, list[str]]) -> HTTPCase:
    """Mostly requests a route takes (its path and one of its methods, a topic and a
    channel that exist or will), with odd queries, lengths and bodies."""
    route = draw(st.sampled_from(sorted(methods)))
    method = draw(st.one_of(st.sampled_from(methods[route]), st.sampled_from(HTTP_METHODS)))
    path = draw(st.sampled_from((route, route, route + "/", route + "/x", route[:-1] or "/")))
    if not draw(st.integers(0, 9)):
        path = "/" + draw(st.text(max_size=12))
    prefix = draw(st.sampled_from((b"", b"topic=t&channel=c&group=c&", b"topic=t&")))
    pairs = draw(
        st.lists(
            st.tuples(st.sampled_from(HTTP_QUERY_KEYS), st.sampled_from(HTTP_QUERY_VALUES)),
            max_size=4,
        )
    )
    query = prefix + b"&".join(k + b"=" + v for k, v in pairs) + draw(st.binary(max_size=4))
    body = draw(
        st.one_of(
            st.binary(max_size=64),
            st.lists(st.binary(max_size=16), max_size=4).map(mpub_binary),
            st.lists(st.binary(max_size=16), max_size=4).map(b"\n".join),
            st.builds(bytes.__mul__, st.sampled_from(_RUN_BYTES), st.sampled_from(_RUN_LENGTHS)),
        )
    )
    headers: list[tuple[bytes, bytes]] = [(b"host", b"127.0.0.1")]
    length = draw(st.sampled_from((*HTTP_LENGTHS, b"%d" % len(body))))
    if length is not None:
        headers.append((b"content-length", length))
    if draw(st.booleans()):
        headers.append((b"accept", b"application/vnd.nsq; version=1.0"))
    cuts = sorted({c % (len(body) + 1) for c in draw(st.lists(st.integers(0, 1 << 20)))})
    chunks = tuple(body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True))
    return HTTPCase(
        method,
        path,
        query,
        tuple(headers),
        chunks,
        draw(st.integers(0, 7)) == 0,
    )
