"""The Helm chart's files without helm: the CRD copy, values against values.schema.json, RBAC
without wildcards, and every operator setting wired into the Deployment. (Rendering, lint and
the API server's verdict are in tests/integration/test_chart.py.)"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from slurmjob_operator.config import Settings
from slurmjob_operator.gen.chartcrd import chart_template
from slurmjob_operator.site.tenantentry import Tenant
from slurmjob_operator.site.tenants import Tenants

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "slurmjob-operator"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)


def env_template() -> str:
    """The operator container's environment as the chart writes it (a helper the Deployment
    and the helm test's Job both include)."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    start = helpers.index('{{- define "slurmjob-operator.env" -}}')
    return helpers[start : helpers.index("{{- end }}\n\n", start)]


TENANT = {"name": "a", "namespaces": ["a"], "accounts": ["a"], "partitions": ["p"]}


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a values file over values.yaml (maps merge, the rest replaces)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def errors(values: dict[str, Any]) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(values)
    ]


def test_chart_crd_is_the_canonical_crd_as_a_kept_template() -> None:
    """The chart has no crds/ folder (Helm would install it before the template, which would
    then fail) and its template is the canonical CRD, kept on uninstall and prune."""
    canonical = (REPO / "crds" / "slurmjob.io_slurmjobs.yaml").read_text()
    assert not (CHART / "crds").exists()
    assert (CHART / "templates" / "crd.yaml").read_text() == chart_template(canonical), (
        "charts/slurmjob-operator/templates/crd.yaml is stale: make crd"
    )
    text = chart_template(canonical)
    assert "helm.sh/resource-policy: keep" in text
    assert "argocd.argoproj.io/sync-options: Prune=false,Delete=false" in text
    with pytest.raises(ValueError, match="delimiters"):
        chart_template(canonical.replace("listKind", "{{ listKind }}"))
    with pytest.raises(ValueError, match="not the CRD"):
        chart_template("kind: ConfigMap\n")


def test_schema_is_a_valid_draft7_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_values_yaml_is_valid() -> None:
    assert errors(VALUES) == []


@pytest.mark.parametrize("path", CI_VALUES, ids=lambda p: p.name)
def test_every_ci_values_file_is_valid(path: Path) -> None:
    assert errors(merged(VALUES, yaml.safe_load(path.read_text()))) == []


def test_the_schema_types_every_value_in_values_yaml() -> None:
    """Each leaf of values.yaml has a schema node of its own (no value slips through an
    untyped object), except inside the Kubernetes pass-through structures."""
    passthrough = {"resources", "podSecurityContext", "securityContext", "affinity"}

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        assert node, f"{path}: not in values.schema.json"
        if path in passthrough:
            return
        if isinstance(value, dict) and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path}: open object"
            for key, sub in value.items():
                walk(sub, node["properties"].get(key, {}), f"{path}.{key}".lstrip("."))
        elif isinstance(value, dict):
            assert "additionalProperties" in node, f"{path}: untyped map"

    walk(VALUES, SCHEMA, "")


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ({"slurm": {"restURL": "http://typo"}}, "slurm"),
        ({"slurm": {"runtimeProfile": "docker"}}, "slurm.runtimeProfile"),
        ({"slurm": {"apiVersion": "v0.0.39"}}, "slurm.apiVersion"),
        ({"slurm": {"auth": {"mode": "password"}}}, "slurm.auth.mode"),
        ({"slurm": {"restUrl": "slurmrestd:6820"}}, "slurm.restUrl"),
        ({"watchNamespaces": ["Team_A"]}, "watchNamespaces.0"),
        ({"storage": {"root": "relative/path"}}, "storage.root"),
        ({"storage": {"stagingOwner": "slurm"}}, "storage.stagingOwner"),
        (
            {"catalogs": {"runtimes": [{"id": "x", "format": "sif", "path": "a.sif"}]}},
            "catalogs.runtimes.0",
        ),
        (
            {
                "catalogs": {
                    "runtimes": [{"id": "x", "format": "oci", "path": "a", "sha256": "0" * 64}]
                }
            },
            "catalogs.runtimes.0.format",
        ),
        (
            {"catalogs": {"gpuSeries": [{"name": "h100", "gpusPerNode": 0}]}},
            "catalogs.gpuSeries.0.gpusPerNode",
        ),
        (
            {"catalogs": {"tenants": [{"name": "a", "namespaces": ["a"], "partitions": ["p"]}]}},
            "catalogs.tenants.0",
        ),
        (
            {"catalogs": {"tenants": [{**TENANT, "accounts": []}]}},
            "catalogs.tenants.0.accounts",
        ),
        (
            {"catalogs": {"tenants": [{**TENANT, "partitions": ["gpu,debug"]}]}},
            "catalogs.tenants.0.partitions.0",
        ),
        (
            {"catalogs": {"tenants": [{**TENANT, "mountSources": ["/lustre/a"]}]}},
            "catalogs.tenants.0.mountSources.0",
        ),
        (
            {"catalogs": {"tenants": [{**TENANT, "maxTimeLimit": "1 day"}]}},
            "catalogs.tenants.0.maxTimeLimit",
        ),
        (
            {"catalogs": {"tenants": [{**TENANT, "slurmUser": "root"}]}},
            "catalogs.tenants.0.slurmUser",
        ),
        ({"catalogs": {"tenants": [{**TENANT, "acounts": ["a"]}]}}, "catalogs.tenants.0"),
        ({"metrics": {"port": 70000}}, "metrics.port"),
        (
            {"metrics": {"prometheusRule": {"submittingFor": "15 minutes"}}},
            "metrics.prometheusRule.submittingFor",
        ),
        ({"rbac": {"secrets": "yes"}}, "rbac.secrets"),
        ({"apiService": {"caBundle": "not a PEM"}}, "apiService.caBundle"),
        ({"apiService": {"tls": {"secretName": "Bad_Name"}}}, "apiService.tls.secretName"),
        ({"apiService": {"tls": {"name": "typo"}}}, "apiService.tls"),
        ({"certManager": {"issuerRef": {"kind": "Vault"}}}, "certManager.issuerRef.kind"),
        ({"certManager": {"duration": "90 days"}}, "certManager.duration"),
        ({"certManager": {"renewBefore": "30d"}}, "certManager.renewBefore"),
        ({"logs": {"service": {"port": 0}}}, "logs.service.port"),
        ({"replicaCount": 2}, ""),
    ],
)
def test_invalid_values_are_refused_where_they_are_wrong(
    override: dict[str, Any], where: str
) -> None:
    found = errors(merged(VALUES, override))
    assert found, override
    assert any(e.split(":")[0] == where for e in found), found


