"""nsqd 1.3.0's HTTP API (docs/protocols/nsq.md §12): publishing, topic and channel administration,
/stats, /info, /ping and /config, with nsqd's status codes, bodies and headers.

The checks run in nsqd's order, because a client that sends several faults at once sees
the first one nsqd would report (/pub reads the body before it looks at the topic). Every
write is answered only after the store has committed it (`router.committed`).
"""

from __future__ import annotations

import logging
import re
import struct
from typing import TYPE_CHECKING, Any

from gateway.http import stats
from gateway.http.router import (
    HTTPError,
    Request,
    Response,
    Router,
    committed,
    text,
    v1,
    v1_json,
)
from gateway.protocols.nsq.names import is_ephemeral, is_valid_name

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.broker import Topic

# nsqd's boolParams: anything else is "not given" (stats) or "true" (/mpub binary)
_BOOLS = {"true": True, "1": True, "false": False, "0": False}
_GO_INT = re.compile(r"[+-]?[0-9]+")
_INT64 = 2**63
_LEN = struct.Struct(">i")
_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING}
_LOG_LEVELS |= {"error": logging.ERROR, "fatal": logging.CRITICAL}
# lg.LogLevel numbers, as GET /config/log_level shows them
_LG_NUMBERS = {logging.DEBUG: 1, logging.INFO: 2, logging.WARNING: 3, logging.ERROR: 4}
_MS = 1_000_000  # ns per ms: nsqd's durations are time.Duration, JSON in nanoseconds


def _valid(name: str) -> bool:
    return is_valid_name(name.encode("utf-8", "surrogateescape"))


def _go_duration_ms(raw: str) -> int | None:
    """`time.Duration(strconv.ParseInt(raw)) * time.Millisecond` in ns, wrapping as int64
    arithmetic does; None when ParseInt fails."""
    if _GO_INT.fullmatch(raw) is None:
        return None
    digits = raw.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 19:
        return None  # past int64 whatever the digits; int() would refuse thousands of them
    value = -int(digits) if raw[0] == "-" else int(digits)
    if not -_INT64 <= value < _INT64:
        return None
    return (value * _MS + _INT64) % (2 * _INT64) - _INT64


def broadcast_address(gateway: Gateway) -> str:
    """Where NSQ clients are told to connect: nsqd.broadcast_address, else the NSQ
    listener's host when it is a specific address, else the hostname (nsqd's default)."""
    configured = gateway.settings.nsqd.broadcast_address
    if configured:
        return configured
    nsq = gateway.addresses.get("nsq")
    if nsq is not None and nsq[0] not in ("0.0.0.0", "::", ""):
        return nsq[0]
    return gateway.nsq.hostname


def port_of(gateway: Gateway, listener: str) -> int:
    """A listener's bound port; -1 when it is off (nsqd's value for a non-TCP listener)."""
    address = gateway.addresses.get(listener)
    return address[1] if address is not None else -1


