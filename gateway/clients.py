"""What the HTTP layer shows of a connection, as values: each session answers
`client_info()` (a consumer's sink, an NSQ publisher) or `route_info()` (a NATS route), so
`/stats`, the admin page and metrics read figures without importing a session class or
reading its attributes. A leaf module: the sessions import it, it imports none of them.

The fields are nsqd's clientV2 stats (the richest of the protocols); another protocol's
worker fills what it has (`ClientInfo.worker`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import trio


@dataclass(frozen=True, slots=True)
class TLSInfo:
    cipher_suite: str
    version: str  # as Go writes it: TLS1.2, not OpenSSL's TLSv1.2
    negotiated_protocol: str

    @staticmethod
    def of(stream: object) -> TLSInfo | None:
        """The TLS a stream speaks; None when it is plain."""
        if not isinstance(stream, trio.SSLStream):
            return None
        cipher = stream.cipher()
        version = stream.version() or ""
        return TLSInfo(
            cipher[0] if cipher else "",
            version.replace("TLSv", "TLS"),
            stream.selected_alpn_protocol() or "",
        )


@dataclass(frozen=True, slots=True)
class ClientInfo:
    client_id: str
    hostname: str
    version: str
    remote_address: str
    state: int  # nsqd's numbers: 0 before SUB, 3 subscribed, 4 closing
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    user_agent: str
    tls: TLSInfo | None = None
    authed: bool = False
    auth_identity: str = ""
    auth_identity_url: str = ""
    pub_counts: tuple[tuple[str, int], ...] = ()  # (topic, messages) in first-publish order

    @staticmethod
    def worker(remote: str, protocol: str, connect_ts: int) -> ClientInfo:
        """Another protocol's worker (beanstalkd, RocketMQ): its address, protocol and
        when it connected (Unix seconds); its window figures are its consumer's, which
        /stats reads from the broker."""
        return ClientInfo(
            client_id=remote.rsplit(":", 1)[0].strip("[]"),
            hostname="",
            version=protocol,
            remote_address=remote,
            state=3,  # subscribed
            ready_count=0,
            in_flight_count=0,
            message_count=0,
            finish_count=0,
            requeue_count=0,
            connect_ts=connect_ts,
            sample_rate=0,
            deflate=False,
            snappy=False,
            user_agent=protocol,
        )


class Client(Protocol):
    def client_info(self) -> ClientInfo: ...


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """A NATS cluster route, as the admin page shows it."""

    server_id: str | None
    server_name: str
    peer: str
    dialed: bool
    interest: int  # subjects and queue groups the server asked for
