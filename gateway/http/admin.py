"""The admin page at `/`: every topic and group, whichever protocol fills or drains it.

The page (admin_page.html, its script admin_page.js served at /admin/page.js) polls
`/admin/api/state` and draws the table, a topic's detail and the rate charts itself,
starting them from the gateway's history and computing rates from the counters of
successive polls; its buttons call the action endpoints below. Everything here reads
the queues through the broker's query API: a beanstalkd tube, an NSQ channel and a topic
fed over a NATS route look the same.

  GET  /admin/api/state                           topics, groups, consumers, routes, links
  GET  /admin/api/peek?topic=&group=&state=&limit=   ready or buried messages
  GET  /admin/api/message?topic=[&group=]&id=     one message, its body in base64
  GET  /admin/api/history                         the gateway's samples (gateway.http.history)
  POST /admin/api/{pause,unpause,empty,delete}?topic=[&group=]
  POST /admin/api/kick?topic=&group=[&bound=]     buried (or deferred) back to ready
  POST /admin/api/publish?topic=                  the request body as one message

Every write is logged by the router with its client and whether a token came with it; a
destructive one (empty, delete) says there what it dropped (the response's note).
"""

from __future__ import annotations

import base64
import dataclasses
import time
from collections import Counter
from importlib import resources
from typing import TYPE_CHECKING, Any

from gateway import __version__, node
from gateway.broker import Group, Topic, query
from gateway.broker.stats import COUNTS
from gateway.clients import ClientInfo, TLSInfo
from gateway.http.gocompat import go_json
from gateway.http.router import HTTPError, Request, Response, Router, committed
from gateway.model import Message
from gateway.protocols.nsq.names import is_ephemeral

if TYPE_CHECKING:
    from gateway.app import Gateway

_JSON = "application/json; charset=utf-8"
_PREVIEW = 200  # bytes of a body shown in a peek
_PEEK_MAX = 100
# bytes of a body the message view shows: enough for any text an operator reads on a page,
# and well under nsqd's default max-msg-size (1 MiB) so a large body is not copied whole
_BODY_MAX = 64 * 1024


def _asset(name: str) -> bytes:
    return resources.files("gateway.http").joinpath(name).read_bytes()


def _json(value: Any, status: int = 200) -> Response:
    return Response(status, go_json(value), _JSON, [("cache-control", "no-store")])


def _group_state(group: query.GroupView) -> dict[str, Any]:
    clients = group.consumers
    consumers = Counter(c.protocol for c in clients)
    counts = group.counts
    return {
        "name": group.name,
        "depth": counts.ready,
        "in_flight": counts.reserved,
        "deferred": counts.delayed,
        "buried": counts.buried,
        "paused": group.paused,
        "message_count": group.message_count,
        "finish_count": group.finish_count,
        "requeue_count": group.requeue_count,
        "timeout_count": group.timeout_count,
        "consumers": dict(sorted(consumers.items())),
        "clients": [
            {
                "protocol": c.protocol,
                "address": c.address,
                "in_flight": c.in_flight,
                "ready": c.ready,
                **_client_details(c.client),
            }
            for c in clients
        ],
        "by_protocol": {
            protocol: dict(zip(COUNTS, counts, strict=True))
            for protocol, counts in sorted(group.by_protocol.items())
        },
    }


def _client_details(info: ClientInfo | None) -> dict[str, Any]:
    """What nsqadmin shows of a client; a worker of another protocol has fewer of them
    (its hostname and user agent are empty)."""
    if info is None:
        return {}
    return {
        "client_id": info.client_id,
        "hostname": info.hostname,
        "user_agent": info.user_agent or info.version,
        "connected_since": info.connect_ts,
        "message_count": info.message_count,
        "finish_count": info.finish_count,
        "requeue_count": info.requeue_count,
        "tls": info.tls.version if info.tls is not None else "",
        "snappy": info.snappy,
        "deflate": info.deflate,
        "authed": info.authed,
    }


_CLIENTS_MAX = 200  # rows of the connections table: a page, not an inventory


def client_rows(gateway: Gateway) -> list[dict[str, Any]]:
    """Every client connection of every protocol, with what its session knows of it
    (nsqadmin's details for NSQ; a NATS client's name and subscriptions)."""
    out: list[dict[str, Any]] = []
    for protocol, server in (
        ("nsq", gateway.nsq),
        ("beanstalk", gateway.beanstalk),
        ("nats", gateway.nats),
        ("rocketmq", gateway.rocketmq),
    ):
        for session in list(getattr(server, "sessions", ()))[:_CLIENTS_MAX]:
            conn = getattr(session, "conn", None)
            tls = TLSInfo.of(conn.stream) if conn is not None else None
            row: dict[str, Any] = {
                "protocol": protocol,
                "address": getattr(session, "remote", ""),
                "connected_since": int(conn.opened) if conn is not None else 0,
                "tls": tls.version if tls is not None else "",
            }
            info_of = getattr(session, "client_info", None)
            if callable(info_of):  # NSQ's and beanstalkd's sessions
                details = _client_details(info_of())
                if not details["connected_since"]:
                    details["connected_since"] = row["connected_since"]
                row.update(details, tls=details["tls"] or row["tls"])
            if protocol == "nats":
                row["client_id"] = str(getattr(session, "client_id", ""))
                row["user_agent"] = getattr(session, "name", "")
                row["subscriptions"] = len(getattr(session, "subs", ()))
            out.append(row)
    out.sort(key=lambda r: (r["protocol"], r["address"]))
    return out[:_CLIENTS_MAX]


