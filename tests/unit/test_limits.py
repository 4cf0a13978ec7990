"""Limits checked before submit: the cluster's answers parsed (captured and hostile), the
verdict on a request (tables and a property), and the controller refusing with nothing staged
while reading the cluster once per poll interval."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.status import Phase
from slurmjob_operator.controller import RetryLater
from slurmjob_operator.core.launch import JobComponent, LaunchRequest
from slurmjob_operator.core.limits import Node, Partition, Snapshot, check
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.slurm.nodes import (
    NodeInfo,
    PartitionInfo,
    gpu_count,
    parse_names,
    parse_nodes,
    parse_partitions,
)

from .controller_fakes import Bed, cpu_spec, make_bed

CAPTURES = Path(__file__).parents[1] / "data" / "slurm-captures" / "slurm-26.05.5"
SAMPLES = Path(__file__).parents[1] / "data" / "slurm-samples" / "slurm-26.05"


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


# -- parsing --------------------------------------------------------------------------------


def test_captured_partitions_nodes_accounts_and_qos_are_read() -> None:
    [debug] = parse_partitions(_load(CAPTURES / "resp_partitions.json"))
    assert debug.name == "debug"
    assert debug.is_up is True
    assert debug.is_default
    assert debug.max_time_minutes is None  # MaxTime=UNLIMITED
    assert debug.max_nodes is None
    assert parse_partitions(_load(CAPTURES / "resp_partition_missing.json")) == []
    [vm] = parse_nodes(_load(SAMPLES / "resp_nodes.json"))
    assert (vm.cpus, vm.memory_mb, vm.gpus, vm.partitions) == (2, 24000, 0, {"debug"})
    assert parse_names("accounts")(_load(CAPTURES / "resp_slurmdb_accounts.json")) == {"root"}
    assert parse_names("qos")(_load(CAPTURES / "resp_slurmdb_qos.json")) == {"normal"}


def test_v0038_flat_partition_fields_are_read() -> None:
    raw = {
        "name": "short",
        "state": "UP",
        "flags": [],
        "max_time_limit": 30,
        "maximum_nodes_per_job": 4,
        "maximum_cpus_per_node": 0xFFFFFFFF,
    }
    [short] = parse_partitions({"partitions": [raw]})
    assert (short.max_time_minutes, short.max_nodes, short.max_cpus_per_node) == (30, 4, None)
    assert short.is_up is True
    assert not short.is_default


@pytest.mark.parametrize(
    "value",
    [True, -5, "30", 1 << 50, {"set": True, "infinite": True, "number": 5}, {"number": 5}, [3]],
)
def test_a_limit_that_is_no_plain_bound_limits_nothing(value: Any) -> None:
    [p] = parse_partitions({"partitions": [{"name": "p", "maximums": {"time": value}}]})
    assert p.max_time_minutes is None


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("", 0),
        ("gpu:4", 4),
        ("gpu:a100:4(S:0-1)", 4),
        ("gpu:a100:2,gpu:h100:2", 4),
        ("gpu:a100", 1),
        ("shard:8,gpu:1", 1),
        ("gpu:a100:99999999999", 0),  # nonsense is no count
        ("gpu:" + ":" * 100_000, 0),
    ],
)
def test_gpus_are_counted_from_gres(gres: str, gpus: int) -> None:
    assert gpu_count(gres) == gpus


@pytest.mark.parametrize("state", ["DOWN", "DRAIN", "INACTIVE"])
def test_a_partition_that_takes_no_jobs_is_not_up(state: str) -> None:
    assert PartitionInfo(name="p", states=frozenset({state})).is_up is False
    assert PartitionInfo(name="p").is_up is None


# -- the verdict ----------------------------------------------------------------------------


def launch(
    *components: JobComponent, partition: str | None = "short", **extra: Any
) -> LaunchRequest:
    return LaunchRequest(
        job_name="j",
        comment="c",
        script="#!/bin/bash\n",
        working_directory="/w",
        standard_output="/w/o",
        standard_error="/w/e",
        environment={},
        components=list(components) or [component()],
        partition=partition,
        **extra,
    )


def component(**extra: Any) -> JobComponent:
    values: dict[str, Any] = {"pool": "main", "nodes": 1, "cpus_per_task": 4, "memory_mb": 8192}
    values.update(extra)
    return JobComponent(**values)


def node(name: str, cpus: int = 8, memory_mb: int = 32768, gpus: int = 0, **extra: Any) -> Node:
    return Node(name, frozenset({"short"}), cpus=cpus, memory_mb=memory_mb, gpus=gpus, **extra)


def snapshot(
    partition: Partition | None = None, nodes: tuple[Node, ...] = (), **extra: Any
) -> Snapshot:
    p = partition or Partition("short", up=True, max_time_minutes=30)
    return Snapshot("tb", {p.name: p}, nodes, **extra)


def test_a_time_limit_over_max_time_is_refused_and_names_the_limit() -> None:
    verdict = check(launch(time_limit_minutes=31), snapshot())
    [refusal] = verdict.refusals
    assert refusal.field == "spec.timeLimit"
    assert "31 minutes exceeds the MaxTime of partition short (30 minutes)" in refusal.message
    assert check(launch(time_limit_minutes=30), snapshot()).ok


def test_a_partition_that_does_not_exist_is_refused_with_the_ones_that_do() -> None:
    [refusal] = check(launch(partition="long"), snapshot()).refusals
    assert refusal.field == "spec.partition"
    assert "partition long does not exist on cluster tb (partitions: short)" in refusal.message


def test_without_a_partition_the_default_one_is_checked() -> None:
    default = Partition("short", up=True, default=True, max_time_minutes=10)
    verdict = check(launch(partition=None, time_limit_minutes=11), snapshot(default))
    assert [r.field for r in verdict.refusals] == ["spec.timeLimit"]
    no_default = Partition("short", up=True, max_time_minutes=10)
    assert check(launch(partition=None, time_limit_minutes=11), snapshot(no_default)).ok


def test_nodes_cpus_memory_and_gpus_must_fit_the_partitions_nodes() -> None:
    nodes = (node("n1", gpus=4, features=frozenset({"a100"})), node("n2"))
    fits = component(nodes=1, gpus_per_node=4, constraints="a100")
    assert check(launch(fits), snapshot(nodes=nodes)).ok
    too_many = component(nodes=2, gpus_per_node=4, constraints="a100")
    [refusal] = check(launch(too_many), snapshot(nodes=nodes)).refusals
    assert refusal.field == "spec.pools[0]"
    assert "2 node(s) with 4 CPUs, 8 GiB, 4 GPUs each requested" in refusal.message
    assert "has 1 such node(s) of 1" in refusal.message
    big = component(cpus_per_task=16)
    [refusal] = check(launch(big), snapshot(nodes=nodes)).refusals
    assert "largest: 8 CPUs, 32 GiB, 4 GPUs" in refusal.message
    unknown = component(constraints="h100")
    [refusal] = check(launch(unknown), snapshot(nodes=nodes)).refusals
    assert "no node of partition short has feature h100" in refusal.message


def test_nodes_the_probe_blamed_are_not_counted_as_room() -> None:
    nodes = (node("n1", gpus=2), node("n2", gpus=2))
    two_gpus = component(gpus_per_node=2)
    assert check(launch(two_gpus, excluded_nodes=("n1",)), snapshot(nodes=nodes)).ok
    [refusal] = check(launch(two_gpus, excluded_nodes=("n1", "n2")), snapshot(nodes=nodes)).refusals
    assert "every node of partition short is excluded" in refusal.message
    assert "collective probe blamed: n1, n2" in refusal.message
    both = component(nodes=2, gpus_per_node=2)
    [refusal] = check(launch(both, excluded_nodes=("n2",)), snapshot(nodes=nodes)).refusals
    assert "without the nodes the collective probe blamed (n2)" in refusal.message
    assert "has 1 such node(s) of 1" in refusal.message


def test_a_constraint_expression_and_unreadable_nodes_rule_nothing_out() -> None:
    nodes = (node("n1", gpus=4),)
    assert check(
        launch(component(gpus_per_node=4, constraints="a100|h100")), snapshot(nodes=nodes)
    ).ok
    vague = (Node("n1", frozenset({"short"}), cpus=None, memory_mb=None),)
    assert check(launch(component(cpus_per_task=512)), snapshot(nodes=vague)).ok
    assert check(launch(component(cpus_per_task=512)), snapshot()).ok  # no nodes read


def test_partition_maxima_name_the_pool() -> None:
    p = Partition("short", up=True, max_nodes=2, max_cpus_per_node=4)
    het = launch(component(pool="a"), component(pool="b", nodes=3, cpus_per_task=8))
    refusals = check(het, snapshot(p), pools=["a", "b"]).refusals
    assert [r.field for r in refusals] == ["spec.pools[1].nodes", "spec.pools[1].cpus"]
    assert "pool b: 3 nodes exceeds the MaxNodes of partition short (2)" in refusals[0].message


def test_accounts_and_qos_are_checked_only_where_accounting_answers() -> None:
    known = snapshot(accounts=frozenset({"physics"}), qos=frozenset({"normal"}))
    assert check(launch(account="Physics", qos="normal"), known).ok
    refusals = check(launch(account="chem", qos="high"), known).refusals
    assert [r.field for r in refusals] == ["spec.account", "spec.qos"]
    assert check(launch(account="chem", qos="high"), snapshot()).ok


def test_a_partition_that_is_down_is_unavailable_not_refused() -> None:
    down = Partition("short", up=False, state="DOWN")
    verdict = check(launch(), snapshot(down))
    assert verdict.refusals == ()
    assert not verdict.ok
    assert verdict.unavailable == "partition short of cluster tb is DOWN: it takes no jobs now"
    # A request that can never fit is refused whatever the partition's state.
    assert check(
        launch(time_limit_minutes=99), snapshot(Partition("short", False, max_time_minutes=5))
    ).refusals


@given(
    cpus=st.integers(1, 256),
    memory=st.integers(1, 1 << 20),
    gpus=st.integers(0, 8),
    count=st.integers(1, 8),
    minutes=st.integers(1, 10_000),
)
def test_a_request_the_cluster_has_room_for_is_never_refused(
    cpus: int, memory: int, gpus: int, count: int, minutes: int
) -> None:
    nodes = tuple(node(f"n{i}", cpus=cpus, memory_mb=memory, gpus=gpus) for i in range(count))
    p = Partition(
        "short", up=True, max_time_minutes=minutes, max_nodes=count, max_cpus_per_node=cpus
    )
    request = component(nodes=count, cpus_per_task=cpus, memory_mb=memory, gpus_per_node=gpus)
    assert check(launch(request, time_limit_minutes=minutes), snapshot(p, nodes)).ok
    over = component(nodes=count, cpus_per_task=cpus + 1, memory_mb=memory, gpus_per_node=gpus)
    assert not check(launch(over, time_limit_minutes=minutes), snapshot(p, nodes)).ok


# -- the controller -------------------------------------------------------------------------


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


def _short(bed: Bed, max_time: int = 5, states: str = "UP") -> None:
    bed.slurm.partition_list = [
        PartitionInfo(name="debug", states=frozenset({states}), max_time_minutes=max_time)
    ]


async def test_an_over_long_time_limit_is_refused_with_nothing_staged_or_sent(bed: Bed) -> None:
    _short(bed)
    ref = bed.store.create("train", cpu_spec(timeLimit="10m"))
    await bed.controller.reconcile(ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == Reason.LIMIT_EXCEEDED
    assert failed.message == (
        "spec.timeLimit: 10 minutes exceeds the MaxTime of partition debug (5 minutes)"
    )
    assert status.attempts == []
    assert bed.slurm.calls == []
    assert not (bed.settings.storage_root / "team-a").exists()
    assert "LimitExceeded" in bed.store.reasons()
    # The spec cannot change (the CRD refuses it): fixed in a new SlurmJob of the same name,
    # made once the refused one is deleted, it is submitted.
    del bed.store.objects[("team-a", "train")]
    again = bed.store.create("train", cpu_spec(timeLimit="5m"))
    await bed.controller.reconcile(again)
    assert bed.store.status(again).phase is Phase.QUEUED


async def test_a_partition_that_is_down_waits_and_submits_once_it_is_up(tmp_path: Path) -> None:
    bed = make_bed(tmp_path, poll_interval=0.001)
    _short(bed, max_time=60, states="DOWN")
    ref = bed.store.create("train", cpu_spec())
    with pytest.raises(RetryLater):
        await bed.controller.reconcile(ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.PENDING
    assert [c.reason for c in status.conditions if c.type == "Ready"] == ["PartitionUnavailable"]
    assert bed.slurm.calls == []
    _short(bed, max_time=60)
    await asyncio.sleep(0.01)  # the next poll interval: the cluster is read again
    await bed.controller.reconcile(ref)
    assert bed.store.status(ref).phase is Phase.QUEUED


async def test_the_cluster_is_read_once_per_poll_interval_not_per_submission(
    tmp_path: Path,
) -> None:
    bed = make_bed(tmp_path, poll_interval=3600)
    refs = [bed.store.create(f"j{i}", cpu_spec()) for i in range(20)]
    for ref in refs:
        await bed.controller.reconcile(ref)
    assert bed.slurm.partition_reads == 1
    assert all(bed.store.status(r).phase is Phase.QUEUED for r in refs)


async def test_limits_that_cannot_be_read_leave_the_checks_to_slurm(bed: Bed) -> None:
    from slurmjob_operator.slurm.errors import SlurmTransient

    bed.slurm.partition_list = SlurmTransient("partitions unreadable")
    ref = bed.store.create("train", cpu_spec())
    await bed.controller.reconcile(ref)
    assert bed.store.status(ref).phase is Phase.QUEUED


async def test_hostile_node_answers_refuse_nothing_they_do_not_show(bed: Bed) -> None:
    bed.slurm.node_list = [
        NodeInfo(
            name="n1", features=frozenset(), states=frozenset(), partitions=frozenset({"debug"})
        )
    ]
    ref = bed.store.create("train", cpu_spec())
    await bed.controller.reconcile(ref)
    assert bed.store.status(ref).phase is Phase.QUEUED


# -- a job whose output could not be opened ------------------------------------------------


def _failed_on_node(bed: Bed, job_id: int, user_id: int | None = None) -> None:
    from datetime import UTC, datetime

    bed.slurm.set_state(job_id, "FAILED")
    started = datetime(2026, 12, 1, 18, 17, tzinfo=UTC)
    bed.slurm.jobs[job_id] = bed.slurm.jobs[job_id].model_copy(
        update={
            "start_time": started,
            "end_time": started,
            "user": "slurmci",
            "user_id": user_id,
            "reason": "RaisedSignal",
            "description": "RaisedSignal:53(Real-time signal 19)",
        }
    )


async def test_a_job_that_could_not_open_its_output_says_so(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await bed.controller.reconcile(ref)
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    _failed_on_node(bed, 100)
    item = next(t for t in bed.controller.followed() if t.ref == ref)
    await bed.controller.refresh(item, await bed.slurm.get_job(100))
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == Reason.STAGING_NOT_WRITABLE
    st = os.stat(staging)
    mode, uid, gid = st.st_mode & 0o7777, st.st_uid, st.st_gid
    assert failed.message.startswith(
        f"Slurm could not open the job's output file {staging / 'stdout.log'} as the job user "
        f"slurmci (uid {uid}): {staging} is owned by {uid}:{gid} with mode {mode:04o}."
    )
    assert "RaisedSignal" in failed.message


async def test_the_uid_named_is_the_one_slurm_ran_the_job_as(bed: Bed) -> None:
    """Not the staging owner the site expects (the operator's own uid 0 without one): Slurm's
    word for the uid the job ran as."""
    ref = bed.store.create("train", cpu_spec())
    await bed.controller.reconcile(ref)
    _failed_on_node(bed, 100, user_id=1000)
    item = next(t for t in bed.controller.followed() if t.ref == ref)
    await bed.controller.refresh(item, await bed.slurm.get_job(100))
    failed = next(c for c in bed.store.status(ref).conditions if c.type == "Failed")
    assert failed.reason == Reason.STAGING_NOT_WRITABLE
    assert "as the job user slurmci (uid 1000):" in failed.message


async def test_a_failed_job_that_wrote_its_output_keeps_slurms_reason(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await bed.controller.reconcile(ref)
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    (staging / "stdout.log").write_text("Traceback ...\n")
    _failed_on_node(bed, 100)
    item = next(t for t in bed.controller.followed() if t.ref == ref)
    await bed.controller.refresh(item, await bed.slurm.get_job(100))
    failed = next(c for c in bed.store.status(ref).conditions if c.type == "Failed")
    assert failed.reason != Reason.STAGING_NOT_WRITABLE


def test_accounting_enforcement_is_read_from_the_captured_conf() -> None:
    from slurmjob_operator.slurm.nodes import ConfFacts, parse_conf

    assert parse_conf(_load(SAMPLES / "resp_conf.json")) == ConfFacts()
    conf = {
        "slurm_conf": {
            "AccountingStorageEnforce": ["ASSOCIATIONS", "QOS"],
            "PrivateData": "accounts,jobs",
            "DependencyParameters": ["kill_invalid_depend"],
        }
    }
    facts = parse_conf(conf)
    assert facts.enforce == {"associations", "qos"}
    assert facts.private_data == {"accounts", "jobs"}
    assert facts.dependency_parameters == {"kill_invalid_depend"}
    assert parse_conf({"slurm_conf": 7}) == ConfFacts()


@pytest.mark.parametrize(
    ("enforced", "refused"),
    [
        (None, []),  # not served: nothing checked
        (frozenset(), []),  # Slurm runs a job of any account: so does the operator
        (frozenset({"associations"}), ["spec.account"]),
        (frozenset({"qos"}), ["spec.account", "spec.qos"]),
    ],
)
async def test_accounts_and_qos_are_refused_only_where_slurm_enforces_them(
    tmp_path: Path, enforced: frozenset[str] | None, refused: list[str]
) -> None:
    bed = make_bed(tmp_path)
    bed.slurm.enforced = enforced
    bed.slurm.accounts = frozenset({"root"})
    bed.slurm.qos = frozenset({"normal"})
    ref = bed.store.create("train", cpu_spec(account="team-a", qos="high"))
    await bed.controller.reconcile(ref)
    status = bed.store.status(ref)
    if not refused:
        assert status.phase is Phase.QUEUED
        return
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == Reason.LIMIT_EXCEEDED
    assert [m.split(":")[0] for m in failed.message.split("; ")] == refused


async def test_accounts_are_not_judged_where_the_operator_may_not_see_them(
    tmp_path: Path,
) -> None:
    bed = make_bed(tmp_path)
    bed.slurm.enforced = frozenset({"associations"})
    bed.slurm.private_data = frozenset({"accounts"})
    bed.slurm.accounts = frozenset({"root"})
    ref = bed.store.create("train", cpu_spec(account="team-a"))
    await bed.controller.reconcile(ref)
    assert bed.store.status(ref).phase is Phase.QUEUED


def test_a_partition_list_is_refused_only_when_no_name_exists() -> None:
    assert check(launch(partition="long,short"), snapshot()).ok
    [refusal] = check(launch(partition="long,longer"), snapshot()).refusals
    assert refusal.message.startswith("none of the partitions long,longer exists on cluster tb")


@pytest.mark.parametrize(
    "partition", ["p" * 100_000, "a,\n\x1b[31mred,b", ",,,,", "x" * 50_000 + ",y"]
)
async def test_a_hostile_partition_name_is_refused_with_a_bounded_message(
    tmp_path: Path, partition: str
) -> None:
    bed = make_bed(tmp_path)
    ref = bed.store.create("train", cpu_spec(partition=partition))
    await bed.controller.reconcile(ref)  # no crash: a message echoing 100 kB is bounded
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == Reason.LIMIT_EXCEEDED
    assert len(failed.message) < 1000
    assert bed.slurm.calls == []


def test_a_condition_message_is_bounded_whatever_a_refusal_echoes() -> None:
    from datetime import UTC, datetime

    from slurmjob_operator.api.status import CONDITION_MESSAGE_MAX, set_condition

    [cond] = set_condition([], "Failed", "True", "InvalidSpec", "x" * 100_000, 1, datetime.now(UTC))
    assert len(cond.message) == CONDITION_MESSAGE_MAX
