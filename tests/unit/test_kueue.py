"""Kueue's Workload for a SlurmJob, and what its conditions mean (tables)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from slurmjob_operator.api.errors import parse_spec
from slurmjob_operator.api.status import Phase
from slurmjob_operator.core.following_kueue import EVICTED_ACTION, evicted
from slurmjob_operator.core.kueue.admission import Admission, verdict
from slurmjob_operator.core.kueue.flavors import (
    PARTITION_KEY,
    SERIES_KEY,
    assigned_flavors,
    flavors_refusal,
    placement,
)
from slurmjob_operator.core.kueue.status import reservation_cleared, with_condition
from slurmjob_operator.core.kueue.workload import (
    QUEUE_LABEL,
    SUSPEND_ANNOTATION,
    owner_of,
    pod_sets,
    queue_of,
    workload_body,
    workload_name,
)
from slurmjob_operator.kube import WorkloadError
from slurmjob_operator.slurm.errors import SlurmRejected
from slurmjob_operator.slurm.nodes import PartitionInfo

from .controller_fakes import Bed, MemoryStore, cpu_spec, make_bed
from .controller_fakes import reconcile_once as _reconcile

UID = "1a2b3c4d-0000-0000-0000-000000000000"


def gpu_spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "framework": {"kind": "custom", "name": "custom", "runtimeId": "custom-sif"},
        "command": ["train"],
        "pools": [
            {"name": "a", "gpuSeries": "h100", "nodes": 2, "gpusPerNode": 8, "cpus": 32,
             "memoryGb": 512},
            {"name": "b", "gpuSeries": "a100", "nodes": 1, "gpusPerNode": 4, "cpus": 16,
             "memoryGb": 256},
        ],
    }  # fmt: skip
    spec.update(extra)
    return spec


def test_one_podset_per_pool_with_its_nodes_and_requests() -> None:
    sets = pod_sets(parse_spec(gpu_spec()))
    assert [(s["name"], s["count"]) for s in sets] == [("a", 2), ("b", 1)]
    [container] = sets[0]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {
        "cpu": "32",
        "memory": "512Gi",
        "nvidia.com/gpu": "8",
    }
    assert (
        "nvidia.com/gpu"
        not in (
            pod_sets(parse_spec(cpu_spec()))[0]["template"]["spec"]["containers"][0]["resources"][
                "requests"
            ]
        )
    )


def test_an_array_asks_for_the_tasks_that_run_at_once() -> None:
    spec = parse_spec(cpu_spec(array={"count": 20, "parallelism": 3}))
    assert pod_sets(spec)[0]["count"] == 3
    assert pod_sets(parse_spec(cpu_spec(array={"count": 4})))[0]["count"] == 4


def test_the_workload_is_owned_by_the_slurmjob_and_names_its_queue() -> None:
    body = workload_body(
        "team-a", "train", UID, parse_spec(cpu_spec()), "lq", "high", "slurmjob.io/v1alpha1"
    )
    assert body["metadata"]["name"] == "slurmjob-train-1a2b3c4d"
    [owner] = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("SlurmJob", UID, True)
    assert body["spec"]["queueName"] == "lq"
    assert body["spec"]["priorityClassRef"]["name"] == "high"
    assert body["spec"]["priority"] == 0  # the class's value is the caller's to give
    with_value = workload_body(
        "team-a", "train", UID, parse_spec(cpu_spec()), "lq", "high", "slurmjob.io/v1alpha1", 1000
    )
    assert with_value["spec"]["priority"] == 1000
    assert (
        "priorityClassRef"
        not in workload_body(
            "team-a", "train", UID, parse_spec(cpu_spec()), "lq", None, "slurmjob.io/v1alpha1"
        )["spec"]
    )


def test_workload_names_are_bounded() -> None:
    name = workload_name("x" * 253, UID)
    assert len(name) <= 253
    assert name.endswith("-1a2b3c4d")


def _wl(*conds: tuple[str, str], reason: str = "r", message: str = "m") -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": reason, "message": message} for t, s in conds
            ],
            "admission": {"clusterQueue": "cq"},
        }
    }


@pytest.mark.parametrize(
    ("workload", "admission"),
    [
        (None, Admission.MISSING),
        ({}, Admission.WAITING),
        (_wl(("QuotaReserved", "False")), Admission.WAITING),
        (_wl(("QuotaReserved", "True")), Admission.WAITING),  # admission checks pending
        (_wl(("QuotaReserved", "True"), ("Admitted", "True")), Admission.ADMITTED),
        (
            _wl(("QuotaReserved", "True"), ("Admitted", "True"), ("Evicted", "True")),
            Admission.EVICTED,
        ),
        (_wl(("Finished", "True"), ("Admitted", "True")), Admission.FINISHED),
        ({"status": {"conditions": "garbage"}}, Admission.WAITING),
        ({"status": {"conditions": [7, {"type": 3}]}}, Admission.WAITING),
    ],
)
def test_what_kueues_conditions_mean(workload: dict[str, Any] | None, admission: Admission) -> None:
    assert verdict(workload).admission is admission


def test_kueues_message_is_kept_while_waiting() -> None:
    found = verdict(_wl(("QuotaReserved", "False"), message="insufficient unused quota for cpu"))
    assert found.message == "insufficient unused quota for cpu"
    assert verdict(_wl(("QuotaReserved", "True"), ("Admitted", "True"))).cluster_queue == "cq"


def test_a_condition_is_written_once() -> None:
    new = {"type": "Finished", "status": "True", "reason": "Succeeded", "message": "x"}
    first = with_condition(_wl(("Admitted", "True")), new)
    assert first is not None
    assert [c["type"] for c in first] == ["Admitted", "Finished"]
    assert with_condition({"status": {"conditions": first}}, new) is None


def test_the_queue_label() -> None:
    assert queue_of({"kueue.x-k8s.io/queue-name": "lq"}) == "lq"
    assert queue_of({"kueue.x-k8s.io/queue-name": ""}) is None
    assert queue_of({}) is None


def test_an_evicted_workload_gives_its_quota_back_as_jobframework_does() -> None:
    workload = _wl(("QuotaReserved", "True"), ("Admitted", "True"), ("Evicted", "True"))
    workload["metadata"] = {"generation": 3}
    patch = reservation_cleared(workload, "Preempted", "preempted by high", "2026-12-01T19:00:00Z")
    assert patch["admission"] is None
    kinds = {c["type"]: (c["status"], c["reason"]) for c in patch["conditions"]}
    assert kinds["QuotaReserved"] == ("False", "Pending")
    assert kinds["Admitted"] == ("False", "NoReservation")
    assert kinds["Requeued"] == ("True", "Preempted")
    assert kinds["Evicted"] == ("True", "r")  # Kueue's own, kept
    assert all(c.get("observedGeneration", 3) == 3 for c in patch["conditions"])
    other = reservation_cleared(workload, "PodsReadyTimeout", "", "2026-12-01T19:00:00Z")
    assert {c["type"]: c["status"] for c in other["conditions"]}["Requeued"] == "False"


def test_the_slurmjob_of_a_workload_is_its_controller_owner() -> None:
    body = workload_body("team-a", "train", UID, parse_spec(cpu_spec()), "lq", None, "x/v1")
    assert owner_of(body) == ("train", UID)
    assert (
        owner_of(
            {
                "metadata": {
                    "ownerReferences": [
                        {"kind": "Job", "name": "j", "uid": "u", "controller": True}
                    ]
                }
            }
        )
        is None
    )
    assert owner_of({"metadata": {"ownerReferences": "garbage"}}) is None
    assert owner_of({}) is None


def test_an_evicted_attempt_spends_no_retry_and_is_due_at_once() -> None:
    from datetime import UTC, datetime

    from slurmjob_operator.api.status import Phase
    from slurmjob_operator.core import reconcile

    now = datetime(2026, 12, 1, 19, 0, tzinfo=UTC)
    recorded = reconcile.record_attempt(
        reconcile.SlurmJobStatus(), number=1, job_name="sj", staging_dir="/s", generation=1, now=now
    ).status
    queued = reconcile.submitted(recorded, 7, 1, now).status
    new = evicted(queued, "Preempted", "by high", 1, now).status
    assert new.phase is Phase.PENDING
    assert new.next_attempt_at == "2026-12-01T19:00:00Z"
    assert new.attempts[-1].retry_action == EVICTED_ACTION
    assert reconcile.next_step(new) is reconcile.Step.RETRY


class _Workloads:
    """An in-memory WorkloadStore: what a namespace's user may have put there first."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    async def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))

    async def create_workload(self, body: Any) -> dict[str, Any]:
        self.objects[(body["metadata"]["namespace"], body["metadata"]["name"])] = dict(body)
        return dict(body)

    async def set_workload_status(self, workload: Any, status: Any) -> bool:
        return True

    async def delete_workload(self, namespace: str, name: str) -> None:
        self.objects.pop((namespace, name), None)

    async def workload_priority(self, name: str) -> int | None:
        return None

    async def flavor_labels(self, name: str) -> dict[str, str] | None:
        return {}

    async def patch_workload(self, namespace: str, name: str, patch: Any) -> dict[str, Any] | None:
        found = self.objects.get((namespace, name))
        if found is None:
            return None
        for key, value in patch.items():
            part = found.setdefault(key, {})
            for inner, item in value.items():
                if isinstance(item, dict):
                    part.setdefault(inner, {}).update(item)
                else:
                    part[inner] = item
        return found

    async def local_queue_exists(self, namespace: str, name: str) -> bool:
        return True


