"""The HTTP router under fuzz: requests straight into its ASGI interface.

hypercorn (h11, h2) parses the bytes; what the gateway owns is everything after: the
router's table, query parsing (gocompat), body reading, and every handler behind it. A
`RouterRig` is a gateway on the memory store with every listener off, run by Trio in a
thread of its own; the fuzzing thread hands it one request at a time. Two rigs get the
same requests, one with each body in one piece and one with it cut into many
`http.request` events, so their states stay in step and their answers must agree.

The property (`check`): a request is answered with one `http.response.start` and one
`http.response.body`, never with a 500 (the router answers 500 only when a handler
raised something unexpected, which it logs with a traceback) and never with an
exception out of the ASGI call; a client that disconnects mid-body gets no answer.
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from gateway.app import Gateway
from gateway.http.server import build_router
from tests.helpers import settings

# Answers that carry times, ids or counters of the whole process: compared by status only.
_VOLATILE = ("/stats", "/info", "/metrics", "/admin/api/", "/lookup", "/nodes", "/config/")
_TIMEOUT = 10.0  # a request that takes longer has hung


@dataclass(frozen=True)
class HTTPCase:
    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: tuple[bytes, ...]  # the body's chunks, each one http.request event
    disconnect: bool  # the client goes away before the body's end


class RouterRig:
    def __init__(self) -> None:
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self.paths: list[str] = []
        self.methods: dict[str, list[str]] = {}  # what each path's route accepts
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> RouterRig:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # reported to the fuzzing thread
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        gateway = Gateway(settings(nsq="off"))
        async with trio.open_nursery() as nursery:
            await nursery.start(gateway.serve)
            self.router = build_router(gateway)
            self.methods = {path: sorted(table) for path, table in self.router.routes.items()}
            for prefix, table in self.router.param_routes.items():
                self.methods[prefix + "log_level"] = sorted(table)
            self.paths = sorted(self.methods)
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def call(self, case: HTTPCase) -> list[MutableMapping[str, Any]]:
        assert self._token is not None
        return trio.from_thread.run(self._call, case, trio_token=self._token)

    async def _call(self, case: HTTPCase) -> list[MutableMapping[str, Any]]:
        scope = {
            "type": "http",
            "http_version": "1.1",
            "method": case.method,
            "path": case.path,
            "raw_path": case.path.encode("utf-8", "surrogateescape"),
            "query_string": case.query,
            "headers": list(case.headers),
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 4151),
            "scheme": "http",
            "root_path": "",
        }
        chunks = list(case.body)
        ended = False

        async def receive() -> MutableMapping[str, Any]:
            nonlocal ended
            if chunks:
                chunk = chunks.pop(0)
                more = bool(chunks) or case.disconnect
                ended = not more
                return {"type": "http.request", "body": chunk, "more_body": more}
            if ended:
                # an ASGI server never gives a finished request more body: waiting here
                # is what it does until the client goes away
                await trio.sleep_forever()
            return {"type": "http.disconnect"}

        sent: list[MutableMapping[str, Any]] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        with trio.fail_after(_TIMEOUT):
            await self.router(scope, receive, send)
        return sent


def answer(sent: Sequence[MutableMapping[str, Any]], case: HTTPCase) -> tuple[int, bytes] | None:
    """(status, body) of a well-formed answer, None for none (a client gone)."""
    if not sent:
        assert case.disconnect, f"no answer to {case}"
        return None
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"], sent
    status = sent[0]["status"]
    assert 100 <= status <= 599, sent
    assert status != 500, (case, sent)
    for name, value in sent[0]["headers"]:
        assert isinstance(name, bytes) and isinstance(value, bytes), sent
    return status, sent[1]["body"]


def check(whole: RouterRig, split: RouterRig, case: HTTPCase) -> None:
    one = answer(whole.call(_in_one_piece(case)), case)
    many = answer(split.call(case), case)
    if one is not None and many is not None and case.path.startswith(_VOLATILE):
        assert one[0] == many[0], (case, one, many)
    else:
        assert one == many, (case, one, many)


def _in_one_piece(case: HTTPCase) -> HTTPCase:
    return HTTPCase(
        case.method, case.path, case.query, case.headers, (b"".join(case.body),), case.disconnect
    )
