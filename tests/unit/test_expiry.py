"""spec.ttlSecondsAfterFinished (issue 25, "Clean-up after the end"): which TTL applies, when
its clock starts, and what the controller deletes (and keeps) with the in-memory apiserver."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.api.status import Phase
from slurmjob_operator.core.claims import finished_at
from slurmjob_operator.core.expiry import TtlPolicy, effective_ttl, expires_in
from slurmjob_operator.times import rfc3339

from .controller_fakes import Bed, cpu_spec, make_bed
from .controller_fakes import reconcile_once as reconcile


@pytest.mark.parametrize(
    ("spec", "default", "maximum", "ttl"),
    [
        (None, None, None, None),  # nobody asked: kept
        (None, 3600, None, 3600),  # the site's default
        (60, 3600, None, 60),  # the spec's own wins over the default
        (0, 3600, None, 0),  # 0: at once
        (90_000, None, 86_400, 86_400),  # capped by the site's maximum
        (None, 90_000, 86_400, 86_400),  # the default too
        (None, None, 86_400, None),  # a maximum alone deletes nothing
    ],
)
def test_which_ttl_applies(
    spec: int | None, default: int | None, maximum: int | None, ttl: int | None
) -> None:
    assert effective_ttl(spec, TtlPolicy(default, maximum)) == ttl


def _finished(bed: Bed, ttl: int | None = None, name: str = "train", **spec: Any) -> ObjectRef:
    """A SlurmJob that ended (Slurm refused its job: Failed, final, Finished=True)."""
    bed.slurm.faults = ["rejected"]
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    ref = bed.store.create(name, cpu_spec(**spec))
    return ref


def _age(bed: Bed, ref: ObjectRef, seconds: float) -> None:
    """Move the end `seconds` into the past, as if the SlurmJob finished that long ago."""
    for cond in bed.store.body(ref)["status"]["conditions"]:
        if cond["type"] == "Finished":
            then = datetime.now(tz=UTC) - timedelta(seconds=seconds)
            cond["lastTransitionTime"] = rfc3339(then)


async def test_the_clock_starts_when_finished_turned_true(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    ref = _finished(bed, ttl=60)
    await reconcile(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    now = datetime.now(tz=UTC)
    at = finished_at(status, None, now)
    assert at is not None
    assert expires_in(status, 60, at + timedelta(seconds=15)) == 45
    assert expires_in(status, 60, at + timedelta(seconds=600)) == 0
    assert expires_in(status, None, at) is None
    # Not final (or Finished=False): no clock at all.
    pending = status.model_copy(update={"phase": Phase.PENDING})
    assert finished_at(pending, None, now) is None


async def test_a_finished_slurmjob_is_deleted_once_its_ttl_passed(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    ref = _finished(bed, ttl=3600)
    await reconcile(bed, ref)  # the submit Slurm refused: Failed
    await reconcile(bed, ref)  # the watch's next event: final, an hour to go
    assert bed.store.deleted == []
    due = bed.controller.wakes.due_in(ref.uid)
    assert due is not None
    assert 3590 < due <= 3600
    _age(bed, ref, 3601)
    await reconcile(bed, ref)
    assert bed.store.deleted == ["train"]
    assert bed.store.body(ref)["metadata"].get("deletionTimestamp")


async def test_a_ttl_of_zero_deletes_at_once_from_the_watchs_copy(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    ref = _finished(bed, ttl=0)
    await reconcile(bed, ref)
    gets = bed.store.gets
    await bed.controller.reconcile(ref, copy.deepcopy(bed.store.body(ref)))
    assert bed.store.deleted == ["train"]
    assert bed.store.gets == gets + 1, "one read, to delete only what it decided on"


async def test_the_site_default_and_maximum(tmp_path: Path) -> None:
    bed = make_bed(tmp_path, ttl_after_finished_default=0, ttl_after_finished_max=10)
    plain = _finished(bed, name="plain")
    await reconcile(bed, plain)
    await reconcile(bed, plain)
    assert bed.store.deleted == ["plain"], "the site's default of 0"
    long = _finished(bed, ttl=86_400, name="long")
    await reconcile(bed, long)
    _age(bed, long, 11)
    await reconcile(bed, long)
    assert bed.store.deleted == ["plain", "long"], "a day asked, ten seconds allowed"


async def test_without_a_ttl_nothing_is_deleted_or_scheduled(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    ref = _finished(bed)
    await reconcile(bed, ref)
    _age(bed, ref, 10**6)
    await reconcile(bed, ref)
    assert bed.store.deleted == []
    assert bed.controller.wakes.due_in(ref.uid) is None


async def test_an_upstream_is_kept_while_a_dependent_has_not_finished(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    upstream = _finished(bed, ttl=0, name="prep")
    await reconcile(bed, upstream)
    bed.slurm.faults = []
    dependent = bed.store.create(
        "train", cpu_spec(dependsOn=[{"name": "prep", "condition": "Finished"}])
    )
    bed.controller.observe_body(copy.deepcopy(bed.store.body(dependent)))
    await reconcile(bed, upstream)
    assert bed.store.deleted == [], "a SlurmJob still to finish depends on it"
    assert bed.controller.wakes.due_in(upstream.uid) is not None, "looked at again later"
    # The dependent runs (its upstream finished) and ends: the upstream may go.
    await reconcile(bed, dependent)
    assert bed.store.status(dependent).phase is Phase.QUEUED
    bed.slurm.set_state(100, "COMPLETED")
    await bed.controller.refresh(
        next(t for t in bed.controller.followed() if t.ref == dependent),
        await bed.slurm.get_job(100),
    )
    assert bed.store.status(dependent).phase is Phase.SUCCEEDED
    bed.controller.observe_body(copy.deepcopy(bed.store.body(dependent)))
    await reconcile(bed, upstream)
    assert bed.store.deleted == ["prep"]


async def test_a_dependent_of_the_same_name_in_another_namespace_protects_nothing(
    tmp_path: Path,
) -> None:
    """dependsOn names a SlurmJob of the dependent's own namespace: team-b's `train` waiting
    on a `prep` of team-b never keeps team-a's `prep` (the index is keyed by namespace)."""
    bed = make_bed(tmp_path)
    upstream = _finished(bed, ttl=0, name="prep")
    assert upstream.namespace == "team-a"
    await reconcile(bed, upstream)
    bed.slurm.faults = []
    elsewhere = bed.store.create(
        "train", cpu_spec(dependsOn=[{"name": "prep", "condition": "Finished"}]), namespace="team-b"
    )
    bed.controller.observe_body(copy.deepcopy(bed.store.body(elsewhere)))
    assert bed.controller.depended_on("team-b", "prep")
    assert not bed.controller.depended_on("team-a", "prep")
    await reconcile(bed, upstream)
    assert bed.store.deleted == ["prep"]


