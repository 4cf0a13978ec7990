"""Per-cluster tenants (site/tenantentry.py, site/tenants.py): a tenant's `defaultCluster` and
its `clusters` sections, what the loader refuses in them (naming the file and the entry), and
`Tenants.for_cluster`, the view the operator's part for one cluster reads limits, Slurm user
and uid from, as `Site` and resolution use it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.api.spec import Mount
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.pipeline import Site
from slurmjob_operator.site.catalogs import (
    CatalogError,
    RuntimeArtifact,
    RuntimeRegistry,
)
from slurmjob_operator.site.catalogwatch import CatalogWatch
from slurmjob_operator.site.mounts import mount_problems
from slurmjob_operator.site.resolve import resolve_site
from slurmjob_operator.site.tenantentry import ClusterLimits, Tenant
from slurmjob_operator.site.tenants import (
    TenantClusterDenied,
    Tenants,
    TenantUnknown,
    check_against_registry,
    load_tenants,
)

from .controller_fakes import cpu_spec, make_settings

SHA = "0" * 64
DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"

# Every key a section may give, with a value unlike the tenant's own (OWN) for it.
OWN: dict[str, Any] = {
    "accounts": ["team-a"],
    "partitions": ["gpu", "debug"],
    "qos": ["normal"],
    "mountSources": ["datasets/team-a"],
    "maxTimeLimit": "24h",
    "slurmUser": "team-a",
    "uid": 1001,
}
OTHER: dict[str, Any] = {
    "accounts": ["team-a-west"],
    "partitions": ["big"],
    "qos": ["low", "normal"],
    "mountSources": ["west/team-a"],
    "maxTimeLimit": 90,
    "slurmUser": "team-a-west",
    "uid": 2001,
}
FIELD = {
    "accounts": "accounts",
    "partitions": "partitions",
    "qos": "qos",
    "mountSources": "mount_sources",
    "maxTimeLimit": "max_time_limit",
    "slurmUser": "slurm_user",
    "uid": "uid",
}


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
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def of(*entries: dict[str, Any]) -> Tenants:
    return Tenants.model_validate({"tenants": list(entries)})


def tenant_of(tenants: Tenants, namespace: str = "team-a") -> Tenant:
    tenant = tenants.get(namespace)
    assert tenant is not None, namespace
    return tenant


def site_with(tenants: Tenants) -> Site:
    """A Site as the operator's part for one cluster would hold it: the view as its tenants."""
    return Site(settings=Settings(), catalogs=CatalogWatch(), tenants=tenants)


def refused(tmp_path: Path, data: Any, clusters: list[str] | None = None) -> str:
    path = write(tmp_path, data)
    with pytest.raises(CatalogError) as caught:
        load_tenants(path, clusters)
    message = str(caught.value)
    prefix = f"{path}: "
    assert message.startswith(prefix), message
    return message.removeprefix(prefix)


# -- inheritance and replacement, per key ---------------------------------------------------


@pytest.mark.parametrize("key", list(OWN))
def test_a_key_given_on_a_cluster_replaces_the_tenants_and_the_others_are_inherited(
    key: str,
) -> None:
    tenants = of(team(**OWN, namespaces=["team-a"], clusters={"west": {key: OTHER[key]}}))
    own = tenant_of(tenants)
    west = tenant_of(tenants.for_cluster("west"))
    for each, field in FIELD.items():
        expected = OTHER[each] if each == key else getattr(own, field)
        assert getattr(west, field) == expected, each
    # The file as written (and the tenant itself) keeps its own.
    assert getattr(own, FIELD[key]) == OWN[key]


def test_the_view_is_what_scope_and_site_read() -> None:
    section = {"accounts": ["w"], "qos": ["low"], "maxTimeLimit": "2h", "slurmUser": "tw", "uid": 7}
    base = of(team(**OWN, clusters={"west": section, "east": {}}))
    west = base.for_cluster("west")
    limits = west.scope("team-a").limits
    assert (limits.accounts, limits.partitions, limits.qos) == (["w"], OWN["partitions"], ["low"])
    assert limits.max_time_minutes == 120
    on_west = site_with(west)
    assert (on_west.slurm_user("team-a"), on_west.job_uid("team-a")) == ("tw", 7)
    assert on_west.slurm_users == {"tw"}
    east = base.for_cluster("east")
    on_east = site_with(east)
    assert (on_east.slurm_user("team-a"), on_east.job_uid("team-a")) == ("team-a", 1001)
    assert east.scope("team-a").limits.max_time_minutes == 24 * 60


