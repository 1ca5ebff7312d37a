"""deploy/compose.yaml: it parses, names the gateway, Redis, Prometheus and Grafana services,
and points at files that exist. (No container engine here: `docker compose config` cannot
run, so the checks that matter are made on the parsed file.)"""

from __future__ import annotations

from typing import Any

import yaml

from gateway import config
from gateway.stores import check_store_url
from tests.deploy.support import DEPLOY, ROOT, dockerfile_stages, env_pairs

COMPOSE = DEPLOY / "compose.yaml"


def _compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def _gateways(services: dict[str, Any]) -> dict[str, Any]:
    return {name: s for name, s in services.items() if name.startswith("gateway")}


def test_names_two_gateways_redis_prometheus_and_grafana() -> None:
    services = _compose()["services"]
    assert {"redis", "prometheus", "grafana"} <= services.keys()
    gateways = _gateways(services)
    assert len(gateways) == 2
    for service in gateways.values():
        # built from the top-level Dockerfile
        assert (COMPOSE.parent / service["build"]["context"]).resolve() == ROOT
        assert service["build"]["dockerfile"] == "Dockerfile"
        assert "redis" in service["depends_on"]


def test_each_gateway_keeps_its_data_on_its_own_volume() -> None:
    doc = _compose()
    volumes = []
    for service in _gateways(doc["services"]).values():
        (mount,) = [v for v in service["volumes"] if v.endswith(":/var/lib/gateway")]
        volumes.append(mount.split(":")[0])
    assert len(set(volumes)) == 2 and set(volumes) <= doc["volumes"].keys()


def test_both_gateways_share_one_redis_database() -> None:
    doc = _compose()
    stores = {s["environment"]["GATEWAY_STORE"] for s in _gateways(doc["services"]).values()}
    assert stores == {"redis://redis:6379/0"}
    check_store_url(stores.pop())
    redis = doc["services"]["redis"]["command"]
    assert redis[redis.index("--appendfsync") + 1] == "always"


def test_the_gateways_run_as_the_comment_says() -> None:
    """As a gateway container gets its settings: the image's config file (through the
    image's GATEWAY_CONFIG), the service's environment over it. Every listener on all
    interfaces and the data in the volume come from the image's file; NATS routes are off
    and the store is Redis because the environment beats that file."""
    _, final = dockerfile_stages()
    image_env = dict(pair for args in final.all("ENV") for pair in env_pairs(args))
    (copy,) = [a.split() for a in final.all("COPY") if a.split()[-1] == image_env["GATEWAY_CONFIG"]]
    for service in _gateways(_compose()["services"]).values():
        assert "command" not in service  # no flag over the environment
        environ = {**image_env, "GATEWAY_CONFIG": str(ROOT / copy[0])}
        settings = config.load(None, environ=environ | service["environment"])
        assert (settings.nsq, settings.http) == ("0.0.0.0:4150", "0.0.0.0:4151")
        assert (settings.nats_route, settings.store) == ("off", "redis://redis:6379/0")
        assert settings.data_dir == "/var/lib/gateway"


def test_prometheus_scrapes_both_gateways_with_the_rules_mounted() -> None:
    doc = _compose()
    prometheus = doc["services"]["prometheus"]
    mounts = _bind_mounts(prometheus)
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    for rule_file in config["rule_files"]:
        assert f"/etc/prometheus/{rule_file}" in mounts, rule_file
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gateway"]
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    assert targets == {f"{name}:4151" for name in _gateways(doc["services"])}


def test_grafana_gets_the_provisioning_and_the_dashboard() -> None:
    grafana = _compose()["services"]["grafana"]
    mounts = _bind_mounts(grafana)
    provisioning = mounts["/etc/grafana/provisioning"]
    providers = yaml.safe_load((provisioning / "dashboards" / "gateway.yml").read_text())
    (provider,) = providers["providers"]
    dashboards = mounts[provider["options"]["path"]]
    assert (dashboards / "gateway.json").is_file()
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"


def _bind_mounts(service: dict[str, Any]) -> dict[str, Any]:
    """container path -> host path, for the mounts of a path in this repository."""
    out = {}
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            path = (COMPOSE.parent / source).resolve()
            assert path.exists(), source
            out[target] = path
    return out
