"""A status's job id is a claim: a tenant that writes its own `slurmjobs/status` to name
another tenant's job gets nothing done to that job, through any path that changes one (issue
21's findings, each reproduced on the code before `core.verified`: there the victim was
cancelled, repointed or held).

The in-memory Slurm lets a job's own user change it; here every namespace's jobs are the
operator's own Slurm user (a site without `slurmUser`s), or the operator is a Slurm admin, so
only the operator's own check stands between the claim and the victim."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import yaml

from slurmjob_operator.api.status import Phase
from slurmjob_operator.controller import Controller, RetryLater
from slurmjob_operator.core import naming
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.metrics import Metrics

from .controller_fakes import (
    OPERATOR_USER,
    Bed,
    MemorySlurm,
    MemoryStore,
    StubToken,
    cpu_spec,
    make_bed,
    make_settings,
)
from .test_kueue import EVICTED_BY_PREEMPTION, _submitted_on_admission
from .test_tenant_users import key_file

CHANGES = ("cancel", "cancel_many", "hold", "release", "dependency")


def changed(slurm: MemorySlurm, job_id: int) -> list[str]:
    """Every call that changed (or tried to change) job `job_id`."""
    job = slurm.jobs.get(job_id)
    names = {str(job_id)} | ({job.sluid} if job is not None and job.sluid else set())
    return [
        call
        for call in slurm.calls
        if call.split(" ", 1)[0] in CHANGES and names & set(call.split()[1:])
    ]


def claim(bed: Bed, ref: Any, job_id: int, **attempt: Any) -> None:
    """What a tenant with write access to slurmjobs/status writes: its attempt names another
    tenant's job."""
    status = bed.store.objects[(ref.namespace, ref.name)]["status"]
    status["attempts"][-1].update({"jobId": job_id, "sluid": None, **attempt})


async def reconcile(bed: Bed, ref: Any) -> None:
    with contextlib.suppress(RetryLater):
        await bed.controller.reconcile(ref)


def refusals(bed: Bed, why: str) -> float:
    return bed.metrics.sample("slurmjob_operator_job_changes_refused_total", {"why": why}) or 0


async def _victim(bed: Bed) -> int:
    """team-b's running job."""
    victim = bed.store.create("victim", cpu_spec(), namespace="team-b")
    await reconcile(bed, victim)
    job_id = bed.store.status(victim).attempts[-1].job_id
    assert job_id is not None
    bed.slurm.set_state(job_id, "RUNNING")
    return job_id


async def _waiting_dependent(bed: Bed) -> tuple[Any, Any]:
    """team-a's `pre` and `post`, post queued in Slurm behind pre's job."""
    pre = bed.store.create("pre", cpu_spec())
    await reconcile(bed, pre)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    await reconcile(bed, post)
    bed.controller.observe_body(bed.store.body(post))
    assert bed.store.status(post).phase is Phase.QUEUED
    return pre, post


async def _upstream_fails(bed: Bed, pre: Any) -> None:
    job_id = bed.store.status(pre).attempts[-1].job_id
    assert job_id is not None
    bed.slurm.set_state(job_id, "FAILED", 1)
    item = next(t for t in bed.controller.followed() if t.ref == pre)
    await bed.controller.refresh(item, await bed.slurm.get_job(item.job_id))
    bed.controller.observe_body(bed.store.body(pre))
    await bed.controller._dependencies.drain()