@pytest.mark.parametrize(
    ("section", "user", "uid"),
    [
        pytest.param({"slurmUser": None, "uid": None}, None, None, id="both-unset-there"),
        pytest.param({"uid": None}, "team-a", None, id="uid-unset-there"),
        pytest.param({"slurmUser": "tw"}, "tw", 1001, id="user-replaced-uid-inherited"),
    ],
)
def test_null_unsets_an_optional_key_on_that_cluster(
    section: dict[str, Any], user: str | None, uid: int | None
) -> None:
    tenant = of(team(slurmUser="team-a", uid=1001, clusters={"west": section})).tenants[0]
    west = tenant.for_cluster("west")
    assert (west.slurm_user, west.uid) == (user, uid)


def test_mount_sources_null_on_a_cluster_means_no_mounts_there() -> None:
    base = of(team(mountSources=["datasets/team-a"], clusters={"west": {"mountSources": None}}))
    assert tenant_of(base.for_cluster("west")).source_parts == []
    assert tenant_of(base).source_parts == [("datasets", "team-a")]


def test_section_mount_sources_are_normalised() -> None:
    tenant = of(team(clusters={"west": {"mountSources": ["./w//x/"]}})).tenants[0]
    assert tenant.for_cluster("west").mount_sources == ["w/x"]


# A property: whatever keys a section gives, the view has exactly those replaced, and a
# section with none is the tenant's own limits; a file whose view would carry a uid without a
# Slurm user is refused, so no view ever does.
_NAMES = st.lists(st.sampled_from(["a", "b", "c.d", "e_f"]), min_size=1, max_size=3, unique=True)
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "accounts": _NAMES,
    "partitions": _NAMES,
    "qos": st.none() | _NAMES,
    "mountSources": st.none()
    | st.lists(st.sampled_from(["d/x", "d/y/z", "e"]), min_size=1, max_size=3, unique=True),
    "maxTimeLimit": st.none() | st.integers(1, 10_000) | st.sampled_from(["90m", "1d2h", "4h"]),
    "slurmUser": st.none() | st.sampled_from(["u1", "u2"]),
    "uid": st.none() | st.integers(1, 60_000),
}


