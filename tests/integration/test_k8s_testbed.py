"""The Kubernetes test bed itself works: kubectl and helm against the local kube-apiserver,
RBAC, and the project's CRD with its CEL rules. No operator code runs here."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.k8s.kube import KubeTestbed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "slurmjob.io_slurmjobs.yaml"
CRD_NAME = "slurmjobs.slurmjob.io"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

# A CRD of our own with a CEL rule: proves CEL validation works without the project's CRD.
WIDGET_CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.testbed.slurmjob.io
spec:
  group: testbed.slurmjob.io
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                replicas: {type: integer, minimum: 0}
                maxReplicas: {type: integer, minimum: 0}
              x-kubernetes-validations:
                - rule: "!has(self.replicas) || self.replicas <= self.maxReplicas"
                  message: replicas must not exceed maxReplicas
                  fieldPath: .replicas
"""


def widget(name: str, replicas: int, max_replicas: int) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "testbed.slurmjob.io/v1",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "maxReplicas": max_replicas},
        }
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def ensure_namespace(kube: KubeTestbed, name: str) -> None:
    kube.apply(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    )


# ----------------------------------------------------------------------------- the bed


def test_client_and_server_versions(kube: KubeTestbed) -> None:
    out = json.loads(kube.kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"] == kube.version
    assert out["serverVersion"]["gitVersion"] == kube.version
    assert out["serverVersion"]["minor"] == kube.version.split(".")[1]


def test_admin_can_do_everything(kube: KubeTestbed) -> None:
    assert kube.kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"
    who = json.loads(kube.kubectl("auth", "whoami", "-o", "json").stdout)
    assert "system:masters" in who["status"]["userInfo"]["groups"]


def test_rbac_denies_an_unbound_user(kube: KubeTestbed) -> None:
    user = kube.kubeconfig_for("testbed-nobody")
    proc = kube.kubectl("auth", "can-i", "list", "pods", kubeconfig=user, check=False)
    assert proc.returncode == 1
    assert proc.stdout.strip() == "no"
    proc = kube.kubectl("get", "namespaces", kubeconfig=user, check=False)
    assert proc.returncode != 0
    assert "forbidden" in proc.stderr.lower()


def test_create_namespace(kube: KubeTestbed) -> None:
    name = unique("testbed-ns")
    kube.kubectl("create", "namespace", name)
    got = json.loads(kube.kubectl("get", "namespace", name, "-o", "json").stdout)
    assert got["status"]["phase"] == "Active"
    # No controller-manager: the namespace stays Terminating, so do not wait for it.
    kube.kubectl("delete", "namespace", name, "--wait=false")


def test_helm_reaches_the_apiserver(kube: KubeTestbed) -> None:
    assert kube.helm("version", "--short").stdout.startswith("v3.")
    releases = json.loads(kube.helm("list", "--all-namespaces", "-o", "json").stdout)
    assert isinstance(releases, list)


def test_own_crd_cel_rule(kube: KubeTestbed) -> None:
    kube.apply(WIDGET_CRD)
    kube.wait_established("widgets.testbed.slurmjob.io")
    kube.apply(widget("ok", 1, 2))
    proc = kube.apply(widget(unique("bad"), 3, 2), check=False)
    assert proc.returncode != 0
    assert "replicas must not exceed maxReplicas" in proc.stderr


# ----------------------------------------------------------------------------- the project CRD


@pytest.fixture(scope="module")
def slurmjob_crd(kube: KubeTestbed) -> dict[str, Any]:
    if not CRD_FILE.is_file():
        pytest.skip(f"{CRD_FILE.relative_to(REPO)} does not exist yet")
    kube.apply(CRD_FILE)
    kube.wait_established(CRD_NAME)
    crd: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return crd


def cel_messages(node: Any) -> list[str]:
    """Every x-kubernetes-validations message in a (part of a) CRD."""
    found: list[str] = []
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", []):
            found.append(rule["message"])
        for value in node.values():
            found += cel_messages(value)
    elif isinstance(node, list):
        for value in node:
            found += cel_messages(value)
    return found


def cel_message(crd: dict[str, Any], phrase: str) -> str:
    matches = [m for m in cel_messages(crd) if phrase in m]
    assert len(matches) == 1, f"expected one CEL message containing {phrase!r}, got {matches}"
    return matches[0]


def load_example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    return doc


def test_project_crd_is_established(kube: KubeTestbed, slurmjob_crd: dict[str, Any]) -> None:
    got = json.loads(kube.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    assert got["spec"]["group"] == "slurmjob.io"
    served = [v["name"] for v in got["spec"]["versions"] if v["served"]]
    assert "v1alpha1" in served
    resources = kube.kubectl("api-resources", "--api-group=slurmjob.io", "-o", "name").stdout
    assert CRD_NAME in resources.split()


def test_examples_are_accepted(kube: KubeTestbed, slurmjob_crd: dict[str, Any]) -> None:
    assert len(EXAMPLES) >= 3, f"expected the three examples, found {EXAMPLES}"
    docs = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    for doc in docs:
        ensure_namespace(kube, doc["metadata"].get("namespace", "default"))
    for path in EXAMPLES:
        kube.apply(path)
    listed = json.loads(kube.kubectl("get", "slurmjobs", "-A", "-o", "json").stdout)
    have = {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in listed["items"]}
    for doc in docs:
        meta = doc["metadata"]
        assert (meta.get("namespace", "default"), meta["name"]) in have
    # What went in is stored (schema defaults may add fields; nothing of ours was pruned).
    for doc in docs:
        meta = doc["metadata"]
        stored = json.loads(
            kube.kubectl(
                "get",
                "slurmjob",
                meta["name"],
                "-n",
                meta.get("namespace", "default"),
                "-o",
                "json",
            ).stdout
        )
        assert [p["name"] for p in stored["spec"]["pools"]] == [
            p["name"] for p in doc["spec"]["pools"]
        ]
        assert stored["spec"]["command"] == doc["spec"]["command"]


def _with_image(doc: dict[str, Any]) -> None:
    doc["spec"]["framework"]["image"] = "docker.io/library/python:3.12"


def _cpu_two_pools(doc: dict[str, Any]) -> None:
    extra = copy.deepcopy(doc["spec"]["pools"][0])
    extra["name"] = "second"
    doc["spec"]["pools"].append(extra)


def _mixed_pools(doc: dict[str, Any]) -> None:
    extra = copy.deepcopy(doc["spec"]["pools"][0])
    extra.update(name="gpu", gpusPerNode=4, gpuSeries="h100")
    doc["spec"]["pools"].append(extra)


@pytest.mark.parametrize(
    ("mutate", "phrase"),
    [
        pytest.param(_with_image, "set exactly one of runtimeId and image", id="framework-image"),
        pytest.param(_cpu_two_pools, "a CPU-only job has exactly one pool", id="cpu-two-pools"),
        pytest.param(_mixed_pools, "a GPU job cannot have a pool with gpusPerNode 0", id="mixed"),
    ],
)
def test_invalid_slurmjob_is_rejected(
    kube: KubeTestbed, slurmjob_crd: dict[str, Any], mutate: Any, phrase: str
) -> None:
    message = cel_message(slurmjob_crd, phrase)
    doc = load_example("cpu-job.yaml")
    doc["metadata"] = {"name": unique("invalid"), "namespace": "default"}
    # The unchanged document is valid (server-side dry run), so the rejection is the rule's.
    kube.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc))
    mutate(doc)
    proc = kube.kubectl("create", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0, f"accepted an invalid SlurmJob:\n{proc.stdout}"
    assert "is invalid" in proc.stderr
    assert message in proc.stderr
    gone = kube.kubectl("get", "slurmjob", doc["metadata"]["name"], check=False)
    assert gone.returncode != 0


IMMUTABLE = "is immutable: create a new SlurmJob"


def _patched(kube: KubeTestbed, name: str, patch: dict[str, Any]) -> Any:
    return kube.kubectl(
        "patch",
        "slurmjob",
        name,
        "-n",
        "default",
        "--type=merge",
        "-p",
        json.dumps(patch),
        check=False,
    )


#: Edits the apiserver refuses, each with the field its message names.
REFUSED_EDITS = [
    ({"spec": {"command": ["echo", "other"]}}, "command"),
    ({"spec": {"timeLimit": "45m"}}, "timeLimit"),
    ({"spec": {"env": [{"name": "A", "value": "1"}]}}, "env"),
    ({"spec": {"qos": "high"}}, "qos"),  # a field added
    ({"spec": {"framework": {"runtimeId": "custom-other"}}}, "framework"),
]


def test_a_spec_is_immutable_but_suspend_and_ttl(
    kube: KubeTestbed, slurmjob_crd: dict[str, Any]
) -> None:
    """Issue 45: the apiserver refuses a spec edit, naming the field and saying to create a new
    SlurmJob; suspend and ttlSecondsAfterFinished change; the same manifest applies again, and
    labels and the status still change."""
    doc = load_example("cpu-job.yaml")
    doc["metadata"] = {"name": unique("immutable"), "namespace": "default"}
    name = doc["metadata"]["name"]
    kube.kubectl("create", "-f", "-", input=yaml.safe_dump(doc))
    try:
        for patch, field in REFUSED_EDITS:
            refused = _patched(kube, name, patch)
            assert refused.returncode != 0, refused.stdout
            assert f"spec.{field} {IMMUTABLE}" in refused.stderr, refused.stderr
        for allowed in ({"spec": {"suspend": True}}, {"spec": {"ttlSecondsAfterFinished": 60}}):
            done = _patched(kube, name, allowed)
            assert done.returncode == 0, done.stderr
        kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))  # suspend back, TTL kept
        labelled = kube.kubectl("label", "slurmjob", name, "-n", "default", "team=a", check=False)
        assert labelled.returncode == 0, labelled.stderr
        status = kube.kubectl(
            "patch",
            "slurmjob",
            name,
            "-n",
            "default",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"phase": "Pending"}}),
            check=False,
        )
        assert status.returncode == 0, status.stderr
        stored = json.loads(
            kube.kubectl("get", "slurmjob", name, "-n", "default", "-o", "json").stdout
        )
        assert stored["spec"]["command"] == doc["spec"]["command"]
        assert stored["spec"]["ttlSecondsAfterFinished"] == 60
    finally:
        kube.kubectl("delete", "slurmjob", name, "-n", "default", "--wait=false", check=False)
