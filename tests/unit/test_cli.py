"""The command line: exit codes, stdout holding only the body, errors naming their field."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmjob_operator.cli import EXIT_INVALID, EXIT_OK, main
from slurmjob_operator.config import Settings
from slurmjob_operator.versions import SUPPORTED_VERSIONS

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.fixture(autouse=True)
def site_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(Settings.env_name(name), raising=False)
    monkeypatch.setenv(
        "SLURMJOB_RUNTIME_REGISTRY_FILE", str(REPO / "examples/site/runtime-registry.yaml")
    )
    monkeypatch.setenv("SLURMJOB_GPU_SERIES_FILE", str(REPO / "examples/site/gpu-series.yaml"))
    monkeypatch.setenv("SLURMJOB_STORAGE_ROOT", "/lustre/slurmjob")


def run(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err, stdin=io.StringIO(stdin))
    return code, out.getvalue(), err.getvalue()


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"cpu-job.yaml", "gpu-single-pool.yaml", "gpu-heterogeneous.yaml"} <= names


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_accepts_every_example(example: Path, version: str) -> None:
    code, out, err = run("render", "-f", str(example), "--api-version", version)
    assert code == EXIT_OK, err
    assert err == ""
    body = json.loads(out)  # stdout is exactly one JSON document
    manifest = yaml.safe_load(example.read_text())
    jobs = body["jobs"] if "jobs" in body else [body["job"]]
    assert len(jobs) == len(manifest["spec"]["pools"])
    script = body.get("script") or jobs[0]["script"]
    assert script.startswith("#!/bin/bash\n")


def test_render_default_is_the_newest_version() -> None:
    code, out, _ = run("render", "-f", str(REPO / "examples/cpu-job.yaml"))
    assert code == EXIT_OK
    body = json.loads(out)
    assert isinstance(body["job"]["environment"], list)  # v0.0.40+ shape
    assert body["job"]["requeue"] is False


def test_render_reads_stdin() -> None:
    text = (REPO / "examples/cpu-job.yaml").read_text()
    code, out, _ = run("render", "-f", "-", stdin=text)
    assert code == EXIT_OK
    assert json.loads(out)["job"]["name"].startswith("sj-default-cpu-hello-")


def _manifest(**spec_changes: Any) -> str:
    manifest = yaml.safe_load((REPO / "examples/cpu-job.yaml").read_text())
    manifest["spec"].update(spec_changes)
    return yaml.safe_dump(manifest)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (
            {
                "framework": {
                    "kind": "custom",
                    "name": "custom",
                    "runtimeId": "custom-python",
                    "image": "nvcr.io/x",
                }
            },
            "spec.framework.image",  # not a reference with a tag or digest
        ),
        (
            {"pools": [{"name": "main", "nodes": 1, "gpusPerNode": -1, "cpus": 1, "memoryGb": 1}]},
            "spec.pools[0].gpusPerNode",
        ),
        ({"mounts": [{"source": "../etc", "target": "/data"}]}, "spec.mounts[0].source"),
        (
            {"framework": {"kind": "custom", "name": "custom", "runtimeId": "custom-nope"}},
            "spec.framework.runtimeId",
        ),
        ({"timeLimit": "forever"}, "spec.timeLimit"),
    ],
)
def test_invalid_input_exits_2_naming_the_field(changes: dict[str, Any], field: str) -> None:
    code, out, err = run("render", "-f", "-", stdin=_manifest(**changes))
    assert code == EXIT_INVALID
    assert out == ""
    assert field in err, err


def test_heterogeneous_pool_without_constraint_is_refused(tmp_path: Path) -> None:
    manifest = yaml.safe_load((REPO / "examples/gpu-heterogeneous.yaml").read_text())
    manifest["spec"]["pools"][1]["gpuSeries"] = "l40s"  # the example catalog gives it none
    manifest["spec"]["pools"][1]["gpusPerNode"] = 4
    code, _, err = run("render", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert code == EXIT_INVALID
    assert "spec.pools[1].gpuSeries" in err
    assert "fail-closed" in err


def test_bad_setting_exits_2_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMJOB_SLURM_REST_API_VERSION", "v9")
    code, _, err = run("render", "-f", str(REPO / "examples/cpu-job.yaml"))
    assert code == EXIT_INVALID
    assert "SLURMJOB_SLURM_REST_API_VERSION" in err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("kind: Pod\napiVersion: v1\nspec: {}\n", "kind"),
        ("kind: SlurmJob\napiVersion: slurmjob.io/v2\nspec: {}\n", "apiVersion"),
        ("{not yaml", "YAML"),
    ],
)
def test_wrong_manifest_exits_2(text: str, needle: str) -> None:
    code, _, err = run("render", "-f", "-", stdin=text)
    assert code == EXIT_INVALID
    assert needle in err


def test_missing_file_exits_2(tmp_path: Path) -> None:
    code, _, err = run("render", "-f", str(tmp_path / "nope.yaml"))
    assert code == EXIT_INVALID
    assert "nope.yaml" in err


def test_unknown_subcommand_exits_2() -> None:
    assert run("frobnicate")[0] == EXIT_INVALID


def test_crd_prints_the_canonical_file() -> None:
    code, out, _ = run("crd")
    assert code == EXIT_OK
    assert out == (REPO / "crds/slurmjob.io_slurmjobs.yaml").read_text()


def test_every_setting_is_documented_in_the_configuration_reference() -> None:
    # The README is the front door; the settings table lives in docs/configuration.md.
    reference = (REPO / "docs" / "configuration.md").read_text()
    missing = [
        Settings.env_name(f) for f in Settings.model_fields if Settings.env_name(f) not in reference
    ]
    assert missing == []
