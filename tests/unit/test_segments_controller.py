"""Walltime segments through the controller (issue 27), on the in-memory apiserver and Slurm:
each segment is an attempt sent with its limit, its warning and the program's variables, the
chain's checkpoint directory is made once and kept across segments, the next segment is sent
at once when one ends by its time limit, the segment time derives from the partition's MaxTime
(and waits while it cannot be read), and deletion removes the directory."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.status import Phase, get_condition
from slurmjob_operator.core import naming
from slurmjob_operator.slurm.errors import SlurmTransient
from slurmjob_operator.slurm.nodes import PartitionInfo

from .controller_fakes import Bed, cpu_spec, make_bed
from .controller_fakes import reconcile_once as reconcile
from .test_controller import refresh
from .test_kueue import EVICTED_ACTION, EVICTED_BY_PREEMPTION, _admitted_on, _submitted_on_admission


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


def chain(**walltime: Any) -> dict[str, Any]:
    spec = cpu_spec(
        walltime={
            "totalTime": "1h",
            "segmentTime": 3,
            "warningSeconds": 60,
            "continueExitCode": 85,
            **walltime,
        }
    )
    del spec["timeLimit"]
    return spec


def env_records(bed: Bed, ref: Any) -> dict[str, str]:
    staging = Path(bed.store.status(ref).attempts[-1].staging_dir or "")
    records = (staging / "job.env").read_bytes().split(b"\0")
    pairs = (r.decode().partition("=") for r in records if r)
    return {name: value for name, _, value in pairs}


def checkpoint_dir(bed: Bed, ref: Any) -> Path:
    return naming.checkpoint_dir(bed.settings.storage_root, ref.namespace, ref.name, ref.uid)


async def test_a_chain_sends_each_segment_with_its_variables_and_keeps_the_checkpoint(
    bed: Bed,
) -> None:
    ref = bed.store.create("train", chain())
    await reconcile(bed, ref)
    first = bed.slurm.requests[-1]
    assert (first.time_limit_minutes, first.warning_signal, first.warning_seconds) == (
        3,
        "USR1",
        60,
    )
    where = checkpoint_dir(bed, ref)
    assert where.is_dir()
    env = env_records(bed, ref)
    assert (env["SLURMJOB_SEGMENT"], env["SLURMJOB_RESUME"]) == ("0", "0")
    assert env["SLURMJOB_CHECKPOINT_DIR"] == str(where)  # the same path on this test cluster
    assert "SLURMJOB_PREVIOUS_JOB_ID" not in env
    (where / "step-1.pt").write_bytes(b"weights")
    bed.slurm.set_state(100, "TIMEOUT")
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.PENDING
    assert status.attempts[0].retry_action == "Segment"
    ready = get_condition(status.conditions, "Ready")
    assert ready is not None
    assert ready.reason == "SegmentContinued"
    await reconcile(bed, ref)
    env = env_records(bed, ref)
    assert (env["SLURMJOB_SEGMENT"], env["SLURMJOB_RESUME"]) == ("1", "1")
    assert env["SLURMJOB_PREVIOUS_JOB_ID"] == "100"
    assert (where / "step-1.pt").read_bytes() == b"weights"  # kept across segments
    assert bed.store.status(ref).segment == 1
    bed.slurm.set_state(101, "COMPLETED", 0)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.SUCCEEDED
    assert [a.retry_action for a in status.attempts] == ["Segment", None]
    await bed.controller.finalize(bed.store.body(ref))
    assert not where.exists()


async def test_the_segment_time_derives_from_the_partition_s_max_time(bed: Bed) -> None:
    bed.slurm.partition_list = [
        PartitionInfo(name="debug", states=frozenset({"UP"}), max_time_minutes=240)
    ]
    ref = bed.store.create("derived", chain(segmentTime=None))
    await reconcile(bed, ref)
    assert bed.slurm.requests[-1].time_limit_minutes == 60  # what is left of totalTime: 1 h
    bed.slurm.partition_list = [PartitionInfo(name="debug", states=frozenset({"UP"}))]
    await asyncio.sleep(0.1)  # past the refusal age (the poll interval, 0.05 s here)
    unlimited = bed.store.create("unlimited", chain(segmentTime=None))
    await reconcile(bed, unlimited)
    status = bed.store.status(unlimited)
    assert status.phase is Phase.FAILED
    assert "unlimited or unset" in (status.message or "")
    assert not status.attempts  # nothing was sent


async def test_a_max_time_that_cannot_be_read_waits(bed: Bed) -> None:
    bed.slurm.partition_list = SlurmTransient("slurmrestd is down")
    ref = bed.store.create("waiting", chain(segmentTime=None))
    again = await reconcile(bed, ref)
    assert again is not None  # tried again at the next poll
    status = bed.store.status(ref)
    assert status.phase is Phase.PENDING
    submitted = get_condition(status.conditions, "Submitted")
    assert submitted is not None
    assert submitted.reason == "PartitionUnavailable"
    assert not bed.slurm.requests


async def _running_on_admission(tmp_path: Path) -> tuple[Bed, Any, Any, dict[str, Any]]:
    """A chain admitted by Kueue, its first segment running."""
    bed, store, ref, workload = await _submitted_on_admission(tmp_path, chain())
    bed.slurm.set_state(100, "RUNNING")
    await refresh(bed, ref)
    return bed, store, ref, workload


async def test_kueue_s_workload_stays_admitted_and_ready_across_segments(tmp_path: Path) -> None:
    bed, _, ref, workload = await _running_on_admission(tmp_path)

    def marks() -> dict[str, str]:
        return {c["type"]: c["status"] for c in workload["status"]["conditions"]}

    assert marks()["PodsReady"] == "True"
    bed.slurm.set_state(100, "TIMEOUT")
    await refresh(bed, ref)
    assert bed.store.status(ref).phase is Phase.PENDING
    assert marks()["PodsReady"] == "True"  # the next segment is due: not Finished
    assert "Finished" not in marks()
    await reconcile(bed, ref)  # no new admission needed: the same one holds
    assert len(bed.slurm.requests) == 2
    assert bed.store.status(ref).segment == 1
    bed.slurm.set_state(101, "COMPLETED", 0)
    await refresh(bed, ref)
    assert marks()["Finished"] == "True"


async def test_a_segment_evicted_by_kueue_while_running_is_resumed_by_the_next(
    tmp_path: Path,
) -> None:
    bed, _, ref, workload = await _running_on_admission(tmp_path)
    workload["status"]["conditions"] = EVICTED_BY_PREEMPTION
    await reconcile(bed, ref)
    assert bed.slurm.was_cancelled(100)
    [attempt] = bed.store.status(ref).attempts
    assert attempt.retry_action == EVICTED_ACTION
    workload["status"] = _admitted_on(main="default")["status"]
    await reconcile(bed, ref)
    env = env_records(bed, ref)
    assert (env["SLURMJOB_SEGMENT"], env["SLURMJOB_RESUME"]) == ("1", "1")
    assert env["SLURMJOB_PREVIOUS_JOB_ID"] == "100"


async def test_what_the_job_left_unremovable_never_holds_the_finalizer(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = bed.store.create("train", chain())
    await reconcile(bed, ref)
    where = checkpoint_dir(bed, ref)
    (where / "stuck").write_bytes(b"x")
    unlink = os.unlink

    def refusing(path: Any, *args: Any, **kwargs: Any) -> None:
        if path == "stuck":  # as a file the operator may not remove
            raise PermissionError(13, "Permission denied")
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refusing)
    await bed.controller.finalize(bed.store.body(ref))  # returns: the finalizer goes
    [message] = [m for _, r, m in bed.store.events if r == "CheckpointNotRemoved"]
    assert str(where / "stuck") in message
    assert not bed.controller.followed()


async def test_a_previous_job_id_a_status_claims_is_only_shown_never_acted_on(bed: Bed) -> None:
    """Whoever may write the status can make `SLURMJOB_PREVIOUS_JOB_ID` name any job (another
    tenant's): it reaches that SlurmJob's own program as text, and no Slurm call names it."""
    ref = bed.store.create("train", chain())
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "TIMEOUT")
    await refresh(bed, ref)
    body = bed.store.body(ref)
    body["status"]["attempts"][0]["jobId"] = 4242  # a job of someone else
    await reconcile(bed, ref)
    env = env_records(bed, ref)
    assert env["SLURMJOB_PREVIOUS_JOB_ID"] == "4242"
    assert not [call for call, _ in bed.slurm.acted if "4242" in call]
    assert len(bed.slurm.requests) == 2  # the next segment, sent as any would be