def node_state(gateway: Gateway) -> dict[str, Any]:
    """The node panel: this process, its store and its connections."""
    return {
        "version": __version__,
        "started": gateway.started,
        "uptime": max(0.0, time.time() - gateway.started),
        "rss": node.rss(),
        "config_file": gateway.config_file or "",
        "store": node.store_info(gateway),
    }


def _held(groups: list[query.GroupView]) -> dict[str, int]:
    """Every group's messages of a topic together, by state (beside the topic's own
    depth, which is its backlog as nsqd's /stats counts it)."""
    out = {"depth": 0, "in_flight": 0, "deferred": 0, "buried": 0}
    for g in groups:
        c = g.counts
        out["depth"] += c.ready
        out["in_flight"] += c.reserved
        out["deferred"] += c.delayed
        out["buried"] += c.buried
    return out


def state(gateway: Gateway) -> dict[str, Any]:
    broker = gateway.broker
    topics = []
    for topic in query.topics(broker, by_name=True):
        groups = query.groups(broker, topic.name, by_name=True, clients=True)
        topics.append(
            {
                "name": topic.name,
                "paused": topic.paused,
                "backlog": topic.backlog,
                "groups_total": _held(groups),
                "message_count": topic.message_count,
                "published": dict(sorted(topic.published_by.items())),
                "groups": [_group_state(g) for g in groups],
            }
        )
    connections = {
        s.labels["protocol"]: int(s.value)
        for family in gateway.metrics.connections.collect()
        for s in family.samples
    }
    routes = [
        {
            "server_id": info.server_id,
            "server_name": info.server_name,
            "peer": info.peer,
            "dialed": info.dialed,
            "interest": info.interest,
        }
        for info in (route.route_info() for route in gateway.cluster.routes.values())
    ]
    return {
        "time": time.time(),
        "state": gateway.state,
        "addresses": {k: f"{h}:{p}" for k, (h, p) in gateway.addresses.items()},
        "published": dict(sorted(broker.published_by.items())),
        "connections": dict(sorted(connections.items())),
        "routes": routes,
        "links": [dataclasses.asdict(status) for status in gateway.links.statuses],
        "node": node_state(gateway),
        "clients": client_rows(gateway),
        "topics": topics,
    }


def _message(msg: Message) -> dict[str, Any]:
    body = msg.body[:_PREVIEW]
    return {
        "id": msg.id,
        "attempts": msg.attempts,
        "priority": msg.priority,
        "age": max(0.0, time.time() - msg.timestamp / 1e9),
        "size": len(msg.body),
        "body": body.decode("utf-8", "replace"),
        "truncated": len(msg.body) > _PREVIEW,
        "headers": msg.headers or [],
        "origin": msg.origin,
    }


def _whole_message(found: query.Located) -> dict[str, Any]:
    msg = found.message
    body = msg.body[:_BODY_MAX]
    return {
        "id": msg.id,
        "id_hex": f"{msg.id:016x}",  # as NSQ clients see it
        "state": found.state,
        "attempts": msg.attempts,
        "priority": msg.priority,
        "age": max(0.0, time.time() - msg.timestamp / 1e9),
        "time_left": found.left,
        "size": len(msg.body),
        "headers": msg.headers or [],
        "origin": msg.origin,
        "reply_to": msg.reply_to,
        "body_base64": base64.b64encode(body).decode("ascii"),
        "truncated": len(msg.body) > _BODY_MAX,
    }


def _lost(gateway: Gateway, topic: str, group: str | None, action: str) -> dict[str, int]:
    """What an empty or a delete drops, by state: a group's messages; a topic's backlog,
    and for a delete its groups' too (an empty of a topic leaves its groups alone, as
    nsqd's /topic/empty does)."""
    broker = gateway.broker
    if group is not None:
        views = [v for v in [query.group(broker, topic, group)] if v is not None]
        backlog = 0
    else:
        views = query.groups(broker, topic) if action == "delete" else []
        view = query.topic(broker, topic)
        backlog = view.backlog if view is not None else 0
    held = _held(views)
    return {
        "ready": held["depth"] + backlog,
        "in_flight": held["in_flight"],
        "deferred": held["deferred"],
        "buried": held["buried"],
    }


# the states a peek can list (the API's name -> the query's), each in the order it will
# leave that state
_LISTS: dict[str, query.State] = {"ready": "ready", "deferred": "delayed", "buried": "buried"}


