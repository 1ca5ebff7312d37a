"""No-work Trio servers: the runtime's ceiling for bench/compare.py (not a test, not a broker).

One process serves one protocol (``nsq``, ``nats`` or ``beanstalk``) with canned replies and
as little bookkeeping as the clients of the compare workloads need to run: no queue, no
store, no validation. It is built the way issue 15 measured the fastest Trio request/response
server on this machine, which is also the pattern the gateway's sockets follow:

* raw non-blocking sockets, not ``SocketStream``; the task parks in
  ``trio.lowlevel.wait_readable`` and reads once it returns;
* every complete command of one read is parsed in one go (the rest waits in a buffer);
* the replies of one read (and what it delivers to other connections) leave in one ``send``
  per connection, straight from the reading task; a writer task only takes over what the
  socket did not accept;
* after sending, the task waits for readability at once instead of first trying a ``recv``
  that usually finds nothing (one system call and one scheduler pass less per request).

What each protocol keeps:

* nsq: per topic a count of published messages and one canned message frame (the body of
  the last publish); a subscriber gets ``min(RDY - in flight, count)`` copies of that frame
  in one send, FIN frees one slot. IDENTIFY answers ``OK``.
* nats: subjects to (connection, sid); ``*``/``>`` subscriptions (nats-py's request inbox)
  in a short list. PUB is copied to every matching subscription as MSG.
* beanstalk: put answers ``INSERTED 1``, reserve returns the last body this connection put,
  delete answers ``DELETED``; use/watch/ignore as greenstalk expects.

Run by bench/compare.py as ``python bench/ceiling.py PROTOCOL [HOST:PORT]``; prints
``listening protocol=<p> address=<host>:<port>`` on stderr like the gateway.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
from collections.abc import Callable

import trio

# One read takes up to this much, as the gateway's sessions do. Not more: recv(n) allocates n
# bytes first, and above glibc's mmap threshold (128 KiB) every read pays an mmap and munmap,
# about 13 us per read in a micro-benchmark here.
RECV_SIZE = 64 << 10
NSQ_MAGIC = b"  V2"
NSQ_FRAME = struct.Struct(">Ii")
BE32 = struct.Struct(">I")
NATS_INFO = (
    b'INFO {"server_id":"ceiling","server_name":"ceiling","version":"2.9.0","proto":1,'
    b'"go":"go1.19","host":"127.0.0.1","port":0,"headers":false,"max_payload":1048576}\r\n'
)


class Conn:
    """One client connection: its socket, its pending output and its protocol state."""

    __slots__ = ("blocked", "inflight", "last_body", "out", "rdy", "sock", "topic", "wake")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()
        self.blocked = False  # the writer task owns the output until the socket drains
        self.wake = trio.Event()
        self.rdy = 0
        self.inflight = 0
        self.topic: Topic | None = None
        self.last_body = b"x"

    def flush(self) -> None:
        """One non-blocking send of everything queued; the rest goes to the writer task."""
        if self.blocked or not self.out:
            return
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.out.clear()
            return
        del self.out[:sent]
        if self.out:
            self.blocked = True
            self.wake.set()

    async def writer(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            try:
                while self.out:
                    await trio.lowlevel.wait_writable(self.sock)
                    try:
                        sent = self.sock.send(self.out)
                    except BlockingIOError:
                        continue
                    del self.out[:sent]
            except OSError:
                return
            finally:
                self.blocked = False


# -- nsq ------------------------------------------------------------------------------------


class Topic:
    __slots__ = ("count", "frame", "subscribers")

    def __init__(self) -> None:
        self.count = 0
        self.frame = b""
        self.subscribers: list[Conn] = []

    def set_body(self, body: bytes) -> None:
        # [size][type 2][timestamp][attempts][16-byte id][body]: always the same message
        data = struct.pack(">iqH", 2, 1_700_000_000_000_000_000, 1) + b"0" * 16 + body
        self.frame = BE32.pack(len(data)) + data

    def deliver(self) -> None:
        for conn in self.subscribers:
            room = min(conn.rdy - conn.inflight, self.count)
            if room > 0:
                conn.out += self.frame * room
                conn.inflight += room
                self.count -= room
                conn.flush()


NSQ_OK = NSQ_FRAME.pack(6, 0) + b"OK"
nsq_topics: dict[bytes, Topic] = {}


def nsq_topic(name: bytes) -> Topic:
    topic = nsq_topics.get(name)
    if topic is None:
        topic = nsq_topics[name] = Topic()
    return topic


def nsq_parse(conn: Conn, buf: bytearray) -> int:
    """Handle every complete command in buf; returns how many bytes were used."""
    pos = 0
    end = len(buf)
    if conn.rdy < 0:  # the magic has not been read yet
        if end < 4:
            return 0
        pos, conn.rdy = 4, 0
    touched: Topic | None = None
    out = conn.out
    while True:
        nl = buf.find(b"\n", pos)
        if nl < 0:
            break
        line = bytes(buf[pos:nl])
        verb = line[:3]
        if verb in (b"PUB", b"MPU", b"IDE", b"DPU"):
            if end - (nl + 1) < 4:
                break
            (size,) = BE32.unpack_from(buf, nl + 1)
            stop = nl + 5 + size
            if stop > end:
                break
            if verb == b"IDE":
                out += NSQ_OK
            else:
                topic = nsq_topic(line.split(b" ", 2)[1])
                if verb == b"MPU":
                    (count,) = BE32.unpack_from(buf, nl + 5)
                    (first,) = BE32.unpack_from(buf, nl + 9)
                    body = bytes(buf[nl + 13 : nl + 13 + first])
                else:
                    count, body = 1, bytes(buf[nl + 5 : stop])
                if len(topic.frame) != len(body) + 30:
                    topic.set_body(body)
                topic.count += count
                out += NSQ_OK
                touched = topic
            pos = stop
            continue
        pos = nl + 1
        if verb == b"FIN":
            conn.inflight -= 1
        elif verb == b"RDY":
            conn.rdy = int(line[4:])
        elif verb == b"SUB":
            topic = nsq_topic(line.split(b" ", 2)[1])
            topic.subscribers.append(conn)
            conn.topic = topic
            out += NSQ_OK
        elif verb == b"CLS":
            data = b"CLOSE_WAIT"
            out += NSQ_FRAME.pack(len(data) + 4, 0) + data
        # NOP, REQ, TOUCH: nothing to answer in a ceiling
    if conn.topic is not None:
        conn.topic.deliver()
    if touched is not None and touched is not conn.topic:
        touched.deliver()
    return pos


def nsq_close(conn: Conn) -> None:
    if conn.topic is not None:
        conn.topic.subscribers.remove(conn)


# -- nats -----------------------------------------------------------------------------------

# subject -> [(conn, sid)]; wildcard subscriptions are few (nats-py's request inbox)
nats_subs: dict[bytes, list[tuple[Conn, bytes]]] = {}
nats_wild: list[tuple[list[bytes], Conn, bytes]] = []
nats_dirty: set[Conn] = set()


def nats_match(pattern: list[bytes], tokens: list[bytes]) -> bool:
    for i, p in enumerate(pattern):
        if p == b">":
            return len(tokens) > i
        if i >= len(tokens) or (p != b"*" and p != tokens[i]):
            return False
    return len(tokens) == len(pattern)


def nats_publish(subject: bytes, reply: bytes, payload: bytes | bytearray) -> None:
    targets = nats_subs.get(subject, ())
    if nats_wild:
        tokens = subject.split(b".")
        targets = [*targets, *((c, sid) for p, c, sid in nats_wild if nats_match(p, tokens))]
    tail = b" %d\r\n" % len(payload) + payload + b"\r\n"
    middle = b" " + reply if reply else b""
    for conn, sid in targets:
        conn.out += b"MSG " + subject + b" " + sid + middle + tail
        nats_dirty.add(conn)


def nats_parse(conn: Conn, buf: bytearray) -> int:
    pos = 0
    end = len(buf)
    out = conn.out
    while True:
        nl = buf.find(b"\r\n", pos)
        if nl < 0:
            break
        verb = bytes(buf[pos : pos + 4]).upper()
        if verb == b"PUB ":
            args = bytes(buf[pos + 4 : nl]).split()
            size = int(args[-1])
            stop = nl + 2 + size + 2
            if stop > end:
                break
            nats_publish(args[0], args[1] if len(args) == 3 else b"", buf[nl + 2 : nl + 2 + size])
            pos = stop
            continue
        if verb == b"PING":
            out += b"PONG\r\n"
        elif verb == b"SUB ":
            args = bytes(buf[pos + 4 : nl]).split()
            subject, sid = args[0], args[-1]
            if b"*" in subject or b">" in subject:
                nats_wild.append((subject.split(b"."), conn, sid))
            else:
                nats_subs.setdefault(subject, []).append((conn, sid))
        elif verb == b"UNSU":
            sid = bytes(buf[pos + 6 : nl]).split()[0]
            nats_drop(conn, sid)
        # CONNECT (verbose false), PONG: nothing to answer
        pos = nl + 2
    for other in nats_dirty:
        if other is not conn:
            other.flush()
    nats_dirty.clear()
    return pos


def nats_drop(conn: Conn, sid: bytes | None = None) -> None:
    for subject, subs in list(nats_subs.items()):
        subs[:] = [(c, s) for c, s in subs if c is not conn or (sid is not None and s != sid)]
        if not subs:
            del nats_subs[subject]
    nats_wild[:] = [w for w in nats_wild if w[1] is not conn or (sid is not None and w[2] != sid)]


# -- beanstalk ------------------------------------------------------------------------------


def beanstalk_parse(conn: Conn, buf: bytearray) -> int:
    pos = 0
    end = len(buf)
    out = conn.out
    while True:
        nl = buf.find(b"\r\n", pos)
        if nl < 0:
            break
        line = bytes(buf[pos:nl])
        if line.startswith(b"put "):
            size = int(line.rsplit(b" ", 1)[1])
            stop = nl + 2 + size + 2
            if stop > end:
                break
            conn.last_body = bytes(buf[nl + 2 : nl + 2 + size])
            out += b"INSERTED 1\r\n"
            pos = stop
            continue
        if line.startswith(b"reserve"):
            body = conn.last_body
            out += b"RESERVED 1 %d\r\n" % len(body) + body + b"\r\n"
        elif line.startswith(b"delete "):
            out += b"DELETED\r\n"
        elif line.startswith(b"use "):
            out += b"USING " + line[4:] + b"\r\n"
        elif line.startswith(b"watch "):
            out += b"WATCHING 2\r\n"
        elif line.startswith(b"ignore "):
            out += b"WATCHING 1\r\n"
        else:
            out += b"UNKNOWN_COMMAND\r\n"
        pos = nl + 2
    return pos


# -- the shell ------------------------------------------------------------------------------

Parse = Callable[[Conn, bytearray], int]
PROTOCOLS: dict[str, tuple[Parse, Callable[[Conn], None], bytes]] = {
    "nsq": (nsq_parse, nsq_close, b""),
    "nats": (nats_parse, nats_drop, NATS_INFO),
    "beanstalk": (beanstalk_parse, lambda conn: None, b""),
}


async def serve_conn(sock: socket.socket, protocol: str) -> None:
    parse, close, greeting = PROTOCOLS[protocol]
    conn = Conn(sock)
    if protocol == "nsq":
        conn.rdy = -1  # magic first
    buf = bytearray()
    recv = sock.recv
    wait_readable = trio.lowlevel.wait_readable
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.writer)
        if greeting:
            conn.out += greeting
            conn.flush()
        try:
            while True:
                await wait_readable(sock)
                try:
                    data = recv(RECV_SIZE)
                except BlockingIOError:
                    continue
                if not data:
                    break
                buf += data
                used = parse(conn, buf)
                if used:
                    del buf[:used]
                conn.flush()
        except OSError:
            pass
        finally:
            close(conn)
            nursery.cancel_scope.cancel()
            sock.close()


async def main(protocol: str, host: str, port: int) -> None:
    listener = trio.socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    await listener.bind((host, port))
    listener.listen(128)
    bound = listener.getsockname()
    print(f"listening protocol={protocol} address={bound[0]}:{bound[1]}", file=sys.stderr)
    sys.stderr.flush()
    async with trio.open_nursery() as nursery:
        while True:
            accepted, _ = await listener.accept()
            sock = socket.socket(fileno=accepted.detach())
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nursery.start_soon(serve_conn, sock, protocol)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in PROTOCOLS:
        sys.exit(f"usage: ceiling.py {{{','.join(PROTOCOLS)}}} [HOST:PORT]")
    host, _, port = (sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1:0").rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(main, sys.argv[1], host, int(port))
