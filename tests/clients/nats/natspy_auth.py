"""nats-py 2.16.0 against a server with users and permissions: what the library reports.

    natspy_auth.py --host H --port P --user U --password PW [--publish SUBJECT]

Connects with the credentials (no reconnects). On refusal prints {"connect_error": "..."};
otherwise publishes one message to SUBJECT, flushes, waits for the server's asynchronous
error (nats-py hands a permissions violation to error_cb) and prints
{"connected": true, "errors": [...]}.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import nats


async def main(args: argparse.Namespace) -> dict[str, object]:
    errors: list[str] = []
    got_error = asyncio.Event()

    async def error_cb(exc: Exception) -> None:
        errors.append(str(exc))
        got_error.set()

    try:
        nc = await nats.connect(
            f"nats://{args.host}:{args.port}",
            user=args.user,
            password=args.password,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=5,
            error_cb=error_cb,
        )
    except Exception as exc:
        return {"connect_error": f"{type(exc).__name__}: {exc}", "errors": errors}
    try:
        if args.publish:
            await nc.publish(args.publish, b"hello")
            await nc.flush()
            await asyncio.wait_for(got_error.wait(), 10)
    finally:
        await nc.close()
    return {"connected": True, "errors": errors}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--publish", default="")
    print(json.dumps(asyncio.run(main(p.parse_args()))), flush=True)
