"""The Helm chart against the real kube-apiserver: `helm lint` and `helm template` over every
`ci/*-values.yaml`, the rendered manifests accepted by `kubectl apply --dry-run=server`, and an
operator that authenticates as the chart's ServiceAccount (a token minted by the API server, not
the admin certificate) running a CPU job on Slurm 26.05 to Succeeded, with `kubectl auth can-i`
proving what that ServiceAccount can and cannot do."""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration import leaks
from tests.integration.sitefiles import site_env
from tests.integration.test_operator_e2e import CRD, OPERATOR, Operator, cpu_spec
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.config import Settings
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.clusters import load_clusters
from slurmjob_operator.site.tenants import Tenants

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "slurmjob-operator"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
CI_NAMESPACE = "slurmjob-chart-ci"  # release namespace of the dry-run installs
CI_WATCHED = ("slurmjob-ci-a", "slurmjob-ci-b")  # ci/namespaced-values.yaml's watchNamespaces
# ci/signing-key-pvc-values.yaml's tenants: a cluster-wide install's secretKeyRef Roles.
CI_TENANT_NAMESPACES = ("team-a", "team-a-dev", "team-b")

# The Prometheus Operator's and cert-manager's kinds, reduced to what lets the API server
# accept the objects.
MONITORING_CRDS = [
    ("monitoring.coreos.com", "servicemonitors", "ServiceMonitor"),
    ("monitoring.coreos.com", "prometheusrules", "PrometheusRule"),
    ("cert-manager.io", "issuers", "Issuer"),
    ("cert-manager.io", "certificates", "Certificate"),
]


def _monitoring_crd(group: str, plural: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def _ids(path: Path) -> str:
    return path.name.removesuffix("-values.yaml")


def render(
    kube: KubeTestbed,
    *args: str,
    release: str = "ci",
    namespace: str = CI_NAMESPACE,
    check: bool = True,
) -> list[dict[str, Any]]:
    proc = kube.helm("template", release, str(CHART), "-n", namespace, *args, check=check)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def render_error(kube: KubeTestbed, *args: str) -> str:
    proc = kube.helm("template", "ci", str(CHART), *args, check=False)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = of_kind(docs, "Deployment")
    return dep


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = deployment(docs)["spec"]["template"]["spec"]["containers"]
    return c


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(docs)["env"]}


