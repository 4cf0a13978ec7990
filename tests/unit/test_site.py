"""Validation against the site's catalogs (api.site)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.api.spec import Framework, Pool, SlurmJobSpec
from slurmjob_operator.config import RuntimeProfile, Settings
from slurmjob_operator.site.catalogs import (
    GpuSeries,
    GpuSeriesCatalog,
    RuntimeArtifact,
    RuntimeRegistry,
    load_gpu_series,
    load_runtime_registry,
)
from slurmjob_operator.site.resolve import SiteResolution, resolve_site
from slurmjob_operator.site.tenants import Tenants

from .test_spec import changed, cpu_spec, gpu_spec, het_spec

ROOT = Path(__file__).resolve().parents[2]
SHA = "0" * 64

REGISTRY = RuntimeRegistry(
    runtimes=[
        RuntimeArtifact(id="custom-python", format="sqsh", path="rt/python.sqsh", sha256=SHA),
        RuntimeArtifact(id="custom-trainer", format="sqsh", path="rt/trainer.sqsh", sha256=SHA),
        RuntimeArtifact(id="custom-sif", format="sif", path="rt/python.sif", sha256=SHA),
        RuntimeArtifact(id="torch-2.5", format="sqsh", path="rt/torch.sqsh", sha256=SHA),
    ]
)
SERIES = GpuSeriesCatalog(
    series=[
        GpuSeries(name="h100", slurm_constraint="h100", gpus_per_node=8),
        GpuSeries(name="a100", slurm_constraint="a100", gpus_per_node=4),
        GpuSeries(name="l40s", gpus_per_node=4),
    ]
)


def settings(**values: Any) -> Settings:
    return Settings(storage_root=Path("/storage"), slurm_partition="batch", **values)


def resolve(spec: dict[str, Any], **values: Any) -> SiteResolution:
    return resolve_site(parse_spec(spec), settings(**values), REGISTRY, SERIES)


def refusal(spec: dict[str, Any] | SlurmJobSpec, **values: Any) -> SpecError:
    parsed = spec if isinstance(spec, SlurmJobSpec) else parse_spec(spec)
    with pytest.raises(SpecError) as caught:
        resolve_site(parsed, settings(**values), REGISTRY, SERIES)
    return caught.value


def test_cpu_only() -> None:
    site = resolve(cpu_spec())
    assert site.runtime.id == "custom-python"
    assert site.series == {"main": None}
    assert site.exclusive == {"main": False}
    assert site.partition == "batch"
    assert site.constraint("main") is None


def test_single_pool_whole_nodes_are_exclusive() -> None:
    site = resolve(gpu_spec())
    assert site.series["train"] == SERIES.get("h100")
    assert site.exclusive == {"train": True}
    assert site.partition == "gpu"
    assert site.constraint("train") == "h100"


def test_partial_nodes_are_shared() -> None:
    site = resolve(changed(gpu_spec(), pools__0__gpusPerNode=2))
    assert site.exclusive == {"train": False}


def test_single_pool_may_use_a_series_without_constraint() -> None:
    site = resolve(changed(gpu_spec(), pools__0__gpuSeries="l40s", pools__0__gpusPerNode=4))
    assert site.constraint("train") is None
    assert site.exclusive == {"train": True}


def test_heterogeneous() -> None:
    site = resolve(het_spec())
    assert site.exclusive == {"policy": True, "rollout": True}
    assert [site.constraint(p) for p in ("policy", "rollout")] == ["h100", "a100"]


def test_partition_falls_back_to_none() -> None:
    spec = parse_spec(cpu_spec())
    site = resolve_site(spec, Settings(), REGISTRY, SERIES)
    assert site.partition is None


def test_apptainer_runs_sif() -> None:
    spec = changed(cpu_spec(), framework__runtimeId="custom-sif")
    site = resolve(spec, slurm_runtime_profile=RuntimeProfile.APPTAINER)
    assert site.runtime.format == "sif"


@pytest.mark.parametrize(
    ("spec", "settings_values", "path", "text"),
    [
        pytest.param(
            changed(cpu_spec(), framework__runtimeId="custom-nope"),
            {},
            "spec.framework.runtimeId",
            "'custom-nope' is not in the site's runtime registry",
            id="unknown-runtime",
        ),
        pytest.param(
            changed(cpu_spec(), framework__runtimeId="custom-sif"),
            {},
            "spec.framework.runtimeId",
            "is a sif artifact, but this site's runtime profile enroot-pyxis runs sqsh",
            id="sif-on-enroot",
        ),
        pytest.param(
            cpu_spec(),
            {"slurm_runtime_profile": RuntimeProfile.APPTAINER},
            "spec.framework.runtimeId",
            "is a sqsh artifact, but this site's runtime profile apptainer runs sif",
            id="sqsh-on-apptainer",
        ),
        pytest.param(
            changed(gpu_spec(), pools__0__gpuSeries="b200"),
            {},
            "spec.pools[0].gpuSeries",
            "unknown GPU series 'b200' (known: a100, h100, l40s)",
            id="unknown-series",
        ),
        pytest.param(
            changed(cpu_spec(), pools__0__gpuSeries="b200"),
            {},
            "spec.pools[0].gpuSeries",
            "unknown GPU series",
            id="unknown-series-on-cpu-pool",
        ),
        pytest.param(
            changed(gpu_spec(), pools__0__gpusPerNode=9),
            {},
            "spec.pools[0].gpusPerNode",
            "9 GPUs per node, but series 'h100' has 8 per node",
            id="too-many-gpus",
        ),
        pytest.param(
            changed(het_spec(), pools__1__gpuSeries="l40s"),
            {},
            "spec.pools[1].gpuSeries",
            "declares no slurmConstraint, so a heterogeneous component could land on arbitrary "
            "GPU nodes; refused (fail-closed)",
            id="het-without-constraint",
        ),
    ],
)
def test_refusals(
    spec: dict[str, Any], settings_values: dict[str, Any], path: str, text: str
) -> None:
    error = refusal(spec, **settings_values)
    assert error.field == path
    assert any(m.startswith(f"{path}: ") and text in m for m in error.messages), error.messages


def test_heterogeneous_cpu_pool_is_refused_even_past_the_model() -> None:
    # The model already refuses it; built without validation, the site refuses it too.
    spec = SlurmJobSpec.model_construct(
        framework=Framework(kind="custom", name="custom", runtime_id="custom-trainer"),
        command=["x"],
        pools=[
            Pool(name="gpu", gpu_series="h100", gpus_per_node=8, cpus=1, memory_gb=1),
            Pool(name="cpu", cpus=1, memory_gb=1),
        ],
        partition=None,
    )
    error = refusal(spec)
    assert error.field == "spec.pools[1].gpusPerNode"
    assert "heterogeneous" in error.messages[0]


def test_all_problems_at_once() -> None:
    spec = changed(het_spec(), framework__runtimeId="custom-nope", pools__0__gpusPerNode=16)
    spec["pools"][1]["gpuSeries"] = "l40s"
    error = refusal(spec)
    assert [m.split(": ")[0] for m in error.messages] == [
        "spec.framework.runtimeId",
        "spec.pools[0].gpusPerNode",
        "spec.pools[1].gpuSeries",
    ]


def test_empty_catalogs_say_so() -> None:
    with pytest.raises(SpecError, match="the catalog is empty"):
        resolve_site(parse_spec(cpu_spec()), settings(), RuntimeRegistry(), SERIES)


def test_long_catalogs_are_abbreviated() -> None:
    many = RuntimeRegistry(
        runtimes=[
            RuntimeArtifact(id=f"custom-{i:02}", format="sqsh", path=f"r/{i}.sqsh", sha256=SHA)
            for i in range(15)
        ]
    )
    with pytest.raises(SpecError, match="and 5 more"):
        resolve_site(
            parse_spec(changed(cpu_spec(), framework__runtimeId="custom-x")),
            settings(),
            many,
            SERIES,
        )


def test_examples_resolve_against_the_example_site() -> None:
    site_dir = ROOT / "examples" / "site"
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    if not examples or not (site_dir / "runtime-registry.yaml").exists():
        pytest.skip("no examples yet")
    registry = load_runtime_registry(site_dir / "runtime-registry.yaml")
    series = load_gpu_series(site_dir / "gpu-series.yaml")
    for path in examples:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                resolve_site(parse_spec(doc["spec"]), settings(), registry, series)


# -- tenant limits --------------------------------------------------------------------------

TENANTS = Tenants.model_validate(
    {
        "tenants": [
            {
                "name": "team-a",
                "namespaces": ["team-a", "team-a-dev"],
                "accounts": ["team-a", "team-a-big"],
                "partitions": ["gpu", "debug"],
                "qos": ["normal", "low"],
                "mountSources": ["datasets/team-a", "datasets/public", "scratch/a"],
                "maxTimeLimit": "24h",
                "slurmUser": "team-a",
                "uid": 1001,
            },
            {
                "name": "team-b",
                "namespaces": ["team-b"],
                "accounts": ["team-b"],
                "partitions": ["debug"],
                "mountSources": ["datasets/public", "scratch/a/b-only"],
            },
            {
                "name": "team-c",
                "namespaces": ["team-c"],
                "accounts": ["team-c"],
                "partitions": ["debug"],
            },
        ]
    }
)


def tenant_resolve(
    spec: dict[str, Any], namespace: str = "team-a", root: Path = Path("/storage")
) -> SiteResolution:
    return resolve_site(
        parse_spec(spec),
        Settings(storage_root=root, slurm_partition="batch"),
        REGISTRY,
        SERIES,
        TENANTS.scope(namespace),
    )


def tenant_refusal(
    spec: dict[str, Any], namespace: str = "team-a", root: Path = Path("/storage")
) -> SpecError:
    with pytest.raises(SpecError) as caught:
        tenant_resolve(spec, namespace, root)
    return caught.value


def mounts(*entries: tuple[str, bool]) -> list[dict[str, Any]]:
    return [
        {"source": source, "target": f"/m{i}", "readOnly": ro}
        for i, (source, ro) in enumerate(entries)
    ]


def test_a_tenants_defaults_fill_what_the_spec_leaves_out() -> None:
    site = tenant_resolve(cpu_spec())
    assert (site.account, site.partition, site.qos) == ("team-a", "gpu", "normal")
    assert site.time_limit_minutes == 24 * 60
    assert site.tenant is not None
    assert (site.tenant.name, site.tenant.slurm_user, site.tenant.uid) == ("team-a", "team-a", 1001)
    applied = site.applied_to(parse_spec(cpu_spec()))
    assert (applied.account, applied.qos, applied.time_limit_minutes) == ("team-a", "normal", 1440)


def test_what_the_spec_says_inside_the_limits_is_kept() -> None:
    spec = changed(cpu_spec(), account="team-a-big", partition="debug", qos="low", timeLimit="24h")
    site = tenant_resolve(spec)
    assert (site.account, site.partition, site.qos) == ("team-a-big", "debug", "low")
    assert site.time_limit_minutes == 1440
    parsed = parse_spec(spec)
    assert site.applied_to(parsed) is parsed


def test_a_tenant_without_qos_or_time_limit_passes_the_spec_through() -> None:
    site = tenant_resolve(changed(cpu_spec(), qos="anything"), namespace="team-b")
    assert (site.qos, site.time_limit_minutes, site.partition) == ("anything", None, "debug")


def test_single_tenant_resolution_is_unchanged() -> None:
    site = resolve(changed(cpu_spec(), partition="gpu,debug", account="x", qos="y"))
    assert (site.partition, site.account, site.qos, site.tenant) == ("gpu,debug", "x", "y", None)
    assert site.time_limit_minutes is None


@pytest.mark.parametrize(
    ("update", "namespace", "path", "text"),
    [
        pytest.param(
            {"account": "team-b"},
            "team-a",
            "spec.account",
            "'team-b' is not in tenant team-a's accounts (team-a, team-a-big)",
            id="foreign-account",
        ),
        pytest.param(
            {"partition": "batch"},
            "team-a",
            "spec.partition",
            "'batch' is not in tenant team-a's partitions (gpu, debug)",
            id="foreign-partition",
        ),
        pytest.param(
            {"partition": "gpu,debug"},
            "team-a",
            "spec.partition",
            "'gpu,debug' is a list; a tenant's job names one partition",
            id="partition-list",
        ),
        pytest.param(
            {"qos": "high"},
            "team-a",
            "spec.qos",
            "'high' is not in tenant team-a's qos list (normal, low)",
            id="foreign-qos",
        ),
        pytest.param(
            {"timeLimit": "1d1m"},
            "team-a",
            "spec.timeLimit",
            "1441 minutes is longer than tenant team-a's maxTimeLimit of 1440 minutes",
            id="too-long",
        ),
        pytest.param(
            {"mounts": mounts(("datasets/team-ab", True))},
            "team-a",
            "spec.mounts[0].source",
            "is not under tenant team-a's mountSources (datasets/team-a, datasets/public, "
            "scratch/a)",
            id="prefix-is-whole-components",
        ),
        pytest.param(
            {"mounts": mounts(("datasets", True))},
            "team-a",
            "spec.mounts[0].source",
            "is not under tenant team-a's mountSources",
            id="parent-of-a-source",
        ),
        pytest.param(
            {"mounts": mounts(("datasets/team-a", True))},
            "team-c",
            "spec.mounts[0].source",
            "cannot be mounted: tenant team-c has no mountSources",
            id="tenant-without-sources",
        ),
        pytest.param(
            {"mounts": mounts(("team-a/job-12345678", True))},
            "team-a",
            "spec.mounts[0].source",
            "is in the staging tree of namespace team-a",
            id="own-staging-tree",
        ),
        pytest.param(
            {"mounts": mounts(("team-b", True))},
            "team-a",
            "spec.mounts[0].source",
            "is in the staging tree of namespace team-b",
            id="another-namespace",
        ),
        pytest.param(
            {"mounts": mounts(("rt", True))},
            "team-a",
            "spec.mounts[0].source",
            "overlaps the runtimes folder 'rt'",
            id="runtimes-folder",
        ),
        pytest.param(
            {"mounts": mounts(("rt/python.sqsh", True))},
            "team-a",
            "spec.mounts[0].source",
            "overlaps the runtimes folder 'rt'",
            id="runtime-artifact",
        ),
        pytest.param(
            {"mounts": mounts(("datasets/public", False))},
            "team-a",
            "spec.mounts[0].source",
            "is shared with another tenant, so it is read-only: set readOnly: true",
            id="shared-read-write",
        ),
        pytest.param(
            {"mounts": mounts(("datasets/public/sub", False))},
            "team-b",
            "spec.mounts[0].source",
            "is shared with another tenant",
            id="shared-read-write-below",
        ),
        pytest.param(
            {"mounts": mounts(("scratch/a", True))},
            "team-a",
            "spec.mounts[0].source",
            "reaches into another tenant's mount source",
            id="contains-another-tenants-source",
        ),
        pytest.param(
            {"mounts": mounts(("scratch/a/b-only/x", True))},
            "team-a",
            "spec.mounts[0].source",
            "reaches into another tenant's mount source",
            id="inside-another-tenants-source",
        ),
        pytest.param(
            {"mounts": mounts(("datasets/team-a", True), ("datasets/team-ab/x", True))},
            "team-a",
            "spec.mounts[1].source",
            "is not under tenant team-a's mountSources",
            id="names-the-index",
        ),
    ],
)
def test_tenant_limits_are_refused_naming_the_field(
    update: dict[str, Any], namespace: str, path: str, text: str
) -> None:
    error = tenant_refusal({**cpu_spec(), **update}, namespace)
    assert error.field == path, error.messages
    assert any(m.startswith(f"{path}: ") and text in m for m in error.messages), error.messages


@pytest.mark.parametrize(
    ("namespace", "entries"),
    [
        pytest.param("team-a", [("datasets/team-a", False)], id="own-read-write"),
        pytest.param("team-a", [("datasets/team-a/deep/er", False)], id="own-below"),
        pytest.param("team-a", [("datasets/public", True)], id="shared-read-only"),
        pytest.param("team-b", [("datasets/public/sub", True)], id="shared-below-read-only"),
        pytest.param("team-a", [("scratch/a/mine", False)], id="beside-another-tenants-source"),
        pytest.param("team-b", [("scratch/a/b-only", False)], id="nested-own-source"),
    ],
)
def test_tenant_mounts_that_are_admitted(namespace: str, entries: list[tuple[str, bool]]) -> None:
    tenant_resolve({**cpu_spec(), "mounts": mounts(*entries)}, namespace)


def test_every_limit_is_reported_at_once() -> None:
    spec = {
        **cpu_spec(),
        "account": "x",
        "partition": "y",
        "qos": "z",
        "timeLimit": "2d",
        "mounts": mounts(("elsewhere", True)),
    }
    fields = [m.split(": ")[0] for m in tenant_refusal(spec).messages]
    assert fields == [
        "spec.partition",
        "spec.account",
        "spec.qos",
        "spec.timeLimit",
        "spec.mounts[0].source",
    ]


def test_a_symlink_out_of_a_tenants_source_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    own = root / "datasets" / "team-a"
    own.mkdir(parents=True)
    (root / "team-b" / "job-1234abcd").mkdir(parents=True)
    (root / "datasets" / "team-b").mkdir()
    (own / "to-staging").symlink_to(root / "team-b" / "job-1234abcd")
    (own / "to-b").symlink_to("../team-b")
    (own / "out").symlink_to("/etc")
    (own / "inside").symlink_to("data")
    (own / "data").mkdir()
    cases = {
        "to-staging": "resolves through a symlink to 'team-b/job-1234abcd', which is in the "
        "staging tree of namespace team-b",
        "to-b": "resolves through a symlink to 'datasets/team-b', which is not under tenant "
        "team-a's mountSources",
        "out": "resolves (through a symlink) to a path outside the storage root",
    }
    for link, text in cases.items():
        spec = {**cpu_spec(), "mounts": mounts((f"datasets/team-a/{link}", True))}
        error = tenant_refusal(spec, root=root)
        [message] = error.messages
        assert message.startswith(f"spec.mounts[0].source: 'datasets/team-a/{link}' {text}")
    tenant_resolve({**cpu_spec(), "mounts": mounts(("datasets/team-a/inside", False))}, root=root)
