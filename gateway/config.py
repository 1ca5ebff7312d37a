"""Settings from four sources; the higher one wins, key by key:

    command-line flags > GATEWAY_* environment variables > the TOML file > defaults

as every tool users know orders them: a flag typed on the command line is the most
deliberate choice, so an environment inherited from a shell, an image or a pod cannot
silently undo it. `gather()` also records which source each setting came from, so
`check-config` and the start-up log can name the winner wherever two sources disagree.

Every limit is a setting with nsqd's (or the relevant server's) default, so a gateway
started with no configuration behaves like the servers its clients expect.

Environment names: top-level keys as `GATEWAY_<KEY>` (GATEWAY_NSQ, GATEWAY_TLS_CERT,
GATEWAY_STORE, ...), section keys as `GATEWAY_<SECTION>__<KEY>`
(GATEWAY_NSQD__MAX_MSG_SIZE). Lists in the environment are comma-separated.
GATEWAY_CONFIG names the file when no --config is given (the flag wins here too).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from gateway.addresses import parse_address, parse_route_url
from gateway.config_errors import Describer, pair_error, setting_error

# the guarding sections live in config_guard.py; they are part of this model, and
# imported from here like every other section
from gateway.config_guard import (
    HTTPSettings,
    LimitsSettings,
    NATSUser,
    TLSSettings,
    _Section,
)
from gateway.config_links import (
    BeanstalkImportSettings,
    NSQExportSettings,
    NSQImportSettings,
)
from gateway.config_rocketmq import RocketMQSettings

OFF = "off"


class NSQDSettings(_Section):
    """NSQ TCP behaviour; names and defaults follow nsqd 1.3.0's flags (ms for durations)."""

    max_msg_size: int = Field(1048576, ge=1)
    max_body_size: int = Field(5242880, ge=1)
    max_rdy_count: int = Field(2500, ge=1)
    msg_timeout: int = Field(60000, ge=1000)
    max_msg_timeout: int = Field(900000, ge=1000)
    max_req_timeout: int = Field(3600000, ge=0)
    client_timeout: int = Field(60000, ge=2000)  # the default heartbeat is half of it
    max_heartbeat_interval: int = Field(60000, ge=1000)
    max_output_buffer_size: int = Field(65536, ge=64)
    max_output_buffer_timeout: int = Field(30000, ge=1)
    min_output_buffer_timeout: int = Field(25, ge=1)
    snappy: bool = True
    deflate: bool = True
    max_deflate_level: int = Field(6, ge=1, le=9)
    tls_required: bool = False
    auth_http_addresses: list[str] = Field(default_factory=list)
    auth_http_request_method: Literal["get", "post"] = "get"
    max_line_length: int = Field(16384, ge=64)
    max_output_bytes: int = Field(4 * 1024 * 1024, ge=65536)
    hostname: str = "localhost"
    # The address NSQ clients are told to dial (HTTP /info, and the producer the nsqlookupd
    # endpoints list). nsqd's default is the hostname; unset here, it is the NSQ listener's
    # host when that is a specific address (a sidecar on 127.0.0.1), else the hostname.
    broadcast_address: str | None = None
    # nsqlookupd TCP addresses (host:port, nsqd's repeatable --lookupd-tcp-address) the
    # gateway registers with, as nsqd does: every topic and group NSQ can name
    lookupd_tcp_addresses: list[str] = Field(default_factory=list)

    @field_validator("lookupd_tcp_addresses")
    @classmethod
    def _lookupd_addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            _, port = parse_address(address)
            if port == 0:
                raise ValueError(f"an nsqlookupd address needs its port, got {address!r}")
        return value


class BeanstalkSettings(_Section):
    """beanstalkd behaviour; defaults follow beanstalkd 1.13."""

    group: str = Field(
        "beanstalk", min_length=1
    )  # the group all beanstalkd workers of a tube share
    max_job_size: int = Field(65535, ge=0, le=1073741824)  # beanstalkd -z
    default_ttr: int = Field(60, ge=1)  # seconds, for messages published without a ttr (NSQ, NATS)


