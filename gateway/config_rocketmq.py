"""The `[rocketmq_broker]` settings: how the RocketMQ listener presents the gateway as a
nameserver and broker. Part of the settings model in config.py."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator

from gateway.addresses import parse_address
from gateway.config_guard import _Section


class RocketMQSettings(_Section):
    """The RocketMQ remoting listener (nameserver and broker on one port); defaults follow
    the Apache RocketMQ 4.9 broker's where it has one."""

    read_queues: int = Field(4, ge=1, le=1024)  # queues per topic in routes (readQueueNums)
    write_queues: int = Field(4, ge=1, le=1024)  # writeQueueNums
    # host:port written into routes and message ids; clients dial it. Unset: the bound
    # address (an unspecified bind address needs this set; IPv4, notes 7.1).
    advertise: str | None = None
    max_frame_size: int = Field(16777216, ge=1024)  # NettyDecoder's frameMaxLength
    max_header_size: int = Field(1048576, ge=1024, le=0xFFFFFF)
    max_message_size: int = Field(4194304, ge=1)  # maxMessageSize (after inflating)
    max_suspend: float = Field(20.0, ge=0)  # s a pull is held at most (clients wait 30)
    # messages one (topic, consumer group) holds between delivery and commit
    group_window: int = Field(4096, ge=1)
    client_timeout: float = Field(120.0, gt=0)  # s without heartbeat before a client is dropped
    # s an orderly consumer's queue lock lasts unless renewed (lockMaxLiveTime)
    queue_lock_seconds: float = Field(60.0, gt=0)
    max_output_bytes: int = Field(4 * 1024 * 1024, ge=65536)
    # messageDelayLevel in seconds, level 1 first (retries use level 3 + attempt)
    delay_levels: list[float] = Field(
        default_factory=lambda: [
            1,
            5,
            10,
            30,
            60,
            120,
            180,
            240,
            300,
            360,
            420,
            480,
            540,
            600,
            1200,
            1800,
            3600,
            7200,
        ],
        min_length=1,
    )
    broker_name: str = Field("broker-a", min_length=1)
    cluster_name: str = Field("DefaultCluster", min_length=1)

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, value: str | None) -> str | None:
        if value is not None:
            host, _ = parse_address(value)
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"advertise must be an IPv4 host:port, got {value!r}") from None
        return value

    @field_validator("delay_levels")
    @classmethod
    def _levels(cls, value: list[float]) -> list[float]:
        if any(level < 0 for level in value):
            raise ValueError("delay levels are seconds >= 0")
        return value
