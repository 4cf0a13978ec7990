"""The chart's admission policies (issue 45, section 1): their CEL, evaluated with cel-python,
refuses each manifest of the table with the reconciler's own reason and words (and admits what
the reconciler admits); a metadata write, a deletion and an update the rules do not read are
never judged; `slurmjobs/status` is the operator's alone; the parameters are the operator's
own reading of the tenants file and settings, the chart's rendering of them the same map. The
real apiserver's verdict on the same table is tests/integration/test_admission_e2e.py's."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmjob_operator.api.spec import parse_time_limit
from slurmjob_operator.cli import main
from slurmjob_operator.gen.admission import SLURMJOBS, STATUS, chart_template
from slurmjob_operator.gen.admissioncel import minutes, py_repr
from slurmjob_operator.site.admission import MAX_LITERAL, ParamsTooLarge, admission_params

from .admission_oracle import (
    CASES,
    CHART_SITE,
    CLUSTERS,
    Case,
    cli_params,
    create_request,
    evaluate,
    manifest,
    policy_verdict,
    reconciler_refusal,
    site_settings,
    tenants,
    tenants_model,
)
from .test_chart_files import CHART
from .test_crd import apply_defaults, crd_schema

NS = {"alpha": "team-alpha", "queued": "team-q", "beta": "team-beta", "none": "no-team"}


def _object(case: Case) -> dict[str, Any]:
    return apply_defaults(crd_schema(), manifest(case, NS))


def _verdict(obj: dict[str, Any], params: dict[str, str], **kw: Any) -> str | None:
    return policy_verdict(SLURMJOBS, params, create_request(obj), obj, **kw)


def test_the_chart_template_is_generated() -> None:
    assert (CHART / "templates" / "admission.yaml").read_text() == chart_template(), (
        "charts/slurmjob-operator/templates/admission.yaml is stale: make crd"
    )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_policy_refuses_with_the_reconcilers_reason_and_words(
    case: Case, tmp_path: Path
) -> None:
    settings = site_settings(tmp_path, NS)
    obj = _object(case)
    expected = reconciler_refusal(obj, settings)
    assert (expected is not None) is case.refused, expected
    verdict = _verdict(obj, cli_params(settings))
    assert verdict == (f"{expected[0]}: {expected[1]}" if expected else None)


@pytest.mark.parametrize(
    ("case_id", "words"),
    [
        ("tenant-unknown", "TenantUnknown: metadata.namespace: namespace 'no-team' belongs to no"),
        ("time-limit", "tenant alpha's maxTimeLimit of 120 minutes"),
        ("total-time-site", "than the site's maximum (SLURMJOB_MAX_TOTAL_TIME) of 7200 minutes"),
        ("total-time-tenant", "than tenant alpha's maxTotalTime of 4320 minutes"),
        ("image-registry", "(tenant alpha's imageRegistries)"),
        ("cluster-of-another-tenant", "spec.cluster: tenant alpha may use clusters default, west"),
        ("account-quoted", 'spec.account: "it\'s" is not in tenant alpha'),
    ],
)
def test_the_words_name_the_setting(case_id: str, words: str, tmp_path: Path) -> None:
    # A few of the table's words as a reader sees them (the comparison above is exact).
    obj = _object(next(c for c in CASES if c.id == case_id))
    verdict = _verdict(obj, cli_params(site_settings(tmp_path, NS)))
    assert verdict is not None
    assert words in verdict


@pytest.mark.parametrize(
    ("case", "overrides", "reason"),
    [
        (next(c for c in CASES if c.id == "image-admitted"), {"images_enabled": False}, "enable"),
        (next(c for c in CASES if c.id == "total-time-site"), {"max_total_time": 90}, "site's"),
        (next(c for c in CASES if c.id == "admitted"), {"mpi_plugins": None}, None),
    ],
    ids=["images-disabled", "site-maximum", "no-mpi-plugins"],
)
def test_the_sites_settings_feed_the_rules(
    case: Case, overrides: dict[str, Any], reason: str | None, tmp_path: Path
) -> None:
    settings = site_settings(tmp_path, NS, **overrides)
    obj = _object(case)
    expected = reconciler_refusal(obj, settings)
    assert (expected is None) is (reason is None)
    if expected is not None:
        assert reason is not None
        assert reason in expected[1]
    assert _verdict(obj, cli_params(settings)) == (
        f"{expected[0]}: {expected[1]}" if expected else None
    )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_without_tenants_only_the_sites_rules_hold(case: Case, tmp_path: Path) -> None:
    settings = site_settings(tmp_path, NS, tenants_file=None, image_registries="registry.example")
    obj = _object(case)
    expected = reconciler_refusal(obj, settings)
    assert _verdict(obj, cli_params(settings)) == (
        f"{expected[0]}: {expected[1]}" if expected else None
    )


def test_a_namespace_of_no_tenant_is_left_alone_when_unclaimed(tmp_path: Path) -> None:
    settings = site_settings(tmp_path, NS)
    obj = _object(next(c for c in CASES if c.id == "tenant-unknown"))
    params = cli_params(settings)
    assert _verdict(obj, params) is not None
    assert _verdict(obj, params, refuse_unclaimed=False) is None
    # A tenant's namespace is judged either way.
    account = _object(next(c for c in CASES if c.id == "account"))
    assert _verdict(account, params, refuse_unclaimed=False) is not None


def _update(obj: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    return {**create_request(new), "operation": "UPDATE"}


def test_metadata_writes_deletions_and_unread_fields_are_never_judged(tmp_path: Path) -> None:
    """A rule tightened after a SlurmJob was made never holds back its finalizer, a label,
    its deletion, nor `suspend` or `ttlSecondsAfterFinished`."""
    params = cli_params(site_settings(tmp_path, NS))
    old = _object(next(c for c in CASES if c.id == "time-limit"))  # breaks maxTimeLimit
    finalized = json.loads(json.dumps(old))
    finalized["metadata"]["finalizers"] = []
    finalized["metadata"]["labels"] = {"x": "y"}
    deleting = json.loads(json.dumps(old))
    deleting["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    suspended = json.loads(json.dumps(old))
    suspended["spec"]["suspend"] = True
    suspended["spec"]["ttlSecondsAfterFinished"] = 60
    for new in (finalized, deleting, suspended):
        assert policy_verdict(SLURMJOBS, params, _update(old, new), new, old) is None
    # A change of a field the rules read is judged (the CRD refuses it first).
    changed = json.loads(json.dumps(old))
    changed["spec"]["account"] = "acct-b"
    verdict = policy_verdict(SLURMJOBS, params, _update(old, changed), changed, old)
    assert verdict is not None
    assert verdict.startswith("InvalidSpec: spec.account:")


@pytest.mark.parametrize(
    ("user", "namespace", "refuse", "allowed"),
    [
        ("system:serviceaccount:sys:op", "team-alpha", True, True),
        ("system:serviceaccount:sys:intruder", "team-alpha", True, False),
        ("admin", "no-team", True, False),
        ("admin", "no-team", False, True),  # not this release's namespace
        ("system:serviceaccount:other:op", "no-team", False, True),
    ],
)
def test_status_is_written_by_the_operator_alone(
    user: str, namespace: str, refuse: bool, allowed: bool, tmp_path: Path
) -> None:
    params = cli_params(site_settings(tmp_path, NS))
    obj = {"metadata": {"name": "job", "namespace": namespace}, "spec": {}, "status": {}}
    request = {**create_request(obj, user), "operation": "UPDATE"}
    verdict = policy_verdict(STATUS, params, request, obj, obj, refuse_unclaimed=refuse)
    assert (verdict is None) is allowed, verdict
    if verdict is not None:
        assert f"slurmjobs/status of {namespace}/job is written by the operator only" in verdict
        assert "(system:serviceaccount:sys:op), not by " + user in verdict


@pytest.mark.parametrize(
    "text",
    ["plain", "it's", 'say "hi"', "both ' and \"", "back\\slash", "tab\there", "line\nbreak"],
)
def test_names_are_shown_as_python_shows_them(text: str) -> None:
    assert evaluate(py_repr("v"), {"v": _cel(text)}) == repr(text)


@pytest.mark.parametrize("value", [1, 90, "90", " 90 ", "90m", "4h", "1d", "1d2h30m", "2h5m", "3d"])
def test_durations_are_read_as_the_operator_reads_them(value: int | str) -> None:
    assert evaluate(minutes("v"), {"v": _cel(value)}) == parse_time_limit(value)


def _cel(value: Any) -> Any:
    celpy = pytest.importorskip("celpy")
    return celpy.json_to_cel(value)


# -- the parameters -------------------------------------------------------------------------------


def test_the_parameters_are_the_tenants_model_per_cluster(tmp_path: Path) -> None:
    """Each tenant's limits on each cluster, read back from the map as the policy reads them
    (the cluster's section, else the tenant's own), are the `for_cluster` view's."""
    params = cli_params(site_settings(tmp_path, NS))
    model = tenants_model(NS)
    shown = {
        "accounts": lambda t: ", ".join(t.accounts),
        "partitions": lambda t: ", ".join(t.partitions),
        "qos": lambda t: ", ".join(t.qos or []),
        "mounts": lambda t: ", ".join(t.mount_sources or []),
        "maxTime": lambda t: "" if t.max_time_minutes is None else str(t.max_time_minutes),
        "maxTotal": lambda t: "" if t.max_total_minutes is None else str(t.max_total_minutes),
    }
    for cluster in CLUSTERS:
        view = model.for_cluster(cluster)
        for tenant in view.tenants:
            for key, of in shown.items():
                at = f"tenant/{tenant.name}@{cluster}/{key}"
                value = params.get(at, params[f"tenant/{tenant.name}/{key}"])
                assert value == of(tenant.limits()), (cluster, tenant.name, key)
            for namespace in tenant.namespaces:
                assert params[f"namespace/{namespace}"] == tenant.name
    assert params["tenant/alpha/clusters"] == "default, west"
    assert params["tenant/beta/clusters"] == ""
    assert params["tenant/alpha/mounts"] == "datasets/alpha, datasets/shared"
    assert params["tenant/beta/others"] == "datasets/alpha, datasets/shared"
    assert params["site/clusters"] == "default, west, east"
    assert params["site/maxTotal"] == str(5 * 1440)


