"""The tenants file (site/tenants.py, site/tenantentry.py, site/storagepaths.py): what the
loader takes and what it refuses (naming the file and the entry), the tenant of a namespace,
the path rules on whole components, the check against the runtime registry, doctor's tenancy
report, and the tenant's defaults reaching the submit body."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmjob_operator.config import Settings
from slurmjob_operator.controller.pipeline import Site, render_manifest
from slurmjob_operator.doctor import Outcome, Report
from slurmjob_operator.doctor.tenancy import check_tenancy
from slurmjob_operator.site.catalogs import CatalogError, RuntimeArtifact, RuntimeRegistry
from slurmjob_operator.site.storagepaths import overlap, path_parts, runtime_dirs, under
from slurmjob_operator.site.tenants import (
    Tenants,
    TenantUnknown,
    check_against_registry,
    load_tenants,
)

from .controller_fakes import cpu_spec, make_settings

SHA = "0" * 64


def team(name: str = "team-a", **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "namespaces": [name],
        "accounts": [name],
        "partitions": ["debug"],
    }
    entry.update(extra)
    return entry


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


BRIEF = """\
tenants:
  - name: team-a
    namespaces: [team-a, team-a-dev]
    accounts: [team-a]
    partitions: [gpu, debug]
    qos: [normal, low]
    mountSources: [datasets/team-a, datasets/public]
    maxTimeLimit: 24h
    slurmUser: team-a
    uid: 1001
  - name: team-b
    namespaces: [team-b]
    accounts: [team-b, shared]
    partitions: [debug]
