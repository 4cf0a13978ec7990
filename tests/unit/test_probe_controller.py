"""The collective probe through the controller (issue 26, part 2), on the in-memory apiserver
and Slurm: the attempt records what was planned, the batch script's record is read once the
job shows it, a probe that failed everywhere gets a new attempt excluding the nodes it blamed
(with the retry budget untouched), a pass is cached in the operator's ConfigMap and lets the
next job skip the probe, and a record the script did not write changes nothing."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import Phase, get_condition
from slurmjob_operator.controller import Controller
from slurmjob_operator.controller.pipeline import probe_keys_of
from slurmjob_operator.controller.probebook import probe_book
from slurmjob_operator.controller.probing import Probing
from slurmjob_operator.core.kueue import QUEUE_LABEL
from slurmjob_operator.core.naming import PROBE_RECORD_FILE
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.nodes import NodeInfo

from .controller_fakes import Bed, StubToken, cpu_spec, make_bed
from .controller_fakes import reconcile_once as reconcile
from .test_controller import refresh

OK = ("COMPLETED", 0)
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
PROBE = {"command": ["probe"], "timeoutSeconds": 30, "ladder": [{"NCCL_P2P_DISABLE": "1"}]}


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    first = make_bed(tmp_path)
    assert first.settings.runtime_registry_file is not None
    data = json.loads(first.settings.runtime_registry_file.read_text())
    data["runtimes"][0]["probe"] = PROBE
    registry = tmp_path / "probed.yaml"
    registry.write_text(json.dumps(data))
    series = tmp_path / "series.yaml"
    series.write_text(json.dumps({"series": [{"name": "l40s", "gpusPerNode": 2}]}))
    return make_bed(
        tmp_path, runtime_registry_file=registry, gpu_series_file=series, probe_attempts=1
    )


def gpu_spec(**extra: Any) -> dict[str, Any]:
    pool = {"name": "main", "gpuSeries": "l40s", "nodes": 1, "gpusPerNode": 2, "cpus": 1}
    return cpu_spec(pools=[{**pool, "memoryGb": 1}], launch={"shape": "nodes"}, **extra)


def write_record(bed: Bed, ref: Any, text: str) -> None:
    staging = Path(bed.store.status(ref).attempts[-1].staging_dir or "")
    (staging / PROBE_RECORD_FILE).write_text(text)  # as the job user: this process


async def test_a_blamed_node_is_excluded_by_the_next_attempt_and_a_pass_is_cached(
    bed: Bed,
) -> None:
    ref = bed.store.create("train", gpu_spec(retry={"limit": 0}))
    await reconcile(bed, ref)
    planned = bed.store.status(ref).attempts[0].probe
    assert planned is not None
    assert (planned.ladder, planned.cached_rung, planned.excluded) == (2, None, [])
    write_record(bed, ref, "nodes n1\nrung 0 failed n1\nrung 1 failed n1\nresult failed\n")
    bed.slurm.set_state(100, "FAILED", 1)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.PENDING
    assert status.attempts[0].retry_action == "ProbeRetry"
    probe = get_condition(status.conditions, "ProbePassed")
    assert probe is not None
    assert (probe.status, probe.reason) == ("False", "ProbeFailed")
    await reconcile(bed, ref)
    second = bed.store.status(ref).attempts[1]
    assert second.probe is not None
    assert second.probe.excluded == ["n1"]
    assert bed.slurm.requests[-1].excluded_nodes == ("n1",)
    write_record(bed, ref, "nodes n2\nrung 0 passed 41.5\nresult passed 0 41.5\n")
    bed.slurm.set_state(101, "COMPLETED", 0)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.SUCCEEDED
    probe = get_condition(status.conditions, "ProbePassed")
    assert probe is not None
    assert (probe.status, probe.reason) == ("True", "ProbePassed")
    assert "41.5 GB/s" in probe.message
    [cache] = bed.store.configmaps.values()
    assert sorted(k.split("-")[0] for k in cache) == ["avoid", "probe"]
    # The next job of the same namespace and key skips the probe and avoids n1 too.
    other = bed.store.create("again", gpu_spec())
    await reconcile(bed, other)
    again = bed.store.status(other).attempts[0].probe
    assert again is not None
    assert (again.cached_rung, again.excluded) == (0, ["n1"])
    script = bed.slurm.requests[-1].script
    assert "printf 'result skipped %s\\n' 0" in script
    assert "probe_step" not in script
    # The ConfigMap was read once, for the first submit; memory answered the others.
    assert bed.store.configmap_reads == 1


async def test_probe_attempts_spent_end_in_probe_failed(bed: Bed) -> None:
    ref = bed.store.create("train", gpu_spec(retry={"limit": 3}))
    await reconcile(bed, ref)
    for job_id in (100, 101):
        write_record(bed, ref, "nodes n1 n2\nrung 0 failed n2\nrung 1 hung\nresult failed\n")
        bed.slurm.set_state(job_id, "FAILED", 1)
        await refresh(bed, ref)
        await reconcile(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    failed = get_condition(status.conditions, "Failed")
    assert failed is not None
    assert failed.reason == "ProbeFailed"
    assert "0:failed 1:hung" in failed.message
    assert [a.retry_action for a in status.attempts] == ["ProbeRetry", "Fail"]


async def test_too_few_nodes_without_the_blamed_ones_end_in_probe_failed(bed: Bed) -> None:
    """The partition's one node that fits is the one the probe blamed: the new attempt is not
    sent (Slurm would hold or refuse it), and the job fails with ProbeFailed, not as a
    request too big for the cluster."""
    bed.slurm.node_list = [
        NodeInfo(
            name="n1",
            features=frozenset(),
            states=frozenset({"IDLE"}),
            gres="gpu:l40s:2",
            partitions=frozenset({"debug"}),
            cpus=8,
            memory_mb=16384,
        )
    ]
    ref = bed.store.create("train", gpu_spec(retry={"limit": 3}))
    await reconcile(bed, ref)
    write_record(bed, ref, "nodes n1\nrung 0 failed n1\nrung 1 failed n1\nresult failed\n")
    bed.slurm.set_state(100, "FAILED", 1)
    await refresh(bed, ref)
    assert bed.store.status(ref).phase is Phase.PENDING  # a new attempt is due
    await reconcile(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    failed = get_condition(status.conditions, "Failed")
    assert failed is not None
    assert failed.reason == "ProbeFailed"
    assert "too few nodes remain" in failed.message
    assert "collective probe blamed: n1" in failed.message
    assert bed.slurm.calls.count("submit") == 1


async def test_a_record_the_script_did_not_write_is_left_alone(bed: Bed) -> None:
    ref = bed.store.create("train", gpu_spec(retry={"limit": 0}))
    await reconcile(bed, ref)
    write_record(bed, ref, "nodes n1\nrung 0 failed n9\nresult failed\n")
    bed.slurm.set_state(100, "FAILED", 1)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    assert status.attempts[0].probe is not None
    assert status.attempts[0].probe.outcome is None
    assert get_condition(status.conditions, "ProbePassed") is None
    assert not bed.store.configmaps


async def test_what_one_namespace_s_probe_blames_never_steers_another_s_jobs(bed: Bed) -> None:
    """The record is the tenant's text: the nodes it blames go to that namespace's avoid list
    only, and its pass to that namespace's cache entry only."""
    mine = bed.store.create("train", gpu_spec(retry={"limit": 0}), namespace="team-a")
    await reconcile(bed, mine)
    write_record(
        bed, mine, "nodes n1 n2\nrung 0 failed n1 n2\nrung 1 failed n1 n2\nresult failed\n"
    )
    bed.slurm.set_state(100, "FAILED", 1)
    await refresh(bed, mine)
    await reconcile(bed, mine)
    assert bed.slurm.requests[-1].excluded_nodes == ("n1", "n2")  # its own next attempt
    other = bed.store.create("train", gpu_spec(), namespace="team-b")
    await reconcile(bed, other)
    planned = bed.store.status(other).attempts[0].probe
    assert planned is not None
    assert (planned.excluded, planned.cached_rung) == ([], None)
    assert bed.slurm.requests[-1].excluded_nodes == ()
    write_record(bed, mine, "nodes n3\nrung 0 passed 41.5\nresult passed 0 41.5\n")
    bed.slurm.set_state(101, "COMPLETED", 0)
    await refresh(bed, mine)
    again = bed.store.create("again", gpu_spec(), namespace="team-b")
    await reconcile(bed, again)
    planned = bed.store.status(again).attempts[0].probe
    assert planned is not None
    assert planned.cached_rung is None  # team-a's pass lets team-b skip nothing


