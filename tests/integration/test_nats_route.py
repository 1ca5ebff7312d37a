"""The gateway as a route peer of real nats-server clusters: Debian's 2.9.10 and the wheel's
2.15.1, with the gateway dialing the server and the server dialing the gateway.

Unmodified clients on both ends, in subprocesses: nats-py on the real server (and on the
gateway's own NATS port where a test needs a NATS client there), pynsq and greenstalk on the
gateway. Readiness is awaited through what each side reports, never slept for: the server's
/routez (the interest it holds for the gateway's route) and the gateway's own route state.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.app import Gateway
from gateway.protocols.nats.route_session import RouteSession
from tests.clients import corpus
from tests.clients import harness as h
from tests.clients.beanstalk import servers as beanstalk_servers
from tests.clients.nats import servers
from tests.clients.nats.cluster import CLUSTER, NatsServer, eventually, nats_server
from tests.helpers import RawNSQ, be32, read_until, running_gateway

pytestmark = pytest.mark.clients

VERSIONS = ["2.9", "2.15"]
DIRECTIONS = ["gateway-dials", "server-dials"]


@pytest.fixture(params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=DIRECTIONS)
def direction(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def route_url(gw: Gateway) -> str:
    host, port = gw.addresses["nats-route"]
    return f"nats://{host}:{port}"


def routes(gw: Gateway) -> list[RouteSession]:
    return list(gw.cluster.routes.values())


async def server_id(srv: NatsServer) -> str:
    return str((await srv.get("/varz"))["server_id"])


async def wait_routed(srv: NatsServer, gw: Gateway) -> None:
    """Both ends have the route: the server lists it, the gateway registered it."""
    sid = await server_id(srv)
    await eventually(lambda: sid in gw.cluster.routes, f"the gateway's route to {srv.name}")
    await eventually(lambda: srv.routes_to(gw.cluster.server_id), f"{srv.name}'s route to us")


@asynccontextmanager
async def routed(
    version: str, direction: str, tmp: Path, *, server: dict[str, Any] | None = None, **gw: Any
) -> AsyncIterator[tuple[NatsServer, Gateway]]:
    """One real server and one gateway, routed in `direction`."""
    settings = {"nats_route": "127.0.0.1:0", "nats_cluster": CLUSTER, **gw}
    if direction == "gateway-dials":
        async with (
            nats_server(version, "s1", tmp, **(server or {})) as srv,
            running_gateway(nats_routes=[srv.cluster_url], **settings) as gateway,
        ):
            await wait_routed(srv, gateway)
            yield srv, gateway
    else:
        async with (
            running_gateway(**settings) as gateway,
            nats_server(version, "s1", tmp, routes=[route_url(gateway)], **(server or {})) as srv,
        ):
            await wait_routed(srv, gateway)
            yield srv, gateway


def interest_of(srv: NatsServer, gw: Gateway, subject: str, queue: str = "") -> Any:
    async def check() -> bool:
        return (subject, queue) in await srv.route_interest(gw.cluster.server_id)

    return check


def remote_plain(gw: Gateway, subject: str) -> Any:
    return lambda: any(subject in r.plain for r in routes(gw))


def pynsq(gw: Gateway, mode: str, topic: str, *options: Any) -> list[str]:
    return h.command("pynsq", mode, gw, topic, *options)


def natspy(address: tuple[str, int], scenario: str, *options: Any) -> list[str]:
    return servers.natspy(scenario, address, *options)


# -- the handshake ---------------------------------------------------------------------------


async def test_route_handshake(version: str, direction: str, tmp_path: Path) -> None:
    """One route each way is registered on both ends, without pooling or compression; the
    2.15 server's extra `$SYS`-pinned connection (when it dials) is turned away by the server
    and leaves the gateway with exactly one route."""
    async with routed(version, direction, tmp_path) as (srv, gw):
        [route] = await srv.routes_to(gw.cluster.server_id)
        assert route["did_solicit"] is (direction == "server-dials")
        if version == "2.15":
            assert route["compression"] in ("not supported", "off")
            assert route.get("pooling") in (None, False)
        assert [r.remote_id for r in routes(gw)] == [await server_id(srv)]
        [ours] = routes(gw)
        assert ours.solicited is (direction == "gateway-dials")
        assert ours.remote_info["cluster"] == CLUSTER
        assert gw.metrics.protocol_errors.collect()[0].samples == [] or all(
            s.labels["protocol"] != "nats-route"
            for s in gw.metrics.protocol_errors.collect()[0].samples
        )


# -- messages across ---------------------------------------------------------------------------


async def test_natspy_on_server_feeds_nsq_and_beanstalk(
    version: str, direction: str, tmp_path: Path
) -> None:
    """nats-py publishes 300 binary bodies (with a header) on the real server to subject
    `r.orders`, which a pynsq Reader consumes at the gateway, and 300 to `r.jobs`, which a
    greenstalk worker reserves: every body arrives exactly once, byte for byte (NSQ and
    beanstalkd carry the body only). The gateway asked for both subjects because they have
    groups."""
    n = 300
    bodies = corpus.make_bodies(n, seed=41, max_size=4000)
    path = h.write_corpus(tmp_path, bodies)
    async with routed(version, direction, tmp_path, beanstalk="127.0.0.1:0") as (srv, gw):
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                reader = await h.spawn(
                    nursery, pynsq(gw, "sub", "r.orders", "--count", n, "--max-in-flight", 50)
                )
                worker = await h.spawn(
                    nursery,
                    beanstalk_servers.greenstalk(
                        "reserve", gw.addresses["beanstalk"], "--tube", "r.jobs",
                        "--count", n, "--timeout", 60,
                    ),
                )  # fmt: skip
                await h.wait_until(h.has_consumers(gw, "r.orders", "ch"), "the pynsq Reader")
                await eventually(interest_of(srv, gw, "r.orders"), "RS+ r.orders at the server")
                await eventually(
                    lambda: bool(
                        gw.broker.topics.get("r.jobs") and gw.broker.topics["r.jobs"].groups
                    ),
                    "the greenstalk worker's group",
                )
                await eventually(interest_of(srv, gw, "r.jobs"), "RS+ r.jobs at the server")
                for subject in ("r.orders", "r.jobs"):
                    pub = await servers.run(
                        natspy(srv.client, "pub", "--subject", subject, "--bodies", path,
                               "--headers", json.dumps({"X-Trace": "abc"}), "--timeout", 30)
                    )  # fmt: skip
                    assert pub["published"] == n and pub["async_errors"] == []
                await h.wait_until(h.finished(gw, "r.orders", "ch", n), f"{n} FINs")
                sub = await reader.result()
                got = await worker.result()
    h.assert_clean(sub)
    h.assert_same_bodies(h.received(sub), h.digests(bodies))
    assert not got["timed_out"]
    jobs = [bytes.fromhex(body) for _, body in got["jobs"]]
    assert jobs == bodies  # one route, one publisher: publish order


async def test_nsq_publish_reaches_natspy_on_server(
    version: str, direction: str, tmp_path: Path
) -> None:
    """A nats-py subscriber on the real server asks for `r.up` (RS+ to the gateway); a pynsq
    Writer publishes 400 bodies to topic `r.up` at the gateway: the subscriber gets each one,
    in order, byte for byte, without headers."""
    n = 400
    bodies = corpus.make_bodies(n, seed=42, max_size=4000)
    path = h.write_corpus(tmp_path, bodies)
    async with routed(version, direction, tmp_path) as (srv, gw):
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                sub = await servers.spawn(
                    nursery,
                    natspy(srv.client, "sub", "--subject", "r.up", "--count", n, "--timeout", 60),
                )
                await sub.wait_ready()
                await eventually(remote_plain(gw, "r.up"), "RS+ r.up at the gateway")
                pub = await h.run(pynsq(gw, "pub", "r.up", "--bodies", path, "--pub", 100))
                h.assert_published(pub, 100 + 3)
                got = await sub.result()
    assert got["async_errors"] == []
    assert [m[2] for m in got["messages"]] == [corpus.digest(b) for b in bodies]
    assert {m[4] is None for m in got["messages"]} == {True}


async def test_headers_and_reply_subjects_both_ways(
    version: str, direction: str, tmp_path: Path
) -> None:
    """Request/reply across the route, both ways, with nats-py on each end (the gateway's own
    NATS port on one side): 50 requests with a header; every reply comes back to its requester
    with `re:` + the request body and the header echoed by the responder."""
    n = 50
    bodies = corpus.make_bodies(n, seed=43, max_size=2000)
    path = h.write_corpus(tmp_path, bodies)
    headers = {"X-Req": "r1", "X-Other": "two words"}
    async with routed(version, direction, tmp_path, nats="127.0.0.1:0") as (srv, gw):
        gw_nats = gw.addresses["nats"]
        for responder_at, requester_at, subject in (
            (gw_nats, srv.client, "svc.gw"),
            (srv.client, gw_nats, "svc.srv"),
        ):
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    responder = await servers.spawn(
                        nursery,
                        natspy(responder_at, "reply", "--subject", subject, "--count", n,
                               "--timeout", 40),
                    )  # fmt: skip
                    await responder.wait_ready()
                    if responder_at == gw_nats:
                        await eventually(interest_of(srv, gw, subject), f"RS+ {subject}")
                    else:
                        await eventually(remote_plain(gw, subject), f"RS+ {subject}")
                    req = await servers.run(
                        natspy(requester_at, "request", "--subject", subject, "--bodies", path,
                               "--headers", json.dumps(headers), "--concurrency", 10,
                               "--timeout", 40)
                    )  # fmt: skip
                    answered = await responder.result()
            assert req["async_errors"] == [] and answered["async_errors"] == []
            want = [[corpus.digest(b"re:" + b), headers] for b in bodies]
            assert req["replies"] == want, subject
            assert all(r and r.startswith("_INBOX.") for r in answered["reply_subjects"])


async def test_queue_groups_deliver_exactly_once_across_the_route(
    version: str, direction: str, tmp_path: Path
) -> None:
    """Queue group `workers` on `r.q` with 2 nats-py members on the real server and 2 on the
    gateway's NATS port. 400 messages published on the server, then 400 on the gateway: each
    one reaches exactly one member, and members on both sides get a share."""
    n = 400
    first = corpus.make_bodies(n, seed=44, max_size=500)
    second = [b"gw:" + b for b in corpus.make_bodies(n, seed=45, max_size=500)]
    async with routed(version, direction, tmp_path, nats="127.0.0.1:0") as (srv, gw):
        gw_nats = gw.addresses["nats"]
        for bodies, publish_at in ((first, srv.client), (second, gw_nats)):
            path = h.write_corpus(tmp_path, bodies, f"bodies{publish_at[1]}.bin")
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    members = []
                    for at in (srv.client, gw_nats):
                        m = await servers.spawn(
                            nursery,
                            natspy(at, "members", "--subject", "r.q", "--group", "workers",
                                   "--members", 2, "--timeout", 40),
                        )  # fmt: skip
                        await m.wait_ready()
                        members.append(m)
                    await eventually(interest_of(srv, gw, "r.q", "workers"), "RS+ r.q workers")
                    await eventually(
                        lambda: any(("r.q", "workers") in r.queues for r in routes(gw)),
                        "the server's queue interest at the gateway",
                    )
                    await eventually(interest_of(srv, gw, "r.q.end"), "RS+ r.q.end")
                    await eventually(remote_plain(gw, "r.q.end"), "RS+ r.q.end at the gateway")
                    pub = await servers.run(
                        natspy(publish_at, "pub", "--subject", "r.q", "--bodies", path,
                               "--then", "r.q.end", "--timeout", 30)
                    )  # fmt: skip
                    assert pub["published"] == n
                    results = [await m.result() for m in members]
            per_side = [sum(len(x) for x in r["members"]) for r in results]
            got = Counter(d for r in results for member in r["members"] for d in member)
            assert got == Counter(corpus.digest(b) for b in bodies), per_side
            assert all(per_side), f"one side got nothing: {per_side}"


async def test_rs_minus_stops_delivery(version: str, direction: str, tmp_path: Path) -> None:
    """Interest goes both ways and so does its end. An ephemeral NSQ channel on `r.gone` makes
    the gateway announce it; when its consumer leaves, the channel goes and so does the
    interest (RS-), and later publishes on the server no longer reach the gateway. A nats-py
    subscriber on the server that leaves takes its interest with it: the gateway stops
    forwarding `r.down`."""
    async with routed(version, direction, tmp_path) as (srv, gw):
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                reader = await h.spawn(
                    nursery, pynsq(gw, "sub", "r.gone", "--channel", "c#ephemeral", "--count", 1)
                )
                await h.wait_until(h.has_consumers(gw, "r.gone", "c#ephemeral"), "the Reader")
                await eventually(interest_of(srv, gw, "r.gone"), "RS+ r.gone")
                await servers.run(
                    natspy(srv.client, "pub", "--subject", "r.gone", "--bodies",
                           h.write_corpus(tmp_path, [b"one"], "one.bin"))
                )  # fmt: skip
                assert h.received(await reader.result()) == h.digests([b"one"])
            await eventually(
                lambda: not gw.broker.topics["r.gone"].groups, "the ephemeral channel to go"
            )

            async def gone() -> bool:
                return not await interest_of(srv, gw, "r.gone")()

            await eventually(gone, "RS- r.gone at the server")
            before = gw.metrics.bytes_in.labels("nats-route")._value.get()
            await servers.run(
                natspy(srv.client, "pub", "--subject", "r.gone", "--bodies",
                       h.write_corpus(tmp_path, [b"x" * 1000] * 20, "twenty.bin"))
            )  # fmt: skip
            # the server answers our PING only after everything it sent before it
            [route] = routes(gw)
            route._unanswered = 1
            route.send(b"PING\r\n")
            await eventually(lambda: route._unanswered == 0, "a PONG")
            assert gw.metrics.bytes_in.labels("nats-route")._value.get() - before < 1000

            # the other way: a subscriber on the server that leaves
            sub = await servers.run(
                natspy(srv.client, "unsub-max", "--subject", "r.down", "--max", 1, "--publish", 0)
            )
            assert sub["async_errors"] == []
            await eventually(lambda: not remote_plain(gw, "r.down")(), "RS- r.down")
            assert not gw.broker.taps.interested("r.down")


# -- liveness, restarts, topology ----------------------------------------------------------------


async def test_route_answers_pings_and_pings_back(version: str, tmp_path: Path) -> None:
    """A server that PINGs its routes every second (ping_max 2) keeps the gateway's route:
    several PINGs are answered and the route stays the same connection; a PING of the
    gateway's own is answered by the server. (The gateway's PINGs are otherwise left at 30 s
    here: 2.9 delays its own PINGs on a route that is busy.)"""
    async with routed(
        version,
        "gateway-dials",
        tmp_path,
        server={"extra": 'ping_interval: "1s"\nping_max: 2', "log": True},
    ) as (srv, gw):
        [route] = routes(gw)
        [before] = await srv.routes_to(gw.cluster.server_id)

        def pongs() -> int:
            return srv.log_text().count("<<- [PONG]")

        await eventually(lambda: pongs() >= 3, "3 PONGs from the gateway", timeout=20)
        [after] = await srv.routes_to(gw.cluster.server_id)
        assert after["rid"] == before["rid"]
        assert routes(gw) == [route]
        assert "Stale Connection" not in srv.log_text()
        route._unanswered = 1
        route.send(b"PING\r\n")
        await eventually(lambda: route._unanswered == 0, "the server's PONG")


async def test_route_comes_back_after_a_server_restart(
    version: str, direction: str, tmp_path: Path
) -> None:
    """The server is killed and started again on the same ports (a new server id): the route
    is re-established (the gateway redials, or the server does), the gateway announces its
    interest again, and messages flow."""
    n = 50
    bodies = corpus.make_bodies(n, seed=46, max_size=1000)
    path = h.write_corpus(tmp_path, bodies)
    async with routed(version, direction, tmp_path, nats_routing__reconnect_max_wait=0.5) as (
        srv,
        gw,
    ):
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                reader = await h.spawn(nursery, pynsq(gw, "sub", "r.back", "--count", n))
                await h.wait_until(h.has_consumers(gw, "r.back", "ch"), "the Reader")
                old = await server_id(srv)
                await srv.stop()
                await eventually(lambda: not routes(gw), "the gateway to see the route drop")
                await srv.start()
                await wait_routed(srv, gw)
                assert await server_id(srv) != old
                await eventually(interest_of(srv, gw, "r.back"), "RS+ r.back after the restart")
                pub = await servers.run(
                    natspy(srv.client, "pub", "--subject", "r.back", "--bodies", path)
                )
                assert pub["published"] == n
                h.assert_same_bodies(h.received(await reader.result()), h.digests(bodies))


async def test_three_server_mesh(version: str, direction: str, tmp_path: Path) -> None:
    """Servers A and B form a cluster; the gateway is routed to A only, by configuration or by
    A dialing it. Gossip completes the mesh (the gateway dials B, or B dials the gateway), and
    then traffic flows both ways between a nats-py client on B and NSQ clients of the gateway,
    each message exactly once (routes do not relay, so a copy through A would be a
    duplicate)."""
    n = 200
    bodies = corpus.make_bodies(n, seed=47, max_size=1000)
    path = h.write_corpus(tmp_path, bodies)
    gateway = {"nats_route": "127.0.0.1:0", "nats_cluster": CLUSTER}
    if direction == "server-dials":
        async with (
            running_gateway(**gateway) as gw,
            nats_server(version, "a", tmp_path, routes=[route_url(gw)]) as a,
            nats_server(version, "b", tmp_path, routes=[a.cluster_url]) as b,
        ):
            await run_mesh(a, b, gw, bodies, path)
            # B joined after the gateway: A told the gateway about B (gossip INFO), and the
            # gateway dialed B, as a nats-server does
            assert gw.cluster.routes[await server_id(b)].solicited
    else:
        async with (
            nats_server(version, "a", tmp_path) as a,
            nats_server(version, "b", tmp_path, routes=[a.cluster_url]) as b,
        ):
            # the servers first, so that the gateway hears of B by gossip from A
            await eventually(servers_routed(a, b), "the A-B route")
            async with running_gateway(nats_routes=[a.cluster_url], **gateway) as gw:
                await run_mesh(a, b, gw, bodies, path)


def servers_routed(a: NatsServer, b: NatsServer) -> Any:
    async def check() -> bool:
        return bool(await a.routes_to(await server_id(b)))

    return check


async def run_mesh(
    a: NatsServer, b: NatsServer, gw: Gateway, bodies: list[bytes], path: Path
) -> None:
    n = len(bodies)
    await wait_routed(a, gw)
    await wait_routed(b, gw)  # gossip did it
    assert len(gw.cluster.routes) == 2
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            # B -> gateway: one copy each (B sends it on its route to us, A does not relay)
            reader = await h.spawn(nursery, pynsq(gw, "sub", "m.up", "--count", n))
            await h.wait_until(h.has_consumers(gw, "m.up", "ch"), "the Reader")
            await eventually(interest_of(b, gw, "m.up"), "RS+ m.up at B")
            await eventually(interest_of(a, gw, "m.up"), "RS+ m.up at A")
            pub = await servers.run(natspy(b.client, "pub", "--subject", "m.up", "--bodies", path))
            assert pub["published"] == n
            await h.wait_until(h.finished(gw, "m.up", "ch", n), f"{n} FINs")
            # gateway -> B
            sub = await servers.spawn(
                nursery,
                natspy(b.client, "sub", "--subject", "m.down", "--count", n, "--timeout", 60),
            )
            await sub.wait_ready()
            await eventually(remote_plain(gw, "m.down"), "RS+ m.down at the gateway")
            wrote = await h.run(pynsq(gw, "pub", "m.down", "--bodies", path))
            h.assert_published(wrote, 2)
            got = await sub.result()
            assert [m[2] for m in got["messages"]] == [corpus.digest(x) for x in bodies]
            await reader.stop()
            sub_result = await reader.result()
    h.assert_same_bodies(h.received(sub_result), h.digests(bodies))
    assert h.group(gw, "m.up", "ch").finish_count == n  # no duplicate through A


# -- refusals ----------------------------------------------------------------------------------


async def test_cluster_name_mismatch_is_refused(version: str, tmp_path: Path) -> None:
    """A server of cluster `OTHER` that dials the gateway (cluster `C`) is refused with
    nats-server's own error, and no route is registered."""
    async with (
        running_gateway(nats_route="127.0.0.1:0", nats_cluster=CLUSTER) as gw,
        nats_server(
            version, "x", tmp_path, routes=[route_url(gw)], cluster_name="OTHER", log=True
        ) as srv,
    ):
        await eventually(
            lambda: 'cluster name "OTHER" does not match "C"' in srv.log_text(),
            "the server to log our refusal",
        )
        assert routes(gw) == []