def _rules_helper(name: str = "rules") -> str:
    """A rules helper's text, to the `end` of its define (a blank line follows it)."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    match = re.search(
        rf'define "slurmjob-operator\.{name}" -\}}\}}\n(.*?)\{{\{{- end \}}\}}\n\n', helpers, re.S
    )
    assert match, f"the {name} helper moved"
    return match.group(1)


def _granted(text: str) -> set[tuple[str, str, str]]:
    lines = [line for line in text.splitlines() if not line.strip().startswith("{{")]
    return {
        (group, resource, verb)
        for rule in yaml.safe_load("\n".join(lines))
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_rules_name_no_wildcard() -> None:
    text = _rules_helper() + (CHART / "templates" / "rbac.yaml").read_text()
    assert "*" not in re.sub(r"(?m)#.*$", "", text)


def test_rbac_rules_are_exactly_the_operators_calls() -> None:
    """With the template conditionals removed (all rules on): what docs/helm.md lists. Secrets
    are a rule of their own, never in the shared rules (a ClusterRole holds those)."""
    assert _granted(_rules_helper()) == {
        *(
            ("slurmjob.io", "slurmjobs", verb)
            for verb in ("get", "list", "watch", "patch", "delete")
        ),
        ("slurmjob.io", "slurmjobs/status", "patch"),
        ("", "events", "create"),
        *(
            ("kueue.x-k8s.io", "workloads", verb)
            for verb in ("get", "list", "watch", "create", "patch", "delete")
        ),
        ("kueue.x-k8s.io", "workloads/status", "patch"),
        ("kueue.x-k8s.io", "localqueues", "get"),
        # Workloads are made with blockOwnerDeletion: OpenShift's admission wants this.
        ("slurmjob.io", "slurmjobs/finalizers", "update"),
    }
    assert _granted(_rules_helper("secretsRule")) == {("", "secrets", "get")}


def test_no_role_of_the_chart_may_create_secrets() -> None:
    """The serving certificate's Secret is the chart's: the operator may read and replace
    that one name, and create none (it could mint a token Secret for any ServiceAccount)."""
    rbac = (CHART / "templates" / "rbac.yaml").read_text()
    serving = rbac[rbac.index("name: {{ $fullname }}-serving-cert") :].split("---")[0]
    text = serving[serving.index("rules:") :].replace("{{ $secret | quote }}", "SECRET")
    assert yaml.safe_load(text)["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["SECRET"],
            "verbs": ["get", "update"],
        }
    ]
    for text in (rbac, _rules_helper(), _rules_helper("secretsRule")):
        for rule in re.findall(r"resources: \[\"?secrets\"?\]\n\s*verbs: \[([^\]]*)\]", text):
            assert "create" not in rule


def test_the_serving_cert_secret_has_no_data_for_helm_or_argo_to_own() -> None:
    rbac = (CHART / "templates" / "rbac.yaml").read_text()
    start = rbac.index("kind: Secret\n")
    secret = rbac[start : rbac.index("{{- end }}", start)]
    assert "type: Opaque" in secret
    assert "data" not in secret.lower().replace("metadata", "")
    # Rendered over no Secret an earlier operator made (lookup), only a missing or Helm's own.
    guard = rbac[:start].rsplit("{{- if", 1)[1]
    assert 'lookup "v1" "Secret"' in rbac[:start]
    assert "meta.helm.sh/release-name" in guard


def test_every_operator_setting_is_set_by_the_deployment() -> None:
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert '{{- include "slurmjob-operator.env" . | nindent 12 }}' in deployment
    env = env_template()
    missing = [
        Settings.env_name(field)
        for field in Settings.model_fields
        if f"- name: {Settings.env_name(field)}\n" not in env
    ]
    assert missing == []


def test_the_tenants_values_are_the_tenants_file() -> None:
    """What `catalogs.tenants` admits is what the operator's loader takes: the ci values'
    tenants load as they are, and the schema names every key the loader knows."""
    values = yaml.safe_load((CHART / "ci" / "signing-key-pvc-values.yaml").read_text())
    tenants = Tenants.model_validate({"tenants": values["catalogs"]["tenants"]})
    assert [t.name for t in tenants.tenants] == ["team-a", "team-b"]
    node = SCHEMA["properties"]["catalogs"]["properties"]["tenants"]["items"]
    known = {info.alias or name for name, info in Tenant.model_fields.items()}
    assert set(node["properties"]) == known
    required = {
        info.alias or name for name, info in Tenant.model_fields.items() if info.is_required()
    }
    assert set(node["required"]) == required


def test_the_charts_apiservice_is_the_log_apis() -> None:
    """The APIService the chart registers, the one the leader may patch (RBAC) and the one it
    is told to patch are the log API's group and version, and it points at the Service in
    front of the log port."""
    from slurmjob_operator.api.logs import API_GROUP, API_SERVICE_NAME, API_VERSION

    logs = (CHART / "templates" / "logs.yaml").read_text()
    assert f"  name: {API_SERVICE_NAME}\n" in logs
    assert f"  group: {API_GROUP}\n  version: {API_VERSION}\n" in logs
    assert "targetPort: logs" in logs
    users = (CHART / "templates" / "userroles.yaml").read_text()
    assert f"apiGroups: [{API_GROUP}]\n    resources: [slurmjobs/log]\n    verbs: [get]" in users
    rbac = (CHART / "templates" / "rbac.yaml").read_text()
    assert f"resourceNames: [{API_SERVICE_NAME}]\n    verbs: [get, patch]" in rbac
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert f"- name: SLURMJOB_LOGS_APISERVICE\n  value: {API_SERVICE_NAME}\n" in env_template()
    assert "- name: logs\n              containerPort: {{ .Values.logs.port }}" in deployment
    assert VALUES["logs"]["port"] not in (VALUES["health"]["port"], VALUES["metrics"]["port"])


def test_deprecated_keys_still_pass_the_schema() -> None:
    """Values files written for the service-proxy log endpoint and the pod label still install
    (the keys do nothing)."""
    old = {
        "logs": {
            "service": {"name": "slurmjob-operator-logs", "port": 8081, "annotations": {"a": "b"}},
            "proxySubjects": [{"kind": "Group", "name": "system:authenticated"}],
        },
        "leaderElection": {"podLabel": True},
    }
    assert errors(merged(VALUES, old)) == []
    assert "service" not in VALUES["logs"]
    assert "proxySubjects" not in VALUES["logs"]


def test_the_image_exposes_the_ports_the_chart_serves() -> None:
    dockerfile = (CHART.parents[1] / "Dockerfile").read_text()
    (line,) = [x for x in dockerfile.splitlines() if x.startswith("EXPOSE ")]
    exposed = {int(p) for p in line.split()[1:]}
    assert exposed == {VALUES["health"]["port"], VALUES["logs"]["port"], VALUES["metrics"]["port"]}


def test_the_chart_has_no_image_and_no_uid_of_its_own() -> None:
    """There is no public image and no uid right for every site: both must be given."""
    assert VALUES["image"]["repository"] == ""
    assert "runAsUser" not in VALUES["podSecurityContext"]
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'required "image.repository is required' in helpers
    assert 'required "podSecurityContext.runAsUser is required' in helpers
