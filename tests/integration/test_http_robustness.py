"""Input on which the HTTP server library itself fails must end that connection alone.
hypercorn 0.18's Trio worker let such an error out of the listeners' nursery, and the
whole gateway process exited: NSQ, beanstalkd and NATS with it. Found by a review; each
case here killed the gateway before."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import httpx
import trio

from tests.helpers import RawNSQ, be32, http_base, running_gateway


async def still_serving(gw: object) -> None:
    async with httpx.AsyncClient(base_url=http_base(gw)) as client:  # type: ignore[arg-type]
        assert (await client.get("/ping")).text == "OK"
    nsq = await RawNSQ.connect(gw)  # type: ignore[arg-type]
    await nsq.send(b"PUB alive\n" + be32(1) + b"x")
    assert await nsq.frame() == (0, b"OK")


async def test_http2_data_after_the_reply_ends_that_connection_only() -> None:
    """RFC 9113 8.1 lets a client go on sending a request's body after the server has
    answered it (a 413, a 404, /topic/create answered at once). hypercorn forgot the
    stream on its answer and raised KeyError on its next DATA frame."""
    async with running_gateway(http="127.0.0.1:0") as gw:
        stream = await trio.open_tcp_stream(*gw.addresses["http"])
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        headers = [(":method", "POST"), (":path", "/topic/create?topic=late")]
        conn.send_headers(1, [*headers, (":scheme", "http"), (":authority", "gw")])
        await stream.send_all(conn.data_to_send())
        with trio.fail_after(10):
            ended = False
            while not ended:
                data = await stream.receive_some(65536)
                assert data, "closed before the reply"
                events = conn.receive_data(data)
                ended = any(isinstance(e, h2.events.StreamEnded) for e in events)
                await stream.send_all(conn.data_to_send())
        conn.send_data(1, b"a late body", end_stream=True)
        await stream.send_all(conn.data_to_send())
        with trio.move_on_after(1):
            while await stream.receive_some(65536):
                pass
        await stream.aclose()
        await still_serving(gw)


async def test_an_h2c_upgrade_with_settings_that_are_no_base64_ends_that_connection_only() -> None:
    async with running_gateway(http="127.0.0.1:0") as gw:
        for settings in (b"!!!notbase64", b"AAM"):
            stream = await trio.open_tcp_stream(*gw.addresses["http"])
            await stream.send_all(
                b"GET /ping HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                b"Upgrade: h2c\r\nHTTP2-Settings: " + settings + b"\r\n\r\n"
            )
            with trio.move_on_after(2):
                while await stream.receive_some(65536):
                    pass
            await stream.aclose()
        await still_serving(gw)
