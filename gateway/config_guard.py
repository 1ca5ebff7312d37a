"""The settings that guard the gateway: `[tls]`, `[http]` (its token), `[limits]`, and
the NATS users with their permissions. Part of the settings model in config.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.config_errors import pair_error


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class NATSPermission(_Section):
    """Subject patterns a user may (allow) or may not (deny) use; no allow list: all."""

    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)

    @field_validator("allow", "deny")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        from gateway.subjects import is_valid_subscription

        bad = [
            p for p in value or [] if not is_valid_subscription(p) or any(c.isspace() for c in p)
        ]
        if bad:
            raise ValueError(f"invalid subject patterns: {bad}")
        return value


class NATSPermissions(_Section):
    """nats-server's `permissions`: `publish` and `subscribe`, each a list of allowed
    subjects or a table with `allow` and `deny`."""

    publish: NATSPermission | None = None
    subscribe: NATSPermission | None = None

    @field_validator("publish", "subscribe", mode="before")
    @classmethod
    def _list_is_allow(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        return {"allow": value} if isinstance(value, list) else value


class NATSUser(_Section):
    user: str = Field(min_length=1)
    password: str
    permissions: NATSPermissions | None = None


class ListenerTLS(_Section):
    """`[tls.<listener>]`: this listener's own certificate or client verification, in
    place of the shared ones (a public HTTPS certificate beside an internal one, say)."""

    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None
    verify: bool | None = None  # unset: the shared `verify`

    @model_validator(mode="after")
    def _pair(self) -> ListenerTLS:
        if self.cert is not None and self.key is None:
            raise pair_error("cert", "key", "a certificate needs its private key")
        if self.key is not None and self.cert is None:
            raise pair_error("key", "cert", "a private key needs its certificate")
        return self


class TLSSettings(_Section):
    """The `[tls]` table: `cert` and `key` are the top-level `tls_cert` and `tls_key`
    (`--tls-cert`, `--tls-key`, GATEWAY_TLS_CERT); the rest is here."""

    # a CA whose client certificates are accepted, and whether one is required: NATS
    # clients (nats-server's tls_verify) and HTTPS (mutual TLS)
    client_ca: str | None = None
    verify: bool = False
    # the listeners that use the certificate (NSQ: offered through IDENTIFY; NATS:
    # required, as nats-server with a tls block; HTTPS: its own port, HTTP/2 by ALPN).
    # The plain HTTP listener never uses it, as nsqd's --http-address.
    listeners: list[Literal["nsq", "nats", "https"]] = Field(
        default_factory=lambda: ["nsq", "nats", "https"]
    )

    # per-listener overrides: [tls.nsq], [tls.nats], [tls.https], [tls.beanstalk]
    nsq: ListenerTLS | None = None
    nats: ListenerTLS | None = None
    https: ListenerTLS | None = None
    beanstalk: ListenerTLS | None = None

    @model_validator(mode="before")
    @classmethod
    def _http_was_https(cls, data: Any) -> Any:
        """`http` in `listeners` and `[tls.http]` are read as `https`: before the HTTPS
        listener had a port of its own, they named TLS on the HTTP port."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "http" in data:
            data.setdefault("https", data.pop("http"))
        listeners = data.get("listeners")
        if isinstance(listeners, list):
            data["listeners"] = ["https" if name == "http" else name for name in listeners]
        return data

    @model_validator(mode="after")
    def _verify_needs_ca(self) -> TLSSettings:
        for name in ("", "nsq", "nats", "https", "beanstalk"):
            o = getattr(self, name) if name else None
            verify = self.verify if o is None or o.verify is None else o.verify
            ca = (o.client_ca if o is not None else None) or self.client_ca
            if verify and ca is None:
                where = f"[tls.{name}] " if name else ""
                raise ValueError(f"{where}verify needs a client_ca")
        return self

    def for_listener(self, name: str) -> tuple[str | None, str | None, str | None]:
        """(cert, key, client CA to require) of one listener: its override, else the
        shared pair (passed in by the caller as None here) and settings."""
        o: ListenerTLS | None = getattr(self, name)
        verify = self.verify if o is None or o.verify is None else o.verify
        ca = ((o.client_ca if o is not None else None) or self.client_ca) if verify else None
        if o is not None and o.cert is not None:
            return o.cert, o.key, ca
        return None, None, ca


class HTTPSettings(_Section):
    """The HTTP listener's `[http]` table (its `address` key is the listener's address,
    the same as the top-level `http = "host:port"`)."""

    # With a token, every write (nsqd's /pub, /mpub, topic and channel actions, /config
    # PUT) and every admin action needs `Authorization: Bearer <token>` (or basic auth
    # with the token as password); without one they answer 401. /ping, /health and
    # /ready never ask.
    auth_token: str | None = Field(None, min_length=1)
    # the reads too: /metrics, /stats, /info, the lookup endpoints and the admin page's data
    protect_reads: bool = False

    @model_validator(mode="after")
    def _reads_need_token(self) -> HTTPSettings:
        if self.protect_reads and self.auth_token is None:
            raise ValueError("protect_reads needs an auth_token")
        return self


class LimitsSettings(_Section):
    """Bounds on what clients can make the gateway hold (README, Limits)."""

    # connections one TCP listener (NSQ, beanstalkd, NATS) takes; past it the new one is
    # refused in its protocol's words (NATS: nats-server's 'maximum connections exceeded')
    # nats-server's default (64K); nsqd and beanstalkd have none
    max_connections: int = Field(65_536, ge=1)
    # from one client address, per listener; 0: no limit (the default, as in nsqd,
    # beanstalkd and nats-server: a sidecar sees every client from 127.0.0.1, and a
    # fleet behind NAT comes from one address)
    max_connections_per_ip: int = Field(0, ge=0)
    # bytes queued for one NATS client that its socket has not taken, before it is cut
    # off as a slow consumer (the smaller of this and nats_server.max_pending); past 3/4
    # of it, its publishers stall (gateway/stall.py)
    max_pending_bytes: int = Field(64 * 1024 * 1024, ge=65536)
    # the same for all NATS clients together; past it, a client with more than
    # max_pending_bytes / 64 waiting is cut off as a slow consumer
    max_buffered_bytes: int = Field(1024 * 1024 * 1024, ge=1024 * 1024)
    # microseconds of commands one connection may run before the others get their turn:
    # a client pipelining thousands of commands in one write cannot stall the rest
    turn_microseconds: int = Field(20, ge=5, le=100_000)
    # beanstalkd (which answers bad input for ever) and NATS errors that keep the
    # connection: past this many in a row, the connection is closed
    max_errors_in_a_row: int = Field(100, ge=1)
