"""A beanstalkd client: the codec (beanstalk_codec.py) on a Trio stream. The links speak
to live beanstalkd servers with it, and `gateway import` to the gateway's own beanstalkd
listener. The Python clients there are (greenstalk, pystalk) use blocking sockets; none
runs on Trio."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import trio

from gateway.links.beanstalk_codec import (
    ProtocolError,
    Reply,
    ReplyReader,
    command,
    yaml_dict,
    yaml_list,
)

_RECEIVE_SIZE = 65536
CALL_TIMEOUT = 30.0  # s a server may take to answer (a blocking reserve: its timeout more)


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
