"""`--store` URLs of the Redis store, and the coredis client they make.

redis://[user:pass@]host:port/db     one Redis server (database `db`, default 0)
rediss://...                         the same over TLS, the system's CAs trusted unless
  ?ssl_ca_certs=PATH                   this CA bundle (PEM) is
  &ssl_certfile=PATH&ssl_keyfile=PATH  a client certificate, for `tls-auth-clients yes`
  &ssl_cert_reqs=required|optional|none   how the server's certificate is checked
redis+cluster://host:port[,host:port...]   a Redis Cluster (any reachable nodes)
?shared=no                           one gateway owns the data (see docs/storage.md)
"""

from __future__ import annotations

import functools
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")
DEFAULT_PORT = 6379
# a server that does not answer a command within this long counts as lost
STREAM_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0


class RedisURLError(ValueError):
    pass


@dataclass(frozen=True)
class RedisTarget:
    nodes: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    cluster: bool = False
    shared: bool = True
    # TLS options, named as redis-py and coredis name them (rediss:// only)
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cert_reqs: str = "required"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS settings of every connection to this target (None: plain TCP)."""
        return _ssl_context(self) if self.tls else None

    @property
    def address(self) -> str:
        """Where, for log lines (no credentials)."""
        return ",".join(f"{h}:{p}" for h, p in self.nodes)

    def client(self) -> Any:
        import coredis

        common: dict[str, Any] = {
            "username": self.username,
            "password": self.password,
            "stream_timeout": STREAM_TIMEOUT,
            "connect_timeout": CONNECT_TIMEOUT,
            "ssl": self.tls,
            "ssl_context": self.ssl_context(),
            "decode_responses": False,
        }
        if self.cluster:
            return coredis.RedisCluster(
                startup_nodes=[{"host": h, "port": p} for h, p in self.nodes], **common
            )
        host, port = self.nodes[0]
        return coredis.Redis(host, port, self.db, **common)


@functools.cache
def _ssl_context(target: RedisTarget) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=target.ssl_ca_certs)
    if target.ssl_cert_reqs != "required":
        context.check_hostname = False
        context.verify_mode = (
            ssl.CERT_OPTIONAL if target.ssl_cert_reqs == "optional" else ssl.CERT_NONE
        )
    if target.ssl_certfile:
        context.load_cert_chain(target.ssl_certfile, target.ssl_keyfile)
    return context


_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
_CERT_REQS = ("required", "optional", "none")


def _hide_password(url: str) -> str:
    """The URL for error messages: a password in it is not repeated."""
    return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)


def parse_redis_url(url: str) -> RedisTarget:
    """The target a Redis `--store` URL names; RedisURLError saying what is wrong."""
    try:
        return _parse(url)
    except RedisURLError as exc:
        raise RedisURLError(str(exc).replace(url, _hide_password(url))) from None


def _parse(url: str) -> RedisTarget:
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise RedisURLError(f"unsupported URL {url!r}: use redis://host:port/db")
    cluster = scheme.endswith("+cluster")
    parts = urlsplit(url)
    netloc = parts.netloc
    user = password = None
    if "@" in netloc:
        cred, _, netloc = netloc.rpartition("@")
        user_s, _, pass_s = cred.partition(":")
        user, password = unquote(user_s) or None, unquote(pass_s) or None
    nodes: list[tuple[str, int]] = []
    for hostport in netloc.split(","):
        host, colon, port_s = hostport.rpartition(":")
        if not colon:
            host, port_s = hostport, str(DEFAULT_PORT)
        host = host.strip("[]")
        if not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
            raise RedisURLError(f"bad host:port {hostport!r} in {url!r}")
        nodes.append((host, int(port_s)))
    if len(nodes) > 1 and not cluster:
        raise RedisURLError(f"several hosts in {url!r}: only redis+cluster:// takes a list")
    path = parts.path.strip("/")
    if path and (cluster or not path.isdigit()):
        raise RedisURLError(f"bad database {path!r} in {url!r}: a number (and none for a cluster)")
    query = parse_qs(parts.query)
    shared_s = query.pop("shared", ["yes"])[-1].lower()
    if shared_s not in ("yes", "no", "1", "0", "true", "false"):
        raise RedisURLError(f"bad shared={shared_s!r} in {url!r}: yes or no")
    tls = scheme.startswith("rediss")
    options = {name: query.pop(name)[-1] for name in _TLS_OPTIONS if name in query}
    if query:
        raise RedisURLError(f"unknown option {next(iter(query))!r} in {url!r}")
    if options and not tls:
        raise RedisURLError(f"{next(iter(options))} in {url!r}: TLS options need rediss://")
    cert_reqs = options.pop("ssl_cert_reqs", "required")
    if cert_reqs not in _CERT_REQS:
        raise RedisURLError(f"bad ssl_cert_reqs={cert_reqs!r} in {url!r}: one of {_CERT_REQS}")
    for name, path_s in options.items():
        if not Path(path_s).is_file():
            raise RedisURLError(f"{name} file {path_s!r} in {url!r}: no such file")
    if "ssl_keyfile" in options and "ssl_certfile" not in options:
        raise RedisURLError(f"ssl_keyfile without ssl_certfile in {url!r}")
    target = RedisTarget(
        tuple(nodes),
        int(path or 0),
        user,
        password,
        tls=tls,
        cluster=cluster,
        shared=shared_s in ("yes", "1", "true"),
        ssl_cert_reqs=cert_reqs,
        **options,
    )
    if tls:
        try:
            target.ssl_context()
        except (OSError, ssl.SSLError) as exc:  # a file that is no certificate or key
            raise RedisURLError(f"TLS settings of {url!r}: {exc}") from None
    return target