async def _find(gateway: Gateway, request: Request) -> tuple[Topic, Group | None]:
    name = request.arg("topic")
    if not name:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    group_name = request.arg("group")
    # with a store shared by several gateways, also what another one made a moment ago
    topic = await gateway.broker.existing_topic(name, group_name)
    if topic is None:
        raise HTTPError(404, "TOPIC_NOT_FOUND")
    if group_name is None:
        return topic, None
    group = topic.group(group_name, create=False)
    if group is None:
        raise HTTPError(404, "GROUP_NOT_FOUND")
    return topic, group


def register(router: Router, gateway: Gateway) -> None:
    page = _asset("admin_page.html")
    script = _asset("admin_page.js")

    async def index(request: Request) -> Response:
        return Response(200, page, "text/html; charset=utf-8", [("cache-control", "no-store")])

    async def page_script(request: Request) -> Response:
        return Response(
            200, script, "text/javascript; charset=utf-8", [("cache-control", "no-store")]
        )

    async def get_state(request: Request) -> Response:
        return _json(state(gateway))

    async def peek(request: Request) -> Response:
        _, group = await _find(gateway, request)
        if group is None:
            raise HTTPError(400, "MISSING_ARG_GROUP")
        which = request.arg("state") or "ready"
        try:
            limit = min(int(request.arg("limit") or 10), _PEEK_MAX)
        except ValueError:
            raise HTTPError(400, "INVALID_LIMIT") from None
        state = _LISTS.get(which)
        if state is None:
            raise HTTPError(400, "INVALID_STATE")
        # a shared store's (Redis) queue, whichever gateway holds what
        msgs = await query.first(gateway.broker, group, state, limit)
        return _json({"state": which, "messages": [_message(m) for m in msgs]})

    async def message(request: Request) -> Response:
        topic, group = await _find(gateway, request)
        try:
            msg_id = int(request.arg("id") or "")
        except ValueError:
            raise HTTPError(400, "INVALID_ID") from None
        found = await query.find_in(gateway.broker, group if group is not None else topic, msg_id)
        if found is None:
            raise HTTPError(404, "MESSAGE_NOT_FOUND")
        return _json(_whole_message(found))

    async def history(request: Request) -> Response:
        return _json(gateway.history.as_json())

    async def publish(request: Request) -> Response:
        name = request.arg("topic")
        if not name:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        # any protocol's name (a subject, a tube), but one a log line and a page can show
        if len(name) > 255 or not name.isprintable() or " " in name:
            raise HTTPError(400, "INVALID_TOPIC")
        limit = gateway.settings.nsqd.max_msg_size
        body = await request.body(limit + 1)
        if len(body) > limit:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        (msg,), _ = gateway.broker.publish(
            name, [body], origin=f"admin {request.remote}", ephemeral=is_ephemeral(name)
        )
        response = _json({"ok": True, "id": msg.id})
        response.note = f"published message {msg.id} ({len(body)} B) to {name}"
        return response

    def action(name: str) -> Any:
        async def handler(request: Request) -> Response:
            topic, group = await _find(gateway, request)
            result: dict[str, Any] = {"ok": True}
            target: Topic | Group = group if group is not None else topic
            what = f"{topic.name}/{group.name}" if group is not None else topic.name
            note = ""
            if name in ("empty", "delete"):
                lost = _lost(gateway, topic.name, None if group is None else group.name, name)
                result["dropped"] = lost
                note = f"{name} {what}: {sum(lost.values())} messages dropped " + (
                    "(" + ", ".join(f"{k} {n}" for k, n in lost.items()) + ")"
                )
            if name == "pause":
                target.pause()
            elif name == "unpause":
                if group is not None:
                    group.pause_for(0)  # a beanstalkd pause-tube ends too
                target.unpause()
            elif name == "empty":
                target.empty()
            elif name == "delete":
                if group is None:
                    gateway.broker.delete_topic(topic.name)
                else:
                    topic.delete_group(group.name)
            elif name == "kick":
                if group is None:
                    raise HTTPError(400, "MISSING_ARG_GROUP")
                try:
                    bound = int(request.arg("bound") or 1000000)
                except ValueError:
                    raise HTTPError(400, "INVALID_BOUND") from None
                result["kicked"] = await gateway.broker.kick(group, bound)
                note = f"kick {what}: {result['kicked']} messages back to ready"
            response = _json(result)
            response.note = note or f"{name} {what}"
            return response

        return handler

    router.add("/", index, "GET", "HEAD")
    router.add("/admin/page.js", page_script, "GET", "HEAD")
    router.add("/admin/api/state", get_state, "GET")
    router.add("/admin/api/peek", peek, "GET")
    router.add("/admin/api/message", message, "GET")
    router.add("/admin/api/history", history, "GET")
    router.add("/admin/api/publish", committed(gateway.broker.flush, publish), "POST")
    for name in ("pause", "unpause", "empty", "delete", "kick"):
        router.add(f"/admin/api/{name}", committed(gateway.broker.flush, action(name)), "POST")
