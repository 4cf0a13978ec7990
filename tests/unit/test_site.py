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
