"""A job's Slurm user on Slurm 26.05 attacks the operator through the job's own staging
directory (issue 9, findings 1 and 2): it replaces stdout.log, or the whole attempt directory,
with a symbolic link to a file only the operator can read, or stdout.log with a FIFO, while
the job runs. The status must never carry the file's marker, and the other jobs must keep
being followed while the FIFO sits there.

The operator runs as `slurmjob-operator run` (as in test_operator_e2e), the job as the testbed's
Slurm user, which owns its staging directory on the shared storage. The job's command itself
cannot plant anything there: it runs in a real container that sees the attempt directory
read-only (the first test checks that too). The user can, from anywhere else it runs (a login
node, another session): the tests plant as that user on the host, while the job runs.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import cpu_spec
from tests.integration.test_operator_e2e import Operator, _operator
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

# The job's own directory, whichever way it is told; exit 7 when it is not there.
ENTER = 'd=${SLURMJOB_STAGING_DIR:-$PWD}; cd "$d" && [ -e job.sh ] || exit 7; '


@pytest.fixture(scope="module")
def op(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    # Tails read again every second while a job runs (30 s by default): what a job plants
    # after its first line is met at once, and the module waits for no refresh.
    refresh = {"SLURMJOB_LOG_REFRESH": "1"}
    yield from _operator(kube, slurm_2605, tmp_path_factory.mktemp("storage-attacks"), **refresh)


@pytest.fixture
def marker_file(tmp_path: Path) -> tuple[Path, str]:
    """A file only root (the operator) may read, in a directory only root may enter."""
    marker = "OPERATOR-ONLY-" + uuid.uuid4().hex
    secret_dir = tmp_path / "operator-only"
    secret_dir.mkdir(mode=0o700)
    path = secret_dir / "token"
    path.write_text(marker + "\n")
    path.chmod(0o600)
    return path, marker


def _as_job_user(op: Operator, staging: Path, script: str) -> None:
    """Run ``script`` in ``staging`` as the job's Slurm user, on the host: what that user can
    do to its own staging directory outside the job."""
    subprocess.run(
        ["runuser", "-u", op.testbed.user, "--", "sh", "-c", f'cd "$1" && {script}', "sh", staging],
        check=True,
        timeout=30,
    )


def _staging(obj: dict[str, Any]) -> Path:
    return Path(obj["status"]["attempts"][-1]["stagingDir"])


def _tail(obj: dict[str, Any]) -> str:
    logs = (obj.get("status") or {}).get("logs") or {}
    return str((logs.get("stdout") or {}).get("tail") or "")


def _watch_without(op: Operator, name: str, marker: str, within: float = 90) -> dict[str, Any]:
    """Poll the resource until its phase is final; the marker must never show on the way."""
    deadline = time.monotonic() + within
    obj: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        obj = op.get(name)
        assert obj is not None
        assert marker not in json.dumps(obj), f"the status published the marker:\n{obj}"
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Cancelled"):
            return obj
        time.sleep(0.5)
    raise AssertionError(f"{name} not final in {within} s: {json.dumps(obj)}\n{op.log_tail()}")


def test_a_symlinked_log_never_reaches_the_status(
    op: Operator, marker_file: tuple[Path, str]
) -> None:
    path, marker = marker_file
    # The job's user swaps the log only once the test has seen the first tail in the status;
    # the job tries first, from its container, and cannot.
    script = (
        ENTER + "echo before-the-swap; for i in $(seq 600); do [ -e go ] && break; sleep 0.1; "
        "done; ln -s /x in-the-job 2>/dev/null && echo job-planted >&2 || "
        "echo job-read-only >&2; sleep 12"
    )
    op.apply("symlink", cpu_spec(["bash", "-c", script]))
    seen = op.wait_for(
        "symlink",
        lambda o: "before-the-swap" in _tail(o) and marker not in json.dumps(o),
        # The job may queue behind another lane's jobs on the two nodes first.
        within=180,
        what="the first tail in the status",
    )
    _as_job_user(op, _staging(seen), f"rm -f stdout.log && ln -s {path} stdout.log")
    (_staging(seen) / "go").touch()
    obj = _watch_without(op, "symlink", marker)
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    staging = _staging(obj)
    assert (staging / "stdout.log").is_symlink(), "the job's user did plant the link"
    assert not (staging / "in-the-job").exists(), "the job wrote in its attempt directory"
    # The tail read before the swap is kept; nothing is read through the link.
    assert "before-the-swap" in obj["status"]["logs"]["stdout"]["tail"]
    assert "symbolic link" in op.log_tail(400)
    assert path.read_text() == marker + "\n"


def test_a_symlinked_attempt_directory_never_reaches_the_status(
    op: Operator, tmp_path: Path
) -> None:
    """O_NOFOLLOW on the file alone would miss this: the job owns the directories above it."""
    marker = "OPERATOR-ONLY-" + uuid.uuid4().hex
    decoy = tmp_path / "decoy"
    decoy.mkdir(mode=0o700)
    for name in ("stdout.log", "stderr.log", "job.sh"):
        (decoy / name).write_text(marker + "\n")
        (decoy / name).chmod(0o600)
    script = ENTER + "echo before-the-swap; sleep 15"
    op.apply("dirlink", cpu_spec(["bash", "-c", script]))
    seen = op.wait_for(
        "dirlink", lambda o: "before-the-swap" in _tail(o), within=180, what="the first tail"
    )
    d = _staging(seen)
    _as_job_user(op, d.parent, f'mv "{d.name}" "{d.name}.moved" && ln -s {decoy} "{d.name}"')
    obj = _watch_without(op, "dirlink", marker)
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    assert _staging(obj).is_symlink(), "the job's user did plant the link"
    op.kube.kubectl(
        "delete", "slurmjob", "dirlink", "-n", op.namespace, "--timeout=60s", timeout=70
    )
    assert op.get("dirlink") is None, "deletion is not stuck on the link"
    assert sorted(p.name for p in decoy.iterdir()) == ["job.sh", "stderr.log", "stdout.log"]


def test_a_fifo_at_the_log_stalls_no_other_job(op: Operator) -> None:
    # A fixed 30 s: a job that held its CPU until told would keep the bystander pending behind
    # another lane's whole-node job that waits for that CPU.
    script = ENTER + "echo before-the-fifo; sleep 30"
    op.apply("fifo", cpu_spec(["bash", "-c", script]))
    obj = op.wait_phase("fifo", "Running", "Succeeded", "Failed", within=60)
    fifo = _staging(obj) / "stdout.log"
    _as_job_user(op, _staging(obj), "rm -f stdout.log && mkfifo stdout.log")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if fifo.exists() and stat.S_ISFIFO(os.lstat(fifo).st_mode):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the job did not plant its FIFO:\n{op.log_tail()}")
    time.sleep(3)  # a few poll cycles with the FIFO in place
    op.apply("bystander", cpu_spec(["bash", "-c", "echo bystander-ok"]))
    other = op.wait_phase("bystander", "Succeeded", "Failed", "Cancelled", within=60)
    assert other["status"]["phase"] == "Succeeded", other["status"]
    assert "bystander-ok" in other["status"]["logs"]["stdout"]["tail"]
    done = op.wait_phase("fifo", "Succeeded", "Failed", "Cancelled", within=60)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert "a FIFO" in op.log_tail(400)
