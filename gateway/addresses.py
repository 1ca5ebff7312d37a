"""Listener and route addresses as settings write them and as logs show them.

A leaf module: the config sections, the app and the NATS cluster all read addresses,
and none of them should have to import another to do so.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import unquote, urlsplit

Address = tuple[str, int]


def parse_address(value: str) -> Address:
    """`host:port` (IPv6 as `[::1]:port`) -> (host, port). Port 0 picks a free port."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address must be host:port or 'off', got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    number = int(port)
    if number > 65535:
        raise ValueError(f"port out of range in {value!r}")
    return host, number


def parse_route_url(url: str) -> tuple[str, int, str | None, str | None]:
    """`nats://[user:pass@]host:port` (also nats-route:// and tls://) -> parts."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.scheme not in ("nats", "nats-route", "tls", "route"):
        raise ValueError(f"route URL must be nats://host:port, got {url!r}")
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"bad port in route URL {url!r}") from e
    if not parts.hostname or port is None:
        raise ValueError(f"route URL must be nats://host:port, got {url!r}")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return parts.hostname, port, user, password


def format_address(host: str, port: int) -> str:
    """What parse_address reads back: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether a bound host is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
