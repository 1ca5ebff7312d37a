"""`--store` URLs of the Redis store, and the coredis client they make.

redis://[user:pass@]host:port/db     one Redis server (database `db`, default 0)
rediss://...                         the same over TLS
redis+cluster://host:port[,host:port...]   a Redis Cluster (any reachable nodes)
?shared=no                           one gateway owns the data (see docs/storage.md)
"""

from __future__ import annotations

from dataclasses import dataclass
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
            "decode_responses": False,
        }
        if self.cluster:
            return coredis.RedisCluster(
                startup_nodes=[{"host": h, "port": p} for h, p in self.nodes], **common
            )
        host, port = self.nodes[0]
        return coredis.Redis(host, port, self.db, **common)


def parse_redis_url(url: str) -> RedisTarget:
    """The target a Redis `--store` URL names; RedisURLError saying what is wrong."""
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
    if query:
        raise RedisURLError(f"unknown option {next(iter(query))!r} in {url!r}")
    return RedisTarget(
        tuple(nodes),
        int(path or 0),
        user,
        password,
        tls=scheme.startswith("rediss"),
        cluster=cluster,
        shared=shared_s in ("yes", "1", "true"),
    )