def test_the_cli_prints_the_parameters_as_chart_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = site_settings(tmp_path, NS)
    (tmp_path / "clusters.yaml").write_text(
        yaml.safe_dump({"clusters": [{"name": n} for n in CLUSTERS]})
    )
    env = {
        "SLURMJOB_SLURM_REST_URL": "http://slurmrestd.invalid:6820",
        "SLURMJOB_STORAGE_ROOT": str(settings.storage_root),
        "SLURMJOB_TENANTS_FILE": str(settings.tenants_file),
        "SLURMJOB_CLUSTERS_FILE": str(tmp_path / "clusters.yaml"),
        "SLURMJOB_CLUSTER_NAME": "default",
        "SLURMJOB_MAX_TOTAL_TIME": "5d",
        "SLURMJOB_IMAGES_ENABLED": "1",
        "SLURMJOB_IMAGE_CACHE_ROOT": "/var/lib/slurmjob-images",
        "SLURMJOB_IMAGE_CACHE_USER": "imgcache",
        "SLURMJOB_IMAGE_CACHE_UID": "2999",
        "SLURMJOB_IMAGE_IMPORT_PARTITION": "debug",
        "SLURMJOB_MPI_PLUGINS": "pmi2",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["admission-params"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == {"admission": {"params": cli_params(settings)}}


def test_parameters_too_large_for_one_expression_are_refused(tmp_path: Path) -> None:
    many = {f"n{i}": f"team-{i:04d}" for i in range(400)}
    big = [
        {
            "name": f"t{i}",
            "namespaces": [ns],
            "accounts": [f"account-{i}"] * 20,
            "partitions": ["debug"],
        }
        for i, ns in enumerate(many.values())
    ]
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({"tenants": big}))
    settings = site_settings(tmp_path, NS, tenants_file=path)
    with pytest.raises(ParamsTooLarge, match=str(MAX_LITERAL)):
        admission_params(settings, tenants_model(NS).model_validate({"tenants": big}), CLUSTERS)


# -- the chart renders the same map -------------------------------------------------------------


def _helm() -> str | None:
    found = sorted(Path("/var/cache/slurmjob-testbed/k8s").glob("helm-*/helm"))
    return str(found[-1]) if found else shutil.which("helm")


def render_chart(tmp_path: Path, values: dict[str, Any], *args: str) -> list[dict[str, Any]]:
    helm = _helm()
    if helm is None:
        pytest.skip("no helm binary (make testbed builds it)")
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = subprocess.run(
        [helm, "template", "rel", str(CHART), "-n", "sys",
         "-f", str(CHART / "ci" / "default-values.yaml"), "-f", str(path), *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def chart_params(
    docs: list[dict[str, Any]], policy: str = "rel-slurmjob-operator-slurmjobs"
) -> Any:
    (found,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and
                d["metadata"]["name"] == policy]  # fmt: skip
    (site,) = [v for v in found["spec"]["variables"] if v["name"] == "site"]
    return json.loads(site["expression"])


def test_the_chart_renders_the_parameters_the_operator_reads(tmp_path: Path) -> None:
    """The map in the rendered policy is the one `admission-params` prints from the chart's
    own Deployment settings, tenants file and clusters file, as the operator reads them."""
    values = {**CHART_SITE, "catalogs": {"tenants": tenants(NS)}}
    docs = render_chart(tmp_path, values)
    settings = site_settings(tmp_path, NS)
    assert chart_params(docs) == cli_params(settings)
    assert chart_params(docs, "rel-slurmjob-operator-status") == cli_params(settings)
    # The Deployment's settings are the ones the table's site has.
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SLURMJOB_MAX_TOTAL_TIME"] == "5d"
    assert env["SLURMJOB_MPI_PLUGINS"] == "pmi2"
    assert env["SLURMJOB_IMAGES_ENABLED"] == "true"
    (catalogs,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-catalogs")
    ]
    assert yaml.safe_load(catalogs["data"]["tenants.yaml"]) == {"tenants": tenants(NS)}
    (clusters,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-clusters")
    ]
    names = [c["name"] for c in yaml.safe_load(clusters["data"]["clusters.yaml"])["clusters"]]
    assert tuple(names) == CLUSTERS


def test_the_rendered_policies_are_the_generated_ones(tmp_path: Path) -> None:
    """What helm renders is the generator's CEL word for word, with the chart's three values
    in: the rules, whether unclaimed namespaces are refused, the operator's user name."""
    docs = render_chart(tmp_path, {"watchNamespaces": ["a", "b"]})
    site = json.dumps(chart_params(docs), sort_keys=True, separators=(",", ":"))
    for name, spec in (("slurmjobs", SLURMJOBS), ("status", STATUS)):
        (policy,) = [
            d
            for d in docs
            if d["kind"] == "ValidatingAdmissionPolicy"
            and d["metadata"]["name"] == f"rel-slurmjob-operator-{name}"
        ]
        rendered = policy["spec"]
        given = {v["name"]: v["expression"] for v in rendered["variables"]}
        assert json.dumps(json.loads(given["site"]), sort_keys=True, separators=(",", ":")) == site
        assert given["refuseUnclaimed"] == "true"  # every watched namespace is the release's
        if name == "status":
            assert given["operator"] == "'system:serviceaccount:sys:rel-slurmjob-operator'"
        chart = {"site", "refuseUnclaimed", "operator"}
        ours = [v for v in spec["variables"] if v["name"] not in chart]
        assert [v for v in rendered["variables"] if v["name"] not in chart] == ours
        assert {k: v for k, v in rendered.items() if k != "variables"} == {
            k: v for k, v in spec.items() if k != "variables"
        }
        (binding,) = [
            d
            for d in docs
            if d["kind"] == "ValidatingAdmissionPolicyBinding"
            and d["metadata"]["name"] == f"rel-slurmjob-operator-{name}"
        ]
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]
        assert binding["spec"]["validationActions"] == ["Deny"]
        (selector,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert selector == {
            "key": "kubernetes.io/metadata.name",
            "operator": "In",
            "values": ["a", "b"],
        }
    assert render_chart(tmp_path, {"admission": {"enabled": False}}, "--show-only",
                        "templates/crd.yaml")  # fmt: skip
    off = render_chart(tmp_path, {"admission": {"enabled": False}})
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmission")]


def test_tenants_the_chart_cannot_read_need_their_parameters(tmp_path: Path) -> None:
    helm = _helm()
    if helm is None:
        pytest.skip("no helm binary (make testbed builds it)")
    values = {"catalogs": {"existingConfigMap": "site", "existingConfigMapHasTenants": True}}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = subprocess.run(
        [helm, "template", "rel", str(CHART), "-f", str(CHART / "ci" / "default-values.yaml"),
         "-f", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode != 0
    assert "admission.params is needed with catalogs.existingConfigMapHasTenants" in proc.stderr
    assert "slurmjob-operator admission-params" in proc.stderr
