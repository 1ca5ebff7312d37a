"""Coverage-guided fuzzing of one codec with atheris (libFuzzer): the libFuzzer process.

    python -m tests.fuzz.atheris_main <codec> [--max-run N] [libFuzzer flags] [corpus dirs]

libFuzzer owns the process (it exits on the first failure and writes the input to
`-artifact_prefix`), so tests and bench/fuzz.py run this as a subprocess. Its input is
not the byte stream itself but a recipe read with atheris' FuzzedDataProvider: the
variant, then a list of parts (a seed frame, a frame built around fuzzed content with
its length fields right, raw bytes, a long run of one byte), then how to cut the
stream. Coverage feedback steers which parts and contents get combined; a plain byte
stream would almost never keep a length prefix consistent with a mutated body.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import atheris

# Only what a codec target runs is instrumented here: the HTTP target's router rig imports
# (and would instrument) the whole gateway, which took most of each codec run's start-up.
with atheris.instrument_imports(include=["gateway"]):
    from tests.fuzz.strategies import (
        HTTP_LENGTHS,
        HTTP_METHODS,
        HTTP_QUERY_KEYS,
        HTTP_QUERY_VALUES,
        mpub_binary,
    )
    from tests.fuzz.targets import TARGETS, Target, bytewise, check, cut

if TYPE_CHECKING:
    from tests.fuzz import http_target

_RUN_BYTES = b"90[{ \t\r\n\x00\xff-"
_MAX_PARTS = 12
_BYTEWISE_LIMIT = 512  # cutting longer streams a byte at a time costs more than it finds
# The longest run of one byte: past every limit that is a count of bytes (JSON nesting
# ~1000, Python's 4300 digits, NATS' 4096-byte control line). --max-run raises it for
# long campaigns (a route's 64 KiB control line).
_max_run = 4500


def recipe(target: Target, data: bytes) -> tuple[list[bytes], int]:
    """(chunks, variant) from a fuzzer input."""
    fdp = atheris.FuzzedDataProvider(data)
    variant = fdp.ConsumeIntInRange(0, target.variants - 1)
    parts = [target.prefix] if target.prefix and fdp.ConsumeBool() else []
    while fdp.remaining_bytes() > 2 and len(parts) < _MAX_PARTS:
        kind = fdp.ConsumeIntInRange(0, 3)
        if kind == 0:
            parts.append(target.seeds[fdp.ConsumeIntInRange(0, len(target.seeds) - 1)])
        elif kind == 1:
            build = target.builders[fdp.ConsumeIntInRange(0, len(target.builders) - 1)]
            parts.append(build(_content(fdp)))
        elif kind == 2:
            parts.append(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64)))
        else:
            parts.append(_run(fdp))
    stream = b"".join(parts)
    seed = fdp.ConsumeIntInRange(0, 255)  # 0 once the input is used up
    if seed >= 240 and len(stream) <= _BYTEWISE_LIMIT:
        return bytewise(stream), variant
    return cut(stream, seed), variant


def _content(fdp: atheris.FuzzedDataProvider) -> bytes:
    if fdp.ConsumeBool():
        return _run(fdp)
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))


def _run(fdp: atheris.FuzzedDataProvider) -> bytes:
    byte = _RUN_BYTES[fdp.ConsumeIntInRange(0, len(_RUN_BYTES) - 1)]
    if fdp.ConsumeBool():
        return bytes((byte,)) * fdp.ConsumeIntInRange(1, 64)
    # just past the limits that count bytes: long runs cost time, so only these
    lengths = (225, 1025, 4097, _max_run)
    return bytes((byte,)) * lengths[fdp.ConsumeIntInRange(0, len(lengths) - 1)]


def http_recipe(methods: dict[str, list[str]], data: bytes) -> http_target.HTTPCase:
    """A request from a fuzzer input: mostly one a route takes (see http_cases)."""
    from tests.fuzz import http_target  # imported, instrumented, by main()

    fdp = atheris.FuzzedDataProvider(data)
    routes = sorted(methods)
    route = routes[fdp.ConsumeIntInRange(0, len(routes) - 1)]
    allowed = methods[route] if fdp.ConsumeBool() else HTTP_METHODS
    method = allowed[fdp.ConsumeIntInRange(0, len(allowed) - 1)]
    path = (route, route + "/", route + "/x", route[:-1] or "/")[fdp.ConsumeIntInRange(0, 3)]
    pairs = [(b"topic", b"t"), (b"channel", b"c"), (b"group", b"c")][: fdp.ConsumeIntInRange(0, 3)]
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        key = HTTP_QUERY_KEYS[fdp.ConsumeIntInRange(0, len(HTTP_QUERY_KEYS) - 1)]
        if fdp.ConsumeBool():
            value = HTTP_QUERY_VALUES[fdp.ConsumeIntInRange(0, len(HTTP_QUERY_VALUES) - 1)]
        else:
            value = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16))
        pairs.append((key, value))
    query = b"&".join(k + b"=" + v for k, v in pairs)
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        body = mpub_binary([fdp.ConsumeBytes(8) for _ in range(fdp.ConsumeIntInRange(0, 3))])
    elif kind == 1:
        body = _run(fdp)
    else:
        body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    headers = [(b"host", b"127.0.0.1")]
    length = (*HTTP_LENGTHS, b"%d" % len(body))[fdp.ConsumeIntInRange(0, len(HTTP_LENGTHS))]
    if length is not None:
        headers.append((b"content-length", length))
    disconnect = fdp.ConsumeIntInRange(0, 7) == 0
    chunks = tuple(cut(body, fdp.ConsumeIntInRange(0, 255))) if body else (b"",)
    return http_target.HTTPCase(method, path, query, tuple(headers), chunks, disconnect)


def main(argv: list[str]) -> None:
    global _max_run
    flags = argv[2:]
    if flags[:1] == ["--max-run"]:
        _max_run = int(flags[1])
        flags = flags[2:]
    if argv[1] == "http":
        with atheris.instrument_imports(include=["gateway"]):
            from tests.fuzz import http_target
        with http_target.RouterRig() as whole, http_target.RouterRig() as split:

            def one_request(data: bytes) -> None:
                http_target.check(whole, split, http_recipe(whole.methods, data))

            atheris.Setup([argv[0], *flags], one_request)
            atheris.Fuzz()
        return
    target = TARGETS[argv[1]]

    def one_input(data: bytes) -> None:
        chunks, variant = recipe(target, data)
        check(target, chunks, variant)

    atheris.Setup([argv[0], *flags], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
