"""Walltime segments end to end (issue 27): `kubectl apply` against the real kube-apiserver,
the operator as its own process, the real Slurm 26.05 underneath, segments of two minutes
(`segmentTime: 2`, `warningSeconds: 60`).

One test waits for Slurm's own warning signal (its `kill_warning_*` fields, sent 30 to 60 s
into a two-minute segment); the others end their segments with `continueExitCode` at once.
No test waits for a real TIMEOUT. The module waits far more than it computes, so it runs in a
lane of its own beside the two lanes (`[lanes] own` in tests/budgets.toml).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import cpu_spec
from tests.integration.test_operator_e2e import Operator, _operator
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.core.jobview import BaseState

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

CONTINUE = 85
FINAL = ("Succeeded", "Failed", "Cancelled")


@pytest.fixture(scope="module")
def op(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    yield from _operator(kube, slurm_2605, tmp_path_factory.mktemp("walltime"))


def _chain(script: str, profile: str = "apptainer", **walltime: Any) -> dict[str, Any]:
    spec = cpu_spec(["bash", "-c", script], profile)
    del spec["timeLimit"]
    spec["walltime"] = {
        "totalTime": "30m",
        "segmentTime": 2,
        "warningSeconds": 60,
        "continueExitCode": CONTINUE,
        **walltime,
    }
    return spec


def _one_job_per_segment(op: Operator, attempts: list[dict[str, Any]]) -> None:
    """Exactly once: each segment's unique job name names one Slurm job, its own."""
    for attempt in attempts:
        jobs = op.slurm_jobs_named(attempt["jobName"])
        assert {j.job_id for j in jobs} == {attempt["jobId"]}, (attempt, jobs)


def _checkpoint(attempt: dict[str, Any]) -> Path:
    return Path(attempt["stagingDir"]).parent / "checkpoint"


def test_a_program_counting_through_three_segments_ends_succeeded_with_its_count(
    op: Operator,
) -> None:
    """In Apptainer; test_walltime_pyxis_e2e.py runs the same through Pyxis and Enroot."""
    count_through_three_segments(op)


def count_through_three_segments(op: Operator) -> None:
    """Slurm's warning signal reaches the program in its container, twice, before the
    segment ends: the program saves its count and asks for the next segment."""
    # Counts while it runs; on the warning signal it writes the count and asks to continue;
    # the third segment reports what it found and ends the chain.
    script = f"""
f=$SLURMJOB_CHECKPOINT_DIR/count
n=$(cat "$f" 2>/dev/null || echo 0)
p=${{SLURMJOB_PREVIOUS_JOB_ID:-none}}
echo "segment=$SLURMJOB_SEGMENT resume=$SLURMJOB_RESUME previous=$p count=$n"
if [ "$SLURMJOB_SEGMENT" -ge 2 ]; then exit 0; fi
trap 'echo "$n" > "$f"; echo "signalled at $n"; exit {CONTINUE}' USR1
while true; do n=$((n + 1)); sleep 1 & wait $!; done
"""
    op.apply("counter", _chain(script, op.env["SLURMJOB_SLURM_RUNTIME_PROFILE"]))
    obj = op.wait_phase("counter", *FINAL, within=360)
    status = obj["status"]
    assert status["phase"] == "Succeeded", status
    attempts = status["attempts"]
    assert [a["segment"]["index"] for a in attempts] == [0, 1, 2]
    assert [a.get("retryAction") for a in attempts] == ["Segment", "Segment", None]
    assert [a["segment"].get("ended") for a in attempts[:2]] == ["ContinueExitCode"] * 2
    assert all(a["segment"]["progress"] for a in attempts[:2])
    assert status["segment"] == 2
    assert attempts[1]["segment"]["previousJobId"] == attempts[0]["jobId"]
    tail = status["logs"]["stdout"]["tail"]
    count = int(Path(_checkpoint(attempts[-1]) / "count").read_text())
    assert count > 20  # two segments signalled 30 to 60 s in, counting every second
    assert f"segment=2 resume=1 previous={attempts[1]['jobId']} count={count}" in tail
    _one_job_per_segment(op, attempts)
    reasons = [e["reason"] for e in op.events("counter")]
    assert reasons.count("SegmentContinued") == 2
    assert "RetryScheduled" not in reasons
    op.kube.kubectl("delete", "slurmjob", "counter", "-n", op.namespace, "--timeout=60s")
    assert not _checkpoint(attempts[-1]).exists()


def test_two_segments_without_progress_stop_the_chain(op: Operator) -> None:
    op.apply("idle", _chain(f"echo nothing saved; exit {CONTINUE}"))
    obj = op.wait_phase("idle", *FINAL, within=120)
    status = obj["status"]
    assert status["phase"] == "Failed", status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "NoProgress"
    attempts = status["attempts"]
    assert [a["segment"]["progress"] for a in attempts] == [False, False]
    _one_job_per_segment(op, attempts)


def test_deleting_a_chain_cancels_its_running_segment(op: Operator) -> None:
    script = f"""
if [ "$SLURMJOB_SEGMENT" -eq 0 ]; then date > "$SLURMJOB_CHECKPOINT_DIR/first"; exit {CONTINUE}; fi
sleep 600
"""
    op.apply("deleted", _chain(script))
    obj = op.wait_for(
        "deleted",
        lambda o: (
            (o.get("status") or {}).get("phase") == "Running"
            and len(o["status"].get("attempts", [])) == 2
        ),
        within=120,
        what="segment 1 running",
    )
    attempt = obj["status"]["attempts"][-1]
    checkpoint = _checkpoint(attempt)
    assert (checkpoint / "first").exists()
    op.kube.kubectl(
        "delete", "slurmjob", "deleted", "-n", op.namespace, "--timeout=60s", timeout=70
    )
    assert op.get("deleted") is None
    [job] = op.slurm_job(attempt["jobId"])
    assert job.base_state is BaseState.CANCELLED
    assert not checkpoint.parent.exists(), "the checkpoint directory goes with the SlurmJob"


def test_an_operator_killed_between_segments_submits_each_segment_once(op: Operator) -> None:
    script = f"""
f=$SLURMJOB_CHECKPOINT_DIR/count
n=$(( $(cat "$f" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$f"
if [ "$SLURMJOB_SEGMENT" -ge 3 ]; then exit 0; fi
sleep 2
exit {CONTINUE}
"""
    op.apply("killed", _chain(script))
    for segments in (2, 3):
        # Killed once the chain is between segments: the next one due, recorded or in flight.
        op.wait_for(
            "killed",
            lambda o, n=segments: len((o.get("status") or {}).get("attempts", [])) >= n,
            within=120,
            what=f"segment {segments - 1} recorded",
        )
        op.kill()
        time.sleep(1.0)
        op.start()
    obj = op.wait_phase("killed", *FINAL, within=180)
    status = obj["status"]
    assert status["phase"] == "Succeeded", status
    attempts = status["attempts"]
    # A kill between an attempt's record and its POST leaves an attempt that was never sent:
    # proven absent after the fencing window, its segment then goes out under a new attempt.
    # Exactly once is about the jobs: one per segment, each segment's once.
    sent = [a for a in attempts if a.get("jobId") is not None]
    assert [a["segment"]["index"] for a in sent] == [0, 1, 2, 3], attempts
    assert all(a.get("provenAbsentAt") for a in attempts if a.get("jobId") is None), attempts
    _one_job_per_segment(op, sent)
    assert int((_checkpoint(attempts[-1]) / "count").read_text()) == 4