@st.composite
def _tenant_and_section(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    own = {k: draw(_VALUES[k]) for k in ("accounts", "partitions")}
    for key in ("qos", "mountSources", "maxTimeLimit", "slurmUser"):
        value = draw(_VALUES[key])
        if value is not None:
            own[key] = value
    if "slurmUser" in own and draw(st.booleans()):
        own["uid"] = draw(st.integers(1, 60_000))
    keys = draw(st.lists(st.sampled_from(list(OWN)), unique=True))
    section = {}
    for key in keys:
        value = draw(_VALUES[key])
        if value is not None or key not in ("accounts", "partitions"):
            section[key] = value
    return own, section


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(_tenant_and_section())
def test_a_view_replaces_exactly_the_keys_its_section_gives(
    case: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    own, section = case
    entry = team(**own, clusters={"x": section})
    user = section.get("slurmUser", own.get("slurmUser"))
    uid = section.get("uid", own.get("uid"))
    if uid is not None and user is None:
        with pytest.raises(ValidationError):
            of(entry)
        return
    tenant = of(entry).tenants[0]
    view = tenant.for_cluster("x")
    for key, field in FIELD.items():
        expected = section[key] if key in section else getattr(tenant, field)
        assert getattr(view, field) == expected, key
    assert view.uid is None or view.slurm_user is not None
    if not section:
        assert view.limits() == tenant.limits()


# -- which clusters a tenant may use --------------------------------------------------------


def test_a_tenant_without_clusters_is_itself_on_every_cluster() -> None:
    base = of(team(**OWN), team("team-b"))
    for name in ("east", "west", "gpu"):
        view = base.for_cluster(name)
        assert view.tenants == base.tenants
        assert view.get("team-a") == base.get("team-a")
        assert view.scope("team-a").limits == base.scope("team-a").limits
        assert view.scope("team-b").other_sources == base.scope("team-b").other_sources


@pytest.mark.parametrize(
    ("cluster", "allowed"),
    [("east", True), ("west", True), ("gpu", False), ("eas", False), ("", False)],
)
def test_only_the_listed_clusters_are_allowed(cluster: str, allowed: bool) -> None:
    view = of(team(clusters={"west": {}, "east": {}}), team("team-b")).for_cluster(cluster)
    assert view.scope("team-b").tenant.name == "team-b"  # no clusters: everywhere
    if allowed:
        assert view.scope("team-a").tenant.name == "team-a"
        return
    with pytest.raises(TenantClusterDenied) as caught:
        view.scope("team-a")
    denied = caught.value
    assert isinstance(denied, SpecError)
    assert denied.field == "spec.cluster"
    assert denied.messages == [
        f"spec.cluster: tenant team-a may use clusters east, west; not {cluster}"
    ]
    assert (denied.tenant, denied.cluster, denied.allowed) == ("team-a", cluster, ["east", "west"])


def test_a_denied_tenant_keeps_its_namespaces_but_not_its_user() -> None:
    base = of(
        team(namespaces=["team-a", "team-a-dev"], slurmUser="ua", uid=11, clusters={"east": {}}),
        team("team-b", slurmUser="ub", uid=12),
    )
    west = base.for_cluster("west")
    denied = tenant_of(west, "team-a-dev")
    assert denied.name == "team-a"
    assert (denied.slurm_user, denied.uid) == (None, None)
    assert west.namespaces == base.namespaces
    with pytest.raises(TenantClusterDenied):
        west.scope("team-a-dev")
    with pytest.raises(TenantUnknown):
        west.scope("team-c")
    assert site_with(west).slurm_users == {"ub"}
    assert site_with(west).slurm_user("team-a") is None
    assert site_with(base.for_cluster("east")).slurm_users == {"ua", "ub"}
    # Its namespaces' staging trees stay out of reach of the others' mounts on that cluster.
    assert "team-a-dev" in west.scope("team-b").staging_namespaces


def test_a_view_of_a_view_is_the_view_of_the_file() -> None:
    base = of(team(**OWN, clusters={"west": {"accounts": ["w"]}, "east": {"qos": ["q"]}}))
    east = base.for_cluster("west").for_cluster("east")
    assert east.tenants == base.for_cluster("east").tenants
    assert tenant_of(east).accounts == OWN["accounts"]
    assert tenant_of(east).qos == ["q"]
    assert (base.cluster, east.cluster) == (None, "east")


def test_the_file_as_written_scopes_every_tenant_with_its_own_limits() -> None:
    # Without a cluster (a single-cluster caller) nothing is denied: the tenant's own limits.
    base = of(team(**OWN, clusters={"west": {"accounts": ["w"]}}))
    assert base.scope("team-a").limits.accounts == OWN["accounts"]


@pytest.mark.parametrize(
    ("entries", "namespace", "expected"),
    [
        pytest.param([team(defaultCluster="east")], "team-a", "east", id="without-clusters"),
        pytest.param(
            [team(defaultCluster="west", clusters={"east": {}, "west": {}})],
            "team-a",
            "west",
            id="among-clusters",
        ),
        pytest.param([team(clusters={"east": {}})], "team-a", None, id="none-named"),
        pytest.param([team(defaultCluster="east")], "team-x", None, id="no-tenant"),
        pytest.param(
            [team(defaultCluster="east"), team("team-b", defaultCluster="west")],
            "team-b",
            "west",
            id="each-its-own",
        ),
    ],
)
def test_the_default_cluster(entries: list[dict[str, Any]], namespace: str, expected: str) -> None:
    tenants = of(*entries)
    assert tenants.default_cluster(namespace) == expected
    # A view says the same: the default is the tenant's, not the cluster's.
    assert tenants.for_cluster("gpu").default_cluster(namespace) == expected


# -- what the loader refuses ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "where", "text"),
    [
        pytest.param(
            team("team-b", clusters={}),
            "tenants[1] (team-b).clusters",
            "at least 1 item",
            id="empty",
        ),
        pytest.param(
            team("team-b", clusters={"West": {}}),
            "tenants[1] (team-b).clusters",
            "'West' is not a cluster name",
            id="bad-cluster-name",
        ),
        pytest.param(
            team("team-b", clusters={"a" * 41: {}}),
            "tenants[1] (team-b).clusters",
            "is not a cluster name",
            id="long-cluster-name",
        ),
        pytest.param(
            team("team-b", clusters={"west-": {}}),
            "tenants[1] (team-b).clusters",
            "'west-' is not a cluster name",
            id="trailing-dash",
        ),
        pytest.param(
            team("team-b", defaultCluster="West"),
            "tenants[1] (team-b).defaultCluster",
            "should match pattern",
            id="bad-default-name",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"acounts": ["x"]}}),
            "tenants[1] (team-b).clusters.west.acounts",
            "Extra inputs",
            id="unknown-section-key",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"name": "x"}}),
            "tenants[1] (team-b).clusters.west.name",
            "Extra inputs",
            id="tenant-key-in-a-section",
        ),
        pytest.param(
            team("team-b", clusters={"west": ["debug"]}),
            "tenants[1] (team-b).clusters.west",
            "valid dictionary",
            id="section-not-a-mapping",
        ),
        pytest.param(
            team("team-b", defaultCluster="east", clusters={"west": {}}),
            "tenants[1] (team-b).defaultCluster",
            "'east' is not among the tenant's clusters (west)",
            id="default-not-among-clusters",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"uid": 5}}),
            "tenants[1] (team-b).clusters.west.uid",
            "is the uid of slurmUser, which is not set on this cluster",
            id="uid-without-user",
        ),
        pytest.param(
            team("team-b", slurmUser="ub", clusters={"west": {"slurmUser": None, "uid": 5}}),
            "tenants[1] (team-b).clusters.west.uid",
            "not set on this cluster",
            id="uid-with-user-unset-there",
        ),
        pytest.param(
            team("team-b", slurmUser="ub", uid=5, clusters={"west": {"slurmUser": None}}),
            "tenants[1] (team-b).clusters.west.slurmUser",
            "the tenant's uid 5 would still apply",
            id="user-unset-uid-inherited",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"slurmUser": "root"}}),
            "tenants[1] (team-b).clusters.west.slurmUser",
            "never run as root",
            id="root",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"slurmUser": "a b"}}),
            "tenants[1] (team-b).clusters.west.slurmUser",
            "should match pattern",
            id="bad-user",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"slurmUser": "u", "uid": 0}}),
            "tenants[1] (team-b).clusters.west.uid",
            "greater than or equal to 1",
            id="uid-zero",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"accounts": None}}),
            "tenants[1] (team-b).clusters.west.accounts",
            "cannot be unset",
            id="accounts-null",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"partitions": []}}),
            "tenants[1] (team-b).clusters.west.partitions",
            "at least 1 item",
            id="partitions-empty",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"partitions": ["gpu,debug"]}}),
            "tenants[1] (team-b).clusters.west.partitions[0]",
            "should match pattern",
            id="partition-list",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"qos": []}}),
            "tenants[1] (team-b).clusters.west.qos",
            "at least 1 item",
            id="qos-empty",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"maxTimeLimit": "1 day"}}),
            "tenants[1] (team-b).clusters.west.maxTimeLimit",
            "maxTimeLimit '1 day'",
            id="bad-duration",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"mountSources": []}}),
            "tenants[1] (team-b).clusters.west.mountSources",
            "at least 1 item",
            id="sources-empty",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"mountSources": ["/lustre/x"]}}),
            "tenants[1] (team-b).clusters.west.mountSources",
            "relative to the storage root",
            id="absolute-source",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"mountSources": ["d/../../x"]}}),
            "tenants[1] (team-b).clusters.west.mountSources",
            "'..' would leave the storage root",
            id="dotdot-source",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"mountSources": ["."]}}),
            "tenants[1] (team-b).clusters.west.mountSources",
            "the storage root itself",
            id="root-source",
        ),
        pytest.param(
            team("team-b", clusters={"west": {"mountSources": ["d/ok", "team-a/x"]}}),
            "tenants[1] (team-b).clusters.west.mountSources",
            "'team-a/x' is in the staging tree of namespace team-a",
            id="source-in-another-staging-tree",
        ),
        pytest.param(
            team("team-b", clusters={"east": {}, "west": {"mountSources": ["./team-b//x"]}}),
            "tenants[1] (team-b).clusters.west.mountSources",
            "'team-b/x' is in the staging tree of namespace team-b",
            id="source-in-its-own-staging-tree",
        ),
    ],
)
def test_the_loader_refuses_a_section_naming_the_file_and_the_entry(
    tmp_path: Path, entry: dict[str, Any], where: str, text: str
) -> None:
    message = refused(tmp_path, {"tenants": [team(), entry]})
    assert message.startswith(f"{where}: "), message
    assert text in message, message


