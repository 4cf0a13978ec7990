"""`slurmjob-operator submit` (the core without Kubernetes) against the real Slurm 26.05:
the console script as a subprocess, status in a local state directory."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.helpers import OPERATOR, cpu_spec, slurm_job
from tests.integration.sitefiles import site_env
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.core.jobview import BaseState, SlurmJobView

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

PROFILE = "apptainer"


@dataclass
class Site:
    env: dict[str, str]
    state_dir: Path
    workdir: Path
    namespace: str

    def manifest(self, name: str, command: list[str]) -> Path:
        path = self.workdir / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "slurmjob.io/v1alpha1",
                    "kind": "SlurmJob",
                    "metadata": {"name": name, "namespace": self.namespace},
                    "spec": cpu_spec(command, PROFILE),
                }
            )
        )
        return path

    def submit(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(OPERATOR), "submit", *argv, "--state-dir", str(self.state_dir)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def slurm_job(self, job_id: int) -> list[SlurmJobView]:
        return slurm_job(self.env, job_id)


@pytest.fixture
def site(slurm_2605: SlurmTestbed, tmp_path: Path) -> Iterator[Site]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        **site_env(slurm_2605, PROFILE, tmp_path),
        "SLURMJOB_POLL_INTERVAL": "1",
        "SLURMJOB_DELETE_TIMEOUT": "30",
    }
    site = Site(env, tmp_path / "state", tmp_path, f"submit-{uuid.uuid4().hex[:8]}")
    yield site
    # What a test left behind: cancel it and remove its staging directory (`--cancel`).
    for state in sorted((site.state_dir / site.namespace).glob("*.json")):
        site.submit("--cancel", state.stem, "-n", site.namespace)
    with contextlib.suppress(OSError):
        (slurm_2605.storage_root / site.namespace).rmdir()


def _status(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        status: dict[str, Any] = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"stdout is not JSON:\n{proc.stdout}\nstderr:\n{proc.stderr}") from exc
    return status


def test_cpu_job_succeeds_with_its_stdout_tail(site: Site) -> None:
    manifest = site.manifest("hello", ["bash", "-c", "echo hello-from-submit"])
    proc = site.submit("-f", str(manifest), "--wait")
    status = _status(proc)
    assert proc.returncode == 0, proc.stderr
    assert status["phase"] == "Succeeded"
    assert "hello-from-submit" in status["logs"]["stdout"]["tail"]
    attempt = status["attempts"][-1]
    assert attempt["exitCode"] == 0
    assert attempt["sluid"].startswith("s")
    # Events and phase changes are lines on stderr.
    assert "Normal Submitted: attempt 1 submitted as Slurm job" in proc.stderr
    assert "phase: Succeeded" in proc.stderr
    # The state file holds the same status.
    stored = json.loads((site.state_dir / site.namespace / "hello.json").read_text())
    assert stored["status"] == status
    assert stored["metadata"]["generation"] == 1


def test_exit_3_fails_with_exit_code_3(site: Site) -> None:
    manifest = site.manifest("fails", ["bash", "-c", "echo it-broke >&2; exit 3"])
    proc = site.submit("-f", str(manifest), "--wait")
    status = _status(proc)
    assert proc.returncode == 1, proc.stderr
    assert status["phase"] == "Failed"
    assert status["attempts"][-1]["exitCode"] == 3
    assert "it-broke" in status["logs"]["stderr"]["tail"]


def test_cancel_of_a_running_job(site: Site) -> None:
    manifest = site.manifest("long", ["sleep", "600"])
    proc = site.submit("-f", str(manifest))
    status = _status(proc)
    assert proc.returncode == 0, proc.stderr
    assert status["phase"] in ("Queued", "Running")
    attempt = status["attempts"][-1]
    staging = Path(attempt["stagingDir"])
    assert staging.is_dir()
    state_file = site.state_dir / site.namespace / "long.json"
    assert state_file.is_file()

    proc = site.submit("--cancel", "long", "-n", site.namespace)
    assert proc.returncode == 0, proc.stderr
    assert _status(proc)["phase"] == "Cancelled"
    [job] = site.slurm_job(attempt["jobId"])
    assert job.base_state is BaseState.CANCELLED
    assert not state_file.exists()
    assert not staging.parent.exists(), "the staging directory is removed"
