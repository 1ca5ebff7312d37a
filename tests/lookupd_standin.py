"""A stand-in nsqlookupd for tests: its TCP protocol (V1), written from nsqlookupd 1.3.0's
`lookup_protocol_v1.go` and `tcp.go`, with the registration database it keeps.

CI cannot install nsqlookupd, so the registration client is tested against this. Its
bytes are checked against a recording of the real server
(tests/data/nsqlookupd_v1_recording.json, tests/unit/test_nsq_lookupd_codec.py), so what
it answers is what nsqlookupd answers. Deliberately independent of the gateway's codec:
its own parsing, its own name check.

`LookupdConnection` is sans-IO (bytes in, bytes out); `StandInLookupd` serves it on a
Trio TCP listener, can be stopped and started again on the same port (a lookupd
restart), and lets a test wait for a condition on what it holds.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

MAGIC_V1 = b"  V1"
_NAME = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")
_SIZE = struct.Struct(">i")

# (category, key, subkey) as nsqlookupd's Registration: ("client", "", ""),
# ("topic", T, ""), ("channel", T, C)
Registration = tuple[str, str, str]


def _valid(name: str) -> bool:
    # nsqd's protocol.IsValidTopicName / IsValidChannelName
    return 0 < len(name) <= 64 and _NAME.fullmatch(name) is not None


def response(data: bytes) -> bytes:
    """nsqlookupd's protocol.SendResponse: a size, then the data (no frame type)."""
    return _SIZE.pack(len(data)) + data