@pytest.mark.parametrize(
    ("entry", "where", "name"),
    [
        pytest.param(team("team-b", defaultCluster="gpu"), "defaultCluster", "gpu", id="default"),
        pytest.param(
            team("team-b", clusters={"east": {}, "gpu": {}}), "clusters.gpu", "gpu", id="section"
        ),
        pytest.param(
            team("team-b", defaultCluster="gpu", clusters={"gpu": {}}),
            "defaultCluster",
            "gpu",
            id="both",
        ),
    ],
)
def test_a_cluster_the_clusters_file_does_not_name_is_refused(
    tmp_path: Path, entry: dict[str, Any], where: str, name: str
) -> None:
    message = refused(tmp_path, {"tenants": [team(), entry]}, ["west", "east"])
    assert message == (
        f"tenants[1] (team-b).{where}: unknown cluster {name!r} (the clusters file names east, "
        "west)"
    )
    # Without the known names (today's callers) the same file loads.
    assert load_tenants(write(tmp_path, {"tenants": [team(), entry]})) is not None


def test_with_no_clusters_known_every_named_cluster_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, {"tenants": [team(clusters={"east": {}})]}, [])
    assert message.endswith("unknown cluster 'east' (the clusters file names none)"), message
    # A tenant that names no cluster needs none known.
    assert load_tenants(write(tmp_path, {"tenants": [team()]}), []) is not None


