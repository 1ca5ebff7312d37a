"""Every metric the alert rules and the Grafana dashboard read exists in a running gateway's
/metrics, with the labels they select on.

The gateway runs in this process with the store it uses when none is named (as in the
container), a little traffic goes through NSQ, beanstalkd and NATS, and /metrics is scraped.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway import config
from gateway.app import Gateway
from tests.deploy.support import DEPLOY, Query, grafana_queries, parse_promql
from tests.helpers import RawBeanstalk, RawNSQ, be32, read_until

# The durable store's figures (gateway/metrics_store.py), with the type the rules and the
# dashboard assume: test_store_metrics_exist checks them and their queries on their own.
STORE_METRICS = {
    "gateway_store_commit_seconds": "histogram",
    "gateway_store_write_errors_total": "counter",
    "gateway_store_fsyncs_total": "counter",
    "gateway_store_disk_bytes": "gauge",
    "gateway_store_messages": "gauge",  # label where = disk | memory
}
# not the gateway's: Prometheus makes `up` for every target it scrapes
PROMETHEUS_METRICS = {"up"}
# labels Prometheus attaches to every series it scrapes
TARGET_LABELS = {"job", "instance"}
_SUFFIXES = ("_bucket", "_count", "_sum", "_created")

# sample name -> (its family's type, label name -> the values seen)
Exported = dict[str, tuple[str, dict[str, set[str]]]]


def _queries() -> list[Query]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "gateway.json").read_text())
    exprs += grafana_queries(dashboard)
    return [parse_promql(e) for e in exprs]


def _reads_the_store(query: Query) -> bool:
    return any(_store_metric(s.metric) for s in query.selectors)


def _store_metric(sample_name: str) -> bool:
    base = sample_name
    for suffix in _SUFFIXES:
        base = base.removesuffix(suffix)
    return sample_name in STORE_METRICS or base in STORE_METRICS


@asynccontextmanager
async def _gateway(data_dir: Path) -> AsyncIterator[Gateway]:
    listeners = ("nsq", "http", "beanstalk", "nats", "nats_route")
    settings = config.Settings.model_validate(
        {**{name: "127.0.0.1:0" for name in listeners}, "data_dir": str(data_dir)}
    )
    gateway = Gateway(settings)
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.serve)
        yield gateway
        nursery.cancel_scope.cancel()


async def _traffic(gw: Gateway) -> list[trio.SocketStream]:
    """Publish and consume on NSQ (FIN and REQ) and beanstalkd (delete and bury), publish
    over NATS, one bad command, and a connection on the NATS route port. Returns the
    connections to keep open while /metrics is scraped."""
    nsq = await RawNSQ.connect(gw)
    for body in (b"one", b"two"):
        await nsq.send(b"PUB orders\n" + be32(len(body)) + body)
        assert await nsq.frame() == (0, b"OK")
    await nsq.send(b"SUB orders billing\nRDY 1\n")
    assert await nsq.frame() == (0, b"OK")
    _, first = await nsq.frame()
    await nsq.send(b"FIN " + first[10:26] + b"\n")
    _, second = await nsq.frame()
    await nsq.send(b"REQ " + second[10:26] + b" 0\n")  # requeued, then delivered again
    _, again = await nsq.frame()
    await nsq.send(b"FIN " + again[10:26] + b"\n")

    bs = await RawBeanstalk.connect(gw)
    assert await bs.call(b"use jobs\r\n") == b"USING jobs\r\n"
    assert await bs.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"
    for _ in range(2):
        assert (await bs.call(b"put 0 0 60 3\r\njob\r\n")).startswith(b"INSERTED ")
    job = (await bs.call(b"reserve-with-timeout 5\r\n")).split()[1]
    assert await bs.call(b"delete " + job + b"\r\n") == b"DELETED\r\n"
    job = (await bs.call(b"reserve-with-timeout 5\r\n")).split()[1]
    assert await bs.call(b"bury " + job + b" 0\r\n") == b"BURIED\r\n"
    assert await bs.call(b"no-such-command\r\n") == b"UNKNOWN_COMMAND\r\n"

    nats = await trio.open_tcp_stream(*gw.addresses["nats"])
    await read_until(nats, b"\r\n")
    await nats.send_all(b'CONNECT {"verbose":false}\r\nPUB orders 4\r\nnats\r\nPING\r\n')
    await read_until(nats, b"PONG\r\n")
    route = await trio.open_tcp_stream(*gw.addresses["nats-route"])
    return [nsq.stream, bs.stream, nats, route]


async def _scrape(tmp_path: Path) -> Exported:
    async with _gateway(tmp_path / "data") as gw:
        streams = await _traffic(gw)
        host, port = gw.addresses["http"]
        async with httpx.AsyncClient() as client:
            with trio.fail_after(10):
                # the route connection is counted once its session starts
                while True:
                    reply = await client.get(f"http://{host}:{port}/metrics")
                    if 'protocol="nats-route"' in reply.text:
                        break
                    await trio.sleep(0.05)
        for stream in streams:
            await stream.aclose()
    assert reply.status_code == 200
    samples: Exported = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            labels: dict[str, set[str]] = defaultdict(set)
            labels.update(samples.get(sample.name, ("", {}))[1])
            for key, value in sample.labels.items():
                labels[key].add(value)
            samples[sample.name] = (family.type, labels)
    return samples


def _problems(queries: list[Query], exported: Exported) -> list[str]:
    problems = []
    for query in queries:
        labels_here = set(TARGET_LABELS)
        for selector in query.selectors:
            name = selector.metric
            if name in PROMETHEUS_METRICS:
                continue
            if name not in exported:
                problems.append(f"{name} is not in /metrics (read by: {query.text})")
                continue
            labels = exported[name][1]
            labels_here |= labels.keys()
            for label, op, value in selector.matchers:
                if label in TARGET_LABELS:
                    continue
                if label not in labels:
                    problems.append(f"{name} has no label {label} (read by: {query.text})")
                elif op == "=" and "$" not in value and value not in labels[label]:
                    problems.append(f'{name}{{{label}="{value}"}} never appears ({query.text})')
        if query.grouping - labels_here:
            missing = query.grouping - labels_here
            problems.append(f"grouping by {sorted(missing)}, labels no metric has: {query.text}")
    return list(dict.fromkeys(problems))


async def test_every_metric_the_rules_and_the_dashboard_read_exists(tmp_path: Path) -> None:
    queries = _queries()
    read = {s.metric for q in queries for s in q.selectors}
    assert not {m for m in read if not m.startswith("gateway_")} - PROMETHEUS_METRICS
    exported = await _scrape(tmp_path)
    problems = _problems([q for q in queries if not _reads_the_store(q)], exported)
    assert not problems, "\n".join(problems)
    # and the check sees a wrong name, label, label value or grouping label
    for wrong in (
        "rate(gateway_messages_publish_total[5m])",
        'gateway_queue_depth{channel="x"}',
        'gateway_open_connections{protocol="nats_route"}',
        "sum by (channel) (gateway_queue_depth)",
    ):
        assert len(_problems([parse_promql(wrong)], exported)) == 1, wrong


async def test_store_metrics_exist(tmp_path: Path) -> None:
    # the same check for the queries on the durable store's metrics, plus their types
    queries = [q for q in _queries() if _reads_the_store(q)]
    assert len(queries) >= 5
    exported = await _scrape(tmp_path)
    problems = _problems(queries, exported)
    assert not problems, "\n".join(problems)
    types = {name: kind for name, (kind, _) in exported.items()}
    for name, kind in STORE_METRICS.items():
        sample = name + ("_count" if kind == "histogram" else "")
        family = name.removesuffix("_total")
        assert types.get(sample) == kind, f"{family}: {types.get(sample)}, expected {kind}"
    assert {"disk", "memory"} <= exported["gateway_store_messages"][1]["where"]