@pytest.mark.parametrize("kind", ["symlink", "fifo", "hardlink", "oversized"])
async def test_a_record_that_is_no_plain_small_file_of_the_job_is_not_read(
    bed: Bed, tmp_path: Path, kind: str
) -> None:
    """probe.record in a directory the job user owns: a link to a passing record elsewhere, a
    FIFO (a read would block), a second name of another file, or more than a record can be,
    is refused without reading it; the job's end is decided as any other's."""
    ref = bed.store.create("train", gpu_spec(retry={"limit": 0}))
    await reconcile(bed, ref)
    staging = Path(bed.store.status(ref).attempts[-1].staging_dir or "")
    passing = tmp_path / "elsewhere.record"
    passing.write_text("nodes n1\nrung 0 passed 99\nresult passed 0 99\n")
    record = staging / PROBE_RECORD_FILE
    if kind == "symlink":
        record.symlink_to(passing)
    elif kind == "fifo":
        os.mkfifo(record)
    elif kind == "hardlink":
        os.link(passing, record)
    else:
        record.write_text(
            "nodes n1\nrung 0 passed 99\n" + "rung 0 hung\n" * 400 + "result failed\n"
        )
    bed.slurm.set_state(100, "FAILED", 1)
    async with asyncio.timeout(10):
        await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    probe = status.attempts[0].probe
    assert probe is not None
    assert probe.outcome is None
    assert get_condition(status.conditions, "ProbePassed") is None
    assert not bed.store.configmaps