def test_known_clusters_load(tmp_path: Path) -> None:
    data = {"tenants": [team(defaultCluster="east", clusters={"east": {}, "west": {}})]}
    tenants = load_tenants(write(tmp_path, data), frozenset({"east", "west", "gpu"}))
    assert tenants is not None
    assert tenants.default_cluster("team-a") == "east"
    section = tenants.tenants[0].clusters
    assert section == {"east": ClusterLimits(), "west": ClusterLimits()}


# -- mount sources of sections: the runtime registry and the other tenants ------------------


@pytest.mark.parametrize(
    ("source", "hit"), [("runtimes", True), ("runtimes/x", True), ("", False), ("data", False)]
)
def test_a_section_source_overlapping_the_runtimes_folder_is_refused(
    tmp_path: Path, source: str, hit: bool
) -> None:
    registry = RuntimeRegistry(
        runtimes=[RuntimeArtifact(id="a", format="sqsh", path="runtimes/a.sqsh", sha256=SHA)]
    )
    section = {"mountSources": [source]} if source else {}
    tenants = of(
        team(mountSources=["data"]),
        team("team-b", mountSources=["data"], clusters={"east": {}, "west": section}),
    )
    path = tmp_path / "tenants.yaml"
    if not hit:
        check_against_registry(tenants, registry, path)
        return
    with pytest.raises(CatalogError) as caught:
        check_against_registry(tenants, registry, path)
    assert str(caught.value) == (
        f"{path}: tenants[1] (team-b).clusters.west.mountSources: {source!r} overlaps the "
        "runtimes folder 'runtimes' of the runtime registry"
    )


def test_site_load_checks_section_sources_against_the_registry(tmp_path: Path) -> None:
    # make_settings' runtime lives in runtimes/.
    bad = write(tmp_path, {"tenants": [team(clusters={"west": {"mountSources": ["runtimes"]}})]})
    with pytest.raises(CatalogError, match=r"clusters\.west\.mountSources: .*runtimes folder"):
        Site.load(make_settings(tmp_path, tenants_file=bad), clusters=["default", "west"])


def test_site_load_refuses_a_cluster_the_operator_does_not_have(tmp_path: Path) -> None:
    path = write(tmp_path, {"tenants": [team(clusters={"west": {}})]})
    with pytest.raises(
        CatalogError, match=r"unknown cluster 'west' \(the clusters file names default\)"
    ):
        Site.load(make_settings(tmp_path, tenants_file=path))


def test_another_tenants_sources_on_any_cluster_stay_its_own(tmp_path: Path) -> None:
    # team-b keeps datasets/b-east only on east; on west, team-a (which lists all of datasets)
    # still may not take it: the storage root is the same for every cluster.
    base = of(
        team(mountSources=["datasets"]),
        team("team-b", clusters={"east": {"mountSources": ["datasets/b-east"]}}),
    )
    west = base.for_cluster("west")
    scope = west.scope("team-a")
    assert scope.other_sources == (("datasets", "b-east"),)
    mounts = [
        Mount(source="datasets/b-east/x", target="/in", readOnly=True),
        Mount(source="datasets/mine", target="/mine"),
    ]
    problems = mount_problems(mounts, tmp_path, RuntimeRegistry(), scope)
    assert problems == [
        "spec.mounts[0].source: 'datasets/b-east/x' reaches into another tenant's mount source"
    ]