async def _raw_nats(address: tuple[str, int], *subs: bytes) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(*address)
    await stream.send_all(b'CONNECT {"verbose":false}\r\n' + b"".join(subs) + b"PING\r\n")
    await read_until(stream, b"PONG\r\n")
    return stream


async def test_wildcards_cross_the_route(version: str, direction: str, tmp_path: Path) -> None:
    """Wildcard interest both ways: `w.*` and `w.>` of a client at the gateway get what a
    client of the server publishes on `w.a` and `w.a.b`; `up.>` of a client on the server
    gets what an NSQ client publishes to topic `up.x.y` at the gateway."""
    async with routed(version, direction, tmp_path, nats="127.0.0.1:0") as (srv, gw):
        here = await _raw_nats(gw.addresses["nats"], b"SUB w.* 1\r\n", b"SUB w.> 2\r\n")
        there = await _raw_nats(srv.client, b"SUB up.> 1\r\n")
        await eventually(interest_of(srv, gw, "w.*"), "RS+ w.*")
        await eventually(interest_of(srv, gw, "w.>"), "RS+ w.>")
        await eventually(remote_plain(gw, "up.>"), "RS+ up.> at the gateway")
        await there.send_all(b"PUB w.a 1\r\na\r\nPUB w.a.b 2\r\nab\r\nPUB w.end 0\r\n\r\n")
        got = await read_until(here, b"MSG w.end 2 0\r\n\r\n")
        if b"MSG w.end 1 0\r\n" not in got:  # the two sentinels may come in either order
            got += await read_until(here, b"MSG w.end 1 0\r\n\r\n")
        assert sorted(got.split(b"MSG ")[1:]) == sorted(
            [b"w.a 1 1\r\na\r\n", b"w.a 2 1\r\na\r\n", b"w.a.b 2 2\r\nab\r\n",
             b"w.end 1 0\r\n\r\n", b"w.end 2 0\r\n\r\n"]
        )  # fmt: skip
        nsq = await RawNSQ.connect(gw)
        await nsq.send(b"PUB up.x.y\n" + be32(5) + b"hello")
        assert await nsq.frame() == (0, b"OK")
        assert await read_until(there, b"hello\r\n") == b"MSG up.x.y 1 5\r\nhello\r\n"
        for stream in (here, there):
            await stream.aclose()
        await nsq.aclose()
