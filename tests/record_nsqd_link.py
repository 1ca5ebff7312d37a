"""Record the NSQ links' conversation (tests/nsq_link_conversation.py) against a real
nsqd, into tests/data/nsqd_link_recording.json.

A fresh nsqd is started on free ports of 127.0.0.1 with an empty data path, the steps are
played, and every frame it sent is written down with the step's bytes. Run it from the
repository root with the nsqd binary to record::

    python -m tests.record_nsqd_link --nsqd-bin /path/to/nsqd   # nsqd 1.3.0
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import tempfile
from pathlib import Path

import trio

from tests.nsq_link_conversation import STEPS, encode, play

OUT = Path(__file__).resolve().parent / "data" / "nsqd_link_recording.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _record(nsqd_bin: str) -> None:
    tcp, http = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as data:
        version = subprocess.run(
            [nsqd_bin, "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        argv = [
            nsqd_bin,
            f"--tcp-address=127.0.0.1:{tcp}",
            f"--http-address=127.0.0.1:{http}",
            f"--data-path={data}",
        ]
        with subprocess.Popen(argv, stderr=subprocess.DEVNULL) as nsqd:
            try:
                with trio.fail_after(10):
                    while True:
                        try:
                            (await trio.open_tcp_stream("127.0.0.1", tcp)).socket.close()
                            break
                        except OSError:
                            await trio.sleep(0.05)
                played = await play(("127.0.0.1", tcp), STEPS)
            finally:
                nsqd.terminate()
    steps = [
        {
            "conn": s["conn"],
            "send": encode(s["send"]),
            "reply": [encode(f) for f in s["reply"]],
            **({"closed": s["closed"]} if "closed" in s else {}),
        }
        for s in played
    ]
    OUT.write_text(json.dumps({"server": version, "steps": steps}, indent=1) + "\n")
    print(f"{len(steps)} steps of {version} written to {OUT}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsqd-bin", default="nsqd", help="the nsqd to record")
    trio.run(_record, parser.parse_args().nsqd_bin)


if __name__ == "__main__":
    main()
