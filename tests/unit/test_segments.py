"""Walltime segments (spec.walltime): the spec's rules, the segment's length and plan, the
chain's decisions after each segment (`core.segments`, through `core.afterattempt`), what a
segment adds to its job description and script, and the checkpoint directory's scan and
removal (`storage.checkpoint`)."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.segmentstatus import AttemptSegment
from slurmjob_operator.api.spec import EnvVar
from slurmjob_operator.api.status import Attempt, AttemptDependency, Phase, SlurmJobStatus
from slurmjob_operator.api.walltime import WalltimeSpec
from slurmjob_operator.config import ConfigError, RuntimeProfile, Settings
from slurmjob_operator.controller.pipeline import Site, render_manifest
from slurmjob_operator.core import naming, reconcile, segments
from slurmjob_operator.core.afterattempt import AttemptEnd, after_attempt
from slurmjob_operator.core.dependencies import Action, repoint, upstream_of
from slurmjob_operator.core.following import observed
from slurmjob_operator.core.jobview import BaseState, JobExit, SlurmJobView
from slurmjob_operator.core.limits import Partition, PartitionUnavailable, Snapshot
from slurmjob_operator.core.removal import DEFAULT_BOUNDS, After, after_pass
from slurmjob_operator.core.segments import (
    EMPTY_CHECKPOINT,
    UNKNOWN_CHECKPOINT,
    PartitionTime,
    SegmentPlan,
    SegmentRefused,
    SegmentTimeUnknown,
)
from slurmjob_operator.core.states import observe
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.site.render import render_attempt
from slurmjob_operator.site.templating import RenderError
from slurmjob_operator.slurm.dialects import dialect_for
from slurmjob_operator.storage import checkpoint, trash
from slurmjob_operator.storage.staging import stage_attempt

from .controller_fakes import cpu_spec as unit_cpu_spec
from .controller_fakes import make_settings
from .test_render_support import fixed_artifact, make_context, make_spec, profile_format

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
UID = "3f2a9c1e-0000-4000-8000-000000000001"
CHAIN = WalltimeSpec(total_time="10m", segment_time=3, warning_seconds=60, continue_exit_code=3)


def _spec(**extra: Any) -> Any:
    return make_spec(
        "cpu",
        walltime={"totalTime": "10m", "segmentTime": 3, "warningSeconds": 60},
        partition="cpu",
        **extra,
    )


# --- the spec -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("walltime", "extra", "says"),
    [
        ({"totalTime": "3d"}, {"timeLimit": "4h"}, "timeLimit and walltime cannot be set"),
        ({"totalTime": "3d"}, {"array": {"count": 4}}, "an array cannot have walltime"),
        ({"totalTime": "3d", "continueExitCode": 1}, {}, "exit code of the batch script"),
        ({"totalTime": "3d", "continueExitCode": 95}, {}, "exit code of the batch script"),
        ({"totalTime": "3d", "continueExitCode": 0}, {}, "greater than or equal to 1"),
        ({"totalTime": "3d", "segmentTime": 2, "warningSeconds": 61}, {}, "does not fit"),
        ({"totalTime": "0m"}, {}, "at least one minute"),
        ({"totalTime": "3d", "signal": "KILL"}, {}, "USR1"),
    ],
)
def test_a_walltime_that_cannot_run_is_refused_with_its_reason(
    walltime: dict[str, Any], extra: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValidationError, match=says):
        make_spec("cpu", walltime=walltime, partition="cpu", **extra)


def test_a_walltime_that_can_run_is_taken() -> None:
    spec = make_spec(
        "cpu",
        walltime={"totalTime": "3d", "segmentTime": "4h", "continueExitCode": 85},
        partition="cpu",
    )
    assert spec.walltime is not None
    assert (spec.walltime.total_minutes, spec.walltime.segment_minutes) == (3 * 1440, 240)
    assert spec.time_limit is None


# --- the segment's length -------------------------------------------------------------------


def _minutes(walltime: WalltimeSpec, partition: PartitionTime, tenant: int | None) -> int:
    return segments.segment_minutes(walltime, partition, tenant, "team-a")


OWN = WalltimeSpec(total_time="3d", segment_time="4h", warning_seconds=300)
DERIVED = WalltimeSpec(total_time="3d", warning_seconds=300)


@pytest.mark.parametrize(
    ("walltime", "partition", "tenant", "expected"),
    [
        (OWN, PartitionTime(read=True, minutes=480), None, 240),
        (OWN, PartitionTime(read=False), None, 240),  # given: nothing to read
        (DERIVED, PartitionTime(read=True, minutes=480), None, 480),
        (DERIVED, PartitionTime(read=True, minutes=480), 120, 120),
        (DERIVED, PartitionTime(read=True, minutes=60), 120, 60),
    ],
)
def test_a_segment_is_the_spec_s_time_or_the_smaller_of_max_time_and_the_tenant_s(
    walltime: WalltimeSpec, partition: PartitionTime, tenant: int | None, expected: int
) -> None:
    assert _minutes(walltime, partition, tenant) == expected


@pytest.mark.parametrize(
    ("walltime", "partition", "tenant", "says"),
    [
        (OWN, PartitionTime(read=True, minutes=480), 120, "maxTimeLimit of 120"),
        (OWN, PartitionTime(read=True, minutes=180), None, "exceeds the partition's MaxTime"),
        (DERIVED, PartitionTime(read=True, is_list=True), None, "a list of partitions"),
        (DERIVED, PartitionTime(read=True, minutes=None), 600, "unlimited or unset"),
        (DERIVED, PartitionTime(read=True, minutes=5), None, "warningSeconds"),
    ],
)
def test_a_segment_time_that_cannot_be_had_is_refused(
    walltime: WalltimeSpec, partition: PartitionTime, tenant: int | None, says: str
) -> None:
    with pytest.raises(SegmentRefused, match=says):
        _minutes(walltime, partition, tenant)


def test_an_unreadable_max_time_means_wait_not_refuse() -> None:
    with pytest.raises(SegmentTimeUnknown):
        _minutes(DERIVED, PartitionTime(read=False), None)
    snapshot = Snapshot("c", {"gpu": Partition("gpu", default=True, max_time_minutes=240)})
    assert segments.partition_time(None, snapshot) == PartitionTime(read=True, minutes=240)
    assert segments.partition_time("cpu", snapshot) == PartitionTime(read=False)
    assert segments.partition_time("gpu", None) == PartitionTime(read=False)
    assert segments.partition_time("a,b", snapshot).is_list


def _ran(number: int, index: int, minutes: float, job: int | None = None) -> Attempt:
    start = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
    return Attempt(
        number=number,
        job_name=f"sj-{number}",
        job_id=job or 100 + number,
        started_at=start.isoformat().replace("+00:00", "Z"),
        finished_at=(start + (NOW - NOW) + _td(minutes)).isoformat().replace("+00:00", "Z"),
        segment=AttemptSegment(index=index, limit_minutes=3),
    )


def _td(minutes: float) -> Any:
    from datetime import timedelta

    return timedelta(minutes=minutes)


def test_the_plan_counts_segments_and_shortens_the_last_to_what_is_left() -> None:
    assert segments.plan_segment(CHAIN, [], 3) == SegmentPlan(0, 3, None)
    one = [_ran(1, 0, 3, job=501)]
    assert segments.plan_segment(CHAIN, one, 3) == SegmentPlan(1, 3, 501)
    nine = [_ran(1, 0, 3), _ran(2, 1, 3), _ran(3, 2, 3.5)]
    # 30 s left: never shorter than the warning needs (60 + 60 s).
    assert segments.plan_segment(CHAIN, nine, 3) == SegmentPlan(3, 2, 103)
    # A segment that never ran (lost before Slurm had it, evicted while queued) runs again
    # under its own index, resuming from the same job as before.
    lost = Attempt(
        number=2,
        job_name="sj-2",
        segment=AttemptSegment(index=1, limit_minutes=3, previous_job_id=501),
    )
    queued = lost.model_copy(update={"job_id": 502, "native_state": "PENDING"})
    assert segments.plan_segment(CHAIN, [*one, queued], 3) == SegmentPlan(1, 3, 501)
    # A job Slurm shows no start time for, but which ended by its limit, did run.
    timed = queued.model_copy(update={"native_state": "TIMEOUT"})
    assert segments.plan_segment(CHAIN, [*one, timed], 3) == SegmentPlan(2, 3, 502)
    assert segments.plan_segment(CHAIN, [*one, lost], 3) == SegmentPlan(1, 3, 501)
    # A retried attempt that was no segment (a release without walltime) starts at 0.
    plain = Attempt(number=1, job_name="sj-1", job_id=9)
    assert segments.plan_segment(CHAIN, [plain], 3).index == 0


# --- how a segment ended --------------------------------------------------------------------


def _observed(state: str, rc: int | None = None) -> Any:
    view = SlurmJobView(
        job_id=7, raw_state=(state,), base_state=BaseState(state), exit=JobExit(return_code=rc)
    )
    return observe([view])


@pytest.mark.parametrize(
    ("state", "rc", "how"),
    [
        ("TIMEOUT", None, "Timeout"),
        ("FAILED", 3, "ContinueExitCode"),
        ("FAILED", 4, None),
        ("PREEMPTED", None, "Preempted"),
        ("CANCELLED", None, None),  # a user's scancel ends the chain
        ("NODE_FAIL", None, "NodeFail"),
        ("COMPLETED", 0, None),  # exit 0: the chain ends Succeeded
        ("OUT_OF_MEMORY", None, None),
    ],
)
def test_which_ends_let_the_chain_go_on(state: str, rc: int | None, how: str | None) -> None:
    assert segments.segment_end(_observed(state, rc), CHAIN) == how


# --- the chain's decisions ------------------------------------------------------------------


def _running(*earlier: Attempt, index: int = 0, minutes: float = 3) -> SlurmJobStatus:
    status = SlurmJobStatus(attempts=[*earlier, _ran(len(earlier) + 1, index, minutes)])
    return reconcile.submitted(status, 100 + len(earlier) + 1, 1, NOW).status


def _end(
    status: SlurmJobStatus,
    state: str,
    rc: int | None = None,
    digest: str | None = "sha256:" + "1" * 64,
    total: str = "10m",
) -> Transition:
    spec = make_spec(
        "cpu",
        walltime={
            "totalTime": total,
            "segmentTime": 3,
            "warningSeconds": 60,
            "continueExitCode": 3,
        },
        partition="cpu",
    )
    obs = _observed(state, rc)
    ended = observed(status, obs, 1, NOW)
    return after_attempt(AttemptEnd(ended, spec, obs, "", 1, NOW, checkpoint=digest))


def test_a_segment_that_timed_out_is_followed_by_the_next_at_once() -> None:
    done = _end(_running(), "TIMEOUT")
    status = done.status
    assert status.phase is Phase.PENDING
    assert status.next_attempt_at == "2026-12-05T12:00:00Z"
    attempt = status.attempts[-1]
    assert attempt.retry_action == segments.SEGMENT_ACTION
    assert attempt.segment is not None
    assert (attempt.segment.ended, attempt.segment.progress) == ("Timeout", True)
    assert [(e.type, e.reason) for e in done.events] == [("Normal", "SegmentContinued")]
    assert "segment 1 is due now" in done.events[0].message


def test_continue_exit_code_spends_no_retry_and_other_codes_go_to_the_retry_rules() -> None:
    assert _end(_running(), "FAILED", 3).status.attempts[-1].retry_action == "Segment"
    failed = _end(_running(), "FAILED", 4).status
    assert failed.phase is Phase.FAILED
    assert failed.attempts[-1].retry_action == "Fail"  # no rule matched
    assert failed.attempts[-1].segment is not None
    assert failed.attempts[-1].segment.ended is None
    assert _end(_running(), "COMPLETED", 0).status.phase is Phase.SUCCEEDED


def test_a_preempted_or_node_failed_segment_continues_before_the_user_s_rules() -> None:
    for state in ("PREEMPTED", "NODE_FAIL"):
        status = _end(_running(), state).status
        assert status.attempts[-1].retry_action == "Segment", state


def test_the_chain_ends_walltime_exhausted_when_total_time_or_segments_are_spent() -> None:
    spent = _end(_running(_ran(1, 0, 3), _ran(2, 1, 3), index=2, minutes=4), "TIMEOUT")
    assert spent.status.phase is Phase.FAILED
    assert spent.status.conditions[-1].reason == "WalltimeExhausted"
    assert "totalTime" in (spent.status.message or "")
    short = _ran(1, 0, 0.5)
    counted = [_ran(n + 1, n, 0.1) for n in range(99)]
    many = _end(_running(*counted, index=99, minutes=0.1), "TIMEOUT", total="1d")
    assert "maxSegments (100)" in (many.status.message or "")
    assert short.segment is not None


def test_two_segments_in_a_row_without_progress_stop_the_chain() -> None:
    same = "sha256:" + "2" * 64
    first = _end(_running(), "TIMEOUT", digest=same).status
    assert first.attempts[-1].segment is not None
    assert first.attempts[-1].segment.progress is True  # from empty to something
    idle = first.attempts[-1]
    second = _end(_running(idle, index=1, minutes=1), "TIMEOUT", digest=same).status
    assert second.phase is Phase.PENDING  # one idle segment: goes on
    assert second.attempts[-1].segment is not None
    assert second.attempts[-1].segment.progress is False
    third = _end(_running(idle, second.attempts[-1], index=2, minutes=1), "TIMEOUT", digest=same)
    assert third.status.phase is Phase.FAILED
    assert third.status.message is not None
    assert "NoProgress" in third.status.message
    assert [e.reason for e in third.events] == ["Failed", "NoProgress"]


def test_a_checkpoint_that_cannot_be_read_counts_as_progress() -> None:
    idle = (
        _running()
        .attempts[-1]
        .model_copy(
            update={
                "segment": AttemptSegment(
                    index=0, limit_minutes=3, checkpoint=EMPTY_CHECKPOINT, progress=False
                )
            }
        )
    )
    for digest in (UNKNOWN_CHECKPOINT, None):
        status = _end(_running(idle, index=1, minutes=1), "TIMEOUT", digest=digest).status
        assert status.phase is Phase.PENDING, digest


# --- the job description and the script -----------------------------------------------------


def _rendered(profile: RuntimeProfile, **spec: Any) -> Any:
    settings = Settings(
        storage_root=Path("/srv/slurmjob"),
        slurm_storage_root=Path("/lustre/slurmjob"),
        slurm_runtime_profile=profile,
    )
    made = _spec(**spec)
    ctx = make_context(made, settings, fixed_artifact(profile_format(profile)), partition="cpu")
    ctx = dataclasses.replace(ctx, segment=SegmentPlan(2, 3, 4242))
    return render_attempt(made, ctx)


@pytest.mark.parametrize("profile", list(RuntimeProfile))
def test_a_segment_s_job_carries_its_limit_warning_variables_and_checkpoint(
    profile: RuntimeProfile,
) -> None:
    rendered = _rendered(profile)
    launch = rendered.launch
    assert (launch.time_limit_minutes, launch.warning_signal, launch.warning_seconds) == (
        3,
        "USR1",
        60,
    )
    body = dialect_for("v0.0.44").submit_body(launch)["job"]
    assert body["kill_warning_signal"] == "USR1"
    assert body["kill_warning_delay"] == {"set": True, "infinite": False, "number": 60}
    assert body["kill_warning_flags"] == []  # to the steps, not the batch shell
    assert dialect_for("v0.0.38").submit_body(launch)["job"]["signal"] == "USR1@60"
    records = rendered.files["job.env"].content.split(b"\0")
    where = "/lustre/slurmjob/team-a/resnet-3f2a9c1e/checkpoint"
    for record in (
        b"SLURMJOB_SEGMENT=2",
        b"SLURMJOB_RESUME=1",
        b"SLURMJOB_PREVIOUS_JOB_ID=4242",
        f"SLURMJOB_CHECKPOINT_DIR={where}".encode(),
    ):
        assert record in records
    assert f"{where}:{where}'" in launch.script or f"{where}:{where}\n" in launch.script
    assert f"{where}:{where}:ro" not in launch.script  # read-write
    assert "SLURMJOB_SEGMENT" in launch.script  # a name of the container's variables


def test_a_user_mount_onto_the_checkpoint_directory_is_refused() -> None:
    onto = [
        {"source": "results/x", "target": "/lustre/slurmjob/team-a/resnet-3f2a9c1e/checkpoint/a"}
    ]
    with pytest.raises(RenderError, match="checkpoint directory"):
        _rendered(RuntimeProfile.APPTAINER, mounts=onto)


def test_spec_env_cannot_set_a_segment_variable_even_past_validation() -> None:
    """The preflight admits the four segment names in job.env (the operator's own records);
    spec.env still cannot set one: render refuses it before job.env is written."""
    spec = _spec()
    forged = spec.model_copy(
        update={"env": [EnvVar.model_construct(name="SLURMJOB_CHECKPOINT_DIR", value="/etc")]}
    )
    settings = Settings(storage_root=Path("/srv/slurmjob"))
    ctx = make_context(forged, settings, fixed_artifact(profile_format(RuntimeProfile.APPTAINER)))
    ctx = dataclasses.replace(ctx, segment=SegmentPlan(0, 3))
    with pytest.raises(RenderError, match="SLURMJOB_CHECKPOINT_DIR: reserved"):
        render_attempt(forged, ctx)


def test_a_walltime_spec_without_a_planned_segment_is_not_rendered() -> None:
    settings = Settings(storage_root=Path("/srv/slurmjob"))
    spec = _spec()
    ctx = make_context(spec, settings, fixed_artifact(profile_format(RuntimeProfile.ENROOT_PYXIS)))
    with pytest.raises(RenderError, match="not planned"):
        render_attempt(spec, ctx)


# --- the checkpoint directory ---------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Settings:
    settings = Settings(storage_root=tmp_path)
    staged = naming.staging_dir(tmp_path, "team-a", "resnet", UID, 1)
    from slurmjob_operator.core.launch import StagedFile

    stage_attempt(settings, staged, {"job.sh": StagedFile(b"#!/bin/bash\n", 0o555)})
    checkpoint.make(settings, naming.resource_dir(tmp_path, "team-a", "resnet", UID))
    return settings


def _where(settings: Settings) -> Path:
    return naming.checkpoint_dir(settings.storage_root, "team-a", "resnet", UID)


def _scan(settings: Settings) -> str:
    return checkpoint.scan(settings, "team-a", "resnet", UID, None)


def _remove(settings: Settings) -> list[str]:
    """The finalizer's removal without a cap: passes until nothing more can be done."""
    removal = checkpoint.set_aside(settings, "team-a", "resnet", UID)
    if removal is None:
        return []
    passes = 0
    while True:
        outcome = checkpoint.removal_pass(settings, removal, DEFAULT_BOUNDS)
        passes += 1
        if after_pass(outcome, passes, None) is not After.AGAIN:
            return list(outcome.problems)


def test_the_scan_sees_every_change_and_follows_no_link(tree: Settings, tmp_path: Path) -> None:
    where = _where(tree)
    assert _scan(tree) == EMPTY_CHECKPOINT
    checkpoint.make(tree, where.parent)  # again: kept as it is
    (where / "step").mkdir()
    (where / "step" / "model.pt").write_bytes(b"1")
    one = _scan(tree)
    assert one != EMPTY_CHECKPOINT
    (where / "step" / "model.pt").write_bytes(b"22")
    two = _scan(tree)
    assert two not in (one, EMPTY_CHECKPOINT)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (where / "link").symlink_to(outside)
    linked = _scan(tree)
    (outside / "grows").write_bytes(b"x" * 10)
    assert _scan(tree) == linked  # the link itself is an entry; its target is never read


def test_the_scan_is_bounded(tree: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    where = _where(tree)
    monkeypatch.setattr(checkpoint, "MAX_ENTRIES", 5)
    for i in range(6):
        (where / f"f{i}").write_bytes(b"")
    assert _scan(tree) == UNKNOWN_CHECKPOINT
    for i in range(6):
        (where / f"f{i}").unlink()
    monkeypatch.setattr(checkpoint, "MAX_DEPTH", 2)
    (where / "a" / "b" / "c" / "d").mkdir(parents=True)
    assert _scan(tree) == UNKNOWN_CHECKPOINT


def test_a_checkpoint_directory_replaced_by_a_link_is_not_read(
    tree: Settings, tmp_path: Path
) -> None:
    where = _where(tree)
    where.rmdir()
    (tmp_path / "other").mkdir()
    where.symlink_to(tmp_path / "other")
    assert _scan(tree) == UNKNOWN_CHECKPOINT
    assert _remove(tree) == []
    assert not os.path.lexists(where)
    assert (tmp_path / "other").is_dir()  # the link went, never its target
    assert trash.entries(tmp_path, 10) == []


def test_removal_removes_what_it_can_and_says_what_it_could_not(
    tree: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = _where(tree)
    (where / "kept").mkdir()
    (where / "kept" / "stuck").write_bytes(b"x")
    (where / "gone").write_bytes(b"x")
    unlink = os.unlink

    def refusing(path: Any, *args: Any, **kwargs: Any) -> None:
        if path == "stuck":  # as the job's own file the operator may not remove
            raise PermissionError(13, "Permission denied")
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refusing)
    left = _remove(tree)
    assert left
    assert left[0].startswith(f"{where / 'kept' / 'stuck'}: ")
    assert "Permission denied" in left[0]
    assert not (where / "gone").exists()
    assert not where.exists()  # what stays is in the trash, for the sweep
    [entry] = trash.entries(tree.storage_root, 10)
    monkeypatch.setattr(os, "unlink", unlink)
    assert trash.removal_pass(tree.storage_root, entry, DEFAULT_BOUNDS).done
    assert trash.entries(tree.storage_root, 10) == []


# --- the site's and the tenant's bounds, through the CLI's render ----------------------------


def _chain_body(settings: Settings, namespace: str = "team-a", **walltime: Any) -> Any:
    spec = unit_cpu_spec(timeLimit=None, walltime={"totalTime": "3d", **walltime})
    spec.pop("timeLimit")
    manifest = {"metadata": {"namespace": namespace, "name": "j"}, "spec": spec}
    return render_manifest(manifest, api_version="v0.0.45", settings=settings)


def test_total_time_is_bounded_by_the_site_and_the_tenant(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_total_time="2d")
    with pytest.raises(SpecError, match="SLURMJOB_MAX_TOTAL_TIME"):
        _chain_body(settings, segmentTime="4h")
    tenants = tmp_path / "tenants.yaml"
    entry = {
        "name": "team-a",
        "namespaces": ["team-a"],
        "accounts": ["team-a"],
        "partitions": ["debug"],
        "maxTimeLimit": "2h",
        "maxTotalTime": "1d",
    }
    tenants.write_text(yaml.safe_dump({"tenants": [entry]}))
    settings = make_settings(tmp_path, tenants_file=tenants)
    with pytest.raises(SpecError, match="tenant team-a's maxTotalTime of 1440"):
        _chain_body(settings, segmentTime="1h")
    with pytest.raises(SpecError, match="maxTimeLimit of 120"):
        _chain_body(settings, totalTime="20h", segmentTime="4h")
    job = _chain_body(settings, totalTime="20h", segmentTime="1h")["job"]
    # The tenant's default time limit (2 h) is not the chain's: the segment's is.
    assert job["time_limit"]["number"] == 60
    assert job["kill_warning_signal"] == "USR1"


def test_a_site_maximum_that_is_no_duration_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SLURMJOB_MAX_TOTAL_TIME"):
        Site.load(make_settings(tmp_path, max_total_time="forever"))


def test_a_segment_time_to_derive_from_a_max_time_not_read_waits(tmp_path: Path) -> None:
    with pytest.raises(PartitionUnavailable, match="cannot be read now"):
        _chain_body(make_settings(tmp_path))


def test_a_dependent_of_a_chain_is_repointed_to_each_new_segment() -> None:
    ended = _end(_running(), "TIMEOUT").status
    record = AttemptDependency(name="chain", uid=UID, attempt=1, job_id=101, type="afterok")
    waiting = upstream_of("chain", UID, ended, (), True)
    assert not waiting.final  # a segment's end is no end of the chain
    assert repoint([record], {"chain": waiting}).action is Action.NOTHING
    again = reconcile.record_attempt(
        ended, number=2, job_name="sj-2", staging_dir="/s/attempt-2", generation=1, now=NOW
    ).status
    queued = reconcile.submitted(again, 202, 1, NOW).status
    confirmed = queued.attempts[-1].model_copy(update={"confirmed": True})
    queued = queued.model_copy(update={"attempts": [*queued.attempts[:-1], confirmed]})
    moved = repoint([record], {"chain": upstream_of("chain", UID, queued, (), True)})
    assert moved.action is Action.UPDATE
    assert [(d.attempt, d.job_id) for d in moved.records] == [(2, 202)]
