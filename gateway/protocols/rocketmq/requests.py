"""Reading a request's extFields: typed values, or the error reply the broker would give."""

from __future__ import annotations

import re

from gateway.protocols.rocketmq.codec import ResponseCode
from gateway.protocols.rocketmq.events import Request
from gateway.protocols.rocketmq.header import ext_bool
from gateway.protocols.rocketmq.mapping import valid_group, valid_topic

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class BadRequest(Exception):
    """Answer the request with `code` and `remark` (h11's error_status_hint habit)."""

    def __init__(self, remark: str, code: int = ResponseCode.SYSTEM_ERROR) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def text(request: Request, name: str, default: str | None = None) -> str:
    value = request.ext_fields.get(name, default)
    if value is None:
        # Java's header decoding (CommandCustomHeader.checkFields) names the field
        raise BadRequest(f"the custom field <{name}> is null")
    return value


_INTEGER = re.compile(r"-?[0-9]+")  # Long.parseLong's digits (ASCII only; one sign)


def integer(request: Request, name: str, default: int | None = None) -> int:
    raw = request.ext_fields.get(name)
    if raw is None:
        if default is None:
            raise BadRequest(f"the custom field <{name}> is null")
        return default
    raw = raw.strip()
    if len(raw) > 20 or not _INTEGER.fullmatch(raw):
        raise BadRequest(f"the custom field <{name}> is not a number: {raw[:40]!r}")
    value = int(raw)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise BadRequest(f"the custom field <{name}> is out of range: {raw!r}")
    return value


def flag(request: Request, name: str) -> bool:
    return ext_bool(request.ext_fields.get(name))


def topic(request: Request, name: str = "topic") -> str:
    value = text(request, name)
    if not valid_topic(value):
        raise BadRequest(
            f"topic {value[:140]!r} is not a valid RocketMQ topic "
            "(1-127 of letters, digits, %, |, _ and -)"
        )
    return value


def group(request: Request, name: str) -> str:
    return group_name(text(request, name))


def group_name(value: object) -> str:
    """`value` if it is a valid consumer group name (from a header field or a JSON body)."""
    if not isinstance(value, str) or not valid_group(value):
        raise BadRequest(
            f"consumer group {str(value)[:260]!r} is not a valid RocketMQ group name",
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
        )
    return value


def queue_id(request: Request, topic_name: str, count: int, name: str = "queueId") -> int:
    value = integer(request, name)
    if not 0 <= value < count:
        raise BadRequest(
            f"queueId[{value}] is illegal, topic:[{topic_name}] topicConfig.readQueueNums:[{count}]"
        )
    return value