class NATSServerSettings(_Section):
    """NATS client-protocol behaviour; defaults follow nats-server's."""

    max_payload: int = Field(1048576, ge=1, le=64 * 1024 * 1024)
    max_pending: int = Field(64 * 1024 * 1024, ge=65536)  # past it a client is a slow consumer
    # seconds a write to a client may wait for its socket; past it, a slow consumer too
    write_deadline: float = Field(10.0, gt=0)
    max_control_line: int = Field(4096, ge=256)
    ping_interval: float = Field(120.0, gt=0)  # seconds between PINGs to an idle client
    ping_max: int = Field(2, ge=1)  # unanswered PINGs before 'Stale Connection'
    user: str | None = None  # user/password, or token: what CONNECT must carry
    password: str | None = None
    token: str | None = None
    # several users, each with its own permissions (nats-server's `users` block)
    users: list[NATSUser] = Field(default_factory=list)
    server_name: str = "gateway"
    # seconds: the TLS handshake after INFO, and CONNECT when authentication is required
    tls_timeout: float = Field(2.0, gt=0)
    auth_timeout: float = Field(2.0, gt=0)

    @model_validator(mode="after")
    def _one_kind_of_auth(self) -> NATSServerSettings:
        if self.token is not None and (self.user is not None or self.users):
            raise ValueError("token and users cannot both be set (as in nats-server)")
        names = [u.user for u in self.users] + ([self.user] if self.user is not None else [])
        if len(names) != len(set(names)):
            raise ValueError("a user name appears twice")
        return self


class NATSRoutingSettings(_Section):
    """The NATS cluster route peer (--nats-route, --nats-routes, --nats-cluster).

    Defaults follow nats-server's cluster block where it has one.
    """

    # Subject patterns the gateway asks the cluster for even with no local consumer:
    # messages on them are kept in topics (made on first message) for any protocol.
    imports: list[str] = Field(default_factory=list)
    # Route credentials: what an inbound route's CONNECT must carry, and what the gateway
    # sends when it dials (a route URL's own user:pass@ wins).
    user: str | None = None
    password: str | None = None
    # TLS on routes: accepted routes use tls_cert/tls_key; dialed routes verify the
    # server against tls_ca (the system store when unset).
    tls: bool = False
    tls_ca: str | None = None
    server_name: str | None = None  # unique in the cluster; default gateway-<id prefix>
    # host:port written into INFO for other servers to dial (gossip); the bound address
    # by default.
    advertise: str | None = None
    ping_interval: float = Field(30.0, gt=0)  # seconds; nats-server caps routes at 30 s
    ping_max: int = Field(2, ge=1)  # unanswered PINGs before the route is stale
    reconnect_max_wait: float = Field(2.0, gt=0)  # backoff cap when redialing a route
    handshake_timeout: float = Field(5.0, gt=0)  # CONNECT/INFO must arrive by then
    max_pending: int = Field(64 * 1024 * 1024, ge=65536)  # outbound bytes before closing
    max_control_line: int = Field(65536, ge=4096)  # 2.14+: 16 x max_control_line
    max_payload: int = Field(64 * 1024 * 1024, ge=1024)  # a safety bound; not a NATS limit

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, value: str | None) -> str | None:
        if value is not None:
            parse_address(value)  # host:port, checked here: check-config must see it too
        return value

    @field_validator("imports")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        from gateway.subjects import is_valid_subscription

        bad = [p for p in value if not is_valid_subscription(p) or any(c.isspace() for c in p)]
        if bad:
            raise ValueError(f"invalid subject patterns: {bad}")
        return value


class MetricsSettings(_Section):
    # (topic, group) series exported at most; the rest are summed under "_other"
    max_series: int = Field(1000, ge=1)


