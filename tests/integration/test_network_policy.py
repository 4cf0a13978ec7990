"""Issue 21, section 2: the chart's NetworkPolicy for the operator pods, rendered with helm (the
test bed runs no network plugin that would enforce one; test_chart.py has the apiserver accept
every rendering). A policy that selects the pods closes every port it does not name: each port
the operator serves is named, /metrics only from the selected namespaces, the log port from the
apiserver's CIDRs when given, the probe port from the nodes' when given."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.k8s.kube import binaries

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "slurmjob-operator"


def render(*args: str) -> list[dict[str, Any]]:
    helm = binaries()["helm"]
    proc = subprocess.run(
        [str(helm), "template", "ci", str(CHART), "-n", "slurmjob-system",
         "-f", str(CHART / "ci/default-values.yaml"), *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def policy(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    found = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert len(found) <= 1
    return found[0] if found else None


def rules_by_port(np: dict[str, Any]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for rule in np["spec"]["ingress"]:
        (port,) = rule["ports"]
        assert port["protocol"] == "TCP"
        out[port["port"]] = rule
    return out


def test_the_network_policy_names_every_port_and_who_may_reach_it() -> None:
    docs = render()
    np = policy(docs)
    assert np is not None, "on by default"
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert np["spec"]["policyTypes"] == ["Ingress"]
    rules = rules_by_port(np)
    (container,) = pod["spec"]["containers"]
    # A policy that selects the pods closes every port it does not name: it names them all.
    assert set(rules) == {p["containerPort"] for p in container["ports"]} == {8080, 9090, 8081}
    assert "from" not in rules[8080]  # the kubelet's probes, from its node
    assert rules[9090]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert "from" not in rules[8081]  # the apiserver's addresses are not known here


def test_the_network_policy_takes_the_sites_sources() -> None:
    docs = render(
        "--set", "networkPolicy.apiserverCIDRs={10.0.0.10/32,10.0.0.11/32}",
        "--set", "networkPolicy.probeCIDRs={192.168.0.0/16}",
        "--set", "networkPolicy.metricsNamespaceSelector.matchLabels.team=observability",
        "--set", "metrics.port=9191", "--set", "health.port=8181",
    )  # fmt: skip
    np = policy(docs)
    assert np is not None
    rules = rules_by_port(np)
    assert set(rules) == {8181, 9191, 8081}
    assert rules[8081]["from"] == [
        {"ipBlock": {"cidr": "10.0.0.10/32"}},
        {"ipBlock": {"cidr": "10.0.0.11/32"}},
    ]
    assert rules[8181]["from"] == [{"ipBlock": {"cidr": "192.168.0.0/16"}}]
    assert rules[9191]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring",
        "team": "observability",
    }


def test_the_network_policy_follows_the_ports_and_can_be_left_out() -> None:
    np = policy(render("--set", "metrics.port=0", "--set", "logs.port=0"))
    assert np is not None
    assert set(rules_by_port(np)) == {8080}
    assert policy(render("--set", "networkPolicy.enabled=false")) is None
