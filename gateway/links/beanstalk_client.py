"""A beanstalkd client: a sans-IO codec (commands out, replies in) and a connection on a
Trio stream. The links speak to live beanstalkd servers with it, and `gateway import` to
the gateway's own beanstalkd listener. The Python clients there are (greenstalk, pystalk)
use blocking sockets; none runs on Trio.

The codec knows the wire only (docs/protocols/beanstalkd.md §1, §5): a reply is one line,
and `RESERVED`, `FOUND` and `OK` are followed by `<bytes>` of data and a CRLF. What a
reply means is the caller's business."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import trio

_RECEIVE_SIZE = 65536
# the replies followed by data, and their argument count: the last one is its <bytes>
_WITH_DATA = {"RESERVED": 2, "FOUND": 2, "OK": 1}
_MAX_LINE = 1024  # far more than any reply line beanstalkd sends (a word and two numbers)
CALL_TIMEOUT = 30.0  # s a server may take to answer (a blocking reserve: its timeout more)


class ProtocolError(Exception):
    """The server sent something no beanstalkd sends, or a reply the caller cannot use."""


@dataclass(frozen=True)
class Reply:
    word: str  # RESERVED, INSERTED, NOT_FOUND, ...
    args: tuple[str, ...] = ()
    data: bytes | None = None  # the job body or the YAML of RESERVED, FOUND and OK

    @property
    def id(self) -> int:
        """The job id of RESERVED, FOUND, INSERTED and BURIED <id>."""
        try:
            return int(self.args[0])
        except (IndexError, ValueError):
            raise ProtocolError(f"no job id in {self}") from None

    def __str__(self) -> str:
        return " ".join((self.word, *self.args))


# -- commands out ------------------------------------------------------------------------------


def command(name: str, *args: object) -> bytes:
    """One command line: `name arg arg\\r\\n`."""
    return " ".join((name, *map(str, args))).encode() + b"\r\n"


def put(pri: int, delay: int, ttr: int, body: bytes) -> bytes:
    return b"put %d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(body), body)


# -- replies in --------------------------------------------------------------------------------


class ReplyReader:
    """Bytes from the server in, whole replies out, in order."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def next_reply(self) -> Reply | None:
        """The next whole reply, or None until more bytes arrive."""
        buf = self._buf
        end = buf.find(b"\r\n")
        if end < 0:
            if len(buf) > _MAX_LINE:
                raise ProtocolError(f"a reply line longer than {_MAX_LINE} bytes")
            return None
        try:
            word, *args = bytes(buf[:end]).decode("ascii").split(" ")
        except UnicodeDecodeError:
            raise ProtocolError(f"not a beanstalkd reply: {bytes(buf[:end])[:80]!r}") from None
        if word not in _WITH_DATA:
            del buf[: end + 2]
            return Reply(word, tuple(args))
        if len(args) != _WITH_DATA[word] or not args[-1].isdigit():
            raise ProtocolError(f"{word} without its length: {' '.join(args)!r}")
        start = end + 2
        stop = start + int(args[-1])
        if len(buf) < stop + 2:
            return None
        if buf[stop : stop + 2] != b"\r\n":
            raise ProtocolError(f"{word}'s data is not followed by CRLF")
        data = bytes(buf[start:stop])
        del buf[: stop + 2]
        return Reply(word, tuple(args), data)


def yaml_dict(data: bytes) -> dict[str, str]:
    """The YAML of stats, stats-job and stats-tube: `key: value` lines after `---`. 1.13
    quotes strings (`tube: "default"`), 1.12 does not; the quotes are taken off."""
    out = {}
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            out[key.strip()] = _unquote(value.strip())
    return out


def yaml_list(data: bytes) -> list[str]:
    """The YAML of list-tubes and list-tubes-watched: `- name` lines after `---`."""
    return [
        _unquote(line[2:].strip())
        for line in data.decode("utf-8", "replace").splitlines()
        if line.startswith("- ")
    ]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


# -- a connection --------------------------------------------------------------------------------


class BeanstalkClient:
    """One connection. Calls are serialized by a lock: a reply belongs to the command
    before it, so two tasks (a mover and its touches) must not interleave theirs. A call
    cancelled half-way leaves the replies out of step: the connection is then closed, and
    the next call raises trio.ClosedResourceError."""

    def __init__(self, stream: trio.abc.Stream, address: str = "") -> None:
        self.stream = stream
        self.address = address
        self._reader = ReplyReader()
        self._lock = trio.Lock()

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 10.0) -> BeanstalkClient:
        """Raises OSError (refused, unreachable, timed out)."""
        with trio.move_on_after(timeout) as scope:
            stream = await trio.open_tcp_stream(host, port)
        if scope.cancelled_caught:
            raise TimeoutError(f"no connection to {host}:{port} within {timeout:.0f} s")
        return cls(stream, f"{host}:{port}")

    async def __aenter__(self) -> BeanstalkClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()

    async def calls(self, commands: Sequence[bytes], timeout: float = CALL_TIMEOUT) -> list[Reply]:
        """Send the commands in one write (pipelined) and read one reply each. Raises
        trio.BrokenResourceError or EOFError when the connection is lost, TimeoutError
        when the server does not answer within `timeout`."""
        if not commands:
            return []
        async with self._lock:
            done = False
            try:
                with trio.move_on_after(timeout) as scope:
                    await self.stream.send_all(b"".join(commands))
                    replies = [await self._reply() for _ in commands]
                    done = True
            finally:
                if not done:
                    await self.aclose()  # replies would no longer match their commands
            if scope.cancelled_caught:
                raise TimeoutError(f"{self.address} did not answer within {timeout:.0f} s")
            return replies

    async def call(self, command: bytes, timeout: float = CALL_TIMEOUT) -> Reply:
        (reply,) = await self.calls([command], timeout)
        return reply

    async def expect(self, command: bytes, *words: str) -> Reply:
        """`call`, and a ProtocolError unless the reply is one of `words`."""
        reply = await self.call(command)
        if reply.word not in words:
            raise ProtocolError(f"{command.decode(errors='replace').split()[0]}: {reply}")
        return reply

    async def _reply(self) -> Reply:
        while (reply := self._reader.next_reply()) is None:
            data = await self.stream.receive_some(_RECEIVE_SIZE)
            if not data:
                raise EOFError(f"{self.address} closed the connection")
            self._reader.receive_data(data)
        return reply

    # -- the commands the links use --------------------------------------------------------

    async def list_tubes(self) -> list[str]:
        reply = await self.expect(b"list-tubes\r\n", "OK")
        return yaml_list(reply.data or b"")

    async def stats_job(self, job_id: int) -> dict[str, str] | None:
        """None when the job is gone."""
        reply = await self.expect(command("stats-job", job_id), "OK", "NOT_FOUND")
        return yaml_dict(reply.data or b"") if reply.word == "OK" else None

    async def stats_tube(self, tube: str) -> dict[str, str] | None:
        """None when the tube does not exist."""
        reply = await self.expect(command("stats-tube", tube), "OK", "NOT_FOUND")
        return yaml_dict(reply.data or b"") if reply.word == "OK" else None
