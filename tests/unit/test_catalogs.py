"""Site catalogs: the runtime registry and the GPU series catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmjob_operator.config import RuntimeProfile
from slurmjob_operator.site.catalogs import (
    PROFILE_FORMAT,
    ArtifactFormat,
    CatalogError,
    GpuSeriesCatalog,
    RuntimeRegistry,
    load_gpu_series,
    load_runtime_registry,
)

ROOT = Path(__file__).resolve().parents[2]
SHA = "a" * 64


def write(tmp_path: Path, text: str, name: str = "catalog.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_no_file_means_empty_catalogs() -> None:
    assert load_runtime_registry(None) == RuntimeRegistry()
    assert load_gpu_series(None) == GpuSeriesCatalog()


def test_empty_file_means_empty_catalog(tmp_path: Path) -> None:
    assert load_runtime_registry(write(tmp_path, "")).runtimes == []


def test_runtime_registry(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"runtimes:\n"
        f"  - {{id: custom-a, format: sqsh, path: rt/a.sqsh, sha256: {SHA}}}\n"
        f"  - {{id: custom-b, format: sif, path: rt/b.sif, sha256: {SHA}}}\n",
    )
    registry = load_runtime_registry(path)
    a = registry.get("custom-a")
    assert a is not None
    assert a.format is ArtifactFormat.SQSH
    assert a.path == "rt/a.sqsh"
    b = registry.get("custom-b")
    assert b is not None
    assert b.format is ArtifactFormat.SIF
    assert registry.get("custom-c") is None


def test_gpu_series(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "series:\n"
        "  - {name: h100, slurmConstraint: h100, gpusPerNode: 8}\n"
        "  - {name: l40s, gpusPerNode: 4}\n",
    )
    catalog = load_gpu_series(path)
    h100 = catalog.get("h100")
    assert h100 is not None
    assert (h100.slurm_constraint, h100.gpus_per_node) == ("h100", 8)
    l40s = catalog.get("l40s")
    assert l40s is not None
    assert l40s.slurm_constraint is None
    assert catalog.get("b200") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "runtimes:\n  - {id: a, format: sqsh, path: a.sqsh, sha256: xyz}\n",
            "runtimes.0.sha256",
            id="bad-sha",
        ),
        pytest.param(
            f"runtimes:\n  - {{id: a, format: oci, path: a, sha256: {SHA}}}\n",
            "runtimes.0.format",
            id="bad-format",
        ),
        pytest.param(
            f"runtimes:\n  - {{id: a, format: sqsh, path: /abs/a.sqsh, sha256: {SHA}}}\n",
            "relative to the storage root",
            id="absolute-path",
        ),
        pytest.param(
            f"runtimes:\n  - {{id: a, format: sqsh, path: rt/../../a.sqsh, sha256: {SHA}}}\n",
            "relative to the storage root",
            id="dotdot-path",
        ),
        pytest.param(
            f"runtimes:\n  - {{id: a, format: sqsh, path: a, sha256: {SHA}, extra: 1}}\n",
            "runtimes.0.extra",
            id="unknown-key",
        ),
        pytest.param("runtimes: [\n", "not valid YAML", id="bad-yaml"),
    ],
)
def test_runtime_registry_errors_name_file_and_entry(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(CatalogError, match=message) as caught:
        load_runtime_registry(path)
    assert str(caught.value).startswith(f"{path}: ")


def test_gpu_series_needs_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, "series:\n  - {name: x, gpusPerNode: 0}\n")
    with pytest.raises(CatalogError, match=r"series\.0\.gpusPerNode"):
        load_gpu_series(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read"):
        load_gpu_series(tmp_path / "nope.yaml")


def test_every_profile_has_a_format() -> None:
    assert set(PROFILE_FORMAT) == set(RuntimeProfile)
    assert PROFILE_FORMAT[RuntimeProfile.ENROOT_PYXIS] is ArtifactFormat.SQSH
    assert PROFILE_FORMAT[RuntimeProfile.APPTAINER] is ArtifactFormat.SIF


def test_example_site_catalogs_load() -> None:
    site = ROOT / "examples" / "site"
    if not (site / "runtime-registry.yaml").exists():
        pytest.skip("no example site catalogs yet")
    assert load_runtime_registry(site / "runtime-registry.yaml").runtimes
    assert load_gpu_series(site / "gpu-series.yaml").series