async def test_a_claimed_job_is_not_cancelled_through_a_failed_dependency(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    pre, post = await _waiting_dependent(bed)
    victim = await _victim(bed)
    claim(bed, post, victim)
    await _upstream_fails(bed, pre)
    await reconcile(bed, post)
    assert bed.slurm.jobs[victim].base_state is BaseState.RUNNING
    assert changed(bed.slurm, victim) == []
    assert "JobIdentityMismatch" in bed.store.reasons()
    assert refusals(bed, "identity") >= 1


async def test_a_claimed_job_is_not_repointed_through_a_retried_upstream(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    retry = {
        "limit": 1,
        "backoffSeconds": 0,
        "rules": [{"action": "Retry", "onExitCodes": {"operator": "In", "values": [3]}}],
    }
    pre = bed.store.create("pre", cpu_spec(retry=retry))
    await reconcile(bed, pre)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    await reconcile(bed, post)
    victim = await _victim(bed)
    claim(bed, post, victim)
    first = bed.store.status(pre).attempts[-1].job_id
    assert first is not None
    bed.slurm.set_state(first, "FAILED", 3)  # retried: post would be repointed to the new job
    item = next(t for t in bed.controller.followed() if t.ref == pre)
    await bed.controller.refresh(item, await bed.slurm.get_job(first))
    await reconcile(bed, pre)
    assert len(bed.store.status(pre).attempts) == 2
    bed.controller.observe_body(bed.store.body(pre))
    await bed.controller._dependencies.drain()
    await reconcile(bed, post)
    assert victim not in bed.slurm.dependency
    assert changed(bed.slurm, victim) == []
    assert "JobIdentityMismatch" in bed.store.reasons()


async def test_a_claimed_job_is_not_cancelled_through_a_kueue_eviction(tmp_path: Path) -> None:
    bed, _, ref, workload = await _submitted_on_admission(tmp_path)
    victim = await _victim(bed)
    claim(bed, ref, victim)
    bed.store.objects[(ref.namespace, ref.name)]["status"]["phase"] = "Running"
    workload["status"]["conditions"] = EVICTED_BY_PREEMPTION
    await reconcile(bed, ref)
    assert bed.slurm.jobs[victim].base_state is BaseState.RUNNING
    assert changed(bed.slurm, victim) == []
    assert "JobIdentityMismatch" in bed.store.reasons()
    # The eviction is still recorded and the quota given back: what preempted it runs.
    assert "admission" not in workload["status"]


async def test_a_claimed_job_is_not_held_through_spec_suspend(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    victim = bed.store.create("victim", cpu_spec(), namespace="team-b")
    await reconcile(bed, victim)  # pending: holdable
    victim_job = bed.store.status(victim).attempts[-1].job_id
    assert victim_job is not None
    claim(bed, ref, victim_job)
    bed.store.update(ref, suspend=True)
    await reconcile(bed, ref)
    assert changed(bed.slurm, victim_job) == []
    assert "JobIdentityMismatch" in bed.store.reasons()


async def test_a_job_of_another_slurm_user_is_not_changed_even_with_the_attempts_identity(
    tmp_path: Path,
) -> None:
    """A job carrying the attempt's name and comment but run by a Slurm user the resource
    may not own (another tenant submitted it by hand, copying the identity) is left alone."""
    bed = make_bed(tmp_path)
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    job_id = bed.store.status(ref).attempts[-1].job_id
    assert job_id is not None
    bed.slurm.jobs[job_id] = bed.slurm.jobs[job_id].model_copy(update={"user": "mallory"})
    bed.slurm.admins = frozenset({OPERATOR_USER})
    await bed.controller.finalize(bed.store.body(ref))
    assert changed(bed.slurm, job_id) == []
    assert bed.slurm.jobs[job_id].base_state is not BaseState.CANCELLED
    assert refusals(bed, "owner") == 1


def _two_cluster_bed(tmp_path: Path) -> Bed:
    """The part for cluster `default` of an operator with clusters default and east; team-a
    may use east only; the operator's Slurm user is an admin of default."""
    tenants = tmp_path / "tenants.yaml"
    entry = {"accounts": ["a"], "partitions": ["debug"]}
    tenants.write_text(
        yaml.safe_dump(
            {
                "tenants": [
                    {
                        "name": "team-a",
                        "namespaces": ["team-a"],
                        **entry,
                        "slurmUser": "team-a",
                        "clusters": {"east": {}},
                    },
                    {"name": "team-b", "namespaces": ["team-b"], **entry, "slurmUser": "team-b"},
                ]
            }
        )
    )
    settings = make_settings(
        tmp_path,
        tenants_file=tenants,
        slurm_jwt_key_file=key_file(tmp_path),
        slurm_rest_user=OPERATOR_USER,
    )
    store, slurm, metrics = MemoryStore(), MemorySlurm(admins=frozenset({OPERATOR_USER})), Metrics()
    controller = Controller(
        settings,
        store,
        None,  # type: ignore[arg-type]
        metrics,
        token=StubToken(),  # type: ignore[arg-type]
        link=slurm,  # type: ignore[arg-type]
        clusters=Clusters(("default", "east")),
    )
    return Bed(settings, store, slurm, controller, metrics)


async def test_a_status_naming_a_cluster_the_tenant_may_not_use_changes_nothing_there(
    tmp_path: Path,
) -> None:
    bed = _two_cluster_bed(tmp_path)
    victim = await _victim(bed)
    # team-a's resource, its status rewritten to claim an attempt on `default` and the victim.
    ref = bed.store.create("train", cpu_spec())
    bed.store.objects[("team-a", "train")]["status"] = {
        "phase": "Queued",
        "attempts": [
            {
                "number": 1,
                "jobName": bed.slurm.jobs[victim].name,
                "jobId": victim,
                "cluster": "default",
                "confirmed": True,
                "submittedAt": "2026-01-01T00:00:00Z",
            }
        ],
    }
    bed.store.update(ref, suspend=True)
    await reconcile(bed, ref)
    await bed.controller.finalize(bed.store.body(ref))
    assert changed(bed.slurm, victim) == []
    assert bed.slurm.jobs[victim].base_state is BaseState.RUNNING
    assert "JobChangeRefused" in bed.store.reasons()
    assert refusals(bed, "cluster") >= 1
    assert not [c for c, who in bed.slurm.acted if who is None and c.split()[0] in CHANGES]


async def test_a_copied_identity_run_by_another_slurm_user_is_never_adopted(
    tmp_path: Path,
) -> None:
    """A Slurm user (another tenant's) submits a job carrying a resource's next name and
    comment (both can be predicted); the resource's submit answer is then lost. Adoption keeps
    the resource's own job and leaves the impostor alone (it was kept, and the real job
    cancelled as its duplicate, before)."""
    bed = make_bed(tmp_path)
    victim = bed.store.create("train", cpu_spec(), namespace="team-b")
    bed.slurm.jobs[42] = SlurmJobView(
        job_id=42,
        sluid="s00000042",
        name=naming.job_name(victim.namespace, victim.name, victim.uid, 1),
        comment=naming.comment(victim.namespace, victim.name, victim.uid, 1),
        user="mallory",
        raw_state=("PENDING",),
        base_state=BaseState.PENDING,
    )
    bed.slurm.faults = ["lost"]
    await reconcile(bed, victim)
    real = max(bed.slurm.jobs)
    await reconcile(bed, victim)
    assert bed.store.status(victim).attempts[-1].job_id == real
    assert changed(bed.slurm, real) == []
    assert changed(bed.slurm, 42) == []
    assert "JobIdentityMismatch" in bed.store.reasons()
    assert "DuplicateCancelled" not in bed.store.reasons()
    assert refusals(bed, "owner") >= 1
