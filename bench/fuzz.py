"""Long fuzzing campaigns against every codec and the HTTP router (not a test).

The test suite runs each target for a few seconds (tests/fuzz); this runs the same
harness for as long as asked: atheris (libFuzzer, coverage-guided) for `--seconds` per
target, with longer runs of one byte than the suite uses (`--max-run`, past the NATS
route's 64 KiB control line). Where atheris cannot be imported, Hypothesis runs the same
property for the same time instead.

The property, for every input: it parses into events or gives the codec's own error,
never another exception and never a hang (libFuzzer's `-timeout` per input), and the
same bytes give the same events in one piece or cut anywhere (tests/fuzz/targets.py).
A failing input is written to `--out/<target>-crash-...`; turn it into a regression case
under tests/fuzz/corpus/<target>/ once the codec is fixed.

    .venv/bin/python bench/fuzz.py                        # every target, 60 s each
    .venv/bin/python bench/fuzz.py --seconds 600 --only nsq,nats-route
    .venv/bin/python bench/fuzz.py --corpus /tmp/fuzz-corpus   # keep and reuse what it learns
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tests.fuzz.targets import TARGETS  # noqa: E402

ALL = [*sorted(TARGETS), "http"]
# libFuzzer's status lines: "#12345  DONE  cov: 296 ft: 1070 corp: 195/2082b ... exec/s: 1875"
_STATUS = re.compile(rb"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/\S+.*?exec/s: (\d+)")


def run_atheris(name: str, seconds: int, max_run: int, out: Path, corpus: Path) -> list[str]:
    corpus.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "tests.fuzz.atheris_main",
        name,
        "--max-run",
        str(max_run),
        f"-max_total_time={seconds}",
        "-timeout=30",  # one input taking longer has hung
        f"-artifact_prefix={out}/{name}-",
        "-print_final_stats=1",
        str(corpus),
    ]
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, timeout=seconds + 300)
    elapsed = time.monotonic() - started
    statuses = _STATUS.findall(result.stderr)
    runs, cov, ft, corp, _ = statuses[-1] if statuses else (b"0",) * 5
    crashes = sorted(out.glob(f"{name}-*"))
    verdict = "ok" if result.returncode == 0 else f"FAILED ({', '.join(map(str, crashes))})"
    if result.returncode != 0:
        sys.stderr.write(result.stderr.decode(errors="replace")[-3000:])
    return [
        name,
        "atheris",
        f"{int(runs):,}",
        f"{int(runs) / elapsed:,.0f}",
        f"{int(cov)}/{int(ft)}",
        str(int(corp)),
        verdict,
    ]


def run_hypothesis(name: str, seconds: int) -> list[str]:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.fuzz.strategies import http_cases, streams
    from tests.fuzz.targets import check

    examples = 0
    deadline = time.monotonic() + seconds
    batch = settings(
        max_examples=500, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    if name == "http":
        from tests.fuzz.http_target import RouterRig
        from tests.fuzz.http_target import check as check_http

        with RouterRig() as whole, RouterRig() as split:

            @batch
            @given(st.data())
            def run_http(data: st.DataObject) -> None:
                nonlocal examples
                examples += 1
                check_http(whole, split, data.draw(http_cases(whole.methods)))

            while time.monotonic() < deadline:
                run_http()
    else:
        target = TARGETS[name]

        @batch
        @given(streams(target))
        def run(case: tuple[list[bytes], int]) -> None:
            nonlocal examples
            examples += 1
            check(target, *case)

        while time.monotonic() < deadline:
            run()
    return [name, "hypothesis", f"{examples:,}", f"{examples / seconds:,.0f}", "-", "-", "ok"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="per target (default 60)")
    parser.add_argument("--only", help=f"comma-separated targets of {','.join(ALL)}")
    parser.add_argument(
        "--max-run", type=int, default=70000, help="longest run of one byte (default 70000)"
    )
    parser.add_argument("--corpus", type=Path, help="directory kept between campaigns")
    parser.add_argument("--out", type=Path, default=Path("."), help="where failing inputs go")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else ALL
    for name in names:
        if name not in ALL:
            parser.error(f"unknown target {name!r}; known: {', '.join(ALL)}")
    use_atheris = importlib.util.find_spec("atheris") is not None
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        corpus_root = args.corpus or Path(scratch)
        for name in names:
            print(f"fuzzing {name} for {args.seconds} s ...", flush=True)
            if use_atheris:
                row = run_atheris(name, args.seconds, args.max_run, args.out, corpus_root / name)
            else:
                row = run_hypothesis(name, args.seconds)
            rows.append(row)
    headers = ["target", "engine", "inputs", "inputs/s", "cov/features", "corpus", "result"]
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    for row in [headers, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    if any(row[-1] != "ok" for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
