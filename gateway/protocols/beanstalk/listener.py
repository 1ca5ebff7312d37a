"""The beanstalkd listeners: plain, and TLS from the first byte on a port of its own."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

import trio

from gateway.listeners import Listener, Service
from gateway.protocols.beanstalk.server import BeanstalkServer
from gateway.protocols.beanstalk.session import BeanstalkSession

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.config import Settings
    from gateway.metrics import Metrics
    from gateway.tls import ListenerContexts

_TLS_HANDSHAKE_SECONDS = 5.0  # a beanstalkd TLS client's handshake, after which it is closed


def service(
    settings: Settings, broker: Broker, metrics: Metrics, tls: ListenerContexts
) -> Service[BeanstalkServer]:
    b = settings.beanstalkd
    plain = settings.address("beanstalk")
    wrapped = settings.address("beanstalk_tls")
    # the protocol has no upgrade: the TLS port shows the shared certificate whatever
    # `tls.listeners` says (config.py refuses the port without one)
    context = tls.context("beanstalk", always_shared=True) if wrapped is not None else None
    server = BeanstalkServer(
        broker,
        metrics,
        group_name=b.group,
        max_job_size=b.max_job_size,
        default_ttr=b.default_ttr,
        turn_budget=settings.limits.turn_microseconds / 1e6,
        max_errors_in_a_row=settings.limits.max_errors_in_a_row,
    )
    metrics.before_scrape.append(server.report_bytes)

    async def connection(stream: trio.SocketStream, remote: str) -> None:
        await BeanstalkSession(server, stream, remote).run()

    async def tls_connection(stream: trio.SocketStream, remote: str) -> None:
        assert context is not None
        await _tls_connection(server, context, stream, remote)

    return Service(
        server,
        [
            # the plain listener has neither TLS nor authentication (beanstalkd has none)
            Listener("beanstalk", plain, connection, guarded=False, refuse=_refuse),
            # no TLS session yet to answer a refusal in: the close alone
            Listener("beanstalk-tls", wrapped, tls_connection, guarded=True),
        ],
        before=server.start if plain is not None or wrapped is not None else None,
    )


async def _refuse(stream: trio.SocketStream, remote: str) -> None:
    # beanstalkd's reply when it lacks the resources for a command: the client's first
    # command gets it as its reply
    await stream.send_all(b"OUT_OF_MEMORY\r\n")


async def _tls_connection(
    server: BeanstalkServer, context: ssl.SSLContext, stream: trio.SocketStream, remote: str
) -> None:
    """beanstalkd inside TLS from the first byte (no client library here speaks it; a
    TLS tunnel such as stunnel in front of any client does)."""
    tls = trio.SSLStream(stream, context, server_side=True)
    with trio.move_on_after(_TLS_HANDSHAKE_SECONDS):
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError:
            server.metrics.protocol_error("beanstalk", "TLS_HANDSHAKE")
            await trio.aclose_forcefully(stream)
            return
        await BeanstalkSession(server, tls, remote).run()
        return
    server.metrics.protocol_error("beanstalk", "TLS_HANDSHAKE")
    await trio.aclose_forcefully(stream)
