"""Who reaches the gateway in the deploy files, and at which address: one image tag
everywhere, a NetworkPolicy in each Kubernetes shape, the HTTP token from a Secret, and the
bridge telling NSQ readers in other pods its pod's address (not "localhost")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import trio
import yaml

from gateway import __version__, config
from gateway.app import Gateway
from tests.deploy.support import DEPLOY, DOCKERFILE, ROOT
from tests.helpers import be32, read_until

KUBERNETES = DEPLOY / "kubernetes"
IMAGE = f"mq-gateway:{__version__}"


def _load(relpath: str) -> Any:
    return yaml.safe_load((KUBERNETES / relpath).read_text())


def _gateway_container(deployment: dict[str, Any]) -> dict[str, Any]:
    spec = deployment["spec"]["template"]["spec"]
    (gateway,) = [
        c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "gateway"
    ]
    return gateway


def _pod_env(container: dict[str, Any], fields: dict[str, str], secret: str) -> dict[str, str]:
    """The container's environment as the kubelet fills it in: `fields` for the downward
    API's fieldRefs, `secret` for every secretKeyRef."""
    env = {}
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in source:
            env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            env[item["name"]] = secret
    return env


def test_one_image_tag_everywhere() -> None:
    """The README and the Dockerfile build the tag that compose and the manifests run."""
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"].values()
    used = [s["image"] for s in services if "build" in s]
    used += [
        _gateway_container(_load(f"{shape}/deployment.yaml"))["image"]
        for shape in ("bridge", "sidecar")
    ]
    for text in (DOCKERFILE.read_text(), (ROOT / "README.md").read_text()):
        docker_lines = [
            line for line in text.splitlines() if "docker " in line or "-v gateway-data" in line
        ]
        used += re.findall(r"(?<![\w-])mq-gateway(?::[\w.]+)?(?![\w\[-])", "\n".join(docker_lines))
    assert len(used) >= 6 and set(used) == {IMAGE}, used


def test_paths_the_deploy_files_cite_exist() -> None:
    cited = set()
    for path in [DOCKERFILE, *DEPLOY.rglob("*.y*ml")]:
        cited |= set(
            re.findall(r"\b(?:deploy|config|docs|tests|scripts)/[\w./-]*\w", path.read_text())
        )
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert not missing, missing


def test_each_shape_has_a_network_policy_admitting_named_peers_only() -> None:
    for shape, open_ports in (("bridge", {4150, 11300, 4151}), ("sidecar", {4151})):
        policy = _load(f"{shape}/networkpolicy.yaml")
        assert policy["kind"] == "NetworkPolicy"
        labels = _load(f"{shape}/deployment.yaml")["spec"]["template"]["metadata"]["labels"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        ports = set()
        for rule in policy["spec"]["ingress"]:
            # a rule without `from` (or with an empty peer) admits the whole cluster
            assert rule["from"] and all(peer for peer in rule["from"]), (shape, rule)
            ports |= {p["port"] for p in rule["ports"]}
        assert ports == open_ports, shape
        assert "networkpolicy.yaml" in _load(f"{shape}/kustomization.yaml")["resources"]


def test_the_http_token_comes_from_a_secret(tmp_path: Path) -> None:
    for shape in ("bridge", "sidecar"):
        gateway = _gateway_container(_load(f"{shape}/deployment.yaml"))
        (token,) = [e for e in gateway["env"] if e["name"] == "GATEWAY_HTTP__AUTH_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"]["key"] == "auth_token"
        environ = _pod_env(gateway, {"status.podIP": "10.0.0.7", "metadata.name": "p"}, "s3cret")
        path = tmp_path / f"{shape}.toml"
        path.write_text(_load(f"{shape}/configmap.yaml")["data"]["gateway.toml"])
        assert config.load(path, environ=environ).http_settings.auth_token == "s3cret"


async def test_the_bridge_tells_readers_in_other_pods_its_pods_address(tmp_path: Path) -> None:
    """The bridge pod as its manifests make it: the ConfigMap's settings, the pod's
    environment (its address from the downward API), asked /lookup from another address.
    Without the address, /lookup named the hostname (the ConfigMap's "localhost" stands for
    the machine's name), which a reader in another pod cannot resolve."""
    deployment = _load("bridge/deployment.yaml")
    pod_ip = "127.0.0.1"  # where the pod's listeners are reached here
    fields = {"status.podIP": pod_ip}
    environ = _pod_env(_gateway_container(deployment), fields, "s3cret")
    path = tmp_path / "gateway.toml"
    path.write_text(_load("bridge/configmap.yaml")["data"]["gateway.toml"])
    # the pod's listeners, on free ports of its address here
    flags = {"nsq": f"{pod_ip}:0", "http": f"{pod_ip}:0", "beanstalk": "off", "store": "memory://"}
    settings = config.gather(path, flags, environ | {"GATEWAY_DATA_DIR": str(tmp_path)}).settings()
    assert settings.nsqd.broadcast_address == pod_ip
    assert settings.http_settings.auth_token == "s3cret"
    gateway = Gateway(settings)
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.serve)
        nsq = await trio.open_tcp_stream(*gateway.addresses["nsq"])
        await nsq.send_all(b"  V2PUB orders\n" + be32(1) + b"x")
        await read_until(nsq, b"OK")
        # a reader in another pod: another source address
        with trio.socket.socket() as sock:
            await sock.bind(("127.0.0.2", 0))
            await sock.connect(gateway.addresses["http"])
            await sock.send(
                b"GET /lookup?topic=orders HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
            )
            reply = b""
            with trio.fail_after(10):
                while chunk := await sock.recv(65536):
                    reply += chunk
        (producer,) = json.loads(reply.split(b"\r\n\r\n", 1)[1])["producers"]
        assert producer["broadcast_address"] == pod_ip
        # and it is dialable: the reader reaches the NSQ listener there
        reader = await trio.open_tcp_stream(producer["broadcast_address"], producer["tcp_port"])
        await reader.send_all(b"  V2PUB orders\n" + be32(1) + b"y")
        await read_until(reader, b"OK")
        for stream in (nsq, reader):
            await stream.aclose()
        nursery.cancel_scope.cancel()
