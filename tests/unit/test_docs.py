"""The docs that are generated from, or must cover, the code: they cannot drift.

* docs/crd.md is the output of `python -m slurmjob_operator.gen.docs`;
* docs/configuration.md lists every setting (with its default) and every Helm value;
* the Grafana dashboard queries only metrics the operator exports;
* the SlurmJob inside the Argo Workflows example is valid against the CRD.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from slurmjob_operator.config import Settings
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.gen import docs
from slurmjob_operator.metrics import Metrics

from .test_crd import apply_defaults, cel_errors, crd_schema, strip_extensions

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"
VALUES = ROOT / "charts" / "slurmjob-operator" / "values.yaml"
DASHBOARD = ROOT / "docs" / "grafana" / "slurmjob-operator.json"
WORKFLOW = ROOT / "examples" / "argo" / "workflow.yaml"


def test_crd_reference_is_generated() -> None:
    text = (ROOT / "docs" / "crd.md").read_text()
    assert text == docs.render(), (
        "docs/crd.md is stale: python -m slurmjob_operator.gen.docs > docs/crd.md"
    )


def test_crd_reference_covers_every_field_and_rule() -> None:
    text = docs.render()
    schema = crd_schema()
    for section in ("spec", "status"):
        for obj in docs.objects(schema["properties"][section], section):
            assert f"### `{obj.path}`" in text
            for name in obj.node.get("properties", {}):
                assert f"| `{name}` |" in text
    for rule in re.findall(r"'rule': '([^']*)'", str(schema)):
        assert rule.replace("|", "\\|")[:40] in text


def test_every_condition_reason_is_documented() -> None:
    text = (ROOT / "docs" / "crd.md").read_text(encoding="utf-8")
    for reason in Reason:
        assert f"| `{reason}` |" in text
    assert "`Suspended`=True" in text
    assert "`SlurmReachable`=False" in text


# -- configuration --------------------------------------------------------------------------------


def _table_rows(text: str) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def _doc_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def test_every_setting_is_documented_with_its_default() -> None:
    rows = _table_rows(CONFIGURATION.read_text())
    missing = []
    for field, info in Settings.model_fields.items():
        name = Settings.env_name(field)
        if name not in rows:
            missing.append(name)
            continue
        assert rows[name][0] == _doc_default(info.get_default(call_default_factory=True)), name
    assert not missing, f"docs/configuration.md lacks {missing}"
    documented = {k for k in rows if k.startswith("SLURMJOB_")}
    known = {Settings.env_name(f) for f in Settings.model_fields}
    assert documented <= known, f"documented but unknown: {documented - known}"


def _leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            out += _leaves(value, path)
        else:
            out.append(path)
    return out


def test_every_helm_value_is_documented() -> None:
    if not VALUES.exists():
        pytest.skip("charts/slurmjob-operator/values.yaml does not exist yet")
    rows = _table_rows(CONFIGURATION.read_text())
    missing = [p for p in _leaves(yaml.safe_load(VALUES.read_text())) if p not in rows]
    assert not missing, f"docs/configuration.md lacks the Helm values {missing}"


# -- Grafana ------------------------------------------------------------------------------


def _exported_names() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",),
        }[family.type]
        names.update(family.name + s for s in suffixes)
    return names


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dashboard["panels"])
    assert len(exprs) >= 12
    used = {m for e in exprs for m in re.findall(r"\bslurmjob_operator_[a-z_]+", e)}
    unknown = used - _exported_names()
    assert not unknown, f"the dashboard queries metrics the operator does not export: {unknown}"
    # Every metric the operator exports has a panel.
    families = {f.name for f in Metrics().registry.collect()}
    assert {next(n for n in families if u.startswith(n)) for u in used} == families
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


# -- Argo Workflows -----------------------------------------------------------------------


def test_workflow_creates_a_valid_slurmjob() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    resources = [t["resource"] for t in workflow["spec"]["templates"] if "resource" in t]
    assert len(resources) == 1
    resource = resources[0]
    assert resource["successCondition"] == "status.phase == Succeeded"
    assert resource["failureCondition"] == "status.phase in (Failed, Cancelled)"
    manifest = yaml.safe_load(resource["manifest"])
    assert manifest["apiVersion"] == "slurmjob.io/v1alpha1"
    assert manifest["kind"] == "SlurmJob"
    schema = crd_schema()
    obj = apply_defaults(schema, manifest)
    jsonschema.validate(obj, strip_extensions(schema))
    assert cel_errors(schema, obj, "") == []


def test_argocd_snippet_is_the_health_script() -> None:
    readme = (ROOT / "docs" / "argocd" / "README.md").read_text()
    script = (ROOT / "docs" / "argocd" / "health.lua").read_text()
    block = readme.split("resource.customizations.health.slurmjob.io_SlurmJob: |\n", 1)[1]
    block = block.split("```", 1)[0]
    snippet = "\n".join(line[6:] for line in block.splitlines()) + "\n"
    assert snippet.strip() == script.strip()
