"""What a RocketMQ remoting peer sends, as the codec hands it to the session.

Small frozen, slotted dataclasses (the h11 habit), kept apart from the internal `Message`.
A frame with flag bit 0 clear is a `Request`; with it set, a `Response` (a client answering
a request the gateway sent, such as GET_CONSUMER_RUNNING_INFO). Both carry the header as
decoded, extFields already normalised to text (header.py, `ext_text`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

# RemotingCommand flag bits (RemotingCommand.RPC_TYPE / RPC_ONEWAY).
FLAG_RESPONSE: Final = 1
FLAG_ONEWAY: Final = 2


class SerializeType(IntEnum):
    """The high byte of the header-length word (SerializeType.java)."""

    JSON = 0
    ROCKETMQ = 1


@dataclass(frozen=True, slots=True)
class _Command:
    code: int
    opaque: int
    flag: int = 0
    language: str = "JAVA"
    version: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    # The session answers in the serialization the request used (notes 2.3): ali-ons
    # cannot read a binary header, a Java client started with ROCKETMQ reads either.
    serialize_type: SerializeType = SerializeType.JSON


@dataclass(frozen=True, slots=True)
class Request(_Command):
    @property
    def oneway(self) -> bool:
        """Bit 1: send no response. Java sets it; ali-ons never does (notes 2.4)."""
        return bool(self.flag & FLAG_ONEWAY)


@dataclass(frozen=True, slots=True)
class Response(_Command):
    pass


@dataclass(frozen=True, slots=True)
class ProtocolError:
    """The stream cannot be read any further: close the connection, send nothing.

    That is what the Java broker does on every framing or header decode failure
    (NettyDecoder catches the exception and closes the channel): no opaque can be trusted
    once the framing is lost. After this event the codec yields nothing more.
    """

    reason: str


Event = Request | Response | ProtocolError