@dataclass
class Database:
    """nsqlookupd's RegistrationDB: which producers (by connection id) hold what."""

    registrations: dict[Registration, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def add(self, key: Registration, peer_id: str, info: dict[str, Any]) -> None:
        self.registrations.setdefault(key, {})[peer_id] = info

    def remove(self, key: Registration, peer_id: str) -> int:
        """Remove the producer; how many are left (-1: no such registration)."""
        producers = self.registrations.get(key)
        if producers is None:
            return -1
        producers.pop(peer_id, None)
        return len(producers)

    def topics(self) -> set[str]:
        return {k for c, k, _ in self.registrations if c == "topic"}

    def channels(self, topic: str) -> set[str]:
        return {s for c, k, s in self.registrations if c == "channel" and k == topic}

    def producers(self, topic: str) -> list[dict[str, Any]]:
        return list(self.registrations.get(("topic", topic, ""), {}).values())

    def held_by(self, peer_id: str) -> set[Registration]:
        return {k for k, producers in self.registrations.items() if peer_id in producers}


class LookupdConnection:
    """One client connection's protocol state: feed it bytes, get the bytes to send."""

    def __init__(
        self,
        db: Database,
        peer_id: str,
        *,
        hostname: str,
        broadcast_address: str,
        tcp_port: int,
        http_port: int,
        version: str = "1.3.0",
    ) -> None:
        self.db = db
        self.peer_id = peer_id  # nsqlookupd's: the client's remote address
        self.me = {
            "broadcast_address": broadcast_address,
            "hostname": hostname,
            "http_port": http_port,
            "tcp_port": tcp_port,
            "version": version,
        }
        self.info: dict[str, Any] | None = None  # the IDENTIFY body, once identified
        self.commands: list[bytes] = []  # each command line received, as sent
        self.closed = False
        self._magic: bytes | None = None
        self._buf = bytearray()

    def receive_data(self, data: bytes) -> bytes:
        """What the server sends in answer to `data`; `closed` is set once it would close."""
        self._buf += data
        out = bytearray()
        while not self.closed:
            if self._magic is None:
                if len(self._buf) < 4:
                    break
                self._magic = bytes(self._buf[:4])
                del self._buf[:4]
                if self._magic != MAGIC_V1:
                    out += response(b"E_BAD_PROTOCOL")
                    self.closed = True
                continue
            end = self._buf.find(b"\n")
            if end < 0:
                break
            line = bytes(self._buf[:end])
            params = line.decode("utf-8", "replace").strip().split(" ")
            body: bytes | None = None
            if params[0] == "IDENTIFY" and self.info is None:
                if len(self._buf) < end + 5:
                    break
                (size,) = _SIZE.unpack_from(self._buf, end + 1)
                if len(self._buf) < end + 5 + size:
                    break
                body = bytes(self._buf[end + 5 : end + 5 + size])
                del self._buf[: end + 5 + size]
            else:
                del self._buf[: end + 1]
            self.commands.append(line)
            reply, fatal = self._execute(params, body)
            out += response(reply)
            if fatal:
                self.closed = True
        return bytes(out)

    def _execute(self, params: list[str], body: bytes | None) -> tuple[bytes, bool]:
        """(the response, whether it is a fatal error); nsqlookupd's are all fatal."""
        command, args = params[0], params[1:]
        if command == "PING":
            return b"OK", False
        if command == "IDENTIFY":
            return self._identify(body)
        if command in ("REGISTER", "UNREGISTER"):
            if self.info is None:
                return b"E_INVALID client must IDENTIFY", True
            if not args:
                return f"E_INVALID {command} insufficient number of params".encode(), True
            topic = args[0]
            channel = args[1] if len(args) >= 2 else ""
            if not _valid(topic):
                return f"E_BAD_TOPIC {command} topic name '{topic}' is not valid".encode(), True
            if channel and not _valid(channel):
                text = f"E_BAD_CHANNEL {command} channel name '{channel}' is not valid"
                return text.encode(), True
            if command == "REGISTER":
                self._register(topic, channel)
            else:
                self._unregister(topic, channel)
            return b"OK", False
        return f"E_INVALID invalid command {command}".encode(), True

    def _identify(self, body: bytes | None) -> tuple[bytes, bool]:
        if self.info is not None or body is None:
            return b"E_INVALID cannot IDENTIFY again", True
        try:
            info = json.loads(body)
        except ValueError:
            return b"E_BAD_BODY IDENTIFY failed to decode JSON body", True
        if not isinstance(info, dict):
            return b"E_BAD_BODY IDENTIFY failed to decode JSON body", True
        if not (
            info.get("broadcast_address")
            and info.get("tcp_port")
            and info.get("http_port")
            and info.get("version")
        ):
            return b"E_BAD_BODY IDENTIFY missing fields", True
        self.info = {**info, "remote_address": self.peer_id}
        self.db.add(("client", "", ""), self.peer_id, self.info)
        # Go marshals a map with sorted keys, no spaces
        return json.dumps(self.me, sort_keys=True, separators=(",", ":")).encode(), False

    def _register(self, topic: str, channel: str) -> None:
        assert self.info is not None
        if channel:
            self.db.add(("channel", topic, channel), self.peer_id, self.info)
        self.db.add(("topic", topic, ""), self.peer_id, self.info)

    def _unregister(self, topic: str, channel: str) -> None:
        db = self.db
        if channel:
            key = ("channel", topic, channel)
            if db.remove(key, self.peer_id) == 0 and channel.endswith("#ephemeral"):
                del db.registrations[key]
            return
        for c, k, s in list(db.registrations):
            if c == "channel" and k == topic:
                db.remove((c, k, s), self.peer_id)
        key = ("topic", topic, "")
        if db.remove(key, self.peer_id) == 0 and topic.endswith("#ephemeral"):
            del db.registrations[key]

    def lost(self) -> None:
        """The connection closed: nsqlookupd removes everything this producer held."""
        for key in self.db.held_by(self.peer_id):
            self.db.remove(key, self.peer_id)


def registered(db: Database) -> dict[str, set[str]]:
    """topic -> channels, as /lookup would list them, for producers still connected."""
    return {
        t: {c for c in db.channels(t) if db.registrations.get(("channel", t, c))}
        for t in db.topics()
        if db.registrations.get(("topic", t, ""))
    }


async def converse(
    conn: LookupdConnection, stream: trio.abc.Stream, changed: Callable[[], None]
) -> None:
    """Serve one producer's connection until either side closes it; `changed()` after
    every read and at the end, when the lookupd forgets what the producer held."""
    try:
        while not conn.closed:
            data = await stream.receive_some(65536)
            if not data:
                break
            out = conn.receive_data(data)
            if out:
                await stream.send_all(out)
            changed()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        conn.lost()
        changed()


class StandInLookupd:
    """The stand-in served on 127.0.0.1; `start` again after `stop` is a restart on the
    same port with an empty database, as a real nsqlookupd restart."""

    def __init__(self, hostname: str = "standin", http_port: int = 4161) -> None:
        self.hostname = hostname
        self.http_port = http_port  # what IDENTIFY's answer names; nothing serves it
        self.port = 0
        self.db = Database()
        self.connections: list[LookupdConnection] = []  # every one so far, this run
        self.connects = 0  # connections accepted, over every run
        self._scope: trio.CancelScope | None = None
        self._changed = trio.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, nursery: trio.Nursery) -> None:
        self.db = Database()
        self.connections = []
        await nursery.start(self._serve)

    def stop(self) -> None:
        """Close the listener and every connection at once (a lookupd killed)."""
        assert self._scope is not None
        self._scope.cancel()
        self._scope = None

    async def _serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            self.port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, self._handle, listeners)
                task_status.started()
        self._notify()

    async def _handle(self, stream: trio.SocketStream) -> None:
        host, port = stream.socket.getpeername()[:2]
        conn = LookupdConnection(
            self.db,
            f"{host}:{port}",
            hostname=self.hostname,
            broadcast_address="127.0.0.1",
            tcp_port=self.port,
            http_port=self.http_port,
        )
        self.connections.append(conn)
        self.connects += 1
        async with stream:
            await converse(conn, stream, self._notify)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Until `condition()` holds, checked after each thing the stand-in receives."""
        with trio.fail_after(timeout):
            while not condition():
                await self._changed.wait()

    # -- what a test asks ----------------------------------------------------------

    def registered(self) -> dict[str, set[str]]:
        return registered(self.db)

    def producers(self) -> list[dict[str, Any]]:
        return list(self.db.registrations.get(("client", "", ""), {}).values())

    def commands(self) -> list[bytes]:
        return [line for conn in self.connections for line in conn.commands]
