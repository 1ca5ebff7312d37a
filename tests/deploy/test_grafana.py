"""deploy/grafana/dashboards/gateway.json: a well-formed dashboard whose every panel queries
the Prometheus data source it asks for. (test_metrics_named.py checks the metrics.)"""

from __future__ import annotations

import json
from typing import Any

from tests.deploy.support import DEPLOY, grafana_queries, parse_promql

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "gateway.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


def _panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in doc["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def test_dashboard_is_well_formed() -> None:
    doc = _dashboard()
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    panels = _panels(doc)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names[0] == "datasource" and doc["templating"]["list"][0]["query"] == "prometheus"


def test_every_panel_queries_the_chosen_prometheus() -> None:
    for panel in _panels(_dashboard()):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"], panel["title"]


def test_the_dashboard_covers_what_issue_13_lists() -> None:
    # throughput by protocol and topic, depth and in-flight per group, latency quantiles,
    # errors, connections, store figures
    read = {s.metric for q in grafana_queries(_dashboard()) for s in parse_promql(q).selectors}
    for metric in (
        "gateway_messages_published_total",
        "gateway_queue_depth",
        "gateway_queue_in_flight",
        "gateway_publish_to_ack_seconds_bucket",
        "gateway_protocol_errors_total",
        "gateway_open_connections",
        "gateway_store_commit_seconds_bucket",
    ):
        assert metric in read, metric
