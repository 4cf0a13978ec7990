"""`helm upgrade` from the chart as it was before the CRD became a template (issue 25), on the
real apiserver: the CRD an earlier chart left without Helm's ownership metadata is refused
until it is taken over with exactly the lines docs/helm.md gives, then upgraded in place (the
new schema served, the keep policy and Argo CD's sync options on it), and `helm uninstall`
leaves it.

Alone (tests/budgets.toml, `exclusive`): it puts the older CRD back for a moment, which every
other module's SlurmJobs would feel.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_operator_e2e import CRD
from tests.k8s.kube import KubeTestbed

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "slurmjob-operator"
CRD_NAME = "slurmjobs.slurmjob.io"
#: The last commit whose chart shipped the CRD in its crds/ folder, and whose CRD has no
#: spec.ttlSecondsAfterFinished (the field the upgrade must bring).
CHART_BEFORE = "3aa68a1bfb7347851c44095b15de583b93f044a1"
#: Neither release of this test registers cluster-wide objects of fixed names that other
#: modules use (the users' ClusterRoles, the log API's APIService).
QUIET = ["--set", "userRoles.create=false", "--set", "apiService.enabled=false"]


def _old_chart(tmp: Path) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout: no earlier chart to upgrade from")
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", CHART_BEFORE, "charts/"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert archive.returncode == 0, (
        f"commit {CHART_BEFORE} is not in the history: {archive.stderr!r}"
    )
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True, timeout=60)
    chart = tmp / "charts" / "slurmjob-operator"
    assert (chart / "crds").is_dir(), "that chart shipped its CRD in crds/"
    return chart


def _crd(kube: KubeTestbed) -> dict[str, Any]:
    text = kube.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout
    crd: dict[str, Any] = json.loads(text)
    return crd


def _spec_fields(crd: dict[str, Any]) -> set[str]:
    [version] = crd["spec"]["versions"]
    return set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def _takeover_lines(release: str, namespace: str) -> list[list[str]]:
    """The `kubectl` lines of docs/helm.md's takeover, for this release."""
    doc = (REPO / "docs" / "helm.md").read_text()
    section = doc.split("**Taking over a CRD installed by an earlier chart.**", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split() for line in block.splitlines() if line.startswith("kubectl ")]
    assert len(lines) == 2, block
    swap = {"slurmjob": release, "slurmjob-system": namespace}
    return [
        [re.sub(r"=(slurmjob|slurmjob-system)$", lambda m: "=" + swap[m[1]], w) for w in line]
        for line in lines
    ]


def test_helm_upgrade_takes_over_and_upgrades_the_crd(kube: KubeTestbed, tmp_path: Path) -> None:
    old = _old_chart(tmp_path)
    release, namespace = f"sjup-{uuid.uuid4().hex[:6]}", f"chart-up-{uuid.uuid4().hex[:6]}"
    # The CRD as the earlier chart's crds/ folder left it: that version's, no Helm metadata.
    kube.apply(old / "crds" / "slurmjob.io_slurmjobs.yaml")
    kube.wait_established(CRD_NAME)
    assert "ttlSecondsAfterFinished" not in _spec_fields(_crd(kube))
    try:
        kube.helm(
            "install", release, str(old), "-n", namespace, "--create-namespace",
            "-f", str(old / "ci" / "default-values.yaml"), *QUIET,
        )  # fmt: skip
        # No admission policies: this install is cluster-wide, and its status policy would
        # refuse every other module's status writes (tests/integration/test_admission_e2e.py
        # installs them limited to its own namespaces).
        upgrade = [
            "upgrade", release, str(CHART), "-n", namespace,
            "-f", str(CHART / "ci" / "default-values.yaml"), "--set", "admission.enabled=false",
            *QUIET,
        ]  # fmt: skip
        refused = kube.helm(*upgrade, check=False)
        assert refused.returncode != 0
        assert "invalid ownership metadata" in refused.stderr, refused.stderr
        assert "ttlSecondsAfterFinished" not in _spec_fields(_crd(kube)), "nothing changed"
        for line in _takeover_lines(release, namespace):
            assert line[0] == "kubectl"
            kube.kubectl(*line[1:])
        kube.helm(*upgrade)
        crd = _crd(kube)
        assert "ttlSecondsAfterFinished" in _spec_fields(crd), "the new schema is served"
        annotations = crd["metadata"]["annotations"]
        assert annotations["helm.sh/resource-policy"] == "keep"
        assert annotations["argocd.argoproj.io/sync-options"] == "Prune=false,Delete=false"
        assert annotations["meta.helm.sh/release-name"] == release
        kube.helm("uninstall", release, "-n", namespace)
        assert "ttlSecondsAfterFinished" in _spec_fields(_crd(kube)), "kept on uninstall"
    finally:
        kube.helm("uninstall", release, "-n", namespace, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        # The shared CRD as every other module expects it: the canonical one, no release's.
        kube.kubectl(
            "annotate", "crd", CRD_NAME, "meta.helm.sh/release-name-",
            "meta.helm.sh/release-namespace-", check=False,
        )  # fmt: skip
        kube.kubectl("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by-", check=False)
        kube.apply(CRD)
        kube.wait_established(CRD_NAME)
