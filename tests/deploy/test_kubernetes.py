"""deploy/kubernetes: every manifest passes `kubernetes-validate --strict`, and the sidecar
and bridge are wired as the gateway needs (probes, config, ports, shutdown)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import config
from tests.deploy.support import DEPLOY, ROOT, dockerfile_stages, env_pairs, run_tool

KUBERNETES = DEPLOY / "kubernetes"
# Native sidecars (init containers with restartPolicy: Always) need 1.29; the default of
# kubernetes-validate is its newest schema.
VERSIONS = ("1.29.0", None)
# manifest path -> the example config its ConfigMap carries verbatim
CONFIGMAPS = {
    "sidecar/configmap.yaml": ROOT / "config" / "sidecar.toml",
    "bridge/configmap.yaml": ROOT / "config" / "bridge.toml",
}


def _manifests() -> list[Path]:
    files = sorted(KUBERNETES.rglob("*.yaml"))
    # kustomize's own file is not a Kubernetes object (test_kustomizations checks it)
    return [f for f in files if f.name != "kustomization.yaml"]


def _load(relpath: str) -> Any:
    return yaml.safe_load((KUBERNETES / relpath).read_text())


def _gateway_container(deployment: dict[str, Any]) -> dict[str, Any]:
    spec = deployment["spec"]["template"]["spec"]
    containers = spec.get("initContainers", []) + spec["containers"]
    (gateway,) = [c for c in containers if c["name"] == "gateway"]
    return gateway


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v or "newest")
def test_kubernetes_validate_strict_accepts_every_manifest(version: str | None) -> None:
    files = [str(f.relative_to(ROOT)) for f in _manifests()]
    assert len(files) >= 6
    flags = ["-k", version] if version else []
    result = run_tool("kubernetes-validate", "--strict", *flags, *files)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # every file was really checked against a schema (not skipped for an unknown kind)
    assert output.count(" passed for resource ") == len(files), output


def test_kubernetes_validate_strict_rejects_an_unknown_field(tmp_path: Path) -> None:
    deployment = _load("bridge/deployment.yaml")
    _gateway_container(deployment)["readinesProbe"] = {"httpGet": {"path": "/ready"}}
    broken = tmp_path / "deployment.yaml"
    broken.write_text(yaml.safe_dump(deployment))
    result = run_tool("kubernetes-validate", "--strict", str(broken))
    assert result.returncode != 0
    assert "readinesProbe" in result.stdout + result.stderr


def test_kustomizations_list_exactly_their_manifests() -> None:
    for kustomization in KUBERNETES.rglob("kustomization.yaml"):
        doc = yaml.safe_load(kustomization.read_text())
        assert doc["kind"] == "Kustomization"
        siblings = {f.name for f in kustomization.parent.glob("*.yaml")} - {kustomization.name}
        assert set(doc["resources"]) == siblings, kustomization


@pytest.mark.parametrize("relpath", sorted(CONFIGMAPS))
def test_configmaps_carry_the_example_config_and_it_checks(relpath: str, tmp_path: Path) -> None:
    text = _load(relpath)["data"]["gateway.toml"]
    assert text == CONFIGMAPS[relpath].read_text()
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("shape", ["sidecar", "bridge"])
def test_gateway_container_is_probed_configured_and_bounded(shape: str) -> None:
    deployment = _load(f"{shape}/deployment.yaml")
    pod = deployment["spec"]["template"]
    gateway = _gateway_container(deployment)
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports["http"] == 4151
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # /health answers 503 while the store opens: liveness waits for the startup probe
    assert gateway["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert gateway["resources"]["requests"] and gateway["resources"]["limits"]["memory"]
    assert gateway["args"] == ["--config", "/etc/gateway/gateway.toml"]
    mounts = {m["mountPath"]: m["name"] for m in gateway["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts["/etc/gateway"]]["configMap"]["name"] == _configmap_name(shape)
    assert mounts["/var/lib/gateway"] in volumes  # the image's data volume
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == _image_uid()
    # the gateway stops within 10 s of SIGTERM: the grace period covers it with room
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 20
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(ports["http"])
    assert annotations["prometheus.io/path"] == "/metrics"


def test_sidecar_starts_before_and_stops_after_the_application() -> None:
    spec = _load("sidecar/deployment.yaml")["spec"]["template"]["spec"]
    (gateway,) = spec["initContainers"]
    assert gateway["name"] == "gateway" and gateway["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["app"]


LISTENERS = ("nsq", "http", "beanstalk", "nats", "nats_route", "rocketmq")


@pytest.mark.parametrize("shape", ["sidecar", "bridge"])
def test_the_pod_runs_only_the_listeners_its_config_asks_for(shape: str, tmp_path: Path) -> None:
    """The settings as the pod gets them: the container's args (`--config`, which replaces
    the image's own file), over the pod's environment and the image's, over the ConfigMap.
    A listener the ConfigMap turns off stays off (the sidecar's RocketMQ listener was once
    open to the network in every pod: the image's environment beat the file), only HTTP
    leaves the sidecar's pod, and the queues are on the pod's data volume."""
    gateway = _gateway_container(_load(f"{shape}/deployment.yaml"))
    _, final = dockerfile_stages()
    environ = dict(pair for args in final.all("ENV") for pair in env_pairs(args))
    # (values from the downward API and Secrets are no listener settings: left out)
    environ |= {e["name"]: e["value"] for e in gateway.get("env", []) if "value" in e}
    path = tmp_path / "gateway.toml"
    path.write_text(_load(f"{shape}/configmap.yaml")["data"]["gateway.toml"])
    args = gateway["args"]
    assert args[0] == "--config" and len(args) == 2  # no other flag beats the pod's settings
    running = config.load(path, environ=environ)
    asked = config.load(path, environ={})
    for name in LISTENERS:
        if getattr(asked, name) == "off":
            value = getattr(running, name)
            assert value == "off", f"{shape}: {name} runs on {value}"
    if shape == "sidecar":  # only the HTTP port leaves the pod
        for name in LISTENERS:
            value = getattr(running, name)
            assert name == "http" or value == "off" or value.startswith("127.0.0.1:"), (name, value)
        assert running.http == "0.0.0.0:4151"  # the kubelet's probes reach it
    mounts = {m["mountPath"] for m in gateway["volumeMounts"]}
    assert running.data_dir in mounts, running.data_dir


def test_bridge_service_reaches_the_bridge_ports_and_drains_first() -> None:
    deployment = _load("bridge/deployment.yaml")
    service = _load("bridge/service.yaml")
    gateway = _gateway_container(deployment)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    names = {p["name"] for p in gateway["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == names
    # one replica on one ReadWriteOnce volume: the old pod stops before the new one starts
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    # preStop: beanstalkd drain mode (SIGUSR1 to the gateway, PID 1), then a pause
    command = gateway["lifecycle"]["preStop"]["exec"]["command"]
    assert "kill -USR1 1" in command[-1]
    claim = _load("bridge/pvc.yaml")["metadata"]["name"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "gateway-data", "persistentVolumeClaim": {"claimName": claim}} in volumes


def _configmap_name(shape: str) -> str:
    return str(_load(f"{shape}/configmap.yaml")["metadata"]["name"])


def _image_uid() -> int:
    _, final = dockerfile_stages()
    (user,) = final.all("USER")
    return int(user.split(":")[0])