def test_another_tenants_own_sources_count_where_a_section_replaces_them() -> None:
    # On east, team-b's own datasets/b is replaced by its section; it is team-b's all the same.
    base = of(
        team(mountSources=["datasets"]),
        team(
            "team-b",
            mountSources=["datasets/b"],
            clusters={"east": {"mountSources": ["datasets/b-east"]}},
        ),
    )
    others = base.for_cluster("east").scope("team-a").other_sources
    assert others == (("datasets", "b"), ("datasets", "b-east"))


def test_a_sections_sources_are_the_only_ones_on_its_cluster(tmp_path: Path) -> None:
    base = of(
        team(mountSources=["east/a"], clusters={"east": {}, "west": {"mountSources": ["west/a"]}})
    )
    registry = RuntimeRegistry()
    west = base.for_cluster("west").scope("team-a")
    east = base.for_cluster("east").scope("team-a")
    on_east = [Mount(source="east/a/data", target="/d")]
    on_west = [Mount(source="west/a/data", target="/d")]
    assert mount_problems(on_west, tmp_path, registry, west) == []
    assert mount_problems(on_east, tmp_path, registry, east) == []
    assert mount_problems(on_east, tmp_path, registry, west) == [
        "spec.mounts[0].source: 'east/a/data' is not under tenant team-a's mountSources (west/a)"
    ]
    assert mount_problems(on_west, tmp_path, registry, east) != []


# -- through resolution ---------------------------------------------------------------------


def test_resolution_uses_the_clusters_limits_and_defaults(tmp_path: Path) -> None:
    site = Site.load(make_settings(tmp_path))
    base = of(
        team(
            accounts=["acct"],
            partitions=["p1"],
            maxTimeLimit="1h",
            clusters={"west": {"partitions": ["w1", "w2"], "maxTimeLimit": "3h"}, "east": {}},
        )
    )
    spec = parse_spec(cpu_spec(timeLimit=None))
    west = resolve_site(
        spec,
        site.settings,
        site.catalogs.current.registry,
        site.catalogs.current.gpu_series,
        base.for_cluster("west").scope("team-a"),
    )
    assert (west.account, west.partition, west.time_limit_minutes) == ("acct", "w1", 180)
    east = resolve_site(
        spec,
        site.settings,
        site.catalogs.current.registry,
        site.catalogs.current.gpu_series,
        base.for_cluster("east").scope("team-a"),
    )
    assert (east.partition, east.time_limit_minutes) == ("p1", 60)
    with pytest.raises(SpecError) as caught:
        resolve_site(
            parse_spec(cpu_spec(partition="p1", timeLimit="2h")),
            site.settings,
            site.catalogs.current.registry,
            site.catalogs.current.gpu_series,
            base.for_cluster("west").scope("team-a"),
        )
    assert caught.value.messages == [
        "spec.partition: 'p1' is not in tenant team-a's partitions (w1, w2)"
    ]


# -- the documented example -----------------------------------------------------------------


def test_the_documented_example_loads(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)
    [example] = [b for b in blocks if "defaultCluster" in b]
    tenants = load_tenants(write(tmp_path, yaml.safe_load(example)), ["east", "west", "gpu"])
    assert tenants is not None
    assert any(t.clusters for t in tenants.tenants)
    [with_clusters] = [t for t in tenants.tenants if t.clusters]
    namespace = with_clusters.namespaces[0]
    assert with_clusters.clusters is not None
    assert tenants.default_cluster(namespace) in with_clusters.clusters
    with pytest.raises(TenantClusterDenied):
        tenants.for_cluster("gpu").scope(namespace)


def test_a_tenant_reads_back_as_the_file_said() -> None:
    tenant = Tenant.model_validate(team(defaultCluster="east", clusters={"east": {"qos": None}}))
    assert tenant.model_dump(by_alias=True, exclude_unset=True) == team(
        defaultCluster="east", clusters={"east": {"qos": None}}
    )