def claim_keys(bed: Bed, ref: Any, key: str, avoid: str) -> None:
    """What anyone who may write the status can do: name another tenant's probe keys in it."""
    probe = bed.store.body(ref)["status"]["attempts"][-1]["probe"]
    probe.update(key=key, avoid=avoid)


async def end_with(bed: Bed, ref: Any, record: str, state: str, code: int) -> None:
    write_record(bed, ref, record)
    job_id = bed.store.status(ref).attempts[-1].job_id
    assert job_id is not None
    bed.slurm.set_state(job_id, state, code)
    await refresh(bed, ref)


async def planned(bed: Bed, name: str, namespace: str) -> tuple[int | None, list[str]]:
    ref = bed.store.create(name, gpu_spec(), namespace=namespace)
    await reconcile(bed, ref)
    probe = bed.store.status(ref).attempts[0].probe
    assert probe is not None
    return probe.cached_rung, probe.excluded


async def test_a_status_naming_another_tenants_probe_keys_steers_only_its_own(bed: Bed) -> None:
    """Issue 42: team-a writes team-b's cache and avoid keys into its own status. Its pass
    plants no rung for team-b, its failure neither forgets team-b's rung nor lands the nodes
    it blamed in team-b's avoid list: the keys are made again from team-a's resource."""
    theirs = bed.store.create("train", gpu_spec(retry={"limit": 0}), namespace="team-b")
    await reconcile(bed, theirs)
    keys = bed.store.status(theirs).attempts[0].probe
    assert keys is not None
    planting = bed.store.create("plant", gpu_spec(retry={"limit": 0}), namespace="team-a")
    await reconcile(bed, planting)
    claim_keys(bed, planting, keys.key, keys.avoid)
    await end_with(bed, planting, "nodes n3\nrung 0 passed 41.5\nresult passed 0 41.5\n", *OK)
    assert await planned(bed, "b2", "team-b") == (None, [])  # no rung planted for team-b
    await end_with(
        bed, theirs, "nodes n4\nrung 0 hung\nrung 1 passed 40\nresult passed 1 40\n", *OK
    )
    assert await planned(bed, "b3", "team-b") == (1, [])
    blaming = bed.store.create("blame", gpu_spec(retry={"limit": 0}), namespace="team-a")
    await reconcile(bed, blaming)
    claim_keys(bed, blaming, keys.key, keys.avoid)
    failed = "nodes n1 n2\nrung 0 failed n1 n2\nrung 1 failed n1 n2\nresult failed\n"
    await end_with(bed, blaming, failed, "FAILED", 1)
    # team-b's rung is still cached and it avoids nothing; team-a avoids what it blamed.
    assert await planned(bed, "b4", "team-b") == (1, [])
    assert await planned(bed, "a4", "team-a") == (None, ["n1", "n2"])


