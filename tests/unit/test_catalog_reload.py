"""The runtime registry and the GPU series catalog re-read while the operator runs: the pure
decision (`core.reread`), the holder on real files rewritten in place and swapped as the
kubelet swaps a ConfigMap volume (`site.catalogwatch`), what the operator says of it
(`controller.catalogreload`, the metrics) and what `doctor` says of a bad file."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.catalogreload import CatalogReload
from slurmjob_operator.controller.pipeline import Site, prepare_attempt
from slurmjob_operator.core.reread import FileCopy, Outcome, digest_of, reread
from slurmjob_operator.doctor import Outcome as Check
from slurmjob_operator.doctor import Report
from slurmjob_operator.doctor.catalogs import check_catalogs
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.catalogs import CatalogError, GpuSeriesCatalog, parse_catalog
from slurmjob_operator.site.catalogwatch import RECHECK_SECONDS, CatalogKind, CatalogWatch
from slurmjob_operator.site.clusters import load_clusters

from .controller_fakes import SIF, cpu_spec, make_settings

NAME = "/etc/slurmjob/catalogs/gpu-series.yaml"
H100 = b"series: [{name: h100, slurmConstraint: h100, gpusPerNode: 8}]\n"
A100 = b"series: [{name: a100, gpusPerNode: 4}]\n"
NO_GPUS = b"series: [{name: h100, gpusPerNode: 0}]\n"  # validates as YAML, not as a catalog
NOT_YAML = b"series: [{name: h100\n"


def parse(raw: bytes) -> GpuSeriesCatalog:
    return parse_catalog(Path(NAME), raw, GpuSeriesCatalog)


def in_use(raw: bytes, **extra: Any) -> FileCopy:
    return FileCopy(NAME, digest_of(raw), 100.0, **extra)


def refused(raw: bytes | OSError) -> FileCopy:
    """The copy of H100 in use, after `raw` was refused."""
    first = reread(in_use(H100), raw, parse, 200.0)
    assert first.outcome is Outcome.REFUSED
    return first.copy


GONE = FileNotFoundError(2, "No such file or directory")


# -- the decision -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "read", "outcome", "value", "digest", "stale"),
    [
        # The bytes of the copy in use: nothing to do (a stat change, the same content).
        (in_use(H100), H100, Outcome.UNCHANGED, None, H100, False),
        # A good edit: the new copy, read now.
        (in_use(H100), A100, Outcome.LOADED, A100, A100, False),
        # Bad edits: the last good copy stays, and the file is said to be stale.
        (in_use(H100), NO_GPUS, Outcome.REFUSED, None, H100, True),
        (in_use(H100), NOT_YAML, Outcome.REFUSED, None, H100, True),
        (in_use(H100), GONE, Outcome.REFUSED, None, H100, True),
        # The same refused content again: said once, not on every look.
        (refused(NO_GPUS), NO_GPUS, Outcome.STILL_REFUSED, None, H100, True),
        (refused(GONE), GONE, Outcome.STILL_REFUSED, None, H100, True),
        # Another bad edit after a bad one: refused again, with its own reason.
        (refused(NO_GPUS), NOT_YAML, Outcome.REFUSED, None, H100, True),
        # The bad edit undone: the copy in use is the file's again.
        (refused(NO_GPUS), H100, Outcome.UNCHANGED, None, H100, False),
        # A good edit after a bad one.
        (refused(NOT_YAML), A100, Outcome.LOADED, A100, A100, False),
    ],
)
def test_a_reread_keeps_the_last_good_copy_until_the_file_holds_a_valid_one(
    before: FileCopy,
    read: bytes | OSError,
    outcome: Outcome,
    value: bytes | None,
    digest: bytes,
    stale: bool,
) -> None:
    result = reread(before, read, parse, 300.0)
    assert result.outcome is outcome
    assert result.value == (parse(value) if value is not None else None)
    assert result.copy.digest == digest_of(digest)
    assert result.copy.stale is stale
    assert result.copy.loaded_at == (300.0 if outcome is Outcome.LOADED else 100.0)


@pytest.mark.parametrize(
    ("read", "reason"),
    [
        (NO_GPUS, f"{NAME}: series.0.gpusPerNode: Input should be greater than or equal to 1"),
        (NOT_YAML, f"{NAME}: not valid YAML"),
        (b"\xff\xfe\x00", f"{NAME}: not UTF-8 text"),
        (GONE, f"{NAME}: cannot read: No such file or directory"),
    ],
)
def test_a_refusal_names_the_file_and_what_is_wrong(read: bytes | OSError, reason: str) -> None:
    copy = reread(in_use(H100), read, parse, 300.0).copy
    assert copy.refused is not None
    assert copy.refused.startswith(reason), copy.refused


CONTENTS = [H100, A100, NO_GPUS, NOT_YAML, GONE]


@given(st.lists(st.sampled_from(CONTENTS), max_size=12))
def test_the_copy_in_use_is_the_last_valid_content_and_each_bad_one_is_said_once(
    reads: list[bytes | OSError],
) -> None:
    copy, value = in_use(H100), parse(H100)
    said = 0
    for now, read in enumerate(reads):
        result = reread(copy, read, parse, float(now))
        if result.value is not None:
            value = result.value
        said += result.outcome is Outcome.REFUSED
        copy = result.copy
    good = [r for r in [H100, *reads] if isinstance(r, bytes) and r in (H100, A100)]
    assert value == parse(good[-1])
    assert copy.digest == digest_of(good[-1])
    assert copy.stale is (bool(reads) and reads[-1] not in (H100, A100))
    # A refusal is said when the file turns to bad content it did not hold just before.
    runs = [r for i, r in enumerate(reads) if i == 0 or reads[i - 1] is not r]
    assert said == sum(1 for r in runs if r not in (H100, A100))


# -- the holder on real files -------------------------------------------------------------------


def rewrite(path: Path, raw: bytes) -> None:
    """Write in place and move the mtime on: two writes within the clock's tick with the same
    size would otherwise look the same to a stat (a ConfigMap's swap is a new inode anyway)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_bytes(raw)
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


def test_a_rewritten_file_good_bad_good(tmp_path: Path) -> None:
    path = tmp_path / "gpu-series.yaml"
    path.write_bytes(H100)
    times = iter(range(1000, 2000))
    watch = CatalogWatch.load(Settings(gpu_series_file=path), clock=lambda: float(next(times)))
    assert [s.name for s in watch.current.gpu_series.series] == ["h100"]
    assert watch.check() == []  # nothing changed: not even read

    rewrite(path, NO_GPUS)
    [change] = watch.check()
    assert (change.kind, change.outcome) == (CatalogKind.GPU_SERIES, Outcome.REFUSED)
    assert change.copy.refused is not None
    assert "gpusPerNode" in change.copy.refused
    assert [s.name for s in watch.current.gpu_series.series] == ["h100"]  # the last good copy
    assert watch.check() == []  # said once

    rewrite(path, A100)
    [change] = watch.check()
    assert change.outcome is Outcome.LOADED
    assert not change.copy.stale
    assert [s.name for s in watch.current.gpu_series.series] == ["a100"]
    assert watch.copies()[CatalogKind.GPU_SERIES][1].loaded_at == change.copy.loaded_at > 1000


def test_a_removed_file_keeps_the_copy_and_its_return_is_read(tmp_path: Path) -> None:
    path = tmp_path / "gpu-series.yaml"
    path.write_bytes(H100)
    watch = CatalogWatch.load(Settings(gpu_series_file=path))
    path.unlink()
    [change] = watch.check()
    assert change.outcome is Outcome.REFUSED
    assert "cannot read" in str(change.copy.refused)
    assert watch.check() == []
    assert watch.current.gpu_series.get("h100") is not None
    path.write_bytes(H100)
    [change] = watch.check()
    assert (change.outcome, change.copy.stale) == (Outcome.UNCHANGED, False)


def kubelet_volume(root: Path, files: dict[str, bytes], generation: int) -> None:
    """A ConfigMap volume as the kubelet writes it: the files in a timestamped folder, `..data`
    a symlink to it, each name a symlink through `..data`; an update writes a new folder and
    swaps `..data` with a rename (atomic), then removes the old folder."""
    folder = root / f"..2026_01_01_00_00_0{generation}.000000000"
    folder.mkdir()
    for name, raw in files.items():
        (folder / name).write_bytes(raw)
    old = os.readlink(root / "..data") if (root / "..data").is_symlink() else None
    (root / "..data_tmp").symlink_to(folder.name)
    os.replace(root / "..data_tmp", root / "..data")
    for name in files:
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")
    if old is not None:
        for leftover in (root / old).iterdir():
            leftover.unlink()
        (root / old).rmdir()


def test_the_kubelets_symlink_swap_is_seen(tmp_path: Path) -> None:
    # Same size, same mtime second: only the inode behind the symlinks tells them apart.
    same_size = H100.replace(b"h100", b"h200")
    kubelet_volume(tmp_path, {"gpu-series.yaml": H100}, 1)
    watch = CatalogWatch.load(Settings(gpu_series_file=tmp_path / "gpu-series.yaml"))
    kubelet_volume(tmp_path, {"gpu-series.yaml": same_size}, 2)
    [change] = watch.check()
    assert change.outcome is Outcome.LOADED
    assert watch.current.gpu_series.get("h200") is not None
    kubelet_volume(tmp_path, {"gpu-series.yaml": NOT_YAML}, 3)
    [change] = watch.check()
    assert change.outcome is Outcome.REFUSED
    assert watch.current.gpu_series.get("h200") is not None


def test_a_start_with_a_bad_file_still_fails(tmp_path: Path) -> None:
    path = tmp_path / "gpu-series.yaml"
    path.write_bytes(NOT_YAML)
    with pytest.raises(CatalogError, match="not valid YAML"):
        CatalogWatch.load(Settings(gpu_series_file=path))


def test_files_not_named_are_empty_catalogs_never_looked_for() -> None:
    watch = CatalogWatch.load(Settings())
    assert watch.copies() == {}
    assert watch.check() == []
    assert watch.current.registry.runtimes == []


# -- the same validation as at start: the tenants against the registry ------------------------


def registry_entry(runtime_id: str, path: str) -> dict[str, str]:
    return {"id": runtime_id, "format": "sif", "path": path, "sha256": "a" * 64}


def test_a_registry_edit_reaching_into_a_tenants_source_is_refused(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    tenants = tmp_path / "tenants.yaml"
    team = {
        "name": "team-a",
        "namespaces": ["team-a"],
        "accounts": ["a"],
        "partitions": ["debug"],
        "mountSources": ["datasets/team-a"],
    }
    tenants.write_text(yaml.safe_dump({"tenants": [team]}))
    site = Site.load(settings.model_copy(update={"tenants_file": tenants}))
    assert settings.runtime_registry_file is not None
    entry = registry_entry("custom-x", "datasets/team-a/x.sif")
    rewrite(settings.runtime_registry_file, json.dumps({"runtimes": [entry]}).encode())
    [change] = site.catalogs.check()
    assert change.outcome is Outcome.REFUSED
    assert "overlaps the runtimes folder" in str(change.copy.refused)
    assert site.catalogs.current.registry.get("custom-sif") is not None


# -- decisions read the copy in use -----------------------------------------------------------


def prepare(site: Site, runtime_id: str) -> Any:
    spec = cpu_spec(framework={"kind": "custom", "name": "custom", "runtimeId": runtime_id})
    return prepare_attempt(
        parse_spec(spec),
        site,
        namespace="default",
        name="job",
        uid="00000000-0000-0000-0000-00000000000a",
        attempt=1,
        api_version="v0.0.45",
        secret_values={},
    )


def test_a_new_slurmjob_uses_the_new_registry_after_a_good_edit(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    site = Site.load(settings)
    before = prepare(site, "custom-sif")
    with pytest.raises(SpecError, match="custom-new"):
        prepare(site, "custom-new")
    (settings.storage_root / "runtimes" / "new.sif").write_bytes(SIF)
    entries = [
        registry_entry("custom-sif", "runtimes/unit.sif"),
        registry_entry("custom-new", "runtimes/new.sif"),
    ]
    entries[1]["sha256"] = hashlib.sha256(SIF).hexdigest()
    assert settings.runtime_registry_file is not None
    rewrite(settings.runtime_registry_file, json.dumps({"runtimes": entries}).encode())
    [change] = site.catalogs.check()
    assert change.outcome is Outcome.LOADED
    assert prepare(site, "custom-new").artifact.id == "custom-new"
    # What was prepared before keeps what it was prepared with (a submitted job is never
    # rendered again).
    assert before.artifact.sha256 == hashlib.sha256(SIF).hexdigest()
    now = site.catalogs.current.registry.get("custom-sif")
    assert now is not None
    assert now.sha256 == "a" * 64


# -- what the operator says -------------------------------------------------------------------


async def test_the_reload_counts_a_refused_edit_and_clears_staleness_on_a_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gpu-series.yaml"
    path.write_bytes(H100)
    watch = CatalogWatch.load(Settings(gpu_series_file=path))
    metrics = Metrics()
    reload = CatalogReload([("west", watch)], metrics.catalogs)
    labels = {"cluster": "west", "catalog": "gpu-series"}

    def sample(name: str) -> float | None:
        return metrics.sample(f"slurmjob_operator_catalog_{name}", labels)

    loaded = sample("loaded_timestamp_seconds")
    assert (sample("reload_errors_total"), sample("stale")) == (0, 0)
    assert loaded is not None
    assert loaded > 0

    rewrite(path, NO_GPUS)
    with caplog.at_level(logging.ERROR, logger="slurmjob_operator.controller.catalogreload"):
        await reload.once()
        await reload.once()
    assert (sample("reload_errors_total"), sample("stale")) == (1, 1)
    assert sample("loaded_timestamp_seconds") == loaded
    [record] = caplog.records
    assert "gpu-series of cluster west: the edit is refused" in record.getMessage()
    assert str(path) in record.getMessage()

    rewrite(path, A100)
    await reload.once()
    assert (sample("reload_errors_total"), sample("stale")) == (1, 0)
    assert watch.current.gpu_series.get("a100") is not None


async def test_a_refused_edit_posts_one_warning_event_on_the_operators_pod(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gpu-series.yaml"
    path.write_bytes(H100)
    watch = CatalogWatch.load(Settings(gpu_series_file=path))
    posted: list[tuple[str, str, str]] = []

    async def event(type_: str, reason: str, message: str) -> None:
        posted.append((type_, reason, message))

    reload = CatalogReload([("west", watch)], Metrics().catalogs, event=event)
    rewrite(path, NO_GPUS)
    await reload.once()
    await reload.once()  # the same bad content: said once
    [(type_, reason, message)] = posted
    assert (type_, reason) == ("Warning", "CatalogEditRefused")
    assert "gpu-series of cluster west: the edit is refused" in message
    rewrite(path, A100)
    await reload.once()
    assert len(posted) == 1


async def test_an_event_that_cannot_be_posted_changes_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "gpu-series.yaml"
    path.write_bytes(H100)
    watch = CatalogWatch.load(Settings(gpu_series_file=path))

    async def refused(type_: str, reason: str, message: str) -> None:
        raise RuntimeError("events are forbidden here")

    metrics = Metrics()
    reload = CatalogReload([("west", watch)], metrics.catalogs, event=refused)
    rewrite(path, NO_GPUS)
    await reload.once()
    labels = {"cluster": "west", "catalog": "gpu-series"}
    assert metrics.sample("slurmjob_operator_catalog_stale", labels) == 1


def test_doctor_says_the_file_is_bad_and_the_running_operator_keeps_its_copy(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gpu-series.yaml"
    path.write_bytes(NO_GPUS)
    report = Report()
    registry, series, ok = check_catalogs(Settings(gpu_series_file=path), report)
    [check] = report.checks
    assert (check.name, check.outcome, ok) == ("catalogs", Check.FAIL, False)
    assert f"{path}: series.0.gpusPerNode" in check.detail
    assert "SLURMJOB_GPU_SERIES_FILE" in check.detail
    assert "keeps using the last good copy" in check.detail
    assert "does not start" in check.detail
    assert (series.series, registry.runtimes) == ([], [])

    path.write_bytes(H100)
    report = Report()
    _, series, ok = check_catalogs(Settings(gpu_series_file=path), report)
    assert ok
    assert report.checks[0].outcome is Check.OK
    assert [s.name for s in series.series] == ["h100"]


def test_each_clusters_own_catalog_is_watched_and_counted_under_its_name(tmp_path: Path) -> None:
    shared, west_file = tmp_path / "gpu-series.yaml", tmp_path / "west-gpu-series.yaml"
    shared.write_bytes(H100)
    west_file.write_bytes(A100)
    clusters = tmp_path / "clusters.yaml"
    entries = [{"name": "east"}, {"name": "west", "gpuSeriesFile": str(west_file)}]
    clusters.write_text(yaml.safe_dump({"clusters": entries}))
    sites = load_clusters(Settings(gpu_series_file=shared, clusters_file=clusters))
    watches = [(s.name, Site.load(s.settings, ["east", "west"]).catalogs) for s in sites]
    assert [w.copies()[CatalogKind.GPU_SERIES][0] for _, w in watches] == [shared, west_file]
    metrics = Metrics()
    reload = CatalogReload(watches, metrics.catalogs)
    rewrite(west_file, NOT_YAML)
    asyncio.run(reload.once())

    def errors(cluster: str) -> float | None:
        labels = {"cluster": cluster, "catalog": "gpu-series"}
        return metrics.sample("slurmjob_operator_catalog_reload_errors_total", labels)

    assert (errors("east"), errors("west")) == (0, 1)
    assert watches[1][1].current.gpu_series.get("a100") is not None


class Broken:
    def check(self) -> list[Any]:
        raise RuntimeError("a bug")

    def copies(self) -> dict[Any, Any]:
        return {}


async def test_a_failing_look_at_one_cluster_does_not_stop_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gpu-series.yaml"
    path.write_bytes(H100)
    watch = CatalogWatch.load(Settings(gpu_series_file=path))
    broken = cast(CatalogWatch, Broken())
    reload = CatalogReload([("east", broken), ("west", watch)], Metrics().catalogs)
    rewrite(path, A100)
    with caplog.at_level(logging.ERROR):
        await reload.once()
    assert "catalogs of cluster east: the re-read failed" in caplog.text
    assert watch.current.gpu_series.get("a100") is not None


def test_the_docs_say_how_often_the_files_are_looked_at() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert f"every {RECHECK_SECONDS:g} seconds" in docs