def volumes(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"]}


def ensure_namespace(kube: KubeTestbed, name: str) -> None:
    kube.apply(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    )


def named(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    """The one object of `kind` whose name ends in `suffix`."""
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"].endswith(suffix)]
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ----------------------------------------------------------------------- lint and render


def _readme_values(tmp_path: Path) -> Path:
    """The site-values.yaml of the README's Helm quick start, as a file."""
    text = (REPO / "README.md").read_text()
    block = text.split("cat > site-values.yaml <<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    path = tmp_path / "site-values.yaml"
    # The one placeholder a reader fills in.
    path.write_text(block.replace("<64 hex digits>", "ab" * 32) + "\n")
    return path


def test_the_readmes_values_render_two_replicas_and_two_clusters(
    kube: KubeTestbed, tmp_path: Path
) -> None:
    docs = render(kube, "-f", str(_readme_values(tmp_path)))
    dep = deployment(docs)
    assert dep["spec"]["replicas"] == 2
    env = env_of(docs)
    assert env["SLURMJOB_CLUSTER_NAME"] == "hpc"
    assert env["SLURMJOB_CLUSTERS_FILE"] == "/etc/slurmjob/clusters/clusters.yaml"
    (clusters_map,) = [
        d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-clusters")
    ]
    data = yaml.safe_load(clusters_map["data"]["clusters.yaml"])
    assert data == {
        "clusters": [
            {"name": "hpc"},
            {
                "name": "west",
                "restUrl": "https://slurmrestd.west.internal:6820",
                "partition": "a100",
                "jwtFile": "/etc/slurmjob/clusters/west/token",
            },
        ]
    }
    # The operator's own loader takes the rendered file as it is.
    rendered = tmp_path / "clusters.yaml"
    rendered.write_text(clusters_map["data"]["clusters.yaml"])
    base = Settings(slurm_rest_url="https://slurmrestd.hpc.internal:6820", clusters_file=rendered)
    hpc, west = load_clusters(base)
    assert (hpc.name, west.name) == ("hpc", "west")
    assert west.settings.slurm_jwt_file == Path("/etc/slurmjob/clusters/west/token")
    # Its token is projected next to the clusters file, from its own Secret.
    sources = volumes(docs)["clusters"]["projected"]["sources"]
    assert {
        "secret": {"name": "slurmrestd-west-jwt", "items": [{"key": "token", "path": "west/token"}]}
    } in sources
    c = container(docs)
    assert {"name": "clusters", "mountPath": "/etc/slurmjob/clusters", "readOnly": True} in c[
        "volumeMounts"
    ]


def test_the_readmes_quick_start_renders_the_example_it_applies(
    kube: KubeTestbed, tmp_path: Path
) -> None:
    """The README's Helm quick start as a newcomer runs it: its values, installed by the chart,
    must accept the example it then applies (runtime, partition, mounts): the catalogs the
    chart renders and the settings it sets, given to `slurmjob-operator render`."""
    readme = (REPO / "README.md").read_text()
    applied = re.findall(r"^kubectl apply -f (examples/\S+\.yaml)", readme, re.M)
    assert applied, "the quick start applies an example"
    docs = render(kube, "-f", str(_readme_values(tmp_path)))
    (catalogs,) = [
        d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-catalogs")
    ]
    env = {k: v for k, v in env_of(docs).items() if k.startswith("SLURMJOB_")}
    for key, setting in (
        ("runtime-registry.yaml", "SLURMJOB_RUNTIME_REGISTRY_FILE"),
        ("gpu-series.yaml", "SLURMJOB_GPU_SERIES_FILE"),
    ):
        path = tmp_path / key
        path.write_text(catalogs["data"][key])
        env[setting] = str(path)
    # The pod's files that do not exist here: the credentials and the clusters file are not
    # what `render` reads.
    for setting in ("SLURMJOB_SLURM_JWT_FILE", "SLURMJOB_CLUSTERS_FILE", "SLURMJOB_TEMPLATES_DIR"):
        env.pop(setting, None)
    for example in applied:
        proc = subprocess.run(
            [str(OPERATOR), "render", "-f", str(REPO / example)],
            env={"PATH": "/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, f"{example} with the README's values: {proc.stderr}"
        assert json.loads(proc.stdout)["job"]["partition"]


WEST: dict[str, Any] = {
    "name": "west",
    "restUrl": "https://slurmrestd.west.internal:6820",
    "messageTimeout": 20,
    "stagingOwner": "1000:1000",
    "caBundle": {"secret": {"name": "west-ca"}},
    "auth": {"mode": "signingKey", "existingSecret": "west-key", "jwtLifespan": 600},
    "catalogs": {
        "runtimes": [{"id": "w", "format": "sif", "path": "w/w.sif", "sha256": "ab" * 32}],
        "gpuSeries": [{"name": "h100", "slurmConstraint": "h100", "gpusPerNode": 8}],
    },
    "templates": {"files": {"job.sh.j2": "# west\n", "runtime/apptainer.sh.j2": "# sif\n"}},
}


def test_a_second_cluster_gets_its_own_ca_lifespan_catalogs_templates_and_owner(
    kube: KubeTestbed, tmp_path: Path
) -> None:
    """Everything the clusters file takes per cluster is a chart value too (issue 25), and
    lands in that cluster's folder: a second slurmrestd behind its own private CA verifies
    TLS with that CA, never the first cluster's."""
    values = tmp_path / "west.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "slurm": {"caBundle": {"configMap": {"name": "hpc-ca"}}},
                "clusters": [WEST],
            }
        )
    )
    defaults = str(CHART / "ci/default-values.yaml")
    docs = render(kube, "-f", defaults, "-f", str(values))
    (clusters_map,) = [
        d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-clusters")
    ]
    data = clusters_map["data"]
    rendered = tmp_path / "clusters.yaml"
    rendered.write_text(data["clusters.yaml"])
    base = Settings(
        slurm_rest_url="https://slurmrestd.hpc.internal:6820",
        slurm_ca_bundle=Path("/etc/slurmjob/ca/ca.crt"),
        clusters_file=rendered,
    )
    first, west = load_clusters(base)
    folder = Path("/etc/slurmjob/clusters/west")
    assert first.settings.slurm_ca_bundle == Path("/etc/slurmjob/ca/ca.crt")
    w = west.settings
    assert w.slurm_ca_bundle == folder / "ca.crt"
    assert (w.slurm_jwt_key_file, w.slurm_jwt_lifespan) == (folder / "jwt.key", 600)
    assert (w.slurm_message_timeout, w.staging_owner) == (20, "1000:1000")
    assert w.runtime_registry_file == folder / "runtime-registry.yaml"
    assert w.gpu_series_file == folder / "gpu-series.yaml"
    assert w.templates_dir == folder / "templates"
    # What the files hold, and where the volume puts them.
    assert yaml.safe_load(data["west.runtime-registry.yaml"]) == {
        "runtimes": WEST["catalogs"]["runtimes"]
    }
    assert yaml.safe_load(data["west.gpu-series.yaml"]) == {"series": WEST["catalogs"]["gpuSeries"]}
    projected: dict[str, tuple[str, str]] = {}
    for source in volumes(docs)["clusters"]["projected"]["sources"]:
        [ref] = source.values()
        for item in ref["items"]:
            projected[item["path"]] = (ref["name"], item["key"])
    mapped = clusters_map["metadata"]["name"]
    assert projected["west/ca.crt"] == ("west-ca", "ca.crt")
    assert projected["west/jwt.key"] == ("west-key", "jwt_hs256.key")
    assert projected["west/templates/runtime/apptainer.sh.j2"] == (
        mapped,
        "west.templates.runtime__apptainer.sh.j2",
    )
    assert data["west.templates.runtime__apptainer.sh.j2"] == "# sif\n"
    assert projected["west/runtime-registry.yaml"] == (mapped, "west.runtime-registry.yaml")
    # Two CA sources for one cluster, or a key the schema does not know, are refused.
    both = {**WEST, "caBundle": {"secret": {"name": "a"}, "configMap": {"name": "b"}}}
    values.write_text(yaml.safe_dump({"clusters": [both]}))
    refused = render_error(kube, "-f", defaults, "-f", str(values))
    assert "clusters[west].caBundle: set only one" in refused
    values.write_text(yaml.safe_dump({"clusters": [{**WEST, "caBundel": {}}]}))
    assert "caBundel" in render_error(kube, "-f", defaults, "-f", str(values))


@pytest.mark.parametrize("values", CI_VALUES, ids=_ids)
def test_helm_lint_strict(kube: KubeTestbed, values: Path) -> None:
    kube.helm("lint", "--strict", str(CHART), "-f", str(values))


def test_default_install_is_cluster_wide_restricted_and_elected(kube: KubeTestbed) -> None:
    docs = render(kube, "-f", str(CHART / "ci/default-values.yaml"))
    dep = deployment(docs)
    # Two replicas on one Lease: a rolling update brings the new pod up before the old stops.
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    (pdb,) = of_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    c = container(docs)
    assert c["args"] == ["run", "--liveness=http://0.0.0.0:8080/healthz", "--log-format=json"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert {"name": "healthz", "containerPort": 8080, "protocol": "TCP"} in c["ports"]
    # The restricted Pod Security Standard.
    pod_sc = dep["spec"]["template"]["spec"]["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert isinstance(pod_sc["runAsUser"], int)
    assert isinstance(pod_sc["runAsGroup"], int)
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert volumes(docs)["tmp"]["emptyDir"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    # Token file from the Secret; hostPath storage; catalogs from the chart's ConfigMap.
    env = env_of(docs)
    assert env["SLURMJOB_SLURM_JWT_FILE"] == "/etc/slurmjob/auth/token"
    assert "SLURMJOB_SLURM_JWT_KEY_FILE" not in env
    assert "SLURMJOB_STAGING_OWNER" not in env
    assert env["SLURMJOB_STORAGE_ROOT"] == "/var/lib/slurmjob"
    assert env["SLURMJOB_METRICS_PORT"] == "9090"
    assert volumes(docs)["slurm-auth"]["secret"]["secretName"] == "slurmrestd-jwt"
    assert volumes(docs)["slurm-auth"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert volumes(docs)["storage"]["hostPath"] == {"path": "/lustre/slurmjob", "type": "Directory"}
    (catalogs,) = of_kind(docs, "ConfigMap")
    assert yaml.safe_load(catalogs["data"]["runtime-registry.yaml"]) == {"runtimes": []}
    # No tenants: single-tenant, no tenants file.
    assert "tenants.yaml" not in catalogs["data"]
    assert "SLURMJOB_TENANTS_FILE" not in env
    assert [i["key"] for i in volumes(docs)["catalogs"]["configMap"]["items"]] == [
        "runtime-registry.yaml",
        "gpu-series.yaml",
    ]
    # Cluster-wide RBAC, the log API's (its reviews, its own APIService's caBundle, the front
    # proxy's ConfigMap, its certificate's Secret, the users' role), the Lease's Role; the
    # metrics and log Services, no monitoring objects.
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs if "Role" in d["kind"]) == [
        ("ClusterRole", "ci-slurmjob-operator"),
        ("ClusterRole", "ci-slurmjob-operator-apiservice"),
        ("ClusterRole", "ci-slurmjob-operator-logs-reader"),
        ("ClusterRole", "ci-slurmjob-operator-reviews"),
        ("ClusterRole", "slurmjob-editor"),
        ("ClusterRole", "slurmjob-viewer"),
        ("ClusterRoleBinding", "ci-slurmjob-operator"),
        ("ClusterRoleBinding", "ci-slurmjob-operator-apiservice"),
        ("ClusterRoleBinding", "ci-slurmjob-operator-reviews"),
        ("Role", "ci-slurmjob-operator-leader-election"),
        ("Role", "ci-slurmjob-operator-probe-cache"),
        ("Role", "ci-slurmjob-operator-serving-cert"),
        ("RoleBinding", "ci-slurmjob-operator-auth-reader"),
        ("RoleBinding", "ci-slurmjob-operator-leader-election"),
        ("RoleBinding", "ci-slurmjob-operator-probe-cache"),
        ("RoleBinding", "ci-slurmjob-operator-serving-cert"),
    ]
    assert env["SLURMJOB_LEADER_ELECTION"] == "true"
    # The Lease and nothing else: no right on any pod (a leaked token could swap an image).
    election = named(docs, "Role", "-leader-election")
    assert election["metadata"]["namespace"] == CI_NAMESPACE
    assert {res for rule in election["rules"] for res in rule["resources"]} == {"leases"}
    # The probe cache: its one ConfigMap by name (create cannot be limited to one).
    cache = named(docs, "Role", "-probe-cache")
    assert cache["metadata"]["namespace"] == CI_NAMESPACE
    assert cache["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["slurmjob-probe-cache"],
            "verbs": ["get", "patch"],
        },
    ]
    assert env["SLURMJOB_PROBE_CONFIGMAP"] == "slurmjob-probe-cache"
    assert all(e["name"] != "SLURMJOB_LEADER_POD" for e in c["env"])
    # leaderElection.podLabel is deprecated: still accepted, and it changes nothing.
    labelled = render(
        kube, "-f", str(CHART / "ci/default-values.yaml"), "--set", "leaderElection.podLabel=true"
    )
    assert labelled == docs
    svc = named(docs, "Service", "-metrics")
    assert svc["spec"]["ports"][0]["port"] == 9090
    assert not of_kind(docs, "ServiceMonitor")
    assert not of_kind(docs, "PrometheusRule")
    # The log API: its port on every replica, behind the APIService's Service, TLS from the
    # operator's own certificate (the Secret and the APIService it keeps); the RBAC is in
    # test_the_log_apis_rbac_is_least_privilege.
    assert env["SLURMJOB_LOGS_PORT"] == "8081"
    assert {"name": "logs", "containerPort": 8081, "protocol": "TCP"} in c["ports"]
    logs = named(docs, "Service", "-logs")
    assert logs["metadata"]["name"] == "ci-slurmjob-operator-logs"
    assert logs["metadata"]["namespace"] == CI_NAMESPACE
    assert logs["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "logs", "protocol": "TCP"}
    ]
    assert logs["spec"]["selector"] == deployment(docs)["spec"]["selector"]["matchLabels"]
    (api,) = of_kind(docs, "APIService")
    assert api["metadata"]["name"] == "v1alpha1.logs.slurmjob.io"
    assert api["spec"] == {
        "group": "logs.slurmjob.io",
        "version": "v1alpha1",
        "service": {"name": "ci-slurmjob-operator-logs", "namespace": CI_NAMESPACE, "port": 443},
        "groupPriorityMinimum": 1000,
        "versionPriority": 100,
        "insecureSkipTLSVerify": False,
    }  # no caBundle: the operator's leader patches it, and an upgrade must not take it away
    assert env["SLURMJOB_LOGS_CERT_SECRET"] == "ci-slurmjob-operator-logs-serving-cert"
    assert env["SLURMJOB_LOGS_APISERVICE"] == "v1alpha1.logs.slurmjob.io"
    assert env["SLURMJOB_LOGS_SERVICE"] == "ci-slurmjob-operator-logs"
    (pod_ns,) = [e for e in c["env"] if e["name"] == "SLURMJOB_POD_NAMESPACE"]
    assert pod_ns["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "SLURMJOB_LOGS_TLS_CERT_FILE" not in env
    assert "logs-tls" not in volumes(docs)
    # Never a certificate made by Helm (it would change at every render): the chart makes the
    # operator's Secret empty, with no data for Helm or Argo CD to own; the operator fills it.
    (secret,) = of_kind(docs, "Secret")
    assert secret["metadata"]["name"] == "ci-slurmjob-operator-logs-serving-cert"
    assert secret["metadata"]["namespace"] == CI_NAMESPACE
    assert secret["type"] == "Opaque"
    assert "data" not in secret
    assert "stringData" not in secret
    assert "caBundle" not in api["spec"]
    # Cluster-wide, and no tenants: `get` on Secrets nowhere (no Role for it, none in the
    # ClusterRole) unless namespaces are listed, or every namespace is chosen explicitly.
    operator_role = named(docs, "ClusterRole", "ci-slurmjob-operator")
    assert "secrets" not in {r for rule in operator_role["rules"] for r in rule["resources"]}
    assert not [d for d in docs if d["metadata"]["name"].endswith("-secrets")]
    base = ("-f", str(CHART / "ci/default-values.yaml"))
    listed = render(kube, *base, "--set", "rbac.secretNamespaces={team-x,team-y}")
    roles = [d for d in of_kind(listed, "Role") if d["metadata"]["name"].endswith("-secrets")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-x", "team-y"]
    assert all(
        r["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
        for r in roles
    )
    wide = render(kube, *base, "--set", "rbac.secretsClusterWide=true")
    wide_role = named(wide, "ClusterRole", "ci-slurmjob-operator")
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]} in wide_role["rules"]
    assert not [d for d in wide if d["metadata"]["name"].endswith("-secrets")]
    refused = render_error(
        kube, *base, "--set", "watchNamespaces={a}", "--set", "rbac.secretsClusterWide=true"
    )
    assert "rbac.secretsClusterWide and rbac.secretNamespaces are for a cluster-wide" in refused
    off = render(kube, "-f", str(CHART / "ci/default-values.yaml"), "--set", "logs.port=0")
    names = {d["metadata"]["name"] for d in off}
    assert not [
        n
        for n in names
        if n.endswith(("-logs", "-logs-reader", "-reviews", "-apiservice", "-serving-cert"))
    ]
    assert not of_kind(off, "APIService")
    assert env_of(off)["SLURMJOB_LOGS_PORT"] == "0"
    assert "SLURMJOB_LOGS_CERT_SECRET" not in env_of(off)


def test_namespaced_install_has_no_cluster_wide_rbac(kube: KubeTestbed) -> None:
    # ci/namespaced-values.yaml turns the log API off (its APIService, reviews and users'
    # role are cluster-scoped): nothing cluster-wide. With it on, only the log API's.
    with_logs = render(
        kube, "-f", str(CHART / "ci/namespaced-values.yaml"), "--set", "apiService.enabled=true"
    )
    cluster_wide = [d for d in with_logs if d["kind"].startswith("Cluster")]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in cluster_wide) == [
        ("ClusterRole", "ci-slurmjob-operator-apiservice"),
        ("ClusterRole", "ci-slurmjob-operator-logs-reader"),
        ("ClusterRole", "ci-slurmjob-operator-reviews"),
        ("ClusterRoleBinding", "ci-slurmjob-operator-apiservice"),
        ("ClusterRoleBinding", "ci-slurmjob-operator-reviews"),
    ]
    # The admission policies are cluster-scoped too: with them on, their bindings judge the
    # watched namespaces only.
    admission = render(
        kube, "-f", str(CHART / "ci/namespaced-values.yaml"), "--set", "admission.enabled=true"
    )
    bindings = of_kind(admission, "ValidatingAdmissionPolicyBinding")
    assert sorted(b["metadata"]["name"] for b in bindings) == [
        "ci-slurmjob-operator-slurmjobs",
        "ci-slurmjob-operator-status",
    ]
    for binding in bindings:
        (expression,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert expression["values"] == list(CI_WATCHED)
    docs = render(kube, "-f", str(CHART / "ci/namespaced-values.yaml"))
    assert not of_kind(docs, "ClusterRole")
    assert not of_kind(docs, "ClusterRoleBinding")
    assert not of_kind(docs, "APIService")
    assert not of_kind(docs, "ValidatingAdmissionPolicy")
    assert env_of(docs)["SLURMJOB_LOGS_PORT"] == "0"
    # Besides the Lease's Role and the probe cache's in the release namespace.
    election = [d for d in docs if d["metadata"]["name"].endswith("-leader-election")]
    assert [d["kind"] for d in election] == ["Role", "RoleBinding"]
    cache = [d for d in docs if d["metadata"]["name"].endswith("-probe-cache")]
    assert [d["kind"] for d in cache] == ["Role", "RoleBinding"]
    docs = [d for d in docs if d not in election and d not in cache]
    roles = of_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(CI_WATCHED)
    for role in roles:
        resources = {res for rule in role["rules"] for res in rule["resources"]}
        assert "secrets" not in resources  # rbac.secrets: false
    bindings = of_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(CI_WATCHED)
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "ci-slurmjob-operator", "namespace": CI_NAMESPACE}
        ]
    args = container(docs)["args"]
    assert [a for a in args if a.startswith("--namespace=")] == [
        f"--namespace={ns}" for ns in CI_WATCHED
    ]
    env = env_of(docs)
    assert env["SLURMJOB_SLURM_JWT_KEY_FILE"] == "/etc/slurmjob/auth/jwt.key"
    assert env["SLURMJOB_SLURM_REST_USER"] == "slurmjob"
    assert "SLURMJOB_SLURM_JWT_FILE" not in env
    assert volumes(docs)["storage"]["persistentVolumeClaim"] == {"claimName": "slurmjob-shared"}
    assert deployment(docs)["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 4001


SVC = "ci-slurmjob-operator-logs"
SVC_NAMES = [f"{SVC}.{CI_NAMESPACE}.svc", f"{SVC}.{CI_NAMESPACE}.svc.cluster.local"]


def _logs_rbac(docs: list[dict[str, Any]]) -> set[str]:
    return {
        d["metadata"]["name"].removeprefix("ci-slurmjob-operator-")
        for d in docs
        if "Role" in d["kind"]
        and d["metadata"]["name"].endswith(
            ("-reviews", "-auth-reader", "-serving-cert", "-apiservice", "-logs-reader")
        )
    }


def test_the_log_apis_rbac_is_least_privilege(kube: KubeTestbed) -> None:
    docs = render(kube, "-f", str(CHART / "ci/default-values.yaml"))
    env = env_of(docs)
    sa = {"kind": "ServiceAccount", "name": "ci-slurmjob-operator", "namespace": CI_NAMESPACE}
    # Asking whether a user may read a log; no TokenReviews (no token reaches the operator).
    assert named(docs, "ClusterRole", "-reviews")["rules"] == [
        {
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["subjectaccessreviews"],
            "verbs": ["create"],
        }
    ]
    # The front proxy's ConfigMap, through Kubernetes' own Role for it, in kube-system.
    reader = named(docs, "RoleBinding", "-auth-reader")
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "extension-apiserver-authentication-reader",
    }
    assert reader["subjects"] == [sa]
    # Its own Secret by name, in the release namespace only, and no `create` (the chart
    # makes the Secret): it could otherwise mint a token Secret for any ServiceAccount there.
    secret = env["SLURMJOB_LOGS_CERT_SECRET"]
    role = named(docs, "Role", "-serving-cert")
    assert role["metadata"]["namespace"] == CI_NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [secret],
            "verbs": ["get", "update"],
        },
    ]
    assert [d["metadata"]["name"] for d in of_kind(docs, "Secret")] == [secret]
    assert named(docs, "RoleBinding", "-serving-cert")["subjects"] == [sa]
    # Its own APIService by name, the one it is told to patch and the one the chart makes.
    (api,) = of_kind(docs, "APIService")
    assert env["SLURMJOB_LOGS_APISERVICE"] == api["metadata"]["name"]
    assert named(docs, "ClusterRole", "-apiservice")["rules"] == [
        {
            "apiGroups": ["apiregistration.k8s.io"],
            "resources": ["apiservices"],
            "resourceNames": [api["metadata"]["name"]],
            "verbs": ["get", "patch"],
        }
    ]
    for binding in ("-apiservice", "-reviews"):
        assert named(docs, "ClusterRoleBinding", binding)["subjects"] == [sa]
    # The users' right, aggregated into view and edit; bound to no one by the chart.
    users = named(docs, "ClusterRole", "-logs-reader")
    assert users["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert users["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert users["rules"] == [
        {"apiGroups": ["logs.slurmjob.io"], "resources": ["slurmjobs/log"], "verbs": ["get"]}
    ]
    bound = {b["roleRef"]["name"] for b in docs if b["kind"].endswith("RoleBinding")}
    assert users["metadata"]["name"] not in bound
    # rbac.create: false makes none of it.
    none = render(kube, "-f", str(CHART / "ci/default-values.yaml"), "--set", "rbac.create=false")
    assert not [d for d in none if "Role" in d["kind"]]
    # ... but the Secret still: the site's own RBAC need not allow `create` either.
    assert [d["metadata"]["name"] for d in of_kind(none, "Secret")] == [secret]


def test_the_certificate_from_cert_manager(kube: KubeTestbed) -> None:
    docs = render(kube, "-f", str(CHART / "ci/cert-manager-values.yaml"))
    (api,) = of_kind(docs, "APIService")
    assert api["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{CI_NAMESPACE}/ci-slurmjob-operator-logs"
    }
    assert "caBundle" not in api["spec"]  # the cainjector's
    (cert,) = of_kind(docs, "Certificate")
    assert cert["metadata"]["name"] == "ci-slurmjob-operator-logs"
    assert cert["metadata"]["namespace"] == CI_NAMESPACE
    assert cert["spec"]["dnsNames"] == SVC_NAMES
    assert cert["spec"]["secretName"] == "ci-slurmjob-operator-logs-tls"
    assert cert["spec"]["issuerRef"] == {
        "name": "site-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert (cert["spec"]["duration"], cert["spec"]["renewBefore"]) == ("720h", "240h")
    assert not of_kind(docs, "Issuer")  # the site's ClusterIssuer
    env = env_of(docs)
    assert env["SLURMJOB_LOGS_PORT"] == "8443"
    assert env["SLURMJOB_LOGS_TLS_CERT_FILE"] == "/etc/slurmjob/logs-tls/tls.crt"
    assert env["SLURMJOB_LOGS_TLS_KEY_FILE"] == "/etc/slurmjob/logs-tls/tls.key"
    assert "SLURMJOB_LOGS_CERT_SECRET" not in env
    assert "SLURMJOB_LOGS_APISERVICE" not in env
    assert {"name": "logs", "containerPort": 8443, "protocol": "TCP"} in container(docs)["ports"]
    assert volumes(docs)["logs-tls"]["secret"]["secretName"] == "ci-slurmjob-operator-logs-tls"
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    assert mounts["logs-tls"] == {
        "name": "logs-tls",
        "mountPath": "/etc/slurmjob/logs-tls",
        "readOnly": True,
    }
    # No Secret or APIService rights: cert-manager writes both.
    assert _logs_rbac(docs) == {"reviews", "auth-reader", "logs-reader"}
    # Without an issuer of the site's: a self-signed Issuer of the release's own.
    own = render(
        kube, "-f", str(CHART / "ci/cert-manager-values.yaml"),
        "--set", "certManager.issuerRef.name=",
    )  # fmt: skip
    (issuer,) = of_kind(own, "Issuer")
    assert issuer["spec"] == {"selfSigned": {}}
    (cert,) = of_kind(own, "Certificate")
    assert cert["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }


def test_the_certificate_the_admin_gives(kube: KubeTestbed) -> None:
    from cryptography import x509

    values = yaml.safe_load((CHART / "ci/admin-tls-values.yaml").read_text())
    docs = render(kube, "-f", str(CHART / "ci/admin-tls-values.yaml"))
    (api,) = of_kind(docs, "APIService")
    bundle = base64.b64decode(api["spec"]["caBundle"])
    assert bundle.decode() == values["apiService"]["caBundle"]
    assert x509.load_pem_x509_certificates(bundle)
    assert "annotations" not in api["metadata"]
    assert volumes(docs)["logs-tls"]["secret"]["secretName"] == "slurmjob-logs-tls"
    env = env_of(docs)
    assert env["SLURMJOB_LOGS_TLS_CERT_FILE"] == "/etc/slurmjob/logs-tls/tls.crt"
    assert "SLURMJOB_LOGS_CERT_SECRET" not in env
    assert not of_kind(docs, "Certificate")
    assert not of_kind(docs, "Secret")
    assert _logs_rbac(docs) == {"reviews", "auth-reader", "logs-reader"}


def test_the_log_api_off_for_a_second_release(kube: KubeTestbed) -> None:
    docs = render(
        kube, "-f", str(CHART / "ci/default-values.yaml"), "--set", "apiService.enabled=false",
        release="second",
    )  # fmt: skip
    assert not of_kind(docs, "APIService")
    assert not [d for d in docs if d["metadata"]["name"].endswith("-logs")]
    assert not _logs_rbac(docs)
    assert not [d for d in docs if d["metadata"].get("namespace") == "kube-system"]
    env = env_of(docs)
    assert env["SLURMJOB_LOGS_PORT"] == "0"  # nothing would send it a request
    assert not [p for p in container(docs)["ports"] if p["name"] == "logs"]
    (np,) = of_kind(docs, "NetworkPolicy")
    assert [rule["ports"][0]["port"] for rule in np["spec"]["ingress"]] == [8080, 9090]


def test_the_readmes_values_still_install_with_the_log_api(
    kube: KubeTestbed, tmp_path: Path
) -> None:
    """The README's minimal values need nothing for the log API: the operator makes its own
    certificate into the one Secret the chart renders empty (issue 42: the operator may not
    create Secrets), and Helm renders no certificate."""
    docs = render(kube, "-f", str(_readme_values(tmp_path)))
    assert of_kind(docs, "APIService")
    name = env_of(docs)["SLURMJOB_LOGS_CERT_SECRET"]
    [secret] = of_kind(docs, "Secret")
    assert secret["metadata"]["name"] == name
    assert "data" not in secret
    assert "stringData" not in secret
    again = render(kube, "-f", str(_readme_values(tmp_path)))
    assert again == docs  # nothing random in a render


def test_signing_key_pvc_catalogs_and_templates_from_values(kube: KubeTestbed) -> None:
    docs = render(kube, "-f", str(CHART / "ci/signing-key-pvc-values.yaml"))
    env = env_of(docs)
    assert env["SLURMJOB_SLURM_JWT_LIFESPAN"] == "900"
    assert env["SLURMJOB_SLURM_STORAGE_ROOT"] == "/lustre/slurmjob"
    assert env["SLURMJOB_SLURM_CA_BUNDLE"] == "/etc/slurmjob/ca/ca.crt"
    assert env["SLURMJOB_SLURM_RUNTIME_PROFILE"] == "apptainer"
    assert env["SLURMJOB_SLURM_REST_API_VERSION"] == "v0.0.45"
    assert env["SLURMJOB_TEMPLATES_DIR"] == "/etc/slurmjob/templates"
    vols = volumes(docs)
    assert vols["slurm-auth"]["secret"]["items"] == [{"key": "jwt_hs256.key", "path": "jwt.key"}]
    assert vols["ca-bundle"]["secret"]["items"] == [{"key": "ca.pem", "path": "ca.crt"}]
    assert vols["templates"]["configMap"]["items"] == [
        {"key": "runtime__apptainer.sh.j2", "path": "runtime/apptainer.sh.j2"}
    ]
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    assert mounts["storage"]["subPath"] == "operator"
    assert container(docs)["image"].endswith("@sha256:" + "0123456789abcdef" * 4)
    config_maps = {cm["metadata"]["name"]: cm for cm in of_kind(docs, "ConfigMap")}
    registry = yaml.safe_load(
        config_maps["ci-slurmjob-operator-catalogs"]["data"]["runtime-registry.yaml"]
    )
    assert registry["runtimes"][0]["id"] == "custom-python"
    series = yaml.safe_load(config_maps["ci-slurmjob-operator-catalogs"]["data"]["gpu-series.yaml"])
    assert series["series"][1] == {"name": "l40s", "gpusPerNode": 4}
    # The tenants: rendered as tenants.yaml, mounted, named by SLURMJOB_TENANTS_FILE, and a
    # file the operator's loader takes as it is.
    text = config_maps["ci-slurmjob-operator-catalogs"]["data"]["tenants.yaml"]
    loaded = Tenants.model_validate(yaml.safe_load(text))
    assert [t.name for t in loaded.tenants] == ["team-a", "team-b"]
    team_a = loaded.tenants[0]
    assert (team_a.slurm_user, team_a.uid, team_a.max_time_minutes) == ("team-a", 1001, 1440)
    assert team_a.mount_sources == ["datasets/team-a", "datasets/public"]
    assert env["SLURMJOB_TENANTS_FILE"] == "/etc/slurmjob/catalogs/tenants.yaml"
    assert {"key": "tenants.yaml", "path": "tenants.yaml"} in vols["catalogs"]["configMap"]["items"]
    # secretKeyRef: `get` on Secrets in the tenants' namespaces only, never cluster-wide.
    roles = [d for d in of_kind(docs, "Role") if d["metadata"]["name"].endswith("-secrets")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(CI_TENANT_NAMESPACES)
    assert all(
        r["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
        for r in roles
    )
    operator_role = named(docs, "ClusterRole", "ci-slurmjob-operator")
    assert "secrets" not in {r for rule in operator_role["rules"] for r in rule["resources"]}
    assert (
        "site copy"
        in config_maps["ci-slurmjob-operator-templates"]["data"]["runtime__apptainer.sh.j2"]
    )


def checksums(docs: list[dict[str, Any]]) -> dict[str, str]:
    annotations = deployment(docs)["spec"]["template"]["metadata"]["annotations"]
    return {k: v for k, v in annotations.items() if k.startswith("checksum/")}


def test_only_what_is_read_at_start_restarts_the_pod(kube: KubeTestbed, tmp_path: Path) -> None:
    """The runtime registries and GPU series catalogs are re-read while the operator runs
    (issue 44): changing them leaves the pod template alone. The tenants file, the clusters
    file and the templates are read at start: changing them rolls the pod."""

    def values(name: str, data: dict[str, Any]) -> list[str]:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return ["-f", str(path)]

    base = [
        "-f",
        str(CHART / "ci/signing-key-pvc-values.yaml"),
        *values("west", {"clusters": [WEST]}),
    ]
    before = checksums(render(kube, *base))
    assert before.keys() == {"checksum/tenants", "checksum/clusters", "checksum/templates"}
    a100, west = [{"name": "a100", "gpusPerNode": 4}], WEST["catalogs"]
    re_read = [
        values("series", {"catalogs": {"gpuSeries": a100}}),
        values("runtimes", {"catalogs": {"runtimes": []}}),
        values("west-series", {"clusters": [{**WEST, "catalogs": {**west, "gpuSeries": a100}}]}),
    ]
    for change in re_read:
        assert checksums(render(kube, *base, *change)) == before, change
    read_at_start = {
        "checksum/tenants": values("tenants", {"catalogs": {"tenants": []}}),
        "checksum/clusters": values("west-url", {"clusters": [{**WEST, "restUrl": "https://o:1"}]}),
    }
    for key, change in read_at_start.items():
        assert checksums(render(kube, *base, *change))[key] != before[key], key


def test_monitoring_objects_use_only_the_operators_metrics(kube: KubeTestbed) -> None:
    docs = render(kube, "-f", str(CHART / "ci/monitoring-values.yaml"))
    (monitor,) = of_kind(docs, "ServiceMonitor")
    svc = named(docs, "Service", "-metrics")
    assert monitor["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    for key, value in monitor["spec"]["selector"]["matchLabels"].items():
        assert svc["metadata"]["labels"][key] == value
    (rule,) = of_kind(docs, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {
        "SlurmJobOperatorSlurmAuthFailing",
        "SlurmJobOperatorTokenExpiringSoon",
        "SlurmJobOperatorSubmissionsUnconfirmed",
        "SlurmJobOperatorPollErrors",
    } <= alerts.keys()
    assert alerts["SlurmJobOperatorSubmissionsUnconfirmed"]["for"] == "15m"
    # Every series name and label in the expressions exists in the operator's registry (plus
    # `namespace`, which the ServiceMonitor's scrape adds).
    metrics = Metrics()
    metrics.on_request("/slurm/v0.0.45/ping", "GET", "2xx", 0.01, cluster="hpc")
    with metrics.cycle("hpc"):
        metrics.set_token_expiry(None, cluster="hpc")
        metrics.set_reachable("hpc", True)
    metrics.count_adoption("name")
    metrics.catalogs.observe("hpc", "gpu-series", loaded_at=0.0, stale=False)
    known: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            known.setdefault(sample.name, set()).update(sample.labels)
    for name, alert in alerts.items():
        for metric, selector in re.findall(
            r"(slurmjob_operator_\w+)(?:\{([^}]*)\})?", alert["expr"]
        ):
            assert metric in known, f"{name}: unknown metric {metric}"
            labels = set(re.findall(r"(\w+)\s*(?:=~|!=|!~|=)", selector))
            assert labels <= known[metric] | {"namespace"}, f"{name}: {metric}{{{selector}}}"
    env = env_of(docs)
    assert env["TZ"] == "UTC"
    assert env["SLURMJOB_METRICS_PORT"] == "9191"
    assert env["SLURMJOB_SLURM_PARTITION"] == "gpu"
    vols = volumes(docs)
    assert vols["catalogs"]["configMap"]["name"] == "site-catalogs"
    # existingConfigMapHasTenants: the user's ConfigMap's tenants.yaml is mounted and named.
    assert {"key": "tenants.yaml", "path": "tenants.yaml"} in vols["catalogs"]["configMap"]["items"]
    assert env["SLURMJOB_TENANTS_FILE"] == "/etc/slurmjob/catalogs/tenants.yaml"
    assert vols["ca-bundle"]["configMap"] == {
        "name": "site-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert not of_kind(docs, "ConfigMap")  # catalogs and templates are the user's
    # The admission policy's rules for those tenants: admission.params, as given.
    values = yaml.safe_load((CHART / "ci/monitoring-values.yaml").read_text())
    for policy in of_kind(docs, "ValidatingAdmissionPolicy"):
        (site,) = [v for v in policy["spec"]["variables"] if v["name"] == "site"]
        assert json.loads(site["expression"]) == values["admission"]["params"]


def test_pull_secrets_spread_pod_monitor_and_the_helm_test(kube: KubeTestbed) -> None:
    """imagePullSecrets as charts name it (image.pullSecrets still read for one release), the
    replicas spread over zones, a PodMonitor on request, and `helm test` as doctor --no-probe
    in a Job set up exactly as the operator's container."""
    default = str(CHART / "ci/default-values.yaml")
    docs = render(kube, "-f", default, "--set", "imagePullSecrets[0].name=regcred")
    pod = deployment(docs)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    selector = deployment(docs)["spec"]["selector"]
    assert pod["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": selector,
        }
    ]
    (job,) = of_kind(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert job["spec"]["backoffLimit"] == 0
    test_pod = job["spec"]["template"]["spec"]
    (doctor,) = test_pod["containers"]
    assert doctor["args"] == ["doctor", "--no-probe"]
    assert doctor["image"] == container(docs)["image"]
    assert doctor["env"] == container(docs)["env"]
    assert doctor["volumeMounts"] == container(docs)["volumeMounts"]
    assert test_pod["volumes"] == pod["volumes"]
    for key in ("serviceAccountName", "securityContext", "imagePullSecrets"):
        assert test_pod[key] == pod[key]
    # The job's pods are not the operator's: the Services and the PDB do not select them.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not set(selector["matchLabels"].items()) <= set(labels.items())
    assert not of_kind(docs, "PodMonitor")

    old = render(kube, "-f", str(CHART / "ci/signing-key-pvc-values.yaml"))
    assert deployment(old)["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]

    given = render(
        kube,
        *("-f", default, "--set", "topologySpreadConstraints[0].maxSkew=2"),
        *("--set", "topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname"),
        *("--set", "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule"),
    )
    (spread,) = deployment(given)["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread == {
        "maxSkew": 2,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": selector,
    }
    alone = render(kube, "-f", default, "--set", "leaderElection.enabled=false")
    assert "topologySpreadConstraints" not in deployment(alone)["spec"]["template"]["spec"]

    monitored = render(kube, "-f", default, "--set", "metrics.podMonitor.enabled=true")
    (monitor,) = of_kind(monitored, "PodMonitor")
    assert monitor["spec"]["selector"] == selector
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert {"name": endpoint["port"], "containerPort": 9090, "protocol": "TCP"} in container(
        monitored
    )["ports"]
    assert not of_kind(render(kube, "-f", default, "--set", "helmTest.enabled=false"), "Job")


def test_metrics_port_zero_renders_no_metrics_objects(kube: KubeTestbed) -> None:
    docs = render(
        kube,
        "-f",
        str(CHART / "ci/monitoring-values.yaml"),
        "--set",
        "metrics.port=0",
    )
    assert [d["metadata"]["name"] for d in of_kind(docs, "Service")] == [
        "ci-slurmjob-operator-logs"
    ]
    assert not of_kind(docs, "ServiceMonitor")
    assert not of_kind(docs, "PrometheusRule")
    assert env_of(docs)["SLURMJOB_METRICS_PORT"] == "0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "storage.hostPath.path=/x", "--set", "slurm.auth.existingSecret=s"],
            "slurm.restUrl is required",
        ),
        (
            ["--set", "storage.hostPath.path=/x", "--set", "slurm.restUrl=http://s:6820"],
            "slurm.auth.existingSecret is required",
        ),
        (
            ["-f", "ci/default-values.yaml", "--set", "image.repository="],
            "image.repository is required: there is no public image",
        ),
        (
            [
                *("--set", "slurm.restUrl=http://s:6820", "--set", "slurm.auth.existingSecret=s"),
                *("--set", "storage.hostPath.path=/x", "--set", "image.repository=r/o"),
            ],
            "podSecurityContext.runAsUser is required: the uid of the Slurm job user",
        ),
        (
            ["-f", "ci/monitoring-values.yaml", "--set", "metrics.podMonitor.enabled=true"],
            "metrics.podMonitor.enabled and metrics.serviceMonitor.enabled: choose one",
        ),
        (
            ["-f", "ci/default-values.yaml", "--set", "storage.hostPath.path="],
            "storage: set storage.existingClaim or storage.hostPath.path",
        ),
        (
            ["-f", "ci/default-values.yaml", "--set", "storage.existingClaim=pvc"],
            "set only one of existingClaim and hostPath.path",
        ),
        (
            ["-f", "ci/default-values.yaml", "--set", "slurm.auth.mode=signingKey"],
            "slurm.user is required with slurm.auth.mode=signingKey",
        ),
        (
            ["-f", "ci/default-values.yaml", "--set", "slurm.restURL=http://typo"],
            "additional properties 'restURL' not allowed",
        ),
        (
            ["-f", "ci/default-values.yaml", "--set", "slurm.runtimeProfile=docker"],
            "runtimeProfile",
        ),
        (["-f", "ci/default-values.yaml", "--set", "watchNamespaces[0]=Bad_NS"], "watchNamespaces"),
        (
            ["-f", "ci/signing-key-pvc-values.yaml", "--set", "catalogs.existingConfigMap=cm"],
            "catalogs.tenants is not read with catalogs.existingConfigMap",
        ),
        (
            ["-f", "ci/default-values.yaml", "--set", "catalogs.tenants[0].name=team-a"],
            "missing properties 'namespaces', 'accounts', 'partitions'",
        ),
        (
            ["-f", "ci/default-values.yaml", "--set", "apiService.tls.secretName=tls"],
            "apiService.caBundle is required with apiService.tls.secretName",
        ),
        (
            ["-f", "ci/admin-tls-values.yaml", "--set", "apiService.tls.secretName="],
            "apiService.caBundle is read only with apiService.tls.secretName",
        ),
        (
            ["-f", "ci/admin-tls-values.yaml", "--set", "certManager.enabled=true"],
            "certManager.enabled and apiService.tls.secretName: set only one",
        ),
    ],
    ids=[
        "no-url",
        "no-secret",
        "no-image",
        "no-uid",
        "two-monitors",
        "no-storage",
        "two-storages",
        "key-no-user",
        "typo",
        "profile",
        "bad-namespace",
        "tenants-with-existing-configmap",
        "tenant-without-limits",
        "tls-secret-without-ca",
        "ca-without-tls-secret",
        "cert-manager-and-tls-secret",
    ],
)
def test_bad_values_fail_the_render_naming_the_value(
    kube: KubeTestbed, args: list[str], message: str
) -> None:
    args = [str(CHART / a) if a.startswith("ci/") else a for a in args]
    assert message in render_error(kube, *args)


# ----------------------------------------------------------------------- server dry run


@pytest.fixture(scope="module")
def ci_cluster(kube: KubeTestbed) -> None:
    """The namespaces the ci values name, and stand-ins for the Prometheus Operator's and
    cert-manager's CRDs (this API server has none). Both are left in place: other runs may use
    them at once."""
    for ns in (CI_NAMESPACE, *CI_WATCHED, *CI_TENANT_NAMESPACES):
        ensure_namespace(kube, ns)
    for group, plural, kind in MONITORING_CRDS:
        name = f"{plural}.{group}"
        if kube.kubectl("get", "crd", name, check=False).returncode != 0:
            kube.apply(yaml.safe_dump(_monitoring_crd(group, plural, kind)))
        kube.wait_established(name)


@pytest.mark.parametrize("values", CI_VALUES, ids=_ids)
def test_rendered_manifests_pass_server_dry_run(
    kube: KubeTestbed, ci_cluster: None, values: Path
) -> None:
    text = kube.helm("template", "ci", str(CHART), "-n", CI_NAMESPACE, "-f", str(values)).stdout
    docs = [d for d in yaml.safe_load_all(text) if d]
    # Every namespaced object names its namespace, so no `-n` here.
    cluster_scoped = (
        "ClusterRole",
        "ClusterRoleBinding",
        "APIService",
        "CustomResourceDefinition",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    assert all(d["metadata"].get("namespace") for d in docs if d["kind"] not in cluster_scoped)
    proc = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=text, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(docs), proc.stdout
    assert "Deployment" in {d["kind"] for d in docs}


# ------------------------------------------------------- the chart's ServiceAccount, for real


def can_i(kube: KubeTestbed, subject: str, *args: str) -> bool:
    proc = kube.kubectl("auth", "can-i", f"--as={subject}", *args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stderr
    return answer == "yes"


def apply_rbac(kube: KubeTestbed, release: str, namespace: str, *values: str) -> None:
    text = kube.helm(
        "template", release, str(CHART), "-n", namespace,
        "-f", str(CHART / "ci/default-values.yaml"), *values,
        "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml",
    ).stdout  # fmt: skip
    kube.apply(text)


def delete_release_rbac(kube: KubeTestbed, release: str) -> None:
    """What `apply_rbac` made outside the release namespace: the cluster-scoped objects and
    the RoleBinding in kube-system (deleting the namespace takes the rest)."""
    for suffix in ("", "-reviews", "-apiservice", "-kueue"):
        kube.kubectl(
            "delete", "clusterrolebinding,clusterrole", f"{release}-slurmjob-operator{suffix}",
            "--ignore-not-found", check=False,
        )  # fmt: skip
    kube.kubectl(
        "delete", "rolebinding", f"{release}-slurmjob-operator-auth-reader", "-n", "kube-system",
        "--ignore-not-found", check=False,
    )  # fmt: skip


def sa_kubeconfig(kube: KubeTestbed, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig holding a token the API server minted for the ServiceAccount."""
    token = kube.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": cluster}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": "testbed", "user": sa}}],
        "current-context": sa,
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@dataclass
class ChartOperator(Operator):
    """`slurmjob-operator run` with exactly the arguments of the chart's Deployment, as the
    chart's ServiceAccount (`subject`, living in `op_namespace`)."""

    args: list[str] = field(default_factory=list)
    subject: str = ""
    op_namespace: str = ""
    health_port: int = 0
    release: str = ""

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(OPERATOR), *self.args],
            env=self.env,  # the Deployment's own Lease settings, not process_env()'s
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()


@pytest.fixture(scope="module")
def sa_operator(
    kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChartOperator]:
    """The chart installed with watchNamespaces=[<jobs ns>] (its ServiceAccount and RBAC for
    real, not the Deployment: no pods run here) and the operator started as that
    ServiceAccount with the Deployment's arguments."""
    tmp = tmp_path_factory.mktemp("chart-sa")
    suffix = uuid.uuid4().hex[:6]
    release, op_ns, jobs_ns = f"sj-{suffix}", f"chart-op-{suffix}", f"chart-jobs-{suffix}"
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    for ns in (op_ns, jobs_ns):
        kube.kubectl("create", "namespace", ns)
    health = free_port()
    values = ["--set", f"watchNamespaces={{{jobs_ns}}}", "--set", f"health.port={health}"]
    apply_rbac(kube, release, op_ns, *values)
    docs = render(
        kube, "-f", str(CHART / "ci/default-values.yaml"), *values,
        release=release, namespace=op_ns,
    )  # fmt: skip
    sa = deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp),
        **site_env(slurm_2605, "apptainer", tmp),
        "KUBECONFIG": str(sa_kubeconfig(kube, op_ns, sa, tmp / "sa.kubeconfig")),
        "SLURMJOB_POLL_INTERVAL": "1",
        "SLURMJOB_METRICS_PORT": "0",
        "SLURMJOB_DELETE_TIMEOUT": "30",
        # The Deployment's own leader-election settings (the Lease in the release namespace),
        # with the pod name its downward API would give.
        **{
            e["name"]: e["value"]
            for e in container(docs)["env"]
            if e["name"].startswith(("SLURMJOB_LEADER_", "SLURMJOB_LEASE_")) and "value" in e
        },
        "SLURMJOB_LEASE_IDENTITY": f"{release}-pod-0",
        # The log API as the Deployment sets it (its own certificate in a Secret of the
        # release namespace, which the downward API would name), on loopback.
        **{
            e["name"]: e["value"]
            for e in container(docs)["env"]
            if e["name"].startswith("SLURMJOB_LOGS_") and "value" in e
        },
        "SLURMJOB_LOGS_PORT": str(free_port()),
        "SLURMJOB_LOGS_ADDRESS": "127.0.0.1",
        "SLURMJOB_POD_NAMESPACE": op_ns,
    }
    assert env["SLURMJOB_LEADER_ELECTION"] == "true"
    assert env["SLURMJOB_LOGS_CERT_SECRET"] == f"{release}-slurmjob-operator-logs-serving-cert"
    assert env["SLURMJOB_LEASE_NAMESPACE"] == op_ns
    op = ChartOperator(
        kube,
        slurm_2605,
        jobs_ns,
        env,
        tmp / "operator.log",
        args=container(docs)["args"],
        subject=f"system:serviceaccount:{op_ns}:{sa}",
        op_namespace=op_ns,
        health_port=health,
        release=release,
    )
    op.start()
    try:
        yield op
    finally:
        op.stop()
        print(f"--- operator log ({jobs_ns}) ---\n{op.log_tail(200)}")
        for ns in (op_ns, jobs_ns):
            kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        delete_release_rbac(kube, release)


@pytest.mark.slurm2605
def test_cpu_job_succeeds_with_only_the_charts_serviceaccount(sa_operator: ChartOperator) -> None:
    op = sa_operator
    assert op.args[0] == "run"
    assert f"--namespace={op.namespace}" in op.args
    # The secretKeyRef path needs `get secrets`, which rbac.secrets (default true) grants.
    token = leaks.secret("s3cret")
    op.kube.kubectl(
        "create", "secret", "generic", "hf", "-n", op.namespace, f"--from-literal=token={token}"
    )
    op.apply(
        "cpu",
        cpu_spec(
            ["bash", "-c", 'echo "hello-from-sa len=${#HF_TOKEN}"'],
            env=[
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
            ],
        ),
    )
    obj = op.wait_phase("cpu", "Succeeded", "Failed", "Cancelled", within=90)
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    assert "hello-from-sa len=6" in obj["status"]["logs"]["stdout"]["tail"]
    reasons = [e["reason"] for e in op.events("cpu")]
    assert "Submitted" in reasons
    assert "Succeeded" in reasons
    # The probe endpoint the Deployment's probes use answers.
    port = op.health_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        assert resp.status == 200
    # Deleting goes through the finalizer, which the ServiceAccount may remove (patch).
    op.kube.kubectl("delete", "slurmjob", "cpu", "-n", op.namespace, "--timeout=60s", timeout=70)
    assert op.get("cpu") is None
    # Nothing was refused: no 403 from the API server, no kopf fallback for missing rights
    # (kopf lists Namespaces and watches CRDs unless settings.scanning.disabled is set).
    log = op.log_path.read_text(errors="replace").splitlines()
    refused = [line[:300] for line in log if re.search(r"Forbidden|status=403|Not enough", line)]
    assert not refused, "\n".join(refused[:4])
    # It ran as the leader of the release's Lease.
    holder = op.kube.kubectl(
        "get", "lease", op.env["SLURMJOB_LEASE_NAME"], "-n", op.op_namespace,
        "-o", "jsonpath={.spec.holderIdentity}",
    ).stdout  # fmt: skip
    assert holder == op.env["SLURMJOB_LEASE_IDENTITY"]
    # The leader filled the chart's (Opaque, empty) certificate Secret with the chart's rights
    # alone: get and update on that name, no create.
    secret = json.loads(
        op.kube.kubectl(
            "get", "secret", op.env["SLURMJOB_LOGS_CERT_SECRET"], "-n", op.op_namespace,
            "-o", "json",
        ).stdout
    )  # fmt: skip
    assert secret["type"] == "Opaque"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert secret["metadata"]["labels"]["app.kubernetes.io/instance"] == op.release
    # The chart applied again, server-side and as Argo CD applies (client-side): its manifest
    # names no data, so the certificate the leader wrote stays as it is.
    text = op.kube.helm(
        "template", op.release, str(CHART), "-n", op.op_namespace,
        "-f", str(CHART / "ci/default-values.yaml"),
        "--set", f"watchNamespaces={{{op.namespace}}}", "--set", f"health.port={op.health_port}",
        "--show-only", "templates/rbac.yaml",
    ).stdout  # fmt: skip
    for server_side in (True, False):
        op.kube.apply(text, server_side=server_side)
        again = json.loads(
            op.kube.kubectl(
                "get", "secret", op.env["SLURMJOB_LOGS_CERT_SECRET"], "-n", op.op_namespace,
                "-o", "json",
            ).stdout
        )  # fmt: skip
        assert again["data"] == secret["data"], server_side


@pytest.mark.slurm2605
def test_namespaced_serviceaccount_can_only_what_the_operator_does(
    sa_operator: ChartOperator,
) -> None:
    op = sa_operator
    kube, who, ns = op.kube, op.subject, op.namespace
    sj = "slurmjobs.slurmjob.io"
    for verb in ("get", "list", "watch", "patch", "delete"):  # delete: the TTL after the end
        assert can_i(kube, who, verb, sj, "-n", ns), verb
    assert can_i(kube, who, "patch", sj, "--subresource=status", "-n", ns)
    assert can_i(kube, who, "create", "events", "-n", ns)
    assert can_i(kube, who, "get", "secrets", "-n", ns)
    lease = f"leases.coordination.k8s.io/{op.env['SLURMJOB_LEASE_NAME']}"
    for verb in ("get", "update"):
        assert can_i(kube, who, verb, lease, "-n", op.op_namespace), verb
    assert can_i(kube, who, "create", "leases.coordination.k8s.io", "-n", op.op_namespace)
    # The log API: its reviews, the front proxy's ConfigMap, its own certificate's Secret and
    # its own APIService's caBundle, each by name where RBAC can name it.
    assert can_i(kube, who, "create", "subjectaccessreviews.authorization.k8s.io")
    auth = "configmaps/extension-apiserver-authentication"
    for verb in ("get", "list", "watch"):
        assert can_i(kube, who, verb, auth, "-n", "kube-system"), verb
    cert = f"secrets/{op.release}-slurmjob-operator-logs-serving-cert"
    for verb in ("get", "update"):
        assert can_i(kube, who, verb, cert, "-n", op.op_namespace), verb
    own = "apiservices.apiregistration.k8s.io/v1alpha1.logs.slurmjob.io"
    for verb in ("get", "patch"):
        assert can_i(kube, who, verb, own), verb
    denied = [
        ("create", "tokenreviews.authentication.k8s.io"),  # no token reaches the operator
        ("update", own),
        ("delete", own),
        ("patch", "apiservices.apiregistration.k8s.io/v1beta1.metrics.k8s.io"),
        ("get", "apiservices.apiregistration.k8s.io/v1.slurmjob.io"),
        ("list", "apiservices.apiregistration.k8s.io"),
        ("create", "apiservices.apiregistration.k8s.io"),
        ("delete", cert, "-n", op.op_namespace),
        ("patch", cert, "-n", op.op_namespace),
        ("create", "secrets", "-n", op.op_namespace),  # the chart makes its Secret
        ("get", "secrets/other", "-n", op.op_namespace),
        ("update", "secrets/other", "-n", op.op_namespace),
        ("list", "secrets", "-n", op.op_namespace),
        ("create", "secrets", "-n", ns),
        ("create", "secrets", "-n", "kube-system"),
        ("get", "configmaps/other", "-n", "kube-system"),
        ("update", auth, "-n", "kube-system"),
        ("get", "secrets", "-n", "kube-system"),
        ("get", "leases.coordination.k8s.io/other", "-n", op.op_namespace),
        ("update", "leases.coordination.k8s.io/other", "-n", op.op_namespace),
        ("delete", lease, "-n", op.op_namespace),
        ("list", "leases.coordination.k8s.io", "-n", op.op_namespace),
        ("create", "leases.coordination.k8s.io", "-n", ns),
        ("get", lease, "-n", "default"),
        ("deletecollection", sj, "-n", ns),
        ("create", sj, "-n", ns),
        ("update", sj, "-n", ns),
        ("update", sj, "--subresource=status", "-n", ns),
        ("list", "secrets", "-n", ns),
        ("watch", "secrets", "-n", ns),
        ("get", "configmaps", "-n", ns),
        ("create", "pods", "-n", ns),
        ("patch", "pods", "-n", ns),
        ("patch", "pods", "-n", op.op_namespace),  # no leader label any more: no pod rights
        ("create", "pods", "-n", op.op_namespace),
        ("delete", "pods", "-n", op.op_namespace),
        ("update", "pods", "-n", op.op_namespace),
        ("get", "pods", "-n", op.op_namespace),
        ("delete", "events", "-n", ns),
        ("get", sj, "-n", "default"),
        ("list", sj, "--all-namespaces"),
        ("get", "secrets", "-n", "default"),
        ("get", "secrets", "-n", op.op_namespace),
        ("create", "events", "-n", "default"),
        ("list", "nodes"),
        ("list", "namespaces"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("create", "kopfpeerings.kopf.dev", "-n", ns),
        ("*", "*", "-n", ns),
        ("*", "*", "--all-namespaces"),
    ]
    allowed = [args for args in denied if can_i(kube, who, *args)]
    assert not allowed


def test_namespace_users_get_slurmjobs_through_edit_and_view_never_their_status(
    kube: KubeTestbed,
) -> None:
    """The users' ClusterRoles carry the built-in roles' aggregation labels (this apiserver
    runs no controller-manager to aggregate them, so they are bound directly here): an editor
    creates, changes and deletes SlurmJobs and reads their logs, a viewer reads them; neither
    touches the status, nor anything in another namespace."""
    suffix = uuid.uuid4().hex[:6]
    ns, other = f"roles-{suffix}", f"roles-other-{suffix}"
    docs = render(kube, "-f", str(CHART / "ci/default-values.yaml"))
    editor, viewer = (
        named(docs, "ClusterRole", "slurmjob-editor"),
        named(docs, "ClusterRole", "slurmjob-viewer"),
    )
    aggregated = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in editor["metadata"]["labels"].items() if v == "true"} >= {
        f"{aggregated}edit",
        f"{aggregated}admin",
    }
    assert viewer["metadata"]["labels"][f"{aggregated}view"] == "true"
    for role in (editor, viewer):
        assert all("slurmjobs/status" not in r["resources"] for r in role["rules"])
    logs = named(docs, "ClusterRole", "-logs-reader")
    text = kube.helm(
        "template", "ci", str(CHART), "-n", CI_NAMESPACE,
        "-f", str(CHART / "ci/default-values.yaml"), "--show-only", "templates/userroles.yaml",
    ).stdout  # fmt: skip
    for name in (ns, other):
        kube.kubectl("create", "namespace", name)
    try:
        kube.apply(text)
        for user, role in (("alice", "slurmjob-editor"), ("bob", "slurmjob-viewer")):
            for granted in (role, logs["metadata"]["name"]):
                kube.kubectl(
                    "create", "rolebinding", f"{user}-{granted}", "-n", ns,
                    f"--clusterrole={granted}", f"--user={user}",
                )  # fmt: skip

        def may(user: str, verb: str, namespace: str = ns, sub: str = "") -> bool:
            return _allowed(kube, user, verb, "slurmjobs", namespace, sub, group="slurmjob.io")

        def may_read_logs(user: str) -> bool:
            return _allowed(kube, user, "get", "slurmjobs", ns, "log", group="logs.slurmjob.io")

        # The apiserver's authorizer sees new bindings through its informers: a moment later.
        deadline = time.monotonic() + 15
        while not (may("alice", "get") and may("bob", "get")):
            assert time.monotonic() < deadline, "the bindings never took effect"
            time.sleep(0.2)
        for verb in ("create", "get", "list", "watch", "update", "patch", "delete"):
            assert may("alice", verb), verb
        for verb in ("get", "list", "watch"):
            assert may("bob", verb), verb
        for user in ("alice", "bob"):
            assert may_read_logs(user)
            assert not may(user, "patch", sub="status")
            assert not may(user, "update", sub="status")
            assert not may(user, "get", namespace=other)
        for verb in ("create", "patch", "delete"):
            assert not may("bob", verb), verb
    finally:
        kube.kubectl(
            "delete", "clusterrole", "slurmjob-editor", "slurmjob-viewer", "--ignore-not-found",
            check=False,
        )  # fmt: skip
        for name in (ns, other):
            kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_cluster_wide_serviceaccount_rights(kube: KubeTestbed) -> None:
    suffix = uuid.uuid4().hex[:6]
    release, ns = f"sjcw-{suffix}", f"chart-cw-{suffix}"
    kube.kubectl("create", "namespace", ns)
    try:
        apply_rbac(kube, release, ns, "--set", "rbac.secrets=false")
        who = f"system:serviceaccount:{ns}:{release}-slurmjob-operator"
        sj = "slurmjobs.slurmjob.io"
        for verb in ("get", "list", "watch", "patch", "delete"):
            assert can_i(kube, who, verb, sj, "--all-namespaces"), verb
        assert can_i(kube, who, "patch", sj, "--subresource=status", "-n", "default")
        assert can_i(kube, who, "create", "events", "-n", "default")
        for args in [
            ("get", "secrets", "-n", "default"),  # rbac.secrets=false
            ("deletecollection", sj, "-n", "default"),
            ("create", "pods", "-n", "default"),
            ("get", "configmaps", "-n", "default"),
            ("list", "nodes"),
            ("get", "namespaces"),  # only with the log archive
            ("*", "*", "--all-namespaces"),
        ]:
            assert not can_i(kube, who, *args), args
        archive = ("--set", "archive.enabled=true", "--set", "archive.existingClaim=logs")
        apply_rbac(kube, release, ns, "--set", "rbac.secrets=false", *archive)
        assert can_i(kube, who, "get", f"namespaces/{ns}")
        assert not can_i(kube, who, "list", "namespaces")
        assert not can_i(kube, who, "delete", f"namespaces/{ns}")
        # rbac.secrets (default) with no tenants: `get` on Secrets nowhere; in a namespace of
        # rbac.secretNamespaces only; everywhere only with rbac.secretsClusterWide.
        apply_rbac(kube, release, ns)
        assert not can_i(kube, who, "get", "secrets", "-n", ns)
        assert not can_i(kube, who, "get", "secrets", "-n", "default")
        apply_rbac(kube, release, ns, "--set", f"rbac.secretNamespaces={{{ns}}}")
        assert can_i(kube, who, "get", "secrets", "-n", ns)
        for args in [
            ("get", "secrets", "-n", "default"),
            ("get", "secrets", "-n", "kube-system"),
            ("list", "secrets", "-n", ns),
            ("create", "secrets", "-n", ns),
        ]:
            assert not can_i(kube, who, *args), args
        apply_rbac(kube, release, ns, "--set", "rbac.secretsClusterWide=true")
        assert can_i(kube, who, "get", "secrets", "-n", "default")
        assert not can_i(kube, who, "list", "secrets", "-n", "default")
    finally:
        delete_release_rbac(kube, release)
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_the_log_archive_is_mounted_from_its_own_claim_with_its_settings(
    kube: KubeTestbed,
) -> None:
    """archive.*: the archive's own claim at archive.root in the operator's pod only, its four
    settings, and `get` on namespaces (only the watched ones when they are listed)."""
    base = ("-f", str(CHART / "ci/default-values.yaml"))
    assert "SLURMJOB_ARCHIVE_ROOT" not in env_of(render(kube, *base))
    on = ("--set", "archive.enabled=true", "--set", "archive.existingClaim=slurmjob-logs")
    docs = render(
        kube, *base, *on, "--set", "archive.retentionDays=7", "--set", "archive.maxBytes=2147483648"
    )
    env = env_of(docs)
    assert env["SLURMJOB_ARCHIVE_ROOT"] == "/var/lib/slurmjob-archive"
    assert env["SLURMJOB_ARCHIVE_RETENTION_DAYS"] == "7"
    assert env["SLURMJOB_ARCHIVE_MAX_BYTES"] == "2147483648"
    assert env["SLURMJOB_ARCHIVE_FILE_MAX_BYTES"] == "16777216"
    assert volumes(docs)["archive"]["persistentVolumeClaim"] == {"claimName": "slurmjob-logs"}
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    assert mounts["archive"]["mountPath"] == "/var/lib/slurmjob-archive"
    roles = {r["metadata"]["name"]: r for r in of_kind(docs, "ClusterRole")}
    assert roles["ci-slurmjob-operator-archive"]["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}
    ]
    listed = render(kube, *base, *on, "--set", "watchNamespaces={team-a,team-b}")
    roles = {r["metadata"]["name"]: r for r in of_kind(listed, "ClusterRole")}
    [rule] = roles["ci-slurmjob-operator-archive"]["rules"]
    assert rule["resourceNames"] == ["team-a", "team-b"]
    error = render_error(kube, *base, "--set", "archive.enabled=true")
    assert "existingClaim" in error


def _allowed(
    kube: KubeTestbed,
    user: str,
    verb: str,
    resource: str,
    namespace: str = "",
    sub: str = "",
    *,
    group: str = "kueue.x-k8s.io",
) -> bool:
    """A SubjectAccessReview (in group kueue.x-k8s.io unless told): unlike `kubectl auth
    can-i`, it needs no discovery of the CRDs, which may not be installed yet."""
    attrs = {"verb": verb, "group": group, "resource": resource}
    if namespace:
        attrs["namespace"] = namespace
    if sub:
        attrs["subresource"] = sub
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": attrs},
    }
    proc = kube.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
    return bool(json.loads(proc.stdout)["status"].get("allowed"))


def test_kueue_rights_only_with_kueue_enabled(kube: KubeTestbed) -> None:
    """kueue.enabled grants what the operator does with Kueue (docs/kueue.md, RBAC) and no
    more; without it, nothing of Kueue's."""
    suffix = uuid.uuid4().hex[:6]
    ns = f"chart-kq-{suffix}"
    kube.kubectl("create", "namespace", ns)
    releases = {f"sjkq-{suffix}": True, f"sjnokq-{suffix}": False, f"sjkqns-{suffix}": True}
    try:
        for release, enabled in releases.items():
            values = ["--set", f"kueue.enabled={str(enabled).lower()}"]
            if release.startswith("sjkqns"):  # watchNamespaces: Roles, and the cluster kinds
                values += ["--set", "watchNamespaces={default}"]
            apply_rbac(kube, release, ns, *values)
        for release, enabled in releases.items():
            who = f"system:serviceaccount:{ns}:{release}-slurmjob-operator"
            granted = [
                ("create", "workloads", "default", ""),
                ("patch", "workloads", "default", ""),
                ("delete", "workloads", "default", ""),
                ("watch", "workloads", "default", ""),
                ("patch", "workloads", "default", "status"),
                ("get", "workloadpriorityclasses", "", ""),
                ("get", "resourceflavors", "", ""),
                ("get", "localqueues", "default", ""),
            ]
            for verb, resource, namespace, sub in granted:
                allowed = _allowed(kube, who, verb, resource, namespace, sub)
                assert allowed is enabled, (release, verb, resource, sub)
            # The Workloads' owner references set blockOwnerDeletion: OpenShift's admission
            # lets only who may update the SlurmJob's finalizers set it.
            finalizers = _allowed(
                kube, who, "update", "slurmjobs", "default", "finalizers", group="slurmjob.io"
            )
            assert finalizers is enabled, release
            if release.startswith("sjkqns"):
                assert not _allowed(kube, who, "get", "workloads", "kube-system"), release
            for verb, resource, namespace in [
                ("update", "workloads", "default"),
                ("create", "localqueues", "default"),
                ("delete", "resourceflavors", ""),
                ("patch", "clusterqueues", ""),
            ]:
                assert not _allowed(kube, who, verb, resource, namespace), (release, verb)
    finally:
        kube.kubectl(
            "delete", "role,rolebinding", f"sjkqns-{suffix}-slurmjob-operator", "-n", "default",
            "--ignore-not-found", check=False,
        )  # fmt: skip
        for release in releases:
            delete_release_rbac(kube, release)
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
