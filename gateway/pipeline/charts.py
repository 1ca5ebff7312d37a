"""report.html: one self-contained page (charts as inline PNGs drawn by matplotlib, tables
as HTML), readable offline and attachable to a ticket."""

from __future__ import annotations

import base64
import html
import io
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gateway.archive.events import EVENTS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gateway.pipeline.report import Report

# The throughput chart draws the busiest topics; the tables list every one.
MAX_CHART_TOPICS = 10
_WIDTH, _HEIGHT, _DPI = 9.0, 3.6, 100

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1000px;
       color: #1d232a; padding: 0 1em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
figure { margin: 0.5em 0; } figure img { max-width: 100%; height: auto; }
figcaption { color: #5b6570; font-size: 0.9em; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: 0.5em 0; }
th, td { border-bottom: 1px solid #dde2e7; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
.meta { color: #5b6570; }
"""


def _figure() -> Figure:
    from matplotlib.figure import Figure

    # Figure, not pyplot: no global state, no GUI backend, safe in any thread
    return Figure(figsize=(_WIDTH, _HEIGHT), dpi=_DPI, layout="constrained")


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#5b6570")
    ax.set_xticks([])
    ax.set_yticks([])


def throughput_chart(report: Report) -> str:
    rows = report.rows("throughput")
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["topic"]] = totals.get(r["topic"], 0) + r["published"]
    topics = sorted(totals, key=lambda t: -totals[t])[:MAX_CHART_TOPICS]
    fig = _figure()
    ax = fig.add_subplot()
    seconds = report.bucket_seconds
    for topic in topics:
        points = sorted((r["time"], r["published"] / seconds) for r in rows if r["topic"] == topic)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=topic)
    if topics:
        ax.set_ylabel("messages published / s")
        ax.set_title(f"Throughput per topic ({seconds} s buckets)")
        ax.legend(loc="upper left", fontsize="small")
        fig.autofmt_xdate()
    else:
        _empty(ax, "no messages published")
    return _png(fig)


def latency_chart(report: Report) -> str:
    rows = [r for r in report.rows("by_topic") if r["p50"] is not None]
    fig = _figure()
    ax = fig.add_subplot()
    if rows:
        width = 0.27
        for i, p in enumerate(("p50", "p95", "p99")):
            xs = [j + (i - 1) * width for j in range(len(rows))]
            ax.bar(xs, [r[p] for r in rows], width, label=p)
        ax.set_xticks(range(len(rows)), [r["topic"] for r in rows])
        ax.set_ylabel("publish to acknowledge, ms")
        ax.set_title("Latency percentiles per topic")
        ax.legend(fontsize="small")
    else:
        _empty(ax, "nothing acknowledged")
    return _png(fig)


def flow_chart(report: Report) -> str:
    rows = report.rows("flow")
    producers = sorted({r["producer"] for r in rows})
    consumers = sorted({r["consumer"] for r in rows})
    fig = _figure()
    ax = fig.add_subplot()
    if rows:
        grid = [[0] * len(consumers) for _ in producers]
        for r in rows:
            grid[producers.index(r["producer"])][consumers.index(r["consumer"])] = r["messages"]
        image = ax.imshow(grid, cmap="Blues", aspect="auto")
        peak = max(max(row) for row in grid)
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                color = "white" if value > peak / 2 else "black"
                ax.text(j, i, str(value), ha="center", va="center", color=color)
        ax.set_xticks(range(len(consumers)), consumers)
        ax.set_yticks(range(len(producers)), producers)
        ax.set_xlabel("consumer protocol")
        ax.set_ylabel("producer protocol")
        ax.set_title("Messages delivered, producer x consumer protocol")
        fig.colorbar(image, ax=ax)
    else:
        _empty(ax, "nothing delivered")
    return _png(fig)


def dead_letters_chart(report: Report) -> str:
    rows = [r for r in report.rows("by_group") if r["dead_letters"]]
    fig = _figure()
    ax = fig.add_subplot()
    if rows:
        labels = [f"{r['topic']} / {r['group']}" for r in rows]
        ax.barh(labels, [r["dead_letters"] for r in rows], color="#c0392b")
        ax.invert_yaxis()
        ax.set_xlabel("messages buried (last event)")
        ax.set_title("Dead letters per topic and group")
    else:
        _empty(ax, "no dead letters")
    return _png(fig)


CHARTS = (
    ("throughput", "Throughput over time", throughput_chart),
    ("latency", "Publish-to-acknowledge latency", latency_chart),
    ("flow", "Cross-protocol flow", flow_chart),
    ("dead-letters", "Dead letters", dead_letters_chart),
)


def _cell(value: Any) -> str:
    if value is None:
        return "<td>-</td>"
    if isinstance(value, float):
        return f"<td>{value:,.3f}</td>"
    if isinstance(value, int):
        return f"<td>{value:,}</td>"
    if isinstance(value, datetime):
        return f'<td class="text">{value:%Y-%m-%d %H:%M}</td>'
    return f'<td class="text">{html.escape(str(value))}</td>'


def _table(name: str, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r[c]) for c in columns) + "</tr>" for r in rows)
    return f'<table data-table="{name}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def render_html(report: Report, *, title: str) -> str:
    counts_columns = ("topic", *EVENTS, "bytes", "redelivery_rate", "dead_letters")
    latency_columns = ("topic", "acknowledged", "p50", "p95", "p99")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">{report.events:,} events; generated {generated}</p>',
    ]
    for key, caption, draw in CHARTS:
        parts.append(
            f'<h2>{caption}</h2><figure data-chart="{key}">'
            f'<img alt="{caption}" src="data:image/png;base64,{draw(report)}">'
            "</figure>"
        )
    parts += [
        "<h2>Events per topic</h2>",
        _table("counts", report.rows("by_topic"), counts_columns),
        "<h2>Latency per topic (ms)</h2>",
        _table("latency", report.rows("by_topic"), latency_columns),
        "<h2>Per group</h2>",
        _table(
            "groups",
            report.rows("by_group"),
            ("topic", "group", *EVENTS[1:], "redelivery_rate", "dead_letters"),
        ),
        "<h2>Per protocol pair</h2>",
        _table(
            "pairs",
            report.rows("by_pair"),
            ("producer", "consumer", *EVENTS[1:], "p50", "p95", "p99", "redelivery_rate"),
        ),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