async def test_a_slurmjob_changed_since_the_decision_is_not_deleted(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    ref = _finished(bed, ttl=0)
    await reconcile(bed, ref)
    seen = copy.deepcopy(bed.store.body(ref))
    real_get = bed.store.get

    async def edited_meanwhile(namespace: str, name: str) -> dict[str, Any] | None:
        body = await real_get(namespace, name)
        bed.store.touch(ref, team="b")  # a user's label edit between the read and the delete
        return body

    bed.store.get = edited_meanwhile  # type: ignore[method-assign]
    await bed.controller.reconcile(ref, seen)
    assert bed.store.deleted == []
    assert bed.controller.wakes.due_in(ref.uid) is not None, "looked at again"
    bed.store.get = real_get  # type: ignore[method-assign]
    await reconcile(bed, ref)
    assert bed.store.deleted == ["train"]


async def test_the_pollers_final_write_starts_the_clock_through_the_watch(
    tmp_path: Path,
) -> None:
    """No handler runs for a status change: the watch event of the poller's final write sets
    the wake, and the wake deletes."""
    bed = make_bed(tmp_path)
    ref = bed.store.create("train", cpu_spec(ttlSecondsAfterFinished=0))
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "COMPLETED", return_code=0)
    item = next(t for t in bed.controller.followed() if t.ref == ref)
    await bed.controller.refresh(item, await bed.slurm.get_job(100))
    assert bed.store.status(ref).phase is Phase.SUCCEEDED
    assert bed.store.deleted == []
    bed.controller.observe_body(copy.deepcopy(bed.store.body(ref)))
    assert bed.controller.wakes.due_in(ref.uid) == 0
    await asyncio.sleep(0.05)
    await bed.controller.wakes.drain()
    assert bed.store.deleted == ["train"]
