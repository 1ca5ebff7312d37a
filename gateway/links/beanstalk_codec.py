"""The client side of beanstalkd's protocol, sans-IO: commands out, replies in (no sockets,
no Trio). beanstalk_client.py runs it on a Trio stream.

It knows the wire only (docs/protocols/beanstalkd.md §1, §5): a reply is one line,
and `RESERVED`, `FOUND` and `OK` are followed by `<bytes>` of data and a CRLF. What a
reply means is the caller's business."""

from __future__ import annotations

from dataclasses import dataclass

# the replies followed by data, and their argument count: the last one is its <bytes>
_WITH_DATA = {"RESERVED": 2, "FOUND": 2, "OK": 1}
_MAX_LINE = 1024  # far more than any reply line beanstalkd sends (a word and two numbers)


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
