"""Commands a beanstalkd client sends, as the codec hands them to the session.

One small slotted dataclass per command (the h11 habit): cheap to make, easy to compare in
tests. Not frozen: a frozen dataclass's __init__ goes through object.__setattr__, which
costs more than parsing the line. Treat them as immutable all the same.

Everything is already parsed and range-checked the way beanstalkd 1.13's prot.c checks it:
numbers fit their C types (uint32 for pri/delay/ttr/timeouts, uint64 for job ids), tube
names are valid (names.py). A line that fails those checks never becomes a command event;
it becomes a `Reply` (or a `PutRejected` for a put whose line parsed).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Put:
    pri: int
    delay: int  # seconds
    ttr: int  # seconds; a ttr of 0 has already been turned into 1, as beanstalkd does
    body: bytes  # without the trailing CRLF, which the codec has checked


@dataclass(slots=True)
class Use:
    tube: str


@dataclass(slots=True)
class Reserve:
    pass


@dataclass(slots=True)
class ReserveWithTimeout:
    timeout: int  # seconds, 0..2147483647 (1.13 rejects anything above INT_MAX)


@dataclass(slots=True)
class ReserveJob:
    id: int


@dataclass(slots=True)
class Delete:
    id: int


@dataclass(slots=True)
class Release:
    id: int
    pri: int
    delay: int


@dataclass(slots=True)
class Bury:
    id: int
    pri: int


@dataclass(slots=True)
class Touch:
    id: int


@dataclass(slots=True)
class Watch:
    tube: str


@dataclass(slots=True)
class Ignore:
    tube: str


@dataclass(slots=True)
class Peek:
    id: int


@dataclass(slots=True)
class PeekReady:
    pass


@dataclass(slots=True)
class PeekDelayed:
    pass


@dataclass(slots=True)
class PeekBuried:
    pass


@dataclass(slots=True)
class Kick:
    bound: int  # uint32, already wrapped the way strtoul + the cast to uint do it


@dataclass(slots=True)
class KickJob:
    id: int


@dataclass(slots=True)
class StatsJob:
    id: int


@dataclass(slots=True)
class StatsTube:
    tube: str


@dataclass(slots=True)
class Stats:
    pass


@dataclass(slots=True)
class ListTubes:
    pass


@dataclass(slots=True)
class ListTubeUsed:
    pass


@dataclass(slots=True)
class ListTubesWatched:
    pass


@dataclass(slots=True)
class PauseTube:
    tube: str
    delay: int  # seconds; 0 is passed on as 0 (beanstalkd stores it as 1 ns: un-pause)


@dataclass(slots=True)
class Quit:
    """Close the connection, no reply. The codec yields nothing after it."""


@dataclass(slots=True)
class Reply:
    """Input that gets an error reply and does nothing else: send `data` as it is.

    BAD_FORMAT (line too long, NUL byte, arguments that do not parse) and UNKNOWN_COMMAND.
    Such lines do not count in any cmd-* statistic, with one exception not modelled here:
    prot.c counts cmd-pause-tube before it checks the name's length and leading '-', so
    `pause-tube -foo 1` bumps it on a real beanstalkd.
    """

    data: bytes


@dataclass(slots=True)
class PutRejected:
    """A put whose line parsed (beanstalkd counts it in cmd-put) but that inserts no job.

    JOB_TOO_BIG comes after the codec has thrown away the declared bytes + 2;
    EXPECTED_CRLF after it has read bytes + 2 that did not end in CRLF. In the EXPECTED_CRLF
    case beanstalkd had already made the job, so a job id is used up (`consumes_id`), and
    the connection already counts as a producer.
    """

    reply: bytes
    consumes_id: bool


Event = (
    Put
    | Use
    | Reserve
    | ReserveWithTimeout
    | ReserveJob
    | Delete
    | Release
    | Bury
    | Touch
    | Watch
    | Ignore
    | Peek
    | PeekReady
    | PeekDelayed
    | PeekBuried
    | Kick
    | KickJob
    | StatsJob
    | StatsTube
    | Stats
    | ListTubes
    | ListTubeUsed
    | ListTubesWatched
    | PauseTube
    | Quit
    | Reply
    | PutRejected
)
