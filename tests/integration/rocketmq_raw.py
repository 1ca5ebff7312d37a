"""A byte-level RocketMQ remoting client for transcripts and bad input (tests only).

Built on the gateway's own sans-IO codec, which reads a server's frames the same way it
reads a client's.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from gateway.app import Gateway
from gateway.protocols.rocketmq.codec import RemotingCodec, encode_request
from gateway.protocols.rocketmq.codes import RequestCode
from gateway.protocols.rocketmq.events import ProtocolError, Request, Response


class RawRemoting:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.codec = RemotingCodec()
        self.opaque = 0
        self.responses: dict[int, Response] = {}
        self.requests: list[Request] = []  # what the server sent us (NOTIFY_...)

    @classmethod
    async def connect(cls, gateway: Gateway) -> RawRemoting:
        return cls(await trio.open_tcp_stream(*gateway.addresses["rocketmq"]))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def send(
        self,
        code: int,
        ext: dict[str, object] | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
    ) -> int:
        self.opaque += 1
        await self.stream.send_all(
            encode_request(code, self.opaque, ext_fields=ext or {}, body=body, oneway=oneway)
        )
        return self.opaque

    async def response(self, opaque: int, timeout: float = 5.0) -> Response:
        with trio.fail_after(timeout):
            while opaque not in self.responses:
                data = await self.stream.receive_some(1 << 20)
                assert data, f"closed before the answer to opaque {opaque}"
                self.codec.receive_data(data)
                for event in self.codec.events():
                    if isinstance(event, Response):
                        self.responses[event.opaque] = event
                    elif isinstance(event, Request):
                        self.requests.append(event)
                    else:
                        assert not isinstance(event, ProtocolError), event
        return self.responses.pop(opaque)

    async def call(
        self,
        code: int,
        ext: dict[str, object] | None = None,
        body: bytes = b"",
        timeout: float = 5.0,
    ) -> Response:
        return await self.response(await self.send(code, ext, body), timeout)

    # -- the usual requests -----------------------------------------------------------------

    async def produce(
        self, topic: str, body: bytes, properties: str = "", queue_id: int = 0, sys_flag: int = 0
    ) -> Response:
        return await self.call(
            RequestCode.SEND_MESSAGE_V2,
            {
                "a": "PID_raw",
                "b": topic,
                "c": "TBW102",
                "d": 4,
                "e": queue_id,
                "f": sys_flag,
                "g": 1700000000000,
                "h": 0,
                "i": properties,
                "j": 0,
                "k": False,
            },
            body,
        )

    async def heartbeat(
        self, client_id: str, group: str, topics: dict[str, str], model: str = "CLUSTERING"
    ) -> Response:
        body = {
            "clientID": client_id,
            "consumerDataSet": [
                {
                    "groupName": group,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": model,
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "subscriptionDataSet": [
                        {"topic": t, "subString": s, "subVersion": 1} for t, s in topics.items()
                    ],
                    "unitMode": False,
                }
            ],
            "producerDataSet": [],
        }
        return await self.call(RequestCode.HEART_BEAT, {}, json.dumps(body).encode())

    def pull_fields(
        self, topic: str, group: str, queue_id: int, offset: int, **extra: Any
    ) -> dict[str, object]:
        ext: dict[str, object] = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxMsgNums": 32,
            "sysFlag": 4,
            "commitOffset": -1,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
            "subVersion": 1,
        }
        ext.update(extra)
        return ext

    async def pull(
        self,
        topic: str,
        group: str,
        queue_id: int,
        offset: int,
        timeout: float = 5.0,
        **extra: Any,
    ) -> Response:
        return await self.call(
            RequestCode.PULL_MESSAGE,
            self.pull_fields(topic, group, queue_id, offset, **extra),
            timeout=timeout,
        )