class StorageSettings(_Section):
    """The durable store (`--store` unset: SQLite in `data_dir`; docs/storage.md)."""

    # fsync policy, as beanstalkd's -f: "always" (acknowledge only after fsync: survives
    # power loss), an interval in ms (fsync at least that often), or "never" (the OS
    # decides). Every policy acknowledges a publish only once it is written to the OS,
    # so killing the gateway never loses an acknowledged message.
    fsync: Literal["always", "never"] | int = 50
    # ready messages per group kept in memory; the rest stay on disk and are paged in
    memory_window: int = Field(10_000, ge=100)

    @field_validator("fsync", mode="before")
    @classmethod
    def _fsync(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError('fsync interval must be at least 1 ms (or "always" / "never")')
        return value


class ArchiveSettings(_Section):
    """The message archive: lifecycle events as Parquet segments (docs/archive.md)."""

    enabled: bool = False
    dir: str | None = None  # unset: <data_dir>/archive
    topics: list[str] = Field(default_factory=list)  # fnmatch patterns; empty: every topic
    # the body column: "full", "none" (null), or the first N bytes
    body: Literal["full", "none"] | int = "full"
    # events waiting for the writer; past it they are dropped and counted, never waited for
    buffer: int = Field(100_000, ge=1)
    segment_bytes: int = Field(128 * 1024 * 1024, ge=1)  # close a segment past this size
    segment_seconds: float = Field(3600.0, gt=0)  # or once it has been open this long
    # the Parquet codec: lz4 costs the gateway least CPU (about 0.25 us less per event
    # than zstd, measured); zstd makes segments about half the size
    compression: Literal["zstd", "lz4", "snappy", "gzip", "none"] = "lz4"

    @field_validator("body", mode="before")
    @classmethod
    def _body(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or (isinstance(value, int) and value < 0):
            raise ValueError('body must be "full", "none" or a number of bytes >= 0')
        return value


class BrokerSettings(_Section):
    max_attempts: int = Field(0, ge=0)  # 0: retry for ever; else bury past this many


class Settings(_Section):
    config: str | None = None
    data_dir: str = "./data"
    store: str | None = None
    # seconds to keep trying to reach a Redis store at start (then exit 1, for the
    # orchestrator to restart it); /health answers meanwhile and /ready says why not
    store_wait: float = Field(60.0, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    nsq: str = "127.0.0.1:4150"
    # plain HTTP whatever certificate is configured, as nsqd's --http-address
    http: str = "127.0.0.1:4151"
    # HTTPS on a port of its own, as nsqd's --https-address: served only when a
    # certificate applies to it (tls_cert/tls_key with "https" in tls.listeners, or
    # [tls.https]); nsqd likewise serves its HTTPS port only with --tls-cert
    https: str = "127.0.0.1:4152"
    beanstalk: str = "127.0.0.1:11300"
    # beanstalkd over TLS on a port of its own (the protocol has no upgrade): off unless set
    beanstalk_tls: str = OFF
    nats: str = "127.0.0.1:4222"
    nats_route: str = "127.0.0.1:6222"
    nats_routes: list[str] = Field(default_factory=list)
    nats_cluster: str | None = None
    rocketmq: str = "127.0.0.1:9876"
    tls_cert: str | None = None
    tls_key: str | None = None
    nsqd: NSQDSettings = Field(default_factory=NSQDSettings)
    beanstalkd: BeanstalkSettings = Field(default_factory=BeanstalkSettings)
    nats_server: NATSServerSettings = Field(default_factory=NATSServerSettings)
    nats_routing: NATSRoutingSettings = Field(default_factory=NATSRoutingSettings)
    # the [http] table (written `[http]` in a file, `GATEWAY_HTTP__<KEY>` in the
    # environment): `http` itself stays the listener's address
    http_settings: HTTPSettings = Field(default_factory=HTTPSettings)
    tls_settings: TLSSettings = Field(default_factory=TLSSettings)  # the [tls] table
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    archive: ArchiveSettings = Field(default_factory=ArchiveSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)

    @model_validator(mode="before")
    @classmethod
    def _http_table(cls, data: Any) -> Any:
        return split_http_table(data) if isinstance(data, Mapping) else data

    rocketmq_broker: RocketMQSettings = Field(default_factory=RocketMQSettings)
    # links to live servers, one [[table]] each (docs/bridging.md)
    nsq_import: list[NSQImportSettings] = Field(default_factory=list)
    nsq_export: list[NSQExportSettings] = Field(default_factory=list)
    beanstalk_import: list[BeanstalkImportSettings] = Field(default_factory=list)

    @field_validator("store")
    @classmethod
    def _store(cls, value: str | None) -> str | None:
        if value is not None:
            from gateway.stores import check_store_url

            scheme, _, path = value.partition("://")
            if scheme == "sqlite" and path and not path.startswith("/"):
                # sqlite://data.db reads as a path to many; the store takes only an
                # absolute one, written after a third slash
                raise ValueError(
                    f"a SQLite store needs an absolute path, written after three slashes"
                    f" (sqlite:///absolute/path/to/{path.rsplit('/', 1)[-1]}),"
                    f' got "{value}"'
                )
            check_store_url(value)
        return value

    @field_validator(
        "nsq", "http", "https", "beanstalk", "beanstalk_tls", "nats", "nats_route", "rocketmq"
    )
    @classmethod
    def _address(cls, value: str) -> str:
        if value != OFF:
            parse_address(value)
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.tls_cert is not None and self.tls_key is None:
            raise pair_error("tls_cert", "tls_key", "a certificate needs its private key")
        if self.tls_key is not None and self.tls_cert is None:
            raise pair_error("tls_key", "tls_cert", "a private key needs its certificate")
        if self.nsqd.lookupd_tcp_addresses and OFF in (self.nsq, self.http):
            # nsqlookupd refuses a producer without both ports (E_BAD_BODY), and a consumer
            # it sent here could not connect
            raise setting_error(
                "nsqd.lookupd_tcp_addresses",
                "needs the NSQ and HTTP listeners (nsq and http not off): the lookupd"
                " tells consumers and nsqadmin to reach the gateway there",
            )
        own = self.tls_settings.beanstalk
        if self.beanstalk_tls != OFF and self.tls_cert is None and (own is None or not own.cert):
            raise setting_error(
                "beanstalk_tls",
                "needs a certificate (tls_cert and tls_key, or [tls.beanstalk])",
            )
        return self

    @field_validator("nats_routes")
    @classmethod
    def _route_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            parse_route_url(url)
        return value

    def address(self, listener: str) -> tuple[str, int] | None:
        value = getattr(self, listener)
        return None if value == OFF else parse_address(value)


# Tables whose keys partly live at the top level: table -> (settings field, {table key:
# top-level key}).
_SPLIT_TABLES = {
    "http": ("http_settings", {"address": "http"}),
    "tls": ("tls_settings", {"cert": "tls_cert", "key": "tls_key"}),
}


def split_http_table(data: Mapping[str, Any]) -> dict[str, Any]:
    """`[http]` written as a table: its `address` becomes the top-level `http` (the
    listener), its other keys `http_settings`. A plain `http = "host:port"` is kept.
    Likewise `[tls]`: `cert` and `key` become `tls_cert` and `tls_key`."""
    out = dict(data)
    for name, (settings, top_level) in _SPLIT_TABLES.items():
        table = out.get(name)
        if not isinstance(table, Mapping):
            continue
        rest = dict(table)
        del out[name]
        for key, top in top_level.items():
            if key in rest:
                out[top] = rest.pop(key)
        out[settings] = _merge(dict(out.get(settings) or {}), rest)
    return out


_SECTIONS = {
    "nsqd": NSQDSettings,
    "beanstalkd": BeanstalkSettings,
    "nats_server": NATSServerSettings,
    "nats_routing": NATSRoutingSettings,
    "broker": BrokerSettings,
    "storage": StorageSettings,
    "metrics": MetricsSettings,
    "archive": ArchiveSettings,
    "limits": LimitsSettings,
    "http": HTTPSettings,  # GATEWAY_HTTP__AUTH_TOKEN; GATEWAY_HTTP alone is the address
    "tls": TLSSettings,  # GATEWAY_TLS__CLIENT_CA; GATEWAY_TLS_CERT is the top-level tls_cert
    "rocketmq_broker": RocketMQSettings,
}


def _env_overrides(
    environ: Mapping[str, str],
) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """The GATEWAY_* settings, and the variable each one came from (for messages)."""
    out: dict[str, Any] = {}
    names: dict[tuple[str, ...], str] = {}
    for key, raw in sorted(environ.items()):
        if not key.startswith("GATEWAY_"):
            continue
        name = key[len("GATEWAY_") :].lower()
        section, sep, field = name.partition("__")
        if sep:
            top = _SPLIT_TABLES[section][1].get(field) if section in _SPLIT_TABLES else None
            if top is not None:  # GATEWAY_HTTP__ADDRESS, GATEWAY_TLS__CERT: as in a file
                out[top] = _env_value(Settings, top, raw)
                names[(top,)] = key
                continue
            model = _SECTIONS.get(section)
            if model is None or field not in model.model_fields:
                # a typo would be an error in a file: here too, not silently ignored
                raise ValueError(f"{key}: no such setting ([{section}] {field})" + _near(key))
            section = _SPLIT_TABLES[section][0] if section in _SPLIT_TABLES else section
            out.setdefault(section, {})[field] = _env_value(model, field, raw)
            names[(section, field)] = key
        elif name == "config":
            continue  # which file to read, not a setting in it: gather() weighs it
        elif name in Settings.model_fields and not _is_section(name):
            out[name] = _env_value(Settings, name, raw)
            names[(name,)] = key
    return out, names


def _near(variable: str) -> str:
    """ "; did you mean GATEWAY_NSQD__MAX_MSG_SIZE?" for a misspelt section variable."""
    known = [
        f"GATEWAY_{section}__{name}".upper()
        for section, model in _SECTIONS.items()
        for name in [*model.model_fields, *_SPLIT_TABLES.get(section, ("", {}))[1]]
    ]
    close = difflib.get_close_matches(variable, known, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def _is_section(name: str) -> bool:
    return name not in _SPLIT_TABLES and (
        name in _SECTIONS or name in {settings for settings, _ in _SPLIT_TABLES.values()}
    )


def _env_value(model: type[BaseModel], field: str, raw: str) -> Any:
    annotation = str(model.model_fields[field].annotation)
    if annotation.startswith("list"):
        return [part.strip() for part in raw.split(",") if part.strip()]
    return raw


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def read_file(path: str | Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        if _http_clash(raw):
            raise ValueError(
                f'{path}: `http = "host:port"` and an [http] table cannot both appear'
                " (TOML allows one key http); move the address into the table as"
                ' `address = "host:port"`'
            ) from exc
        raise ValueError(f"{path}: not valid TOML: {exc}") from exc
    return split_http_table(data)


def _http_clash(raw: bytes) -> bool:
    lines = [line.strip() for line in raw.decode("utf-8", "replace").splitlines()]
    top_level = []
    for line in lines:
        if line.startswith("["):
            break
        top_level.append(line)
    has_key = any(line.split("=", 1)[0].strip() == "http" for line in top_level if "=" in line)
    return has_key and any(line.split("#", 1)[0].strip() == "[http]" for line in lines)


# A setting whose value may carry a secret: named in messages, its value never shown.
_SECRET_KEYS = ("password", "token", "users")
# user:password@ in a URL (a store, a NATS route): the password is hidden in messages
_URL_PASSWORD = re.compile(r"(://[^/@:\s]*:)[^/@\s]+@")


@dataclass(frozen=True)
class Override:
    """A setting two sources gave different values: the winner, and those it beat."""

    setting: str  # as a file writes it: nsq, broker.max_attempts, http.auth_token
    value: Any
    source: str  # --nsq, GATEWAY_NSQ, or the config file's path
    # (kind, source, value) of each source that lost, the higher first; kind is "flag",
    # "env" or "file"
    beaten: tuple[tuple[str, str, Any], ...]

    def __str__(self) -> str:
        """`nsq = 127.0.0.1:25181 from --nsq (overrides GATEWAY_NSQ=127.0.0.1:25180)`."""
        secret = any(word in self.setting.rsplit(".", 1)[-1] for word in _SECRET_KEYS)

        def shown(value: Any) -> str:
            return "(hidden)" if secret else _shown(value)

        # each spelled as the user wrote it: GATEWAY_X=v, --x v, or v in the file
        spelled = {"env": "{src}={v}", "flag": "{src} {v}", "file": "{v} in {src}"}
        beaten = " and ".join(
            spelled[kind].format(src=src, v=shown(v)) for kind, src, v in self.beaten
        )
        return f"{self.setting} = {shown(self.value)} from {self.source} (overrides {beaten})"


@dataclass
class Sources:
    """The merged settings before validation, and where each one came from."""

    data: dict[str, Any]
    file: str | None = None  # the file read, if any
    # the source of every setting a file, the environment or a flag gave (a path of keys,
    # as the model names them -> "--nsq", "GATEWAY_NSQ" or the file's path)
    origin: dict[tuple[str, ...], str] = field(default_factory=dict)
    overrides: list[Override] = field(default_factory=list)

    def settings(self) -> Settings:
        """Raises ValidationError listing every problem (describe_errors names sources)."""
        return Settings.model_validate(self.data)


def gather(
    config_file: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    file_flag: str = "--config",
) -> Sources:
    """Flags over GATEWAY_* environment over the file (over the defaults the model has).

    `config_file` is what the command line named (`file_flag` in messages); without it
    GATEWAY_CONFIG names the file. Raises OSError or ValueError for an unreadable file or
    an unknown GATEWAY_<SECTION>__<KEY>."""
    environ = os.environ if environ is None else environ
    from_env = environ.get("GATEWAY_CONFIG") or None
    path = str(config_file) if config_file else from_env
    file_data = read_file(path) if path else {}
    env_data, env_names = _env_overrides(environ)
    flag_data = {k: v for k, v in (flags or {}).items() if v is not None}
    # lowest first: (kind, each setting the layer gives, the name of its source)
    layers: list[tuple[str, dict[tuple[str, ...], Any], Callable[[tuple[str, ...]], str]]] = [
        ("file", _leaves(file_data), lambda _: str(path)),
        ("env", _leaves(env_data), env_names.__getitem__),
        ("flag", _leaves(flag_data), _flag_name),
    ]
    sources = Sources(_merge(_merge(file_data, env_data), flag_data), file=path)
    for key in sorted({key for _, leaves, _ in layers for key in leaves}):
        given = [(kind, name(key), leaves[key]) for kind, leaves, name in layers if key in leaves]
        *rest, (_, source, value) = given
        sources.origin[key] = source
        # a lower source that says the same thing was not overridden
        beaten = tuple(g for g in reversed(rest) if _shown(g[2]) != _shown(value))
        if beaten:
            sources.overrides.append(Override(_written(key), value, source, beaten))
    if path:
        sources.data["config"] = path  # the file read, whichever source named it
        if config_file and from_env and from_env != path:
            lost = (("env", "GATEWAY_CONFIG", from_env),)
            sources.overrides.insert(0, Override("config", path, file_flag, lost))
    return sources


# Flags that set a key of a section, by the name nsqd gives them.
_SECTION_FLAGS = {
    ("nsqd", "lookupd_tcp_addresses"): "--lookupd-tcp-address",
    ("nsqd", "broadcast_address"): "--broadcast-address",
}


def _flag_name(key: tuple[str, ...]) -> str:
    """The flag that gave a setting, as the user typed it."""
    return _SECTION_FLAGS.get(key[:2]) or "--" + key[0].replace("_", "-")


def load(
    config_file: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Flags over environment over file over defaults (gather()). Raises ValidationError
    listing every problem."""
    return gather(config_file, flags, environ).settings()


def _leaves(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """{"nsqd": {"max_msg_size": 5}} -> {("nsqd", "max_msg_size"): 5}: the sources are
    compared key by key, as they are merged."""
    out: dict[tuple[str, ...], Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out.update(_leaves(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def _written(key: Sequence[str | int]) -> str:
    """A model path as the file writes it: ("http_settings", "auth_token") -> http.auth_token."""
    where = ".".join(str(p) for p in key)
    for table, (settings, _) in _SPLIT_TABLES.items():
        if where.startswith(settings):
            where = table + where.removeprefix(settings)
    return where


def _shown(value: Any) -> str:
    """A value as a file or a variable spells it: the environment's "5" and a file's 5 are
    the same setting, not two that disagree. Passwords in URLs are hidden."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, tuple)):
        text = ",".join(_shown(v) for v in value)
    else:
        text = str(value)
    return _URL_PASSWORD.sub(r"\1***@", text)


def describe_errors(error: ValidationError, sources: Sources | None = None) -> list[str]:
    """One line per problem, led by where its value came from: `FILE:key` for the file,
    the flag or the GATEWAY_ variable otherwise (config_errors.py)."""
    describer = Describer(
        Settings,
        sources.origin if sources else {},
        sources.file if sources else None,
        _written,
        {(settings,): list(top) for settings, top in _SPLIT_TABLES.values()},
        lambda key: any(word in key for word in _SECRET_KEYS),
    )
    return describer.lines(error)
