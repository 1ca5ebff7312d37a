"""The codecs under fuzz, each behind one function: a byte stream in, the events out.

Every target feeds its chunks to a fresh codec the way that codec's session does (the
same calls, in the same order, the session's own reactions to events that change how
the codec reads, such as NSQ's IDENTIFY upgrades) and returns what came out. The
fuzzers (Hypothesis in test_codecs.py, atheris in atheris_main.py, bench/fuzz.py) check
two things with `check`:

* any input either parses into events or raises one of the target's own errors (the
  codec's protocol errors; most codecs return them as events, a few raise them), never
  another exception, and never loops: a run may yield at most one event per byte fed,
  plus a few;
* the same bytes give the same events in one piece or split at any points. Where an
  error is raised, the split run may have given events from the chunks before the bad
  one: the one-piece run's events must be a prefix of them.

No sockets and no Trio: the codecs are sans-IO, so this is all plain function calls.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.protocols.beanstalk import codec as bs
from gateway.protocols.nats import client_codec as nc
from gateway.protocols.nats import client_events as nev
from gateway.protocols.nats import route_codec as rc
from gateway.protocols.nsq import codec as nsq
from gateway.protocols.nsq import events as qev
from gateway.protocols.nsq.compression import CompressionError, DeflateStream, SnappyStream
from gateway.protocols.nsq.negotiation import IdentifyError, ServerFeatures, identify
from gateway.protocols.rocketmq import codec as rq
from gateway.protocols.rocketmq import message as rqm
from gateway.protocols.rocketmq.events import Request, Response
from gateway.protocols.rocketmq.events import SerializeType as RQSerialize

# A codec may yield this many events beyond one per byte fed (events that consume no
# bytes of their own: NSQ's MpubStart, a put rejected once its body has gone by).
_EVENT_SLACK = 8


_be32 = struct.Struct(">i").pack


class Loop(AssertionError):
    """A codec kept yielding events without consuming input: it would never return."""


@dataclass(frozen=True)
class Target:
    name: str
    # run(chunks, variant) -> events; raises only `errors`
    run: Callable[[Sequence[bytes], int, list[object]], None]
    errors: tuple[type[BaseException], ...]
    variants: int  # variant numbers 0..variants-1 pick limits and settings
    seeds: tuple[bytes, ...]  # valid frames to mutate and concatenate
    # frames around any content, with their length fields right: what a byte mutation of
    # a seed rarely makes (a 100,000-deep JSON body whose size prefix says so)
    builders: tuple[Callable[[bytes], bytes], ...] = ()
    # what every stream starts with (NSQ's magic), put in front of most generated inputs
    prefix: bytes = b""


def _count(out: list[object], fed: int) -> None:
    if len(out) > fed + _EVENT_SLACK:
        raise Loop(f"{len(out)} events from {fed} bytes")


# -- NSQ ---------------------------------------------------------------------------------------

_NSQ_LIMITS = (
    nsq.Limits(),
    nsq.Limits(max_msg_size=16, max_body_size=64, max_rdy_count=5, max_line_length=48),
    nsq.Limits(max_msg_size=1, max_body_size=9, max_req_timeout=10, max_line_length=24),
)
_NSQ_FEATURES = ServerFeatures()


def _nsq(chunks: Sequence[bytes], variant: int, out: list[object]) -> None:
    """NSQServerCodec as nsq/session.py drives it: IDENTIFY is validated by negotiation.py,
    its compression upgrade installs a decoder, a bad IDENTIFY closes the connection."""
    codec = nsq.NSQServerCodec(_NSQ_LIMITS[variant % 3])
    fed = 0
    for chunk in chunks:
        fed += len(chunk)
        codec.receive_data(chunk)  # CompressionError once a decoder is in
        while (event := codec.next_event()) is not None:
            _count(out, fed)
            if event.__class__ is qev.FinBatch:
                # one FIN per line: how many lines a batch holds depends on the chunks
                out.extend(qev.Fin(b"%016x" % i) for i in event.ids)  # type: ignore[union-attr]
                continue
            out.append(event)
            if event.__class__ is qev.Identify:
                try:
                    identity = identify(event.body, _NSQ_FEATURES, "127.0.0.1")  # type: ignore[union-attr]
                except IdentifyError as exc:
                    out.append(("close", str(exc)))
                    return
                if identity.snappy and identity.deflate:
                    out.append(("close", "both compressions"))
                    return
                out.append(identity)
                codec.heartbeats_disabled = identity.heartbeat_interval == -1
                if identity.snappy:
                    codec.set_decoder(SnappyStream().decode)
                elif identity.deflate:
                    codec.set_decoder(DeflateStream(identity.deflate_level).decode)
                codec.resume()
            elif event.__class__ is qev.ProtocolError:
                return


def _nsq_seeds() -> tuple[bytes, ...]:
    be32 = _be32
    identify_body = b'{"client_id":"c","feature_negotiation":true,"heartbeat_interval":-1}'
    snappy = b'{"feature_negotiation":true,"snappy":true}'
    deflate = b'{"feature_negotiation":true,"deflate":true,"deflate_level":3}'
    msg_id = b"0123456789abcdef"
    return (
        nsq.MAGIC_V2,
        nsq.MAGIC_V2 + b"SUB t c\n",
        b"IDENTIFY\n" + be32(len(identify_body)) + identify_body,
        b"IDENTIFY\n"
        + be32(len(snappy))
        + snappy
        + SnappyStream().encode(b"PUB t\n\x00\x00\x00\x01x"),
        b"IDENTIFY\n" + be32(len(deflate)) + deflate + DeflateStream(3).encode(b"NOP\nRDY 2\n"),
        b"AUTH\n" + be32(6) + b"secret",
        b"SUB topic chan\n",
        b"RDY 10\n",
        b"FIN " + msg_id + b"\n" + b"FIN " + msg_id + b"\n",
        b"REQ " + msg_id + b" 1000\n",
        b"TOUCH " + msg_id + b"\r\n",
        b"PUB topic\n" + be32(5) + b"hello",
        b"DPUB topic 100\n" + be32(3) + b"abc",
        b"MPUB topic\n" + be32(14) + be32(2) + be32(1) + b"a" + be32(1) + b"b",
        b"NOP\n",
        b"CLS\n",
    )


_NSQ_BUILDERS: tuple[Callable[[bytes], bytes], ...] = (
    lambda b: b"IDENTIFY\n" + _be32(len(b)) + b,
    lambda b: b"IDENTIFY\n" + _be32(len(b) + 2) + b"[" + b + b"]",
    lambda b: b"AUTH\n" + _be32(len(b)) + b,
    lambda b: b"PUB t\n" + _be32(len(b)) + b,
    lambda b: b"DPUB t " + b + b"\n" + _be32(1) + b"x",
    lambda b: b"MPUB t\n" + _be32(len(b) + 8) + _be32(1) + _be32(len(b)) + b,
    lambda b: b"RDY " + b + b"\n",
    lambda b: b"REQ 0123456789abcdef " + b + b"\n",
    lambda b: b"SUB " + b + b" c\n",
    lambda b: b"FIN " + b + b"\n",
)


# -- beanstalkd ---------------------------------------------------------------------------------

_BEANSTALK_BUILDERS: tuple[Callable[[bytes], bytes], ...] = (
    lambda b: b"put 0 0 1 %d\r\n%b\r\n" % (len(b), b),
    lambda b: b"put " + b + b"\r\n",
    lambda b: b"use " + b + b"\r\n",
    lambda b: b"kick " + b + b"\r\n",
    lambda b: b"release " + b + b"\r\n",
    lambda b: b"pause-tube " + b + b"\r\n",
    lambda b: b"reserve-with-timeout " + b + b"\r\n",
)
_BEANSTALK_SIZES = (bs.DEFAULT_MAX_JOB_SIZE, 0, 10)


def _beanstalk(chunks: Sequence[bytes], variant: int, out: list[object]) -> None:
    codec = bs.BeanstalkCodec(_BEANSTALK_SIZES[variant % 3])
    fed = 0
    for chunk in chunks:
        fed += len(chunk)
        codec.receive_data(chunk)
        while (event := codec.next_event()) is not None:
            _count(out, fed)
            out.append(event)


_BEANSTALK_SEEDS = (
    b"put 0 0 60 5\r\nhello\r\n",
    b"put 1024 5 1 0\r\n\r\n",
    b"put 1 2 3 70000\r\n",
    b"use tube-a\r\n",
    b"watch tube_b\r\n",
    b"ignore default\r\n",
    b"reserve\r\n",
    b"reserve-with-timeout 5\r\n",
    b"reserve-job 7\r\n",
    b"delete 1\r\n",
    b"release 1 10 0\r\n",
    b"bury 1 5\r\n",
    b"touch 1\r\n",
    b"kick 10\r\n",
    b"kick-job 3\r\n",
    b"peek 1\r\npeek-ready\r\npeek-delayed\r\npeek-buried\r\n",
    b"stats\r\nstats-job 1\r\nstats-tube default\r\n",
    b"list-tubes\r\nlist-tube-used\r\nlist-tubes-watched\r\n",
    b"pause-tube default 10\r\n",
    b"quit\r\n",
    b"x" * 230 + b"\r\n",
)


# -- NATS client and route ----------------------------------------------------------------------

_NATS_CLIENT_BUILDERS: tuple[Callable[[bytes], bytes], ...] = (
    lambda b: b"CONNECT " + b + b"\r\n",
    lambda b: b'CONNECT {"headers":' + b + b"}\r\n",
    lambda b: b"INFO " + b + b"\r\n",
    lambda b: b"PUB s %d\r\n%b\r\n" % (len(b), b),
    lambda b: b"HPUB s %d %d\r\n%b\r\n" % (len(b) // 2, len(b), b),
    lambda b: b"PUB " + b + b"\r\n",
    lambda b: b"SUB " + b + b"\r\n",
    lambda b: b"UNSUB " + b + b"\r\n",
)
_NATS_CLIENT_VARIANTS = (
    # max_payload, max_control_line, headers, require_connect
    (nc.MAX_PAYLOAD_SIZE, nc.MAX_CONTROL_LINE_SIZE, False, False),
    (16, 32, True, False),
    (nc.MAX_PAYLOAD_SIZE, nc.MAX_CONTROL_LINE_SIZE, True, True),
)


def _nats_client(chunks: Sequence[bytes], variant: int, out: list[object]) -> None:
    max_payload, max_line, headers, require_connect = _NATS_CLIENT_VARIANTS[variant % 3]
    codec = nc.NATSClientCodec(max_payload, max_line)
    codec.headers = headers
    codec.require_connect = require_connect
    fed = 0
    for chunk in chunks:
        fed += len(chunk)
        codec.receive_data(chunk)
        while (event := codec.next_event()) is not None:
            _count(out, fed)
            out.append(event)
            if event.__class__ is nev.Connect:
                # what client_session.py reads from CONNECT
                options = event.options  # type: ignore[union-attr]
                for name in ("verbose", "echo", "headers", "no_responders", "user", "pass"):
                    nc.connect_option(options, name)


_NATS_CLIENT_SEEDS = (
    b'CONNECT {"verbose":false,"headers":true,"name":"x"}\r\n',
    b"PING\r\n",
    b"PONG\r\n",
    b"PUB foo 5\r\nhello\r\n",
    b"PUB foo reply.to 0\r\n\r\n",
    b"pub\tfoo  3\r\nabc\r\n",
    b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
    b"HPUB foo r 12 12\r\nNATS/1.0\r\n\r\n\r\n",
    b"SUB foo.* 1\r\n",
    b"SUB foo.> q 2\r\n",
    b"UNSUB 1 5\r\n",
    b"UNSUB 2\r\n",
    b"+OK\r\n",
    b"-ERR 'x'\r\n",
    b'INFO {"server_id":"x"}\r\n',
)


_ROUTE_BUILDERS: tuple[Callable[[bytes], bytes], ...] = (
    lambda b: b"INFO " + b + b"\r\n",
    lambda b: b"CONNECT {" + b + b"}\r\n",
    lambda b: b"RMSG $G s %d\r\n%b\r\n" % (len(b), b),
    lambda b: b"HMSG $G s %d %d\r\n%b\r\n" % (len(b) // 2, len(b), b),
    lambda b: b"LMSG o $G s 0 %d\r\n%b\r\n" % (len(b), b),
    lambda b: b"RMSG " + b + b"\r\n",
    lambda b: b"RS+ " + b + b"\r\n",
    lambda b: b"LS- " + b + b"\r\n",
    lambda b: b"-ERR " + b + b"\r\n",
)
_ROUTE_VARIANTS = (
    (rc.MAX_ROUTE_CONTROL_LINE, rc.MAX_ROUTE_PAYLOAD),
    (40, 16),
    (12, 0),
)


def _nats_route(chunks: Sequence[bytes], variant: int, out: list[object]) -> None:
    codec = rc.RouteCodec(*_ROUTE_VARIANTS[variant % 3])
    fed = 0
    for chunk in chunks:
        fed += len(chunk)
        codec.receive_data(chunk)
        while (event := codec.next_event()) is not None:
            _count(out, fed)
            out.append(event)


_ROUTE_SEEDS = (
    b'INFO {"server_id":"S","cluster":"c"} \r\n',
    b'CONNECT {"verbose":false,"name":"S"}\r\n',
    b"PING\r\nPONG\r\n",
    b"RS+ $G foo\r\n",
    b"RS+ $G foo q 3\r\n",
    b"RS- $G foo q\r\n",
    b"LS+ leaf $G foo\r\n",
    b"LS-  $G leaf.sub\r\n",
    b"RMSG $G foo 5\r\nhello\r\n",
    b"RMSG $G foo + reply q1 q2 3\r\nabc\r\n",
    b"RMSG $G foo | q1 0\r\n\r\n",
    b"HMSG $G foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
    b"LMSG c $G foo 0 2\r\nhi\r\n",
    b"SUB foo 1\r\nA+ x\r\nA- x\r\n+OK\r\n",
    b"PUB foo 2\r\nhi\r\n",
    b"-ERR 'Authorization Violation'\r\n",
)


# -- RocketMQ remoting --------------------------------------------------------------------------

_ROCKETMQ_VARIANTS = (
    (rq.DEFAULT_MAX_FRAME_SIZE, rq.DEFAULT_MAX_HEADER_SIZE),
    (96, 64),
    (16, 4),
)


def _rocketmq(chunks: Sequence[bytes], variant: int, out: list[object]) -> None:
    """RemotingCodec, then what a session decodes from a request: a batch body, records
    (a client's side), properties and an offset message id. Bodies are MalformedBody,
    ids ValueError: the frame was sound, so the connection goes on."""
    codec = rq.RemotingCodec(*_ROCKETMQ_VARIANTS[variant % 3])
    fed = 0
    for chunk in chunks:
        fed += len(chunk)
        codec.receive_data(chunk)
        for event in codec.events():
            _count(out, fed)
            out.append(event)
            if event.__class__ is Request or event.__class__ is Response:
                out.append(_rocketmq_body(event))  # type: ignore[arg-type]


def _rocketmq_body(event: Request | Response) -> object:
    results: list[object] = []
    for decode in (rqm.decode_batch_body, rqm.decode_records):
        try:
            results.append(decode(event.body))
        except rqm.MalformedBody as exc:
            results.append(("malformed", str(exc)))
    results.append(rqm.decode_properties(event.ext_fields.get("properties", "")))
    try:
        results.append(rqm.decode_offset_msg_id(event.ext_fields.get("msgId", "")))
    except ValueError as exc:
        results.append(("bad id", str(exc)))
    return results


def _rocketmq_seeds() -> tuple[bytes, ...]:
    record = rqm.StoredMessage(
        topic="t",
        body=b"hi",
        queue_id=0,
        queue_offset=1,
        physical_offset=2,
        born_timestamp=3,
        born_host="127.0.0.1",
        born_port=1,
        store_timestamp=4,
        store_host="127.0.0.1",
        store_port=2,
        properties="KEYS\x01k\x02",
    )
    batch = rqm.encode_batch_body([rqm.BatchEntry(0, b"a", "TAGS\x01x\x02")])
    ext = {"topic": "t", "properties": "A\x01b\x02", "msgId": record.msg_id}
    requests = [
        rq.encode_command(code, 7, ext_fields=ext, body=body, serialize_type=kind)
        for code, body, kind in (
            (10, b"", RQSerialize.JSON),
            (320, batch, RQSerialize.JSON),
            (11, rqm.encode_record(record), RQSerialize.ROCKETMQ),
            (34, b"{}", RQSerialize.ROCKETMQ),
        )
    ]
    return (*requests, rq.encode_response(7, remark="r", body=b"x"))


def _rocketmq_frame(header: bytes, body: bytes, kind: int) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), kind << 24 | len(header)) + header + body


_ROCKETMQ_BUILDERS: tuple[Callable[[bytes], bytes], ...] = (
    lambda b: _rocketmq_frame(b, b"", 0),
    lambda b: _rocketmq_frame(b'{"code":10,"extFields":' + b + b"}", b"", 0),
    lambda b: _rocketmq_frame(b'{"code":10,"opaque":' + b + b"}", b"", 0),
    lambda b: _rocketmq_frame(b, b"", 1),
    lambda b: _rocketmq_frame(b'{"code":320}', b, 0),
    lambda b: rq.encode_command(11, 1, ext_fields={"properties": b.decode("latin-1")}),
    lambda b: rq.encode_command(11, 1, ext_fields={"msgId": b.decode("latin-1")}),
)


TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target(
            "nsq",
            _nsq,
            (CompressionError,),  # the session drops the connection without a reply
            len(_NSQ_LIMITS),
            _nsq_seeds(),
            _NSQ_BUILDERS,
            nsq.MAGIC_V2,
        ),
        Target(
            "beanstalk",
            _beanstalk,
            (),
            len(_BEANSTALK_SIZES),
            _BEANSTALK_SEEDS,
            _BEANSTALK_BUILDERS,
        ),
        Target(
            "nats-client",
            _nats_client,
            (),
            len(_NATS_CLIENT_VARIANTS),
            _NATS_CLIENT_SEEDS,
            _NATS_CLIENT_BUILDERS,
        ),
        Target("nats-route", _nats_route, (), len(_ROUTE_VARIANTS), _ROUTE_SEEDS, _ROUTE_BUILDERS),
        Target(
            "rocketmq",
            _rocketmq,
            (),
            len(_ROCKETMQ_VARIANTS),
            _rocketmq_seeds(),
            _ROCKETMQ_BUILDERS,
        ),
    )
}


# -- the property ------------------------------------------------------------------------------


def outcome(target: Target, chunks: Sequence[bytes], variant: int) -> tuple[list[object], str]:
    """The events, and the name of the error raised ("" for none)."""
    out: list[object] = []
    try:
        target.run(chunks, variant, out)
    except target.errors as exc:
        return out, type(exc).__name__
    return out, ""


def check(target: Target, chunks: Sequence[bytes], variant: int) -> None:
    """The fuzz property for one input: raises AssertionError (or the unexpected
    exception itself) when it does not hold."""
    whole, whole_error = outcome(target, [b"".join(chunks)], variant)
    split, split_error = outcome(target, chunks, variant)
    if whole_error:
        # Raised errors (a corrupt compressed stream) end the read they are found in:
        # in one piece that is every event after the upgrade; cut, the chunks before
        # the bad one have given theirs, and may have ended the connection otherwise.
        assert split[: len(whole)] == whole, (whole, split)
    else:
        assert not split_error, (split_error, whole)
        assert split == whole, (whole, split)


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def cut(data: bytes, seed: int) -> list[bytes]:
    """`data` cut at 1 to 8 points picked by a PRNG seeded with `seed`."""
    if len(data) < 2:
        return [data]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 8))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def chunkings(data: bytes, seed: int) -> list[list[bytes]]:
    """A few deterministic ways to cut `data`: a byte at a time, and random cuts."""
    return [bytewise(data), cut(data, seed), cut(data, seed + 1)]
