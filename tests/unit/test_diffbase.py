"""kopf's diff base kept in memory: no annotation PATCH, and still a wake on every change of
the spec or the labels, none for a status write, one reconcile after a start."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import bodies, diffs, patches
from kopf._core.intents import causes

from slurmjob_operator.handlers.diffbase import EssenceMemory

FINALIZER = "slurmjob.io/finalizer"


def body(**changes: Any) -> kopf.Body:
    raw: dict[str, Any] = {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": {
            "name": "train",
            "namespace": "team-a",
            "uid": "u-1",
            "generation": 1,
            "resourceVersion": "10",
            "finalizers": [FINALIZER],
            "labels": {"kueue.x-k8s.io/queue-name": "gpu"},
            "annotations": {"team": "a"},
        },
        "spec": {"command": ["python", "train.py"], "pools": [{"name": "main", "nodes": 1}]},
        "status": {"phase": "Queued"},
    }
    for path, value in changes.items():
        node = raw
        *parents, last = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return kopf.Body(raw)


def cause(memory: EssenceMemory, now: kopf.Body, *, initial: bool = False) -> causes.Reason:
    old = memory.fetch(body=now)
    new = memory.build(body=now)
    return causes.detect_changing_cause(
        finalizer=FINALIZER,
        raw_event={"type": "MODIFIED", "object": dict(now)},  # type: ignore[typeddict-item]
        body=now,
        old=old,
        new=new,
        diff=diffs.diff(old, new),
        initial=initial,
        resource=None,
        indices=None,
        logger=None,
        patch=patches.Patch(),
        memo=None,
    ).reason


def handled(memory: EssenceMemory, now: kopf.Body) -> patches.Patch:
    patch = patches.Patch()
    memory.store(body=now, patch=patch, essence=memory.build(body=now))
    return patch


def changed_fields(memory: EssenceMemory, now: kopf.Body) -> set[tuple[str, ...]]:
    old, new = memory.fetch(body=now), memory.build(body=now)
    return {tuple(d[1]) for d in diffs.diff(old, new)}


def test_a_resource_not_handled_by_this_process_is_a_creation() -> None:
    assert cause(EssenceMemory(), body()) is causes.Reason.CREATE
    assert cause(EssenceMemory(), body(), initial=True) is causes.Reason.CREATE


def test_storing_writes_nothing_to_the_resource() -> None:
    memory = EssenceMemory()
    assert handled(memory, body()) == {}
    assert len(memory) == 1


def test_the_operators_own_status_writes_are_nothing_new() -> None:
    memory = EssenceMemory()
    handled(memory, body())
    later = body(status={"phase": "Running", "slurmJobId": 7}, metadata__resourceVersion="11")
    assert cause(memory, later) is causes.Reason.NOOP
    assert cause(memory, later, initial=True) is causes.Reason.RESUME


def test_a_spec_change_is_an_update_of_the_spec_only() -> None:
    memory = EssenceMemory()
    handled(memory, body())
    # suspend: one of the fields the CRD lets change once the SlurmJob exists.
    edited = body(spec__suspend=True, metadata__generation=2)
    assert cause(memory, edited) is causes.Reason.UPDATE
    assert changed_fields(memory, edited) == {("spec",)}


def test_a_label_change_wakes_the_resource_though_the_generation_stays() -> None:
    memory = EssenceMemory()
    handled(memory, body())
    relabelled = body(metadata__labels={"kueue.x-k8s.io/queue-name": "cpu"})
    assert cause(memory, relabelled) is causes.Reason.UPDATE
    assert changed_fields(memory, relabelled) == {("metadata", "labels")}
    unlabelled = body(metadata__labels={})
    assert changed_fields(memory, unlabelled) == {("metadata", "labels")}


def test_a_part_added_since_is_a_change_of_that_part() -> None:
    memory = EssenceMemory()
    bare = body()
    del bare["metadata"]["labels"]  # type: ignore[attr-defined]
    handled(memory, bare)
    assert changed_fields(memory, body()) == {("metadata", "labels")}


def test_after_handling_a_change_it_is_nothing_new_again() -> None:
    memory = EssenceMemory()
    handled(memory, body())
    edited = body(spec__ttlSecondsAfterFinished=60)
    handled(memory, edited)
    assert cause(memory, copy.deepcopy(edited)) is causes.Reason.NOOP


def test_a_deleted_resource_is_forgotten_and_a_deleting_one_never_stored() -> None:
    memory = EssenceMemory()
    handled(memory, body())
    memory.forget("u-1")
    assert len(memory) == 0
    handled(memory, body(metadata__deletionTimestamp="2026-12-04T00:00:00Z"))
    assert len(memory) == 0


def test_the_memory_keeps_digests_not_the_essence() -> None:
    memory = EssenceMemory()
    big = body(spec={"command": ["x" * 100_000]})
    handled(memory, big)
    stored = memory._digests["u-1"]
    assert sum(len(d) for d in stored.values()) <= 16 * len(stored)


def test_a_handler_that_succeeds_at_once_leaves_nothing_to_patch() -> None:
    """kopf stores the handler's success and purges it in the same cycle: with the marker left
    out, the patch is empty and no PATCH goes out after a creation."""
    from slurmjob_operator.handlers.diffbase import UnmarkedProgress

    storage = UnmarkedProgress(prefix="slurmjob.io")
    now = body()
    patch = patches.Patch()
    storage.store(
        key="created",  # type: ignore[arg-type]
        record={"started": "2026-12-04T00:00:00.000000Z", "success": True},  # type: ignore[typeddict-item]
        body=now,
        patch=patch,
    )
    assert "slurmjob.io/kopf-managed" not in patch.metadata.annotations
    storage.purge(key="created", body=now, patch=patch)  # type: ignore[arg-type]
    assert not patch.metadata.annotations
    # kopf's own storage leaves its marker behind: the PATCH this saves.
    marked, own = patches.Patch(), kopf.AnnotationsProgressStorage(prefix="slurmjob.io")
    own.store(key="created", record={"success": True}, body=now, patch=marked)  # type: ignore[arg-type, typeddict-item]
    own.purge(key="created", body=now, patch=marked)  # type: ignore[arg-type]
    assert dict(marked.metadata.annotations) == {"slurmjob.io/kopf-managed": "yes"}


def test_the_operator_keeps_its_diff_base_in_memory() -> None:
    from slurmjob_operator.config import Settings
    from slurmjob_operator.handlers.diffbase import ESSENCES, UnmarkedProgress
    from slurmjob_operator.handlers.lifecycle import configure

    settings = kopf.OperatorSettings()
    configure(settings, Settings())
    assert settings.persistence.diffbase_storage is ESSENCES
    assert isinstance(settings.persistence.progress_storage, UnmarkedProgress)
    assert isinstance(bodies.Body({}), kopf.Body)


@pytest.mark.parametrize(
    "extra_fields",
    [
        set(),
        {("spec",), ("metadata", "labels")},
        {("status", "phase")},
        {"metadata.ownerReferences"},
    ],
)
def test_the_essence_is_kopfs_though_the_status_and_metadata_are_not_copied(
    extra_fields: set[Any],
) -> None:
    """The essence is built without deep-copying the status and managedFields first, and is
    exactly kopf's own, also for a handler's field in the status or the metadata."""
    now = body(
        metadata__managedFields=[{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        metadata__ownerReferences=[{"kind": "Workload", "name": "w"}],
        metadata__annotations={
            "team": "a",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
        },
        status={"phase": "Running", "attempts": [{"number": 1, "jobId": 7}]},
    )
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix="slurmjob.io", key="last-handled-configuration")
    fields = [tuple(f.split(".")) if isinstance(f, str) else f for f in extra_fields]
    ours = EssenceMemory().build(body=now, extra_fields=extra_fields)
    assert ours == kopfs.build(body=now, extra_fields=fields)
    assert ("status" in ours) == any(f[0] == "status" for f in fields)
