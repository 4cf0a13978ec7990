"""`make release` from a clean clone: the wheel, the sdist, the chart package and the image
build context all carry the one version, and a dirty tree is refused."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from tests.k8s.kube import binaries

from slurmjob_operator import __version__

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def release(clone: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, ".ci/release.py", "--out", str(out), "--helm", str(binaries()["helm"])],
        cwd=clone,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_release_artifacts_carry_the_one_version(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    out = tmp_path / "dist"
    proc = release(clone, out)
    assert proc.returncode == 0, proc.stderr
    ver = __version__
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [
            f"slurmjob_operator-{ver}-py3-none-any.whl",
            f"slurmjob_operator-{ver}.tar.gz",
            f"slurmjob-operator-{ver}.tgz",
            f"slurmjob-operator-{ver}-image-context.tar.gz",
            "IMAGE-BUILD.txt",
        ]
    )
    with zipfile.ZipFile(out / f"slurmjob_operator-{ver}-py3-none-any.whl") as wheel:
        metadata = wheel.read(f"slurmjob_operator-{ver}.dist-info/METADATA").decode()
        assert f"\nVersion: {ver}\n" in metadata
        assert "slurmjob_operator/templates/job.sh.j2" in wheel.namelist()
    with tarfile.open(out / f"slurmjob-operator-{ver}.tgz") as chart:
        meta = chart.extractfile("slurmjob-operator/Chart.yaml")
        assert meta is not None
        loaded = yaml.safe_load(meta.read())
        assert (loaded["version"], loaded["appVersion"]) == (ver, ver)
    with tarfile.open(out / f"slurmjob-operator-{ver}-image-context.tar.gz") as context:
        assert {"Dockerfile", "pyproject.toml", "CHANGELOG.md"} <= set(context.getnames())
    assert f"--build-arg VERSION={ver}" in (out / "IMAGE-BUILD.txt").read_text()
    # A change not committed is not released.
    (clone / "README.md").write_text("changed\n")
    dirty = release(clone, tmp_path / "dirty")
    assert dirty.returncode == 1
    assert "uncommitted changes" in dirty.stderr