"""


# -- the loader -----------------------------------------------------------------------------


def test_unset_means_single_tenant() -> None:
    assert load_tenants(None) is None


def test_the_documented_file_loads(tmp_path: Path) -> None:
    tenants = load_tenants(write(tmp_path, BRIEF))
    assert tenants is not None
    a, b = tenants.tenants
    assert a.namespaces == ["team-a", "team-a-dev"]
    assert (a.slurm_user, a.uid) == ("team-a", 1001)
    assert a.max_time_minutes == 24 * 60
    assert a.mount_sources == ["datasets/team-a", "datasets/public"]
    assert (b.qos, b.mount_sources, b.max_time_minutes, b.slurm_user) == (None, None, None, None)
    assert tenants.get("team-a-dev") is a
    assert tenants.get("team-b") is b
    assert tenants.get("team-c") is None
    assert a.limits().accounts == ["team-a"]


def test_mount_sources_are_normalised(tmp_path: Path) -> None:
    tenants = load_tenants(write(tmp_path, {"tenants": [team(mountSources=["./d/x/", "d//y"])]}))
    assert tenants is not None
    assert tenants.tenants[0].mount_sources == ["d/x", "d/y"]


@pytest.mark.parametrize(
    ("data", "where", "text"),
    [
        pytest.param("tenants: [", "", "not valid YAML", id="yaml"),
        pytest.param("- a\n", "", "must be a mapping with a tenants list", id="not-a-mapping"),
        pytest.param({"tenants": []}, "tenants", "at least 1 item", id="no-tenants"),
        pytest.param(
            {"tenants": [team()], "tennants": []}, "tennants", "Extra inputs", id="unknown-top-key"
        ),
        pytest.param(
            {"tenants": [team(acounts=["x"])]},
            "tenants[0] (team-a).acounts",
            "Extra inputs",
            id="unknown-key",
        ),
        pytest.param(
            {"tenants": [team(), team("team-b", namespaces=["team-b", "team-a"])]},
            "tenants",
            "tenants[1] (team-b): namespace team-a already belongs to tenant team-a",
            id="namespace-of-two-tenants",
        ),
        pytest.param(
            {"tenants": [team(), team(namespaces=["other"], accounts=["o"])]},
            "tenants",
            "tenants[1] (team-a): name is already tenants[0]'s",
            id="duplicate-name",
        ),
        pytest.param(
            {"tenants": [team(namespaces=[])]},
            "tenants[0] (team-a).namespaces",
            "at least 1 item",
            id="no-namespaces",
        ),
        pytest.param(
            {"tenants": [team(accounts=[])]},
            "tenants[0] (team-a).accounts",
            "at least 1 item",
            id="no-accounts",
        ),
        pytest.param(
            {"tenants": [team(partitions=[])]},
            "tenants[0] (team-a).partitions",
            "at least 1 item",
            id="no-partitions",
        ),
        pytest.param(
            {"tenants": [team(qos=[])]},
            "tenants[0] (team-a).qos",
            "at least 1 item",
            id="empty-qos",
        ),
        pytest.param(
            {"tenants": [team(mountSources=[])]},
            "tenants[0] (team-a).mountSources",
            "at least 1 item",
            id="empty-mount-sources",
        ),
        pytest.param(
            {"tenants": [team(partitions=["gpu,debug"])]},
            "tenants[0] (team-a).partitions[0]",
            "should match pattern",
            id="partition-list",
        ),
        pytest.param(
            {"tenants": [team(maxTimeLimit="1 day")]},
            "tenants[0] (team-a).maxTimeLimit",
            "maxTimeLimit '1 day'",
            id="bad-duration",
        ),
        pytest.param(
            {"tenants": [team(maxTimeLimit=0)]},
            "tenants[0] (team-a).maxTimeLimit",
            "at least one minute",
            id="zero-duration",
        ),
        pytest.param(
            {"tenants": [team(namespaces=["Team_A"])]},
            "tenants[0] (team-a).namespaces[0]",
            "should match pattern",
            id="bad-namespace",
        ),
        pytest.param(
            {"tenants": [team(mountSources=["/lustre/x"])]},
            "tenants[0] (team-a).mountSources",
            "relative to the storage root",
            id="absolute-source",
        ),
        pytest.param(
            {"tenants": [team(mountSources=["d/../x"])]},
            "tenants[0] (team-a).mountSources",
            "'..' would leave the storage root",
            id="dotdot-source",
        ),
        pytest.param(
            {"tenants": [team(mountSources=["./"])]},
            "tenants[0] (team-a).mountSources",
            "the storage root itself",
            id="root-source",
        ),
        pytest.param(
            {"tenants": [team(), team("team-b", mountSources=["team-a/x"])]},
            "tenants",
            "tenants[1] (team-b): mountSources: 'team-a/x' is in the staging tree of namespace "
            "team-a",
            id="source-in-a-staging-tree",
        ),
        pytest.param(
            {"tenants": [team(uid=1001)]},
            "tenants[0] (team-a)",
            "uid: is the uid of slurmUser, which is not set",
            id="uid-without-user",
        ),
        pytest.param(
            {"tenants": [team(slurmUser="root")]},
            "tenants[0] (team-a)",
            "never run as root",
            id="root-user",
        ),
        pytest.param(
            {"tenants": [team(slurmUser="a b")]},
            "tenants[0] (team-a).slurmUser",
            "should match pattern",
            id="bad-user",
        ),
        pytest.param(
            {"tenants": [team(slurmUser="u", uid=0)]},
            "tenants[0] (team-a).uid",
            "greater than or equal to 1",
            id="uid-zero",
        ),
    ],
)
def test_the_loader_refuses_naming_the_file_and_the_entry(
    tmp_path: Path, data: Any, where: str, text: str
) -> None:
    path = write(tmp_path, data)
    with pytest.raises(CatalogError) as caught:
        load_tenants(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {where}" if where else f"{path}: "), message
    assert text in message, message


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read"):
        load_tenants(tmp_path / "nope.yaml")


# -- paths, scope, registry -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "prefix", "expected"),
    [
        ("datasets/team-a", "datasets/team-a", True),
        ("datasets/team-a/x/y", "datasets/team-a", True),
        ("datasets/team-ab", "datasets/team-a", False),
        ("datasets/team-a.old", "datasets/team-a", False),
        ("datasets", "datasets/team-a", False),
        ("./datasets//team-a/", "datasets/team-a", True),
    ],
)
def test_under_matches_whole_components(path: str, prefix: str, expected: bool) -> None:
    assert under(path_parts(path), path_parts(prefix)) is expected


def test_overlap_is_either_way() -> None:
    assert overlap(("a",), ("a", "b"))
    assert overlap(("a", "b"), ("a",))
    assert not overlap(("a", "b"), ("a", "c"))


def test_scope_of_a_namespace(tmp_path: Path) -> None:
    raw = yaml.safe_load(BRIEF)
    raw["tenants"][1]["mountSources"] = ["datasets/public", "datasets/team-b"]
    tenants = Tenants.model_validate(raw)
    scope = tenants.scope("team-a-dev")
    assert scope.tenant.name == "team-a"
    assert scope.staging_namespaces == {"team-a", "team-a-dev", "team-b"}
    assert scope.other_sources == (("datasets", "public"), ("datasets", "team-b"))
    with pytest.raises(TenantUnknown) as caught:
        tenants.scope("team-x")
    assert caught.value.field == "metadata.namespace"
    assert "namespace 'team-x' belongs to no tenant" in caught.value.messages[0]


def test_runtime_dirs() -> None:
    registry = RuntimeRegistry(
        runtimes=[
            RuntimeArtifact(id="a", format="sqsh", path="runtimes/a.sqsh", sha256=SHA),
            RuntimeArtifact(id="b", format="sqsh", path="runtimes/b.sqsh", sha256=SHA),
            RuntimeArtifact(id="c", format="sif", path="top.sif", sha256=SHA),
        ]
    )
    assert runtime_dirs(registry) == [("runtimes",), ("top.sif",)]


@pytest.mark.parametrize(
    ("source", "refused"),
    [("runtimes", True), ("runtimes/x", True), ("shared", True), ("datasets", False)],
)
def test_a_mount_source_overlapping_the_runtimes_folder_is_refused(
    tmp_path: Path, source: str, refused: bool
) -> None:
    registry = RuntimeRegistry(
        runtimes=[
            RuntimeArtifact(id="a", format="sqsh", path="runtimes/a.sqsh", sha256=SHA),
            RuntimeArtifact(id="b", format="sqsh", path="shared/rt/b.sqsh", sha256=SHA),
        ]
    )
    tenants = Tenants.model_validate({"tenants": [team(mountSources=[source])]})
    path = tmp_path / "tenants.yaml"
    if refused:
        with pytest.raises(
            CatalogError, match=r"tenants\[0\] \(team-a\)\.mountSources: .*runtimes"
        ):
            check_against_registry(tenants, registry, path)
    else:
        check_against_registry(tenants, registry, path)


def test_site_load_reads_and_checks_the_tenants_file(tmp_path: Path) -> None:
    assert Site.load(make_settings(tmp_path)).tenants is None
    good = write(tmp_path, {"tenants": [team(mountSources=["datasets"])]})
    site = Site.load(make_settings(tmp_path, tenants_file=good))
    assert site.tenants is not None
    assert site.scope("team-a") is not None
    # make_settings' runtime lives in runtimes/: a tenant source there stops the start.
    bad = write(tmp_path, {"tenants": [team(mountSources=["runtimes"])]})
    with pytest.raises(CatalogError, match="overlaps the runtimes folder"):
        Site.load(make_settings(tmp_path, tenants_file=bad))


def test_the_setting_is_read_from_the_environment(tmp_path: Path) -> None:
    settings = Settings.from_env({"SLURMJOB_TENANTS_FILE": str(tmp_path / "t.yaml")})
    assert settings.tenants_file == tmp_path / "t.yaml"
    assert Settings.from_env({}).tenants_file is None


# -- doctor ---------------------------------------------------------------------------------


def _tenancy(settings: Settings) -> list[tuple[str, Outcome, str]]:
    report = Report()
    check_tenancy(settings, RuntimeRegistry(), report)
    return [(c.name, c.outcome, c.detail) for c in report.checks]


def test_doctor_reports_single_tenant_mode(tmp_path: Path) -> None:
    [(name, outcome, detail)] = _tenancy(make_settings(tmp_path))
    assert (name, outcome) == ("tenancy", Outcome.OK)
    assert detail.startswith("single-tenant")


def test_doctor_counts_tenants_and_warns_about_shared_slurm_users(tmp_path: Path) -> None:
    path = write(tmp_path, BRIEF)
    checks = _tenancy(make_settings(tmp_path, tenants_file=path))
    assert checks[0][:2] == ("tenancy", Outcome.OK)
    assert "2 tenant(s) (team-a, team-b)" in checks[0][2]
    users = [c for c in checks if c[0] == "tenant users"]
    assert [c[1] for c in users] == [Outcome.WARN, Outcome.FAIL]
    assert "no slurmUser for tenant(s) team-b" in users[0][2]
    assert "the operator's Slurm user" in users[0][2]
    assert "team-a name a slurmUser, which needs the JWT key mode" in users[1][2]
    key = tmp_path / "jwt.key"
    key.write_text("k")
    with_key = _tenancy(make_settings(tmp_path, tenants_file=path, slurm_jwt_key_file=key))
    assert [c[1] for c in with_key if c[0] == "tenant users"] == [Outcome.WARN, Outcome.OK]


def test_doctor_fails_on_a_broken_tenants_file(tmp_path: Path) -> None:
    path = write(tmp_path, {"tenants": [team(), team("team-b", namespaces=["team-a"])]})
    [(name, outcome, detail)] = _tenancy(make_settings(tmp_path, tenants_file=path))
    assert (name, outcome) == ("tenancy", Outcome.FAIL)
    assert "already belongs to tenant team-a" in detail


# -- the tenant's defaults reach the submit body --------------------------------------------


def _body(settings: Settings, namespace: str, **spec: Any) -> dict[str, Any]:
    manifest = {"metadata": {"namespace": namespace, "name": "j"}, "spec": cpu_spec(**spec)}
    return render_manifest(manifest, api_version="v0.0.45", settings=settings)


def test_the_tenants_defaults_are_submitted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "tenants": [
                team(accounts=["acct"], partitions=["p1", "p2"], qos=["q"], maxTimeLimit="2h")
            ]
        },
    )
    settings = make_settings(tmp_path, tenants_file=path)
    job = _body(settings, "team-a", timeLimit=None)["job"]
    assert (job["account"], job["partition"], job["qos"]) == ("acct", "p1", "q")
    assert job["time_limit"] == {"set": True, "infinite": False, "number": 120}
    # What the spec says (inside the limits) is kept.
    job = _body(settings, "team-a", partition="p2", timeLimit="30m")["job"]
    assert (job["partition"], job["time_limit"]["number"]) == ("p2", 30)
    with pytest.raises(TenantUnknown):
        _body(settings, "elsewhere")


def test_single_tenant_bodies_are_unchanged(tmp_path: Path) -> None:
    job = _body(make_settings(tmp_path), "anywhere")["job"]
    assert job["partition"] == "debug"  # SLURMJOB_SLURM_PARTITION
    assert "account" not in job
    assert "qos" not in job
    assert json.dumps(job)  # a plain body
