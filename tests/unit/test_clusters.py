"""Several Slurm clusters behind one operator: where a SlurmJob goes (`core.placement`), the
clusters file (`site.clusters`), and the fleet of per-cluster controllers routing real
resources to two in-memory Slurm clusters."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.spec import CLUSTER_NAME_RE as SPEC_CLUSTER_NAME_RE
from slurmjob_operator.api.status import get_condition
from slurmjob_operator.config import CLUSTER_NAME_RE, ConfigError, RuntimeProfile, Settings
from slurmjob_operator.controller import Controller, RetryLater
from slurmjob_operator.controller.fleet import Fleet
from slurmjob_operator.controller.pipeline import render_manifest
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.clusters import cluster_names, load_clusters

from .controller_fakes import MemorySlurm, MemoryStore, StubToken, cpu_spec, make_settings

TWO = Clusters(("east", "west"))


# -- placement ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec_cluster", "attempts", "tenant_default", "placed"),
    [
        (None, [], None, "east"),  # nothing said: the first
        ("west", [], None, "west"),
        ("west", [], "east", "west"),  # the spec over the tenant's default
        (None, [], "west", "west"),
        ("nowhere", [], None, "east"),  # refused there, with the known names
        (None, [], "gone", "east"),  # a tenant default no longer configured
        ("west", ["east"], None, "east"),  # where the attempts went, whatever the spec says
        (None, ["west", "east"], "west", "east"),  # the latest attempt's
        (None, [None], "west", None),  # a one-cluster release's: which one cannot be told
        ("west", ["retired"], None, None),  # a cluster no longer configured: nobody's
    ],
)
def test_placement(
    spec_cluster: str | None,
    attempts: list[str | None],
    tenant_default: str | None,
    placed: str | None,
) -> None:
    assert TWO.place(spec_cluster, attempts, tenant_default) == placed


def test_an_unnamed_attempt_belongs_to_the_cluster_named_as_the_one_cluster_was() -> None:
    assert Clusters(("east", "west"), legacy="west").place(None, [None]) == "west"
    assert Clusters(("east", "west"), legacy="default").place(None, [None]) is None
    assert Clusters(("only",), legacy="default").place(None, [None]) == "only"


@given(
    spec=st.one_of(st.none(), st.sampled_from(["east", "west", "x"])),
    attempts=st.lists(st.one_of(st.none(), st.sampled_from(["east", "west", "y"])), max_size=4),
    tenant=st.one_of(st.none(), st.sampled_from(["east", "west", "z"])),
)
def test_placement_is_always_a_known_cluster_and_sticks_to_the_attempts(
    spec: str | None, attempts: list[str | None], tenant: str | None
) -> None:
    placed = TWO.place(spec, attempts, tenant)
    if not attempts:
        assert placed in TWO.names
    elif attempts[-1] in TWO.names:
        assert placed == attempts[-1]
    else:  # never another cluster's job on this one
        assert placed is None


def test_refusal_names_the_field_and_the_known_clusters() -> None:
    assert TWO.refusal(None, "east") is None
    assert TWO.refusal("west", "west") is None
    message = TWO.refusal("nowhere", "east")
    assert (
        message == "spec.cluster: 'nowhere' is not a cluster of this operator (known: east, west)"
    )


def test_clusters_need_unique_names() -> None:
    with pytest.raises(ValueError, match="unique"):
        Clusters(("a", "a"))
    with pytest.raises(ValueError, match="at least one"):
        Clusters(())


def test_the_spec_and_the_settings_spell_a_cluster_name_alike() -> None:
    assert SPEC_CLUSTER_NAME_RE == CLUSTER_NAME_RE


# -- the clusters file ----------------------------------------------------------------------


def _file(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "clusters.yaml"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_without_a_file_there_is_one_cluster_from_the_settings() -> None:
    settings = Settings(cluster_name="hpc", slurm_rest_url="http://a:1")
    [only] = load_clusters(settings)
    assert only.name == "hpc"
    assert only.settings is settings


def test_a_key_left_out_takes_the_operators_setting(tmp_path: Path) -> None:
    key = tmp_path / "jwt.key"
    base = Settings(
        slurm_rest_url="http://east:6820",
        slurm_jwt_key_file=key,
        slurm_rest_user="svc",
        slurm_partition="batch",
        poll_interval=3,
        storage_root=tmp_path,
    )
    path = _file(
        tmp_path,
        {
            "clusters": [
                {"name": "east"},
                {
                    "name": "west",
                    "restUrl": "https://west:6820",
                    "apiVersion": "v0.0.38",
                    "jwtFile": str(tmp_path / "west.token"),
                    "partition": "gpu",
                    "runtimeProfile": "apptainer",
                    "storageRoot": str(tmp_path / "west"),
                },
            ]
        },
    )
    east, west = load_clusters(base.model_copy(update={"clusters_file": path}))
    assert east.name == "east"
    assert east.settings.slurm_rest_url == "http://east:6820"
    assert east.settings.cluster_name == "east"
    assert east.settings.clusters_file is None
    assert west.settings.slurm_rest_url == "https://west:6820"
    assert west.settings.slurm_rest_api_version == "v0.0.38"
    assert west.settings.slurm_partition == "gpu"
    assert west.settings.slurm_runtime_profile is RuntimeProfile.APPTAINER
    assert west.settings.storage_root == tmp_path / "west"
    # One way to authenticate: the token file replaces the inherited signing key.
    assert west.settings.slurm_jwt_file == tmp_path / "west.token"
    assert west.settings.slurm_jwt_key_file is None
    # Inherited, and what is the process's stays the process's.
    assert west.settings.slurm_rest_user == "svc"
    assert west.settings.poll_interval == 3
    assert cluster_names([east, west]) == Clusters(("east", "west"))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"clusters": []}, "clusters: List should have at least 1 item"),
        ({"clusters": [{"name": "East"}]}, "clusters[0].name"),
        ({"clusters": [{"name": "a"}, {"name": "a"}]}, "clusters[1].name: 'a' is already"),
        ({"clusters": [{"name": "a", "pollInterval": 1}]}, "clusters[0].pollInterval"),
        ({"clusters": [{"name": "a", "apiVersion": "v9"}]}, "clusters[0].apiVersion: 'v9'"),
        ({"clusters": [{"name": "a", "runtimeProfile": "docker"}]}, "clusters[0].runtimeProfile"),
        ({"clusters": [{"name": "a", "stagingOwner": "x"}]}, "clusters[0].stagingOwner"),
        ({"nodes": []}, "clusters: Field required"),
        ("- a list", "must be a mapping"),
        ("clusters: [", "not valid YAML"),
    ],
)
def test_a_bad_clusters_file_is_refused_naming_the_entry(
    tmp_path: Path, data: Any, message: str
) -> None:
    settings = Settings(clusters_file=_file(tmp_path, data))
    with pytest.raises(ConfigError) as err:
        load_clusters(settings)
    assert "SLURMJOB_CLUSTERS_FILE" in str(err.value)
    assert message in str(err.value)


def test_a_missing_clusters_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_clusters(Settings(clusters_file=tmp_path / "none.yaml"))


# -- the fleet: two clusters, real controllers, in-memory Slurm ------------------------------


class Two:
    def __init__(self, root: Path, clusters: Clusters = TWO, **settings: Any) -> None:
        self.store = MemoryStore()
        self.slurm = {"east": MemorySlurm(), "west": MemorySlurm()}
        self.metrics = Metrics()
        members = [
            Controller(
                make_settings(root / name, cluster_name=name, **settings),
                self.store,
                None,  # type: ignore[arg-type]  # the in-memory Slurm replaces the transport
                self.metrics,
                token=StubToken(),  # type: ignore[arg-type]
                link=self.slurm[name],  # type: ignore[arg-type]
                clusters=clusters,
            )
            for name in clusters.names
        ]
        self.fleet = Fleet(members, clusters)

    async def reconcile(self, ref: Any) -> None:
        body = self.store.objects[(ref.namespace, ref.name)]
        with contextlib.suppress(RetryLater):  # the confirmation is asked for later
            await self.fleet.reconcile(ref, body)

    def names_submitted(self, cluster: str) -> list[str]:
        return [j.name for j in self.slurm[cluster].jobs.values()]


async def test_each_job_goes_to_its_cluster_and_says_so(tmp_path: Path) -> None:
    two = Two(tmp_path)
    first = two.store.create("first", cpu_spec())
    second = two.store.create("second", {**cpu_spec(), "cluster": "west"})
    for ref in (first, second):
        await two.reconcile(ref)
        await two.reconcile(ref)  # confirm
    assert [a.cluster for a in two.store.status(first).attempts] == ["east"]
    assert [a.cluster for a in two.store.status(second).attempts] == ["west"]
    assert len(two.names_submitted("east")) == 1
    assert len(two.names_submitted("west")) == 1
    assert two.names_submitted("west")[0].startswith("sj-team-a-second-")
    # Each cluster's part follows its own job only.
    east, west = two.fleet.members
    assert [t.ref.name for t in east.followed()] == ["first"]
    assert [t.ref.name for t in west.followed()] == ["second"]
    assert sorted(t.ref.name for t in two.fleet.followed()) == ["first", "second"]


async def test_an_unknown_cluster_is_refused_with_nothing_sent(tmp_path: Path) -> None:
    two = Two(tmp_path)
    ref = two.store.create("lost", {**cpu_spec(), "cluster": "nowhere"})
    await two.reconcile(ref)
    status = two.store.status(ref)
    assert status.phase is not None
    assert status.phase.value == "Failed"
    ready = get_condition(status.conditions, "Ready")
    assert ready is not None
    assert ready.reason == Reason.INVALID_SPEC
    assert "spec.cluster: 'nowhere' is not a cluster of this operator (known: east, west)" in (
        ready.message or ""
    )
    assert not two.slurm["east"].jobs
    assert not two.slurm["west"].jobs


async def test_a_cluster_that_is_down_marks_only_its_own_jobs(tmp_path: Path) -> None:
    two = Two(tmp_path)
    refs = {name: two.store.create(name, {**cpu_spec(), "cluster": name}) for name in TWO.names}
    for ref in refs.values():
        await two.reconcile(ref)
        await two.reconcile(ref)
    east, west = two.fleet.members
    await east.report_reachability(False, Reason.SLURM_UNAVAILABLE, "slurmrestd of east failed")
    await west.report_reachability(True, Reason.SLURM_ANSWERING, "slurmrestd of west answers")
    down = get_condition(two.store.status(refs["east"]).conditions, "SlurmReachable")
    assert down is not None
    assert (down.status, down.reason) == ("False", Reason.SLURM_UNAVAILABLE)
    assert get_condition(two.store.status(refs["west"]).conditions, "SlurmReachable") is None


def _old_status(two: Two, name: str, cluster: str | None) -> Any:
    ref = two.store.create(name, cpu_spec())
    body = two.store.objects[(ref.namespace, ref.name)]
    attempt = {"number": 1, "jobName": f"sj-{name}", "jobId": 7, "confirmed": True}
    if cluster is not None:
        attempt["cluster"] = cluster
    body["status"] = {"phase": "Running", "slurmJobId": 7, "attempts": [attempt]}
    return ref, body


async def test_a_status_of_a_one_cluster_release_stays_with_its_cluster(tmp_path: Path) -> None:
    two = Two(tmp_path, clusters=Clusters(("east", "west"), legacy="west"))
    _, body = _old_status(two, "old", None)
    assert two.fleet.owner(ResourceView.of(body)).name == "west"  # type: ignore[union-attr]
    two.fleet.observe_body(body)
    east, west = two.fleet.members
    assert east.followed() == []
    assert [t.job_id for t in west.followed()] == [7]
    two.fleet.observe_body(body, deleted=True)
    assert two.fleet.followed() == []


@pytest.mark.parametrize("cluster", [None, "retired"])
async def test_an_attempt_of_no_configured_cluster_is_left_alone(
    tmp_path: Path, cluster: str | None
) -> None:
    two = Two(tmp_path)  # two clusters, none named as the old one cluster was
    ref, body = _old_status(two, "orphan", cluster)
    two.fleet.observe_body(body)
    assert two.fleet.followed() == []  # no cluster's lookups may call its job lost
    with pytest.raises(RetryLater, match="neither followed nor resubmitted"):
        await two.fleet.reconcile(ref, body)
    # Deleting it looks for its live jobs by name where it belongs (east, the first), and
    # lets it go: the claim of a cluster the operator does not serve holds nothing.
    await two.fleet.finalize(body)
    assert [r for _, r, _ in two.store.events] == ["ClusterUnknown"]
    assert two.slurm["east"].calls == ["list_jobs"]
    assert not two.slurm["west"].calls


def _tenants(root: Path) -> Path:
    path = root / "tenants.yaml"
    path.write_text(
        json.dumps(
            {
                "tenants": [
                    {
                        "name": "team-a",
                        "namespaces": ["team-a"],
                        "accounts": ["a-east"],
                        "partitions": ["debug"],
                        "defaultCluster": "west",
                        "clusters": {"east": {}, "west": {"accounts": ["a-west"]}},
                    },
                    {
                        "name": "team-b",
                        "namespaces": ["team-b"],
                        "accounts": ["b"],
                        "partitions": ["debug"],
                        "clusters": {"east": {}},
                    },
                ]
            }
        )
    )
    return path


async def test_tenants_default_cluster_and_per_cluster_limits(tmp_path: Path) -> None:
    two = Two(tmp_path, tenants_file=_tenants(tmp_path))
    sent: list[Any] = []
    west = two.slurm["west"]
    submit = west.submit

    async def capture(req: Any) -> Any:
        sent.append(req)
        return await submit(req)

    west.submit = capture  # type: ignore[method-assign]
    ref = two.store.create("defaulted", cpu_spec())  # no spec.cluster: team-a's default
    await two.reconcile(ref)
    [attempt] = two.store.status(ref).attempts
    assert attempt.cluster == "west"
    [req] = sent
    assert req.account == "a-west"  # west's section of team-a
    assert not two.slurm["east"].jobs


async def test_a_tenant_off_its_clusters_is_refused_with_nothing_sent(tmp_path: Path) -> None:
    two = Two(tmp_path, tenants_file=_tenants(tmp_path))
    ref = two.store.create("elsewhere", {**cpu_spec(), "cluster": "west"}, namespace="team-b")
    await two.reconcile(ref)
    status = two.store.status(ref)
    ready = get_condition(status.conditions, "Ready")
    assert ready is not None
    assert ready.reason == Reason.INVALID_SPEC
    assert "spec.cluster: tenant team-b may use clusters east; not west" in (ready.message or "")
    assert not two.slurm["west"].jobs
    assert not two.slurm["east"].jobs


def test_render_renders_as_the_cluster_the_job_goes_to(tmp_path: Path) -> None:
    base = make_settings(tmp_path, slurm_partition="east-part")
    path = _file(tmp_path, {"clusters": [{"name": "east"}, {"name": "west", "partition": "a100"}]})
    settings = base.model_copy(update={"clusters_file": path})

    def partition(spec: dict[str, Any]) -> Any:
        manifest = {"metadata": {"name": "r", "namespace": "team-a"}, "spec": spec}
        body = render_manifest(manifest, api_version="v0.0.45", settings=settings)
        return body["job"]["partition"]

    assert partition(cpu_spec()) == "east-part"
    assert partition(cpu_spec(cluster="west")) == "a100"
    with pytest.raises(SpecError, match=r"spec.cluster: 'north' is not a cluster"):
        partition(cpu_spec(cluster="north"))


def test_a_cluster_with_its_own_slurmrestd_never_gets_the_operators_token(tmp_path: Path) -> None:
    base = Settings(
        slurm_rest_url="http://east:6820",
        slurm_jwt_file=tmp_path / "east.token",
        slurm_ca_bundle=tmp_path / "east-ca.pem",
        slurm_partition="batch",
    )
    bare = _file(
        tmp_path, {"clusters": [{"name": "east"}, {"name": "west", "restUrl": "https://w"}]}
    )
    with pytest.raises(ConfigError, match=r"clusters\[1\]: jwtFile or jwtKeyFile is required"):
        load_clusters(base.model_copy(update={"clusters_file": bare}))
    own = _file(
        tmp_path,
        {
            "clusters": [
                {"name": "east"},
                {
                    "name": "west",
                    "restUrl": "https://w",
                    "jwtKeyFile": str(tmp_path / "w.key"),
                    "partition": None,
                },
                {"name": "same", "restUrl": "http://east:6820"},  # the same server: inherits
            ]
        },
    )
    _, west, same = load_clusters(base.model_copy(update={"clusters_file": own}))
    assert west.settings.slurm_jwt_file is None
    assert west.settings.slurm_jwt_key_file == tmp_path / "w.key"
    assert west.settings.slurm_ca_bundle is None  # east's CA is east's
    assert west.settings.slurm_partition is None  # an explicit null unsets the shared default
    assert same.settings.slurm_jwt_file == tmp_path / "east.token"
    assert same.settings.slurm_ca_bundle == tmp_path / "east-ca.pem"


async def test_a_tenant_off_the_first_cluster_goes_to_the_first_it_may_use(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    tenant = {
        "name": "team-w",
        "namespaces": ["team-w"],
        "accounts": ["w"],
        "partitions": ["debug"],
    }
    path.write_text(json.dumps({"tenants": [{**tenant, "clusters": {"west": {}}}]}))
    two = Two(tmp_path, tenants_file=path)
    ref = two.store.create("w", cpu_spec(), namespace="team-w")
    await two.reconcile(ref)
    [attempt] = two.store.status(ref).attempts
    assert attempt.cluster == "west"


def test_doctor_reads_the_tenants_as_each_cluster_sees_them(tmp_path: Path) -> None:
    from slurmjob_operator.doctor import Outcome, Report
    from slurmjob_operator.doctor.tenancy import check_tenancy
    from slurmjob_operator.site.catalogs import RuntimeRegistry

    path = tmp_path / "tenants.yaml"
    tenant = {"name": "team-a", "namespaces": ["team-a"], "accounts": ["a"], "partitions": ["p"]}
    path.write_text(
        json.dumps(
            {"tenants": [{**tenant, "clusters": {"east": {}, "west": {"slurmUser": "alice"}}}]}
        )
    )

    def check(cluster: str, clusters: list[str]) -> dict[str, Any]:
        report = Report()
        settings = Settings(tenants_file=path, cluster_name=cluster)
        check_tenancy(settings, RuntimeRegistry(), report, clusters)
        return {c.name: c for c in report.checks}

    east = check("east", ["east", "west"])
    assert east["tenancy"].outcome is Outcome.OK
    assert east["tenant users"].outcome is Outcome.WARN  # no slurmUser on east
    west = check("west", ["east", "west"])
    # On west the tenant has a Slurm user of its own, which needs the signing key.
    assert west["tenant users"].outcome is Outcome.FAIL
    assert "team-a" in west["tenant users"].detail
    unknown = check("east", ["east"])  # the file names a cluster this operator does not have
    assert unknown["tenancy"].outcome is Outcome.FAIL
    assert "unknown cluster 'west'" in unknown["tenancy"].detail


# -- what a hostile namespace (or a hostile status writer) can do with the routing ------------


async def test_a_status_claiming_another_clusters_job_neither_folds_nor_cancels_it(
    tmp_path: Path,
) -> None:
    two = Two(tmp_path)
    # A job on west that belongs to another resource (another namespace's, say).
    victim = two.store.create("victim", {**cpu_spec(), "cluster": "west"}, namespace="team-b")
    await two.reconcile(victim)
    await two.reconcile(victim)
    [theirs] = two.store.status(victim).attempts
    assert theirs.job_id is not None
    # A resource whose status claims that job on west (a status is only a claim).
    ref, body = _old_status(two, "thief", "west")
    body["status"]["attempts"][0]["jobId"] = theirs.job_id
    body["status"]["slurmJobId"] = theirs.job_id
    two.fleet.observe_body(body)
    # It belongs to east (no spec.cluster, no tenant): an attempt naming west is followed by
    # neither part, so nothing is folded from the victim's job.
    assert all(t.ref != ref for t in two.fleet.followed())
    with pytest.raises(RetryLater, match="neither followed nor resubmitted"):
        await two.fleet.reconcile(ref, body)
    body = two.store.objects[(ref.namespace, ref.name)]
    body["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    with contextlib.suppress(RetryLater):
        await two.fleet.finalize(body)
    # Looked for by its own name on both, never cancelled on either cluster.
    assert two.slurm["west"].jobs[theirs.job_id].base_state.value != "CANCELLED"
    assert not [c for c in two.slurm["west"].calls if c.startswith("cancel")]
    assert "list_jobs" in two.slurm["west"].calls
    assert not [c for c in two.slurm["east"].calls if c.startswith("cancel")]


@pytest.mark.parametrize("cluster", [42, ["west"], "x" * 5000, "West", "-west", ""])
async def test_a_hostile_spec_cluster_is_refused_with_nothing_sent(
    tmp_path: Path, cluster: Any
) -> None:
    two = Two(tmp_path)
    ref = two.store.create("odd", {**cpu_spec(), "cluster": cluster})
    await two.reconcile(ref)
    status = two.store.status(ref)
    ready = get_condition(status.conditions, "Ready")
    assert ready is not None
    assert ready.reason == Reason.INVALID_SPEC
    assert "spec.cluster" in (ready.message or "")
    assert len(ready.message or "") < 2000  # the value is not echoed whole
    assert not two.slurm["east"].jobs
    assert not two.slurm["west"].jobs


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"statistics": {"dbd_agent_queue_size": 0}}, 0),
        ({"statistics": {"dbd_agent_queue_size": 17}}, 17),
        ({"statistics": {"dbd_agent_queue_size": -1}}, None),  # nonsense proves nothing
        ({"statistics": {"dbd_agent_queue_size": False}}, None),  # a bool is no count
        ({"statistics": {"dbd_agent_queue_size": "0"}}, None),
        ({"statistics": {"dbd_agent_queue_size": 0.0}}, None),
        ({"statistics": {}}, None),
        ({"statistics": []}, None),
        ({}, None),
    ],
)
def test_a_hostile_diag_answer_never_reads_as_an_empty_queue(
    payload: dict[str, Any], expected: int | None
) -> None:
    from slurmjob_operator.slurm.nodes import parse_dbd_queue

    assert parse_dbd_queue(payload) == expected