async def test_the_keys_made_again_are_the_submits(bed: Bed) -> None:
    """What `following` remembers under is what the submit looked up: the same function on the
    resource; a partition Kueue's flavor chose counts only where the spec names none."""
    ref = bed.store.create("train", gpu_spec(retry={"limit": 0}), namespace="team-b")
    await reconcile(bed, ref)
    shown = bed.store.status(ref).attempts[0].probe
    assert shown is not None
    site, spec = bed.controller.site, SlurmJobSpec.model_validate(gpu_spec())
    keys = probe_keys_of(spec, site, "team-b")
    assert keys is not None
    assert (keys.cache, keys.avoid, keys.ladder, keys.owner) == (
        shown.key,
        shown.avoid,
        shown.ladder,
        "namespace:team-b",
    )
    placed = probe_keys_of(spec, site, "team-b", placed="gpu")
    named = spec.model_copy(update={"partition": "gpu"})
    assert placed == probe_keys_of(named, site, "team-b")
    assert placed is not None
    assert (placed.cache != keys.cache, placed.avoid) == (True, keys.avoid)
    assert probe_keys_of(named, site, "team-b", placed="other") == placed
    assert probe_keys_of(SlurmJobSpec.model_validate(cpu_spec()), site, "team-b") is None


@pytest.mark.parametrize(
    ("labels", "partition", "placed", "asked"),
    [
        ({}, None, "gpu", [None]),  # no queue: Slurm's partition is not the submit's input
        ({QUEUE_LABEL: "q"}, None, "gpu", ["gpu"]),  # Kueue's flavor chose it: Slurm says which
        ({QUEUE_LABEL: "q"}, None, None, []),  # not known this time (logs only): wait
        ({QUEUE_LABEL: "q"}, "debug", None, [None]),  # the spec's own partition
    ],
)
async def test_a_kueue_jobs_keys_take_the_partition_slurm_reports(
    bed: Bed,
    labels: dict[str, str],
    partition: str | None,
    placed: str | None,
    asked: list[str | None],
) -> None:
    calls: list[str | None] = []

    def keys(view: ResourceView, where: str | None) -> None:
        calls.append(where)

    async def no_slurm() -> Any:
        raise AssertionError("not asked")

    probing = Probing(bed.settings, no_slurm, lambda namespace: None, keys)
    spec = gpu_spec(partition=partition) if partition else gpu_spec()
    ref = bed.store.create("train", spec)
    bed.store.touch(ref, **labels)
    await reconcile(bed, ref)
    view = ResourceView.of(bed.store.body(ref))
    attempt = view.status.attempts[-1]
    transition = Transition(view.status)
    assert await probing.fold(view, attempt, transition, NOW, placed) is transition
    assert calls == asked


async def test_every_part_of_the_process_shares_one_probe_book(bed: Bed) -> None:
    """The fleet's parts weigh the ConfigMap's bound in one memory (`probe_book`): what one
    part's job taught, the other's next submit sees at once, with no read of its own."""
    book = probe_book(bed.settings, bed.store)
    assert book is not None
    parts = [
        Bed(bed.settings, bed.store, bed.slurm, part, bed.metrics)
        for part in (
            Controller(
                bed.settings,
                bed.store,
                None,  # type: ignore[arg-type]  # the in-memory Slurm replaces the transport
                Metrics(),
                token=StubToken(),  # type: ignore[arg-type]
                link=bed.slurm,  # type: ignore[arg-type]
                probes=book,
            )
            for _ in range(2)
        )
    ]
    assert await planned(parts[1], "first", "team-a") == (None, [])
    ref = bed.store.create("train", gpu_spec(retry={"limit": 0}))
    await reconcile(parts[0], ref)
    await end_with(
        parts[0], ref, "nodes n1\nrung 0 failed n1\nrung 1 failed n1\nresult failed\n", "FAILED", 1
    )
    assert await planned(parts[1], "next", "team-a") == (None, ["n1"])
    assert bed.store.configmap_reads == 1
