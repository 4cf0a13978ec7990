"""End to end, job arrays: `kubectl apply` of a SlurmJob with `spec.array`, the operator as a
separate process, a real Slurm underneath (issue 13, part 1).

Slurm 26.05: a 20-task array, parallelism 3, whose tasks 5 and 13 fail on their first run only
(each leaves a marker in a folder the job can write, and fails while its marker is missing);
one retry is allowed. Attempt 2 must run exactly tasks 5 and 13, and the SlurmJob must end
Succeeded with all 20 tasks counted as succeeded. The tasks' own log files (start and end
times) show that at most 3 ran at once. Slurm 22.05 (v0.0.38): a small array that succeeds.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import RETRY_EXIT_3, cpu_spec
from tests.integration.test_operator_e2e import Operator, _operator
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.core.indices import expand
from slurmjob_operator.core.naming import array_log_file

pytestmark = pytest.mark.integration

FAILING = (5, 13)
COUNT = 20
PARALLELISM = 3
_TIME = re.compile(r"^(start|end) ([0-9]+\.[0-9]+)$", re.MULTILINE)

# Every task prints when it starts and ends; tasks 5 and 13 fail (exit 3) while their marker
# is missing, and leave it behind. "$1" is the markers folder (a mount at the same path).
TASK = r"""
i=$SLURMJOB_ARRAY_INDEX
echo "start $(date +%s.%N)"
sleep 2
echo "end $(date +%s.%N)"
if [ "$i" = 5 ] || [ "$i" = 13 ]; then
  if [ ! -e "$1/failed-$i" ]; then
    touch "$1/failed-$i"
    echo "task $i fails this once" >&2
    exit 3
  fi
fi
echo "task $i ok (attempt $SLURMJOB_ATTEMPT)"
"""


@pytest.fixture(scope="module")
def op_2605(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    yield from _operator(kube, slurm_2605, tmp_path_factory.mktemp("arrays2605"))


@pytest.fixture(scope="module")
def op_2205(
    kube: KubeTestbed, crd: None, slurm_2205: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    yield from _operator(kube, slurm_2205, tmp_path_factory.mktemp("arrays2205"))


@pytest.fixture
def markers(op_2605: Operator) -> Iterator[tuple[str, Path]]:
    """A folder under the storage root the job's user may write: (mount source, path)."""
    root = op_2605.testbed.storage_root
    relative = f"array-markers-{uuid.uuid4().hex[:8]}"
    folder = root / relative
    folder.mkdir()
    os.chown(folder, op_2605.testbed.uid, op_2605.testbed.gid)
    try:
        yield relative, folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _times(log: Path) -> tuple[float, float]:
    found = dict(_TIME.findall(log.read_text(errors="replace")))
    return float(found["start"]), float(found["end"])


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = most = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


@pytest.mark.slurm2605
def test_two_failed_tasks_are_retried_alone_and_the_array_succeeds(
    op_2605: Operator, markers: tuple[str, Path]
) -> None:
    op = op_2605
    source, folder = markers
    spec = cpu_spec(
        ["bash", "-c", TASK, "task", str(folder)],
        mounts=[{"source": source, "target": str(folder)}],
        array={"count": COUNT, "parallelism": PARALLELISM},
        retry=RETRY_EXIT_3,
    )
    op.apply("sweep", spec)
    obj = op.wait_phase("sweep", "Succeeded", "Failed", "Cancelled", within=300)
    status: dict[str, Any] = obj["status"]
    assert status["phase"] == "Succeeded", status

    first, second = status["attempts"]
    assert first["array"]["indices"] == f"0-{COUNT - 1}"
    assert expand(first["array"]["failed"]) == list(FAILING)
    assert first["retryAction"] == "Retry"
    assert first["exitCode"] == 3, "the first failed task's exit code"
    assert second["retryOf"] == 1
    assert expand(second["array"]["indices"]) == list(FAILING), "only the failed tasks"
    assert expand(second["array"]["succeeded"]) == list(FAILING)
    array = status["array"]
    assert (array["total"], array["pending"], array["running"]) == (COUNT, 0, 0)
    assert (array["succeeded"], array["failed"]) == (COUNT, 0)
    assert array.get("failedIndices", "") == ""
    assert all((folder / f"failed-{i}").exists() for i in FAILING)

    # Attempt 2 ran tasks 5 and 13 alone, under their own indices and log file names.
    again = Path(second["stagingDir"])
    logs = sorted(p.name for p in again.glob("stdout-*.log"))
    assert logs == sorted(array_log_file("stdout", i) for i in FAILING)
    for index in FAILING:
        assert (
            f"task {index} ok (attempt 2)" in (again / array_log_file("stdout", index)).read_text()
        )
    shown = status["logs"]["stdout"]["tail"]
    assert f"task {array['logIndex']} ok" in shown
    records = op.slurm_job(second["jobId"])  # while slurmctld still holds them
    assert {r.array_task_id for r in records} <= set(FAILING)

    # Attempt 1: every task has its own log; at most PARALLELISM ran at once.
    once = Path(first["stagingDir"])
    spans = [_times(once / array_log_file("stdout", i)) for i in range(COUNT)]
    assert _most_at_once(spans) <= PARALLELISM
    assert "fails this once" in (once / array_log_file("stderr", 5)).read_text()

    op.kube.kubectl("delete", "slurmjob", "sweep", "-n", op.namespace, "--timeout=60s", timeout=70)
    assert op.get("sweep") is None
    assert not once.exists()


@pytest.mark.slurm2605
def test_deleting_a_running_array_cancels_every_task(op_2605: Operator) -> None:
    op = op_2605
    op.apply("long-array", cpu_spec(["sleep", "600"], array={"count": 6, "parallelism": 2}))
    obj = op.wait_phase("long-array", "Running", within=90)
    job_id = obj["status"]["attempts"][-1]["jobId"]
    op.kube.kubectl(
        "delete", "slurmjob", "long-array", "-n", op.namespace, "--timeout=60s", timeout=70
    )
    assert op.get("long-array") is None
    records = op.slurm_job(job_id)
    assert records, "slurmctld still holds the cancelled tasks"
    assert all(r.is_final for r in records)
    assert {r.base_state for r in records} == {"CANCELLED"}


@pytest.mark.slurm2205
def test_a_small_array_succeeds_on_22_05(op_2205: Operator) -> None:
    op = op_2205
    op.apply(
        "small-array",
        cpu_spec(
            ["bash", "-c", 'echo "index=$SLURMJOB_ARRAY_INDEX"'],
            array={"count": 4, "parallelism": 2},
        ),
    )
    obj = op.wait_phase("small-array", "Succeeded", "Failed", "Cancelled", within=120)
    status = obj["status"]
    assert status["phase"] == "Succeeded", status
    assert (status["array"]["total"], status["array"]["succeeded"]) == (4, 4)
    staging = Path(status["attempts"][0]["stagingDir"])
    for index in range(4):
        log = staging / array_log_file("stdout", index)
        assert f"index={index}" in log.read_text()