ADMITTED = {
    "conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "r"},
        {"type": "Admitted", "status": "True", "reason": "r"},
    ]
}


async def test_a_workload_a_user_made_first_is_not_trusted_with_the_admission() -> None:
    from slurmjob_operator.api.resource import ResourceView
    from slurmjob_operator.controller.queues import Queues

    body = {
        "metadata": {
            "name": "train",
            "namespace": "team-a",
            "uid": UID,
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
        },
        "spec": gpu_spec(),
    }
    view = ResourceView.of(body)
    spec = parse_spec(gpu_spec())
    store = _Workloads()
    # Made ahead of the operator under the name it uses: one small pod, admitted cheaply.
    tiny = workload_body(
        "team-a", "train", UID, parse_spec(cpu_spec()), "lq", None, "slurmjob.io/v1alpha1"
    )
    store.objects[("team-a", "slurmjob-train-1a2b3c4d")] = {**tiny, "status": ADMITTED}
    found = await Queues(store).admission(view, spec)
    assert found.admission is Admission.WAITING
    assert found.reason == "WorkloadNotOurs"
    # Another owner, the same shape: not ours either.
    stolen = workload_body("team-a", "train", UID, spec, "lq", None, "slurmjob.io/v1alpha1")
    stolen["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    store.objects[("team-a", "slurmjob-train-1a2b3c4d")] = {**stolen, "status": ADMITTED}
    assert (await Queues(store).admission(view, spec)).reason == "WorkloadNotOurs"
    # The operator's own, admitted: admitted.
    own = workload_body("team-a", "train", UID, spec, "lq", None, "slurmjob.io/v1alpha1")
    store.objects[("team-a", "slurmjob-train-1a2b3c4d")] = {**own, "status": ADMITTED}
    assert (await Queues(store).admission(view, spec)).admission is Admission.ADMITTED


async def test_a_tenant_that_requires_a_queue_refuses_a_slurmjob_without_one(
    tmp_path: Any,
) -> None:
    from slurmjob_operator.api.status import Phase

    from .controller_fakes import make_bed

    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n  - {name: team-a, namespaces: [team-a], accounts: [team-a],\n"
        "     partitions: [debug], requireQueue: true}\n"
    )
    bed = make_bed(tmp_path, tenants_file=tenants)
    ref = bed.store.create("train", cpu_spec())
    await bed.controller.reconcile(ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == "InvalidSpec"
    assert "requires a Kueue LocalQueue (label kueue.x-k8s.io/queue-name)" in failed.message
    assert bed.slurm.calls == []
    # The label added (no generation change): decided again, and submitted.
    bed.store.objects[("team-a", "train")]["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
    await bed.controller.reconcile(ref)
    assert bed.store.status(ref).phase is not Phase.FAILED
    assert bed.slurm.calls != []


# -- the flavor mapping ---------------------------------------------------------------------


def test_a_podset_asks_its_flavor_for_the_pools_series_and_the_specs_partition() -> None:
    sets = pod_sets(parse_spec(gpu_spec(partition="gpu")))
    assert [s["template"]["spec"]["nodeSelector"] for s in sets] == [
        {PARTITION_KEY: "gpu", SERIES_KEY: "h100"},
        {PARTITION_KEY: "gpu", SERIES_KEY: "a100"},
    ]
    # Nothing to ask: no selector. A comma list of partitions is not one label value.
    assert "nodeSelector" not in pod_sets(parse_spec(cpu_spec()))[0]["template"]["spec"]
    [listed] = pod_sets(parse_spec(cpu_spec(partition="a,b")))
    assert "nodeSelector" not in listed["template"]["spec"]


def _admitted_on(**flavors: str) -> dict[str, Any]:
    return {
        "status": {
            **ADMITTED,
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {"name": pool, "flavors": {"cpu": flavor, "nvidia.com/gpu": flavor}}
                    for pool, flavor in flavors.items()
                ],
            },
        }
    }


def test_the_flavors_of_an_admission_by_podset() -> None:
    assert assigned_flavors(_admitted_on(a="f1", b="f2")) == {"a": ("f1",), "b": ("f2",)}
    assert assigned_flavors({"status": {"admission": "junk"}}) == {}


@pytest.mark.parametrize(
    ("spec", "labels", "expected"),
    [
        # The flavors name no partition: the spec's (or the site's default) stands.
        (gpu_spec(), {"f1": {}, "f2": {}}, None),
        # The flavor chooses the partition of a spec that names none.
        (gpu_spec(), {"f1": {PARTITION_KEY: "gpu"}, "f2": {PARTITION_KEY: "gpu"}}, "gpu"),
        # A flavor's series that is the pool's, a partition in the spec's list.
        (gpu_spec(partition="x,gpu"), {"f1": {PARTITION_KEY: "gpu", SERIES_KEY: "h100"},
                                       "f2": {SERIES_KEY: "a100"}}, "gpu"),
    ],
)  # fmt: skip
def test_where_the_admissions_flavors_place_the_job(
    spec: dict[str, Any], labels: dict[str, dict[str, str]], expected: str | None
) -> None:
    assigned = assigned_flavors(_admitted_on(a="f1", b="f2"))
    assert placement(parse_spec(spec), assigned, labels) == expected


@pytest.mark.parametrize(
    ("spec", "labels", "message"),
    [
        (gpu_spec(partition="cpu"), {"f1": {PARTITION_KEY: "gpu"}, "f2": {}},
         "spec.partition is cpu, but Kueue admitted the job on ResourceFlavor f1"),
        (gpu_spec(), {"f1": {PARTITION_KEY: "gpu"}, "f2": {PARTITION_KEY: "big"}},
         "more than one partition: big (f2), gpu (f1)"),
        (gpu_spec(), {"f1": {SERIES_KEY: "a100"}, "f2": {}},
         "pool a asks for GPU series h100, but Kueue admitted it on ResourceFlavor f1"),
        (gpu_spec(), {"f1": {PARTITION_KEY: "gpu; rm -rf /"}, "f2": {}}, "is not a name"),
    ],
)  # fmt: skip
def test_flavors_that_contradict_the_spec_are_refused(
    spec: dict[str, Any], labels: dict[str, dict[str, str]], message: str
) -> None:
    assigned = assigned_flavors(_admitted_on(a="f1", b="f2"))
    with pytest.raises(ValueError, match=re.escape(message)):
        placement(parse_spec(spec), assigned, labels)
    with pytest.raises(ValueError, match="assigns no flavor to podSet b"):
        placement(parse_spec(gpu_spec()), {"a": ("f1",)}, {"f1": {}})


class _KueueStore(MemoryStore):
    """The controller's in-memory store with Kueue's Workloads and ResourceFlavors in it."""

    def __init__(self) -> None:
        super().__init__()
        self.workloads = _Workloads()
        self.flavors: dict[str, dict[str, str]] = {}
        self.local_queues = {"lq"}

    async def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.workloads.get_workload(namespace, name)

    async def create_workload(self, body: Any) -> dict[str, Any]:
        return await self.workloads.create_workload(body)

    async def set_workload_status(self, workload: Any, status: Any) -> bool:
        meta = workload["metadata"]
        stored = self.workloads.objects[(meta["namespace"], meta["name"])]
        merged = {**(stored.get("status") or {}), **status}
        stored["status"] = {k: v for k, v in merged.items() if v is not None}
        return True

    async def delete_workload(self, namespace: str, name: str) -> None:
        await self.workloads.delete_workload(namespace, name)

    async def workload_priority(self, name: str) -> int | None:
        return None

    async def flavor_labels(self, name: str) -> dict[str, str] | None:
        return self.flavors.get(name)

    async def patch_workload(self, namespace: str, name: str, patch: Any) -> dict[str, Any] | None:
        return await self.workloads.patch_workload(namespace, name, patch)

    async def local_queue_exists(self, namespace: str, name: str) -> bool:
        return name in self.local_queues


def _kueue_bed(tmp_path: Any) -> tuple[Bed, _KueueStore, list[Any]]:
    store = _KueueStore()
    bed = make_bed(tmp_path, store=store)
    sent: list[Any] = []
    submit = bed.slurm.submit

    async def capture(req: Any) -> Any:
        sent.append(req)
        return await submit(req)

    bed.slurm.submit = capture  # type: ignore[method-assign]
    return bed, store, sent


def _queued(bed: Bed, spec: dict[str, Any]) -> Any:
    ref = bed.store.create("train", spec)
    bed.store.objects[("team-a", "train")]["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
    return ref


def _conds(bed: Bed, ref: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in bed.store.status(ref).conditions}


async def test_nothing_is_submitted_before_admission_and_the_flavor_chooses_the_partition(
    tmp_path: Any,
) -> None:
    bed, store, sent = _kueue_bed(tmp_path)
    ref = _queued(bed, cpu_spec())
    assert await _reconcile(bed, ref) is not None  # waits, to be asked again
    status = bed.store.status(ref)
    assert status.phase is Phase.PENDING
    assert sent == []
    conds = _conds(bed, ref)
    assert conds["Ready"] == ("False", "WaitingForAdmission")
    assert conds["QuotaReserved"] == ("False", "Pending")
    assert conds["Admitted"] == ("False", "NoReservation")
    [workload] = store.workloads.objects.values()
    # Admitted on a flavor whose nodeLabels name the partition.
    store.flavors["debug-nodes"] = {PARTITION_KEY: "debug"}
    workload["status"] = _admitted_on(main="debug-nodes")["status"]
    assert await _reconcile(bed, ref) is None
    [req] = sent
    assert req.partition == "debug"
    conds = _conds(bed, ref)
    assert conds["QuotaReserved"] == ("True", "QuotaReserved")
    assert conds["Admitted"] == ("True", "Admitted")
    reasons = [reason for _, reason, _ in bed.store.events]
    assert reasons.count("QuotaReserved") == 1
    assert reasons.count("Admitted") == 1


async def test_an_admission_on_a_contradicting_flavor_submits_nothing(tmp_path: Any) -> None:
    bed, store, sent = _kueue_bed(tmp_path)
    ref = _queued(bed, cpu_spec(partition="debug"))
    await _reconcile(bed, ref)
    [workload] = store.workloads.objects.values()
    assert workload["spec"]["podSets"][0]["template"]["spec"]["nodeSelector"] == {
        PARTITION_KEY: "debug"
    }
    store.flavors["big"] = {PARTITION_KEY: "big"}
    workload["status"] = _admitted_on(main="big")["status"]
    assert await _reconcile(bed, ref) is None
    status = bed.store.status(ref)
    assert sent == []
    assert status.phase is Phase.FAILED
    assert not status.attempts
    assert "ResourceFlavor big" in (status.message or "")
    # A flavor that is gone: waits, nothing submitted.
    bed2, store2, sent2 = _kueue_bed(tmp_path / "2")
    ref2 = _queued(bed2, cpu_spec())
    await _reconcile(bed2, ref2)
    [workload2] = store2.workloads.objects.values()
    workload2["status"] = _admitted_on(main="deleted")["status"]
    assert await _reconcile(bed2, ref2) is not None
    assert sent2 == []
    assert bed2.store.status(ref2).phase is Phase.PENDING


# -- eviction: a pending job is held, a running one ended; spec.suspend is `!active` --------

EVICTED_BY_PREEMPTION = [
    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
    {"type": "Admitted", "status": "True", "reason": "Admitted"},
    {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by high"},
]


async def _submitted_on_admission(
    tmp_path: Any, spec: dict[str, Any] | None = None
) -> tuple[Bed, _KueueStore, Any, dict[str, Any]]:
    bed, store, _ = _kueue_bed(tmp_path)
    ref = _queued(bed, spec if spec is not None else cpu_spec())
    await _reconcile(bed, ref)
    [workload] = store.workloads.objects.values()
    store.flavors["default"] = {}
    workload["status"] = _admitted_on(main="default")["status"]
    assert await _reconcile(bed, ref) is None
    assert bed.store.status(ref).phase is Phase.QUEUED
    return bed, store, ref, workload


async def test_a_pending_job_evicted_is_held_and_released_when_admitted_again(
    tmp_path: Any,
) -> None:
    bed, _, ref, workload = await _submitted_on_admission(tmp_path)
    [job] = bed.slurm.jobs
    workload["status"]["conditions"] = EVICTED_BY_PREEMPTION
    await _reconcile(bed, ref)
    assert f"hold {job}" in bed.slurm.calls
    assert not bed.slurm.was_cancelled(job)
    status = bed.store.status(ref)
    assert status.phase is Phase.QUEUED
    [attempt] = status.attempts
    assert attempt.retry_action is None  # the same attempt, kept
    assert _conds(bed, ref)["Evicted"] == ("True", "Preempted")
    # The quota was given back as jobframework does.
    assert "admission" not in workload["status"]
    given = {c["type"]: c["status"] for c in workload["status"]["conditions"]}
    assert given["QuotaReserved"] == "False"
    assert _conds(bed, ref)["QuotaReserved"] == ("False", "Pending")
    # Still waiting: held on, nothing released, nothing submitted.
    calls = list(bed.slurm.calls)
    workload["status"]["conditions"] = [
        c for c in workload["status"]["conditions"] if c["type"] != "Evicted"
    ]
    await _reconcile(bed, ref)
    assert not [c for c in bed.slurm.calls[len(calls) :] if c.startswith(("release", "submit"))]
    # Admitted again: the same job released, never a second one.
    workload["status"] = _admitted_on(main="default")["status"]
    assert await _reconcile(bed, ref) is None
    assert f"release {job}" in bed.slurm.calls
    assert list(bed.slurm.jobs) == [job]
    assert _conds(bed, ref)["Evicted"] == ("False", "Admitted")
    assert _conds(bed, ref)["Admitted"] == ("True", "Admitted")


async def test_a_running_job_evicted_is_cancelled_and_its_attempt_spends_no_retry(
    tmp_path: Any,
) -> None:
    bed, _, ref, workload = await _submitted_on_admission(tmp_path)
    [job] = bed.slurm.jobs
    bed.slurm.set_state(job, "RUNNING")
    workload["status"]["conditions"] = EVICTED_BY_PREEMPTION
    await _reconcile(bed, ref)
    assert bed.slurm.was_cancelled(job)
    status = bed.store.status(ref)
    [attempt] = status.attempts
    assert attempt.retry_action == EVICTED_ACTION
    assert "admission" not in workload["status"]


async def test_spec_suspend_makes_the_workload_inactive(tmp_path: Any) -> None:
    bed, store, sent = _kueue_bed(tmp_path)
    ref = bed.store.create("train", cpu_spec(suspend=True))
    bed.store.objects[("team-a", "train")]["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
    await _reconcile(bed, ref)
    [workload] = store.workloads.objects.values()
    assert workload["spec"]["active"] is False
    bed.store.objects[("team-a", "train")]["spec"]["suspend"] = False
    await _reconcile(bed, ref)
    assert workload["spec"]["active"] is True
    assert sent == []  # still not admitted


async def test_a_missing_local_queue_is_named_and_makes_no_workload(tmp_path: Any) -> None:
    bed, store, _ = _kueue_bed(tmp_path)
    store.local_queues = set()
    ref = _queued(bed, cpu_spec())
    assert await _reconcile(bed, ref) is not None
    assert store.workloads.objects == {}
    assert "LocalQueue lq does not exist in namespace team-a" in (
        bed.store.status(ref).message or ""
    )


async def _refresh(bed: Bed, ref: Any) -> None:
    [item] = [t for t in bed.controller.followed() if t.ref == ref]
    views = await bed.slurm.get_job(bed.slurm.lifecycle_ref(item.job_id, item.sluid))
    await bed.controller.refresh(item, views)


async def _held_by_eviction(tmp_path: Any) -> tuple[Bed, _KueueStore, Any, dict[str, Any], int]:
    bed, store, ref, workload = await _submitted_on_admission(tmp_path)
    [job] = bed.slurm.jobs
    workload["status"]["conditions"] = EVICTED_BY_PREEMPTION
    await _reconcile(bed, ref)
    assert _conds(bed, ref)["Evicted"] == ("True", "Preempted")
    assert f"hold {job}" in bed.slurm.calls
    return bed, store, ref, workload, job


async def test_an_evicted_job_that_is_not_the_attempts_is_left_alone(tmp_path: Any) -> None:
    bed, _, ref, workload = await _submitted_on_admission(tmp_path)
    [job] = bed.slurm.jobs
    bed.slurm.jobs[job] = bed.slurm.jobs[job].model_copy(update={"name": "someone-else"})
    workload["status"]["conditions"] = EVICTED_BY_PREEMPTION
    await _reconcile(bed, ref)
    assert not [c for c in bed.slurm.calls if c.startswith(("hold", "cancel"))]


async def test_an_eviction_whose_hold_does_not_take_ends_the_job(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bed, _, ref, workload = await _submitted_on_admission(tmp_path)
    [job] = bed.slurm.jobs

    async def refused(job_id: int, held: bool) -> tuple[()]:
        raise SlurmRejected("Access/permission denied")

    monkeypatch.setattr(bed.slurm, "hold", refused)
    workload["status"]["conditions"] = EVICTED_BY_PREEMPTION
    await _reconcile(bed, ref)
    assert bed.slurm.was_cancelled(job)
    assert bed.store.status(ref).attempts[-1].retry_action == EVICTED_ACTION
    assert "admission" not in workload["status"]  # the quota given back only once it ended


async def test_a_held_job_readmitted_elsewhere_is_ended_and_submitted_anew(tmp_path: Any) -> None:
    bed, store, ref, workload, job = await _held_by_eviction(tmp_path)
    store.flavors["big"] = {PARTITION_KEY: "big"}  # the spec names none: big is allowed
    big = PartitionInfo(name="big", states=frozenset({"UP"}))
    assert isinstance(bed.slurm.partition_list, list)
    bed.slurm.partition_list = [*bed.slurm.partition_list, big]
    # Made after the last read: a refusal waits for a read younger than the refusal age.
    await asyncio.sleep(bed.controller._submission.limits.refusal_age)
    workload["status"] = _admitted_on(main="big")["status"]
    again = await _reconcile(bed, ref)
    assert again is not None  # the next attempt is due now: tried again by the caller
    assert again.delay == 0
    assert bed.slurm.was_cancelled(job)
    assert f"release {job}" not in bed.slurm.calls
    assert bed.store.status(ref).attempts[-1].retry_action == EVICTED_ACTION
    await _reconcile(bed, ref)  # what the wake scheduled for it does
    status = bed.store.status(ref)
    assert len(status.attempts) == 2
    assert status.attempts[-1].job_id != job


async def test_a_workload_kueue_deactivated_is_not_reactivated(tmp_path: Any) -> None:
    bed, store, _ = _kueue_bed(tmp_path)
    ref = _queued(bed, cpu_spec())
    await _reconcile(bed, ref)
    [workload] = store.workloads.objects.values()
    assert workload["metadata"]["annotations"] == {SUSPEND_ANNOTATION: "false"}
    workload["spec"]["active"] = False  # Kueue's requeuing limit, or a person
    await _reconcile(bed, ref)
    assert workload["spec"]["active"] is False
    # A Workload of the previous release (no annotation), suspended since: adopted as it is,
    # and only a later change of spec.suspend sets spec.active.
    del workload["metadata"]["annotations"]
    workload["spec"]["active"] = True
    bed.store.update(ref, suspend=True)
    await _reconcile(bed, ref)
    assert workload["spec"]["active"] is True
    assert workload["metadata"]["annotations"] == {SUSPEND_ANNOTATION: "true"}
    bed.store.update(ref, suspend=False)
    await _reconcile(bed, ref)
    bed.store.update(ref, suspend=True)
    await _reconcile(bed, ref)
    assert workload["spec"]["active"] is False


async def test_a_held_job_cancelled_by_its_user_finishes_its_workload(tmp_path: Any) -> None:
    bed, _, ref, workload, job = await _held_by_eviction(tmp_path)
    bed.slurm.set_state(job, "CANCELLED")
    await _refresh(bed, ref)
    assert bed.store.status(ref).phase is Phase.CANCELLED
    finished = [c for c in workload["status"]["conditions"] if c["type"] == "Finished"]
    assert [c["status"] for c in finished] == ["True"]


async def test_a_held_job_stays_held_when_the_queue_label_is_removed(tmp_path: Any) -> None:
    bed, _, ref, workload, job = await _held_by_eviction(tmp_path)
    bed.store.objects[("team-a", "train")]["metadata"]["labels"] = {}
    bed.store.update(ref, suspend=True)
    await _reconcile(bed, ref)
    bed.store.update(ref, suspend=False)
    workload["status"] = _admitted_on(main="default")["status"]
    await _reconcile(bed, ref)
    assert f"release {job}" not in bed.slurm.calls
    assert "was removed since" in (bed.store.status(ref).message or "")


async def test_a_held_job_that_started_is_ended_only_on_kueues_word(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bed, store, ref, _, job = await _held_by_eviction(tmp_path)
    bed.slurm.set_state(job, "RUNNING")  # released by someone else, and started
    await _refresh(bed, ref)
    assert bed.store.status(ref).phase is Phase.RUNNING

    async def unavailable(namespace: str, name: str) -> Any:
        raise WorkloadError("HTTP 503")

    monkeypatch.setattr(store, "get_workload", unavailable)
    assert await _reconcile(bed, ref) is not None  # asked again, nothing done
    assert not bed.slurm.was_cancelled(job)
    monkeypatch.undo()
    # Kueue says it has no quota (requeued, pending): it runs without quota, so it is ended.
    await _reconcile(bed, ref)
    assert bed.slurm.was_cancelled(job)
    assert bed.store.status(ref).attempts[-1].retry_action == EVICTED_ACTION


# -- what a namespace's user may write into a Workload ---------------------------------------


def test_flavor_names_from_a_workloads_status_are_bounded_and_checked() -> None:
    spec = parse_spec(cpu_spec())
    assert flavors_refusal(spec, {"main": ("default",)}) is None
    many = {"main": tuple(f"f{i}" for i in range(5))}
    assert "more flavors than the podSets ask for" in (flavors_refusal(spec, many) or "")
    for bad in ("../../secrets", "A", "x" * 300, "a/b", "-a", "a\nb"):
        refused = flavors_refusal(spec, {"main": (bad,)})
        assert refused is not None, bad
        assert "no ResourceFlavor name" in refused
        assert len(refused) < 200


async def test_a_hostile_flavor_name_is_never_looked_up(tmp_path: Any) -> None:
    bed, store, sent = _kueue_bed(tmp_path)
    ref = _queued(bed, cpu_spec())
    await _reconcile(bed, ref)
    [workload] = store.workloads.objects.values()
    looked: list[str] = []
    flavor_labels = store.flavor_labels

    async def counted(name: str) -> dict[str, str] | None:
        looked.append(name)
        return await flavor_labels(name)

    store.flavor_labels = counted  # type: ignore[method-assign]
    workload["status"] = _admitted_on(main="../../api/v1/secrets")["status"]
    await _reconcile(bed, ref)
    assert looked == []
    assert sent == []
    assert bed.store.status(ref).phase is Phase.FAILED


async def test_a_hostile_kueue_reason_and_message_are_bounded_on_the_slurmjob(
    tmp_path: Any,
) -> None:
    bed, _, ref, workload = await _submitted_on_admission(tmp_path)
    workload["status"]["conditions"] = [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
        {"type": "Admitted", "status": "True", "reason": "Admitted"},
        {"type": "Evicted", "status": "True", "reason": "no; rm -rf /\n", "message": "m" * 100_000},
    ]
    await _reconcile(bed, ref)
    evicted_cond = next(c for c in bed.store.status(ref).conditions if c.type == "Evicted")
    assert evicted_cond.reason == "Pending"  # not a condition reason: the fallback
    assert len(evicted_cond.message) <= 32768
    assert len(bed.store.status(ref).message or "") <= 1024 + 200


async def test_a_workload_event_wakes_only_a_slurmjob_of_its_own_namespace() -> None:
    from slurmjob_operator.controller.wakes import Wakes
    from slurmjob_operator.handlers.workloads import workload_changed

    woken: list[Any] = []

    class Fleet:
        wakes = Wakes(backoff=1.0)

        async def wake(self, ref: Any) -> None:
            woken.append(ref)

    # Made in team-b, naming (by uid) a SlurmJob of team-a.
    body = workload_body("team-b", "train", UID, parse_spec(cpu_spec()), "lq", None, "v1")
    await workload_changed(type="MODIFIED", body=body, memo={"controller": Fleet()})
    assert [(r.namespace, r.name, r.uid) for r in woken] == [("team-b", "train", UID)]


async def test_following_an_admitted_job_reads_no_flavor(tmp_path: Any) -> None:
    bed, store, ref, _ = await _submitted_on_admission(tmp_path)
    looked: list[str] = []
    flavor_labels = store.flavor_labels

    async def counted(name: str) -> dict[str, str] | None:
        looked.append(name)
        return await flavor_labels(name)

    store.flavor_labels = counted  # type: ignore[method-assign]
    [job] = bed.slurm.jobs
    bed.slurm.set_state(job, "RUNNING")
    await _refresh(bed, ref)
    for _ in range(3):
        await _reconcile(bed, ref)
    assert looked == []
