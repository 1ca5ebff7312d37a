"""The links to servers the gateway moves traffic to and from: `[[nsq_import]]`,
`[[nsq_export]]` and `[[beanstalk_import]]`, arrays of tables in the settings file (one
table per link). Part of the settings model in config.py."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway.addresses import parse_address
from gateway.config_guard import _Section


def _addresses(value: list[str]) -> list[str]:
    for address in value:
        parse_address(address)  # host:port, raises ValueError with the reason
    return value


class NSQUpstreamSettings(_Section):
    """Where the upstream nsqds are: listed, or found through nsqlookupd (as a pynsq Reader
    or go-nsq's ConnectToNSQLookupd does)."""

    nsqd_tcp_addresses: list[str] = Field(default_factory=list)
    lookupd_http_addresses: list[str] = Field(default_factory=list)
    # s between /lookup polls (pynsq's lookupd_poll_interval)
    lookupd_poll_interval: float = Field(60.0, gt=0)
    name: str | None = None  # the link's name in metrics and the admin page

    @field_validator("nsqd_tcp_addresses")
    @classmethod
    def _nsqd(cls, value: list[str]) -> list[str]:
        return _addresses(value)

    @field_validator("lookupd_http_addresses")
    @classmethod
    def _lookupd(cls, value: list[str]) -> list[str]:
        # nsqadmin and pynsq accept http://host:port as well as host:port
        return _addresses([a.split("://", 1)[-1].rstrip("/") for a in value])

    @model_validator(mode="after")
    def _somewhere(self) -> NSQUpstreamSettings:
        if not self.nsqd_tcp_addresses and not self.lookupd_http_addresses:
            raise ValueError("needs nsqd_tcp_addresses or lookupd_http_addresses")
        return self


class NSQImportSettings(NSQUpstreamSettings):
    """Consume `topic` as `channel` on the upstream nsqds and publish into the gateway's
    topic `to_topic` (the same name unless set); FIN upstream once stored here."""

    topic: str = Field(min_length=1)
    channel: str = Field(min_length=1)
    to_topic: str | None = None
    max_in_flight: int = Field(200, ge=1)


class NSQExportSettings(NSQUpstreamSettings):
    """Consume the gateway's `topic` as the group `group` and MPUB it to an upstream nsqd
    as `to_topic` (the same name unless set); finish here once nsqd said OK."""

    topic: str = Field(min_length=1)
    group: str = Field("nsq_export", min_length=1)
    to_topic: str | None = None
    batch: int = Field(100, ge=1)  # messages per MPUB at most
    max_in_flight: int = Field(1000, ge=1)  # taken here, not yet OK'd upstream


class BeanstalkImportSettings(_Section):
    """Move the jobs of a live beanstalkd into the gateway's tubes, deleting each there only
    once the gateway stored it; with `follow`, keep draining what producers still put."""

    url: str
    tubes: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    follow: bool = True
    name: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "beanstalk" or not parts.hostname:
            raise ValueError(f"a beanstalkd url is beanstalk://host[:port], got {value!r}")
        return value

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        assert parts.hostname is not None
        return parts.hostname, parts.port or 11300
