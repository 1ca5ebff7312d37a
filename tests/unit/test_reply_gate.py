"""The connection shell's reply gate (connection.Connection), driven over a socket pair with
commits the test settles: replies wait for their commit, leave in order however the
commits settle, take their failure's bytes when it fails, and a `last` failure is the
connection's last words."""

from __future__ import annotations

import socket

import trio
import trio.testing

from gateway.broker.errors import StoreUnavailable
from gateway.connection import Connection
from gateway.metrics import Metrics


class Commits:
    """Stands in for the broker's flush: each call waits until the test settles it."""

    def __init__(self) -> None:
        self.waiting: list[tuple[trio.Event, list[StoreUnavailable | None]]] = []

    async def flush(self) -> None:
        done, outcome = trio.Event(), [None]
        self.waiting.append((done, outcome))  # type: ignore[arg-type]
        await done.wait()
        if outcome[0] is not None:
            raise outcome[0]

    def settle(self, i: int, error: StoreUnavailable | None = None) -> None:
        done, outcome = self.waiting[i]
        outcome[0] = error
        done.set()


def connection(commits: Commits) -> tuple[Connection, socket.socket]:
    ours, theirs = socket.socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    conn = Connection(stream, "127.0.0.1:1", "nsq", Metrics(), commit=commits.flush)
    theirs.setblocking(False)
    return conn, theirs


def received(peer: socket.socket) -> bytes:
    try:
        return peer.recv(65536)
    except BlockingIOError:
        return b""


def failed(exc: StoreUnavailable) -> bytes:
    return b"FAILED(%s) " % str(exc).encode()


async def test_replies_wait_for_their_commit_and_leave_in_order() -> None:
    commits = Commits()
    conn, peer = connection(commits)
    async with trio.open_nursery() as nursery:
        conn.nursery = nursery
        conn.out.append(b"a ")
        conn.reply_after_commit(b"ok1 ", failed)
        conn.out.append(b"b ")  # queued behind a held reply: waits with it
        conn.commit_soon()
        await trio.testing.wait_all_tasks_blocked()  # (the commits in the order made)
        conn.reply_after_commit(b"ok2 ", failed)
        conn.commit_soon()
        assert conn.commits_held == 2
        await conn.flush()
        assert received(peer) == b"a "
        await trio.testing.wait_all_tasks_blocked()
        commits.settle(1)  # the later commit first: nothing may overtake the earlier one
        await trio.testing.wait_all_tasks_blocked()
        assert received(peer) == b""
        commits.settle(0)
        await trio.testing.wait_all_tasks_blocked()
        assert received(peer) == b"ok1 b ok2 "
        assert conn.commits_held == 0 and conn.held_from is None


async def test_a_failed_commit_sends_its_failure_bytes_and_the_rest_goes_on() -> None:
    commits = Commits()
    conn, peer = connection(commits)
    async with trio.open_nursery() as nursery:
        conn.nursery = nursery
        conn.reply_after_commit(b"INSERTED 1 ", failed)
        conn.reply_after_commit(b"RESERVED 2 ", None)  # stands whatever the commit did
        conn.out.append(b"USING t ")
        settling = trio.Event()

        async def commit() -> None:
            await conn.commit()  # in this task, as beanstalkd's reader does
            settling.set()

        nursery.start_soon(commit)
        await trio.testing.wait_all_tasks_blocked()
        commits.settle(0, StoreUnavailable("disk full"))
        await settling.wait()
        await conn.flush()
        assert received(peer) == b"FAILED(disk full) RESERVED 2 USING t "
        assert not conn.ended


async def test_a_last_failure_ends_the_connection_and_nothing_after_it_leaves() -> None:
    commits = Commits()
    conn, peer = connection(commits)
    with trio.CancelScope() as scope:
        conn.cancel_scope = scope
        async with trio.open_nursery() as nursery:
            conn.nursery = nursery
            conn.out.append(b"before ")
            conn.reply_after_commit(b"OK1 ", failed, last=True)
            conn.reply_after_commit(b"OK2 ", failed, last=True)
            conn.out.append(b"after ")
            conn.commit_soon()
            await trio.testing.wait_all_tasks_blocked()
            conn.out.append(b"later ")
            commits.settle(0, StoreUnavailable("gone"))
            await trio.testing.wait_all_tasks_blocked()
    assert scope.cancelled_caught  # the connection ended after its last words
    assert conn.ended
    assert received(peer) == b"before FAILED(gone) "


async def test_a_store_that_needs_no_wait_settles_the_commit_at_once_behind_earlier_ones() -> None:
    """`commit_now` (Broker.flush_now): where the store accepts the batch without waiting,
    its replies are released there and then, with no task and no scheduler pass, yet
    still behind an earlier commit that waits; a store that fails takes the waiting path,
    which answers the failure."""
    commits = Commits()
    now = [False]
    failing: list[StoreUnavailable] = []

    def commit_now() -> bool:
        if failing:
            raise failing[0]
        return now[0]

    ours, peer = socket.socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    conn = Connection(
        stream, "127.0.0.1:1", "nsq", Metrics(), commit=commits.flush, commit_now=commit_now
    )
    peer.setblocking(False)
    async with trio.open_nursery() as nursery:
        conn.nursery = nursery
        conn.reply_after_commit(b"waits ", failed)
        conn.commit_soon()  # needs a wait: a task of its own
        now[0] = True
        conn.reply_after_commit(b"at-once ", failed)
        conn.commit_soon()  # settled here, but held behind the first
        assert conn.commits_held == 2
        await conn.flush()
        assert received(peer) == b""
        await trio.testing.wait_all_tasks_blocked()
        commits.settle(0)
        await trio.testing.wait_all_tasks_blocked()
        assert received(peer) == b"waits at-once "
        conn.reply_after_commit(b"alone ", failed)
        conn.commit_soon()
        assert conn.commits_held == 0 and conn.held_from is None  # no task, no pass
        await conn.flush()
        assert received(peer) == b"alone "
        failing.append(StoreUnavailable("disk full"))
        conn.reply_after_commit(b"refused ", failed)
        conn.commit_soon()
        assert conn.commits_held == 1
        await trio.testing.wait_all_tasks_blocked()
        commits.settle(1, StoreUnavailable("disk full"))
        await trio.testing.wait_all_tasks_blocked()
        await conn.flush()
        assert received(peer) == b"FAILED(disk full) "
