"""nsqlookupd 1.3.0's HTTP API (docs/protocols/nsq.md §13), answering for the one nsqd there
is: the gateway itself. A reader configured with lookupd addresses is sent to the gateway's NSQ
listener.

A topic is known once it exists in the broker, as nsqlookupd knows a topic once an nsqd
registered it: /lookup answers 404 TOPIC_NOT_FOUND for any other (docs/semantics.md,
"HTTP"). Only names NSQ clients can use are listed: a beanstalkd tube named `a$b` is no
NSQ topic. Go marshals these replies from maps, so their keys are sorted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.broker import query
from gateway.http import stats
from gateway.http.nsqd import broadcast_address, port_of
from gateway.http.router import HTTPError, Request, Response, Router, v1, v1_json
from gateway.protocols.nsq.names import is_valid_name

if TYPE_CHECKING:
    from gateway.app import Gateway


def _nsq_name(name: str) -> bool:
    return is_valid_name(name.encode("utf-8", "surrogateescape"))


class LookupdAPI:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.broker = gateway.broker

    def _topics(self) -> list[str]:
        return [name for name in query.topic_names(self.broker, by_name=True) if _nsq_name(name)]

    def _channels(self, topic: str) -> list[str]:
        if not _nsq_name(topic):
            return []
        return [g for g in query.group_names(self.broker, topic, by_name=True) if _nsq_name(g)]

    def _producer(self) -> dict[str, Any]:
        """PeerInfo of the gateway's nsqd. remote_address is where nsqd's registration
        connection came from; there is none here, so it is the NSQ listener."""
        gw = self.gateway
        nsq = gw.addresses.get("nsq")
        host = nsq[0] if nsq is not None else broadcast_address(gw)
        return {
            "remote_address": f"{host}:{port_of(gw, 'nsq')}",
            "hostname": gw.nsq.hostname,
            "broadcast_address": broadcast_address(gw),
            "tcp_port": port_of(gw, "nsq"),
            "http_port": port_of(gw, "http"),
            "version": stats.VERSION,
        }

    def _producers(self) -> list[dict[str, Any]]:
        # without an NSQ listener the gateway is no nsqd, and no reader could connect
        return [self._producer()] if "nsq" in self.gateway.addresses else []

    async def lookup(self, request: Request) -> Response:
        topic = request.arg("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if query.topic(self.broker, topic) is None or not _nsq_name(topic):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return v1_json({"channels": self._channels(topic), "producers": self._producers()})

    async def topics(self, request: Request) -> Response:
        return v1_json({"topics": self._topics()})

    async def channels(self, request: Request) -> Response:
        topic = request.arg("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        return v1_json({"channels": self._channels(topic)})

    async def nodes(self, request: Request) -> Response:
        producers = []
        for producer in self._producers():
            topics = self._topics()
            # nsqlookupd's node struct: PeerInfo's fields, then tombstones and topics
            producers.append({**producer, "tombstones": [False] * len(topics), "topics": topics})
        return v1_json({"producers": producers})

    async def tombstone(self, request: Request) -> Response:
        """Tombstoning tells lookupd to stop listing a producer for a topic while its nsqd
        deletes it. The gateway is the only producer and deletes through /topic/delete, so
        this only checks its arguments."""
        if request.arg("topic") is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if request.arg("node") is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        return v1()


def register(router: Router, gateway: Gateway) -> None:
    api = LookupdAPI(gateway)
    router.add("/lookup", api.lookup, "GET")
    router.add("/topics", api.topics, "GET")
    router.add("/channels", api.channels, "GET")
    router.add("/nodes", api.nodes, "GET")
    router.add("/topic/tombstone", api.tombstone, "POST")
