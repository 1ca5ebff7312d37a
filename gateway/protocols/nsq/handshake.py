"""IDENTIFY and AUTH of an NSQ connection: feature negotiation, the TLS, snappy and
deflate upgrades, and authorization against the auth server (a mixin of NSQSession,
which holds the state these methods read and set)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from gateway.protocols.nsq import events as ev
from gateway.protocols.nsq.auth import AuthFailed, AuthState
from gateway.protocols.nsq.codec import OK_FRAME, NSQServerCodec, error_frame, response_frame
from gateway.protocols.nsq.compression import DeflateStream, SnappyStream
from gateway.protocols.nsq.negotiation import (
    IdentifyError,
    Identity,
    identify,
    negotiation_response,
)

if TYPE_CHECKING:
    from gateway.broker import Consumer
    from gateway.protocols.nsq.server import NSQServer

_TLS_HANDSHAKE_TIMEOUT = 5.0  # nsqd's deadline for the upgrade handshake


class _Close(Exception):
    """End the connection after sending what is queued (`frame`: a last error frame)."""

    def __init__(self, frame: bytes | None = None) -> None:
        self.frame = frame


class Handshake:
    """The session's IDENTIFY and AUTH commands (see NSQSession for the attributes)."""

    server: NSQServer
    stream: trio.abc.Stream
    codec: NSQServerCodec
    remote_ip: str
    consumer: Consumer | None
    client_id: str
    hostname: str
    user_agent: str
    sample_rate: int
    msg_timeout: float
    heartbeat_interval: float
    output_buffer_size: int
    output_buffer_timeout: float
    tls: bool
    snappy: bool
    deflate: bool
    auth_state: AuthState | None
    _secret: bytes
    _out: list[bytes]
    _fd: int | None
    _sending: bool
    _encode: Callable[[bytes], bytes] | None
    _next_heartbeat: float
    _flush_at: float
    _timer_scope: trio.CancelScope | None

    if TYPE_CHECKING:  # provided by the session's other bases (not stubs at run time,
        # which would shadow tcp.QueuedWriter's methods in the MRO)

        async def _flush_all(self) -> None: ...
        async def _settle(self) -> None: ...
        async def _send_now(self, frames: list[bytes]) -> None: ...

    async def _identify(self, event: ev.Identify) -> None:
        features = self.server.features
        try:
            identity = identify(event.body, features, self.remote_ip)
        except IdentifyError as exc:
            raise _Close(error_frame(str(exc).encode())) from None
        if identity.snappy and identity.deflate:
            raise _Close(
                error_frame(b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
            )
        self._apply_identity(identity)
        if not identity.feature_negotiation:
            self._out.append(OK_FRAME)
            self.codec.resume()
            return
        self._out.append(response_frame(negotiation_response(identity, features)))
        if not (identity.tls_v1 or identity.snappy or identity.deflate):
            self.codec.resume()
            return
        # Upgrades: the JSON goes out in plain text first, then each step answers OK in
        # its new framing (docs/protocols/nsq.md §9). The client sends nothing until each OK.
        await self._flush_all()
        if identity.tls_v1:
            await self._upgrade_tls()
            await self._send_now([OK_FRAME])
        if identity.snappy:
            snappy = SnappyStream()
            self.codec.set_decoder(snappy.decode)
            self._encode = snappy.encode
            self.snappy = True
            await self._send_now([OK_FRAME])
        if identity.deflate:
            deflate = DeflateStream(identity.deflate_level)
            self.codec.set_decoder(deflate.decode)
            self._encode = deflate.encode
            self.deflate = True
            await self._send_now([OK_FRAME])
        self.codec.resume()

    def _apply_identity(self, identity: Identity) -> None:
        self.client_id = identity.client_id
        self.hostname = identity.hostname
        self.user_agent = identity.user_agent
        self.sample_rate = identity.sample_rate
        self.msg_timeout = identity.msg_timeout / 1000
        self.output_buffer_size = identity.output_buffer_size
        self.output_buffer_timeout = identity.output_buffer_timeout / 1000
        if self.consumer is not None:
            self.consumer.timeout = self.msg_timeout
        now = trio.current_time()
        if identity.heartbeat_interval == -1:
            self.codec.heartbeats_disabled = True
            self.heartbeat_interval = 0.0
            self._next_heartbeat = math.inf
        else:
            self.codec.heartbeats_disabled = False
            self.heartbeat_interval = identity.heartbeat_interval / 1000
            self._next_heartbeat = now + self.heartbeat_interval
        if self._timer_scope is not None:
            self._timer_scope.deadline = min(self._next_heartbeat, self._flush_at)

    async def _upgrade_tls(self) -> None:
        assert self.server.ssl_context is not None
        if self.codec.buffered:
            raise _Close()  # the client must wait for the JSON before its TLS hello
        await self._settle()
        self._sending = True  # the writer must not use the stream while it changes
        try:
            tls_stream = trio.SSLStream(self.stream, self.server.ssl_context, server_side=True)
            with trio.move_on_after(_TLS_HANDSHAKE_TIMEOUT) as scope:
                try:
                    await tls_stream.do_handshake()
                except trio.BrokenResourceError:
                    raise _Close() from None
            if scope.cancelled_caught:
                raise _Close()
            self.stream = tls_stream
            self._fd = None
        finally:
            self._sending = False
        self.tls = True
        self.codec.tls_required = False

    async def _auth(self, event: ev.Auth) -> None:
        if self.auth_state is not None:
            raise _Close(error_frame(b"E_INVALID AUTH already set"))
        auth = self.server.auth
        if auth is None:
            raise _Close(error_frame(b"E_AUTH_DISABLED AUTH disabled"))
        state = await self._query_auth(event.secret)
        if not state.authorizations:
            raise _Close(error_frame(b"E_UNAUTHORIZED AUTH no authorizations found"))
        self.auth_state = state
        self._secret = event.secret
        self._out.append(response_frame(state.response_json()))

    async def _query_auth(self, secret: bytes) -> AuthState:
        assert self.server.auth is not None
        try:
            return await self.server.auth.query(
                secret.decode("utf-8", "surrogateescape"), self.remote_ip, self.tls
            )
        except AuthFailed:
            raise _Close(error_frame(b"E_AUTH_FAILED AUTH failed")) from None

    async def _check_auth(self, cmd: str, topic: str, channel: str) -> None:
        if self.server.auth is None:
            return
        state = self.auth_state
        if state is None or not state.authorizations:
            raise _Close(error_frame(f"E_AUTH_FIRST AUTH required before {cmd}".encode()))
        if state.is_expired(trio.current_time()):
            state = self.auth_state = await self._query_auth(self._secret)
        if not state.is_allowed(topic, channel, "subscribe" if cmd == "SUB" else "publish"):
            raise _Close(
                error_frame(
                    f'E_UNAUTHORIZED AUTH failed for {cmd} on "{topic}" "{channel}"'.encode()
                )
            )