class NSQDAPI:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.broker = gateway.broker
        self.limits = gateway.settings.nsqd
        stats.GC_PAUSES.install()

    # -- shared checks -----------------------------------------------------------------------

    def _new_topic(self, request: Request) -> str:
        """getTopicFromQuery: the named topic, created if missing."""
        name = request.arg("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not _valid(name):
            raise HTTPError(400, "INVALID_TOPIC")
        self.broker.topic(name, ephemeral=is_ephemeral(name))
        return name

    def _topic_arg(self, request: Request) -> str:
        name = request.arg("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        return name

    async def _existing_topic(self, name: str, channel: str | None = None) -> Topic:
        """nsqd's GetExistingTopic; with a store shared by several gateways, one another
        gateway made is found there (as is `channel`, if it was made there)."""
        topic = await self.broker.existing_topic(name, channel)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic

    async def _topic_and_channel(self, request: Request) -> tuple[Topic, str]:
        """getExistingTopicFromQuery: note the _ARG_ in these texts, unlike /pub's."""
        topic = request.arg("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not _valid(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = request.arg("channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not _valid(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return await self._existing_topic(topic, channel), channel

    # -- node --------------------------------------------------------------------------------

    async def ping(self, request: Request) -> Response:
        return text("OK")

    async def info(self, request: Request) -> Response:
        gw = self.gateway
        n = self.limits
        return v1_json(
            {
                "version": stats.VERSION,
                "broadcast_address": broadcast_address(gw),
                "hostname": gw.nsq.hostname,
                "http_port": port_of(gw, "http"),
                "tcp_port": port_of(gw, "nsq"),
                "start_time": int(self.broker.started_at),
                "max_heartbeat_interval": n.max_heartbeat_interval * _MS,
                "max_output_buffer_size": n.max_output_buffer_size,
                "max_output_buffer_timeout": n.max_output_buffer_timeout * _MS,
                "max_deflate_level": n.max_deflate_level,
            }
        )

    # -- publishing --------------------------------------------------------------------------

    async def pub(self, request: Request) -> Response:
        max_size = self.limits.max_msg_size
        if request.content_length > max_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        body = await request.body(max_size + 1)
        if len(body) > max_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        topic = self._new_topic(request)
        delay = 0.0
        defer = request.arg("defer")
        if defer is not None:
            ns = _go_duration_ms(defer)
            if ns is None or ns < 0 or ns > self.limits.max_req_timeout * _MS:
                raise HTTPError(400, "INVALID_DEFER")
            delay = ns / 1e9
        self._publish(request, topic, [body], delay)
        return v1("OK")

    async def mpub(self, request: Request) -> Response:
        max_body = self.limits.max_body_size
        if request.content_length > max_body:
            raise HTTPError(413, "BODY_TOO_BIG")
        topic = self._new_topic(request)
        binary = request.arg("binary")
        # nsqd logs a value other than true/1/false/0 as deprecated and takes it as binary
        if binary is not None and _BOOLS.get(binary, True):
            # nsqd reads only what the messages declare; reading at most max_body_size
            # bounds a chunked upload, which has no Content-Length to check first
            data = await request.body(max_body + 1)
            if len(data) > max_body:
                raise HTTPError(413, "BODY_TOO_BIG")
            bodies = _binary_bodies(data, self.limits.max_msg_size, max_body)
        else:
            data = await request.body(max_body + 1)
            bodies = _text_bodies(data, self.limits.max_msg_size, max_body + 1)
        if bodies:  # an empty text body publishes nothing and is still OK
            self._publish(request, topic, bodies, 0.0)
        return v1("OK")

    def _publish(self, request: Request, topic: str, bodies: list[bytes], delay: float) -> None:
        self.broker.publish(
            topic,
            bodies,
            delay=delay,
            origin=f"http {request.remote}",
            ephemeral=is_ephemeral(topic),
        )

    # -- topics --------------------------------------------------------------------------------

    async def topic_create(self, request: Request) -> Response:
        self._new_topic(request)
        return v1()

    async def topic_delete(self, request: Request) -> Response:
        topic = await self._existing_topic(self._topic_arg(request))
        self.broker.delete_topic(topic.name)
        return v1()

    async def topic_empty(self, request: Request) -> Response:
        name = self._topic_arg(request)
        if not _valid(name):
            raise HTTPError(400, "INVALID_TOPIC")
        (await self._existing_topic(name)).empty()
        return v1()

    async def topic_pause(self, request: Request) -> Response:
        topic = await self._existing_topic(self._topic_arg(request))
        if request.path.endswith("unpause"):
            topic.unpause()
        else:
            topic.pause()
        return v1()

    # -- channels ------------------------------------------------------------------------------

    async def channel_create(self, request: Request) -> Response:
        topic, channel = await self._topic_and_channel(request)
        topic.group(channel, ephemeral=is_ephemeral(channel))
        return v1()

    async def channel_delete(self, request: Request) -> Response:
        topic, channel = await self._topic_and_channel(request)
        if not topic.delete_group(channel):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return v1()

    async def channel_empty(self, request: Request) -> Response:
        topic, channel = await self._topic_and_channel(request)
        group = topic.group(channel, create=False)
        if group is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        group.empty()
        return v1()

    async def channel_pause(self, request: Request) -> Response:
        topic, channel = await self._topic_and_channel(request)
        group = topic.group(channel, create=False)
        if group is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        if request.path.endswith("unpause"):
            group.unpause()
        else:
            group.pause()
        return v1()

    # -- stats and config ----------------------------------------------------------------------

    async def stats(self, request: Request) -> Response:
        def arg(name: str) -> str:
            return request.arg(name) or ""

        include_clients = _BOOLS.get(arg("include_clients"), True)
        include_mem = _BOOLS.get(arg("include_mem"), True)
        topic = arg("topic")
        topics = stats.topic_stats(self.broker, topic, arg("channel"), include_clients)
        producers = stats.producers(self.gateway.nsq.sessions, topic) if include_clients else None
        if topics is None:
            producers = None  # nsqd's GetStats returns early for a topic it does not have
        memory = stats.memory_stats() if include_mem else None
        if arg("format") != "json":
            started = self.broker.started_at
            return v1(stats.text_report(topics, producers, memory, started, "OK"))
        report: dict[str, Any] = {
            "version": stats.VERSION,
            "health": "OK",
            "start_time": int(self.broker.started_at),
            "topics": topics,
        }
        if memory is not None:
            report["memory"] = memory
        report["producers"] = producers
        return v1_json(report)

    def _options(self) -> dict[str, Any]:
        """nsqd's options by their config names, for GET /config/<name>."""
        gw = self.gateway
        n = self.limits
        level = logging.getLogger("gateway").getEffectiveLevel()
        return {
            "log_level": _LG_NUMBERS.get(level, 2),
            "tcp_address": gw.settings.nsq,
            "http_address": gw.settings.http,
            "https_address": gw.settings.https,
            "broadcast_address": broadcast_address(gw),
            # where it registers (--lookupd-tcp-address); [] when it is its own lookupd
            "nsqlookupd_tcp_addresses": list(n.lookupd_tcp_addresses),
            "auth_http_addresses": list(n.auth_http_addresses),
            "msg_timeout": n.msg_timeout * _MS,
            "max_msg_timeout": n.max_msg_timeout * _MS,
            "max_msg_size": n.max_msg_size,
            "max_body_size": n.max_body_size,
            "max_req_timeout": n.max_req_timeout * _MS,
            "max_heartbeat_interval": n.max_heartbeat_interval * _MS,
            "max_rdy_count": n.max_rdy_count,
            "max_output_buffer_size": n.max_output_buffer_size,
            "max_output_buffer_timeout": n.max_output_buffer_timeout * _MS,
            "min_output_buffer_timeout": n.min_output_buffer_timeout * _MS,
            "tls_required": 1 if n.tls_required else 0,
            "deflate": n.deflate,
            "max_deflate_level": n.max_deflate_level,
            "snappy": n.snappy,
        }

    async def config(self, request: Request) -> Response:
        option = request.path.rsplit("/", 1)[1]
        if request.method == "PUT":
            read_max = self.limits.max_msg_size + 1
            body = await request.body(read_max)
            if len(body) == read_max or not body:
                raise HTTPError(413, "INVALID_VALUE")
            # of nsqd's two settable options, only log_level means something here
            if option != "log_level":
                raise HTTPError(400, "INVALID_OPTION")
            level = _LOG_LEVELS.get(body.decode("latin-1").lower())
            if level is None:
                raise HTTPError(400, "INVALID_VALUE")
            logging.getLogger("gateway").setLevel(level)
        options = self._options()
        if option not in options:
            raise HTTPError(400, "INVALID_OPTION")
        value = options[option]
        # nsqd's RespondV1 writes a string as it is (text/plain), anything else as JSON
        return v1(value) if isinstance(value, str) else v1_json(value)


def _text_bodies(data: bytes, max_msg_size: int, read_max: int) -> list[bytes]:
    """/mpub text mode, as nsqd's ReadBytes('\\n') loop: a line ends at each newline (only
    the newline is stripped), empty lines are skipped, and the errors come in the order
    the lines are read."""
    bodies = []
    total = 0
    start = 0
    end = len(data)
    while True:
        newline = data.find(b"\n", start)
        stop = end if newline < 0 else newline + 1
        total += stop - start
        if total == read_max:
            raise HTTPError(413, "BODY_TOO_BIG")
        line = data[start : newline if newline >= 0 else end]
        if line:
            if len(line) > max_msg_size:
                raise HTTPError(413, "MSG_TOO_BIG")
            bodies.append(line)
        if newline < 0:
            return bodies
        start = stop


def _binary_bodies(data: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """/mpub binary mode: `[int32 count]([int32 size][bytes])*`, nsqd's readMPUB. Its
    errors are the TCP codes without `E_`, all 413."""
    if len(data) < 4:
        raise HTTPError(413, "BAD_BODY")
    (count,) = _LEN.unpack_from(data)
    # 4 bytes of count, then at least 5 per message (size + one byte)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise HTTPError(413, "BAD_BODY")
    bodies = []
    pos = 4
    for _ in range(count):
        if pos + 4 > len(data):
            raise HTTPError(413, "BAD_MESSAGE")
        (size,) = _LEN.unpack_from(data, pos)
        pos += 4
        if size <= 0 or size > max_msg_size or pos + size > len(data):
            raise HTTPError(413, "BAD_MESSAGE")
        bodies.append(data[pos : pos + size])
        pos += size
    return bodies


def register(router: Router, gateway: Gateway) -> None:
    api = NSQDAPI(gateway)
    router.add("/ping", api.ping, "GET")
    router.add("/info", api.info, "GET")
    router.add("/stats", api.stats, "GET")
    writes = {
        "/pub": api.pub,
        "/mpub": api.mpub,
        "/topic/create": api.topic_create,
        "/topic/delete": api.topic_delete,
        "/topic/empty": api.topic_empty,
        "/topic/pause": api.topic_pause,
        "/topic/unpause": api.topic_pause,
        "/channel/create": api.channel_create,
        "/channel/delete": api.channel_delete,
        "/channel/empty": api.channel_empty,
        "/channel/pause": api.channel_pause,
        "/channel/unpause": api.channel_pause,
    }
    for path, handler in writes.items():
        router.add(path, committed(api.broker.flush, handler), "POST")
    router.add_param("/config/", api.config, "GET", "PUT")
