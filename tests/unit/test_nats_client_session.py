"""The NATS client session's output, driven without a listener: one write per subscriber per
client batch, and the writer task woken once per queue, not once per message."""

from __future__ import annotations

import socket

import trio

from gateway.broker import Broker
from gateway.metrics import Metrics
from gateway.protocols.nats import client_events as ev
from gateway.protocols.nats.client_session import NATSClientSession
from gateway.protocols.nats.server import NATSServer
from gateway.stores import MemoryStore


class CountingEvent:
    """Stands in for the session's trio.Event: counts the writer's wake-ups."""

    def __init__(self) -> None:
        self.sets = 0

    def set(self) -> None:
        self.sets += 1


def session(server: NATSServer, name: str) -> tuple[NATSClientSession, socket.socket]:
    ours, theirs = socket.socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    s = NATSClientSession(server, stream, f"127.0.0.1:{name}")
    s.connected = True
    s.conn.wake = CountingEvent()  # type: ignore[assignment]
    theirs.setblocking(False)
    return s, theirs


def received(peer: socket.socket) -> bytes:
    got = b""
    while True:
        try:
            got += peer.recv(65536)
        except BlockingIOError:
            return got


async def test_deliveries_are_written_once_per_batch() -> None:
    server = NATSServer(Broker(MemoryStore()), Metrics())
    sub, sub_peer = session(server, "1")
    pub, _ = session(server, "2")
    assert sub._subscribe(ev.Sub("t", None, "9"))

    # another protocol publishing (no NATS client batch): the writer is woken when the
    # queue stops being empty, once
    for body in (b"a", b"b", b"c"):
        server.broker.publish("t", [body], create=False)
    assert sub.conn.wake.sets == 1  # type: ignore[attr-defined]
    assert b"".join(sub.conn.out) == b"MSG t 9 1\r\na\r\nMSG t 9 1\r\nb\r\nMSG t 9 1\r\nc\r\n"
    sub.write_now()
    assert sub.conn.out == []
    assert received(sub_peer) == b"MSG t 9 1\r\na\r\nMSG t 9 1\r\nb\r\nMSG t 9 1\r\nc\r\n"

    # a NATS client's batch: nobody is woken; the subscriber waits in `dirty` once, and the
    # end of the batch writes it
    pub.codec.receive_data(b"PUB t 1\r\nd\r\nPUB t  1\r\ne\r\nPUB t r 1\r\nf\r\n")
    server.in_batch = True
    pub._process()
    server.in_batch = False
    assert sub.conn.wake.sets == 1  # type: ignore[attr-defined]
    assert server.dirty == [sub]
    server.dirty.clear()
    sub.write_now()
    assert received(sub_peer) == b"MSG t 9 1\r\nd\r\nMSG t 9 1\r\ne\r\nMSG t 9 r 1\r\nf\r\n"


async def test_a_subscription_frames_each_subject_it_sees() -> None:
    server = NATSServer(Broker(MemoryStore()), Metrics())
    sub, _ = session(server, "1")
    sub.headers = True
    assert sub._subscribe(ev.Sub("t.*", None, "s1"))
    broker = server.broker
    broker.publish("t.a", [b"1"], create=False)
    broker.publish("t.b", [b"2"], create=False, reply_to="in.1")
    broker.publish("t.a", [b"3"], create=False, header_block=b"NATS/1.0\r\n\r\n")
    broker.publish("t.a", [b"4"], create=False, headers=[("k", "v")])
    assert sub.conn.out == [
        b"MSG t.a s1 1\r\n1\r\n",
        b"MSG t.b s1 in.1 1\r\n2\r\n",
        b"HMSG t.a s1 12 13\r\nNATS/1.0\r\n\r\n3\r\n",
        b"HMSG t.a s1 18 19\r\nNATS/1.0\r\nk: v\r\n\r\n4\r\n",
    ]
