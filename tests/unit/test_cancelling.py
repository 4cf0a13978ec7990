"""`Canceller`: cancels asked for together go out as one `DELETE /jobs` per Slurm user, and
the waits for their ends share one state sweep per tick (the in-memory Slurm of the
controller tests)."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from slurmjob_operator.controller.cancelling import Canceller
from slurmjob_operator.core import verified
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.slurm.errors import (
    SlurmNotFound,
    SlurmRejected,
    SlurmTransient,
    SlurmUnsupported,
)

from .controller_fakes import OPERATOR_USER, MemorySlurm
from .handles import handle


@pytest.fixture(autouse=True)
def _in_a_step(step: Any) -> None:
    """Every test here runs inside one step (a handle lives as long as its step)."""


def slurm_with(count: int, user: str | None = None, first: int = 100) -> MemorySlurm:
    slurm = MemorySlurm()
    for job_id in range(first, first + count):
        slurm.jobs[job_id] = SlurmJobView(
            job_id=job_id,
            user=user or OPERATOR_USER,
            raw_state=("PENDING",),
            base_state=BaseState.PENDING,
        )
    return slurm


def canceller(slurm: MemorySlurm, **kw: Any) -> Canceller:
    kw.setdefault("tick", 0.01)
    return Canceller(slurm.client, slurm.client_for, **kw)


def bulk_calls(slurm: MemorySlurm) -> list[str]:
    return [c for c in slurm.calls if c.startswith("cancel_many")]


async def test_cancels_asked_together_go_out_as_one_request() -> None:
    slurm = slurm_with(200)
    c = canceller(slurm)
    await asyncio.gather(*(c.cancel(handle(job_id)) for job_id in range(100, 300)))
    assert len(bulk_calls(slurm)) == 1
    assert all(j.base_state is BaseState.CANCELLED for j in slurm.jobs.values())
    assert not [call for call in slurm.calls if call.startswith("cancel ")]


async def test_a_batch_holds_at_most_batch_ids() -> None:
    slurm = slurm_with(25)
    c = canceller(slurm, batch=10)
    await asyncio.gather(*(c.cancel(handle(job_id)) for job_id in range(100, 125)))
    assert [len(call.split()) - 1 for call in bulk_calls(slurm)] == [10, 10, 5]


async def test_each_user_cancels_its_own_jobs() -> None:
    slurm = slurm_with(3, user="team-a")
    for job_id in (200, 201):
        slurm.jobs[job_id] = slurm.jobs[100].model_copy(update={"job_id": job_id, "user": "team-b"})
    c = canceller(slurm)
    await asyncio.gather(
        c.cancel(handle(100, "team-a")),
        c.cancel(handle(200, "team-b")),
        c.cancel(handle(101, "team-a")),
    )
    assert slurm.made_as("team-a") == ["cancel_many 100 101"]
    assert slurm.made_as("team-b") == ["cancel_many 200"]


async def test_one_missing_or_refused_job_fails_only_its_own_caller() -> None:
    slurm = slurm_with(2)
    slurm.jobs[102] = slurm.jobs[100].model_copy(update={"job_id": 102, "user": "someone"})
    c = canceller(slurm)
    results = await asyncio.gather(
        c.cancel(handle(100)),
        c.cancel(handle(555)),
        c.cancel(handle(102)),
        c.cancel(handle(101)),
        return_exceptions=True,
    )
    assert results[0] is None
    assert results[3] is None
    assert isinstance(results[1], SlurmNotFound)
    assert isinstance(results[2], SlurmRejected)
    assert slurm.jobs[102].base_state is BaseState.PENDING


async def test_a_failed_request_fails_every_caller_of_the_batch() -> None:
    slurm = slurm_with(3)

    async def down(refs: Any) -> Any:
        raise SlurmTransient("connection refused")

    slurm.cancel_many = down  # type: ignore[method-assign]
    c = canceller(slurm)
    results = await asyncio.gather(
        *(c.cancel(handle(i)) for i in range(100, 103)), return_exceptions=True
    )
    assert all(isinstance(r, SlurmTransient) for r in results)


async def test_without_bulk_cancel_each_job_is_cancelled_with_bounded_concurrency() -> None:
    slurm = slurm_with(20)
    slurm.bulk_cancel = False
    in_flight = peak = 0
    one = slurm.cancel

    async def counted(ref: Any) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        await one(ref)
        in_flight -= 1

    slurm.cancel = counted  # type: ignore[method-assign]
    c = canceller(slurm, concurrency=4)
    await asyncio.gather(*(c.cancel(handle(i)) for i in range(100, 120)))
    assert not bulk_calls(slurm)
    assert peak == 4
    assert all(j.base_state is BaseState.CANCELLED for j in slurm.jobs.values())


async def test_a_server_without_the_route_is_asked_once_then_per_job() -> None:
    slurm = slurm_with(4)
    asked = 0

    async def unserved(refs: Any) -> Any:
        nonlocal asked
        asked += 1
        raise SlurmUnsupported("endpoint not served")

    slurm.cancel_many = unserved  # type: ignore[method-assign]
    c = canceller(slurm)
    await asyncio.gather(c.cancel(handle(100)), c.cancel(handle(101)))
    await asyncio.gather(c.cancel(handle(102)), c.cancel(handle(103)))
    assert asked == 1
    assert [call for call in slurm.calls if call.startswith("cancel ")] == [
        f"cancel {i}" for i in range(100, 104)
    ]


async def test_a_caller_that_gives_up_leaves_the_others_served() -> None:
    slurm = slurm_with(2)
    c = canceller(slurm, linger=0.05)
    gone = asyncio.ensure_future(c.cancel(handle(100)))
    kept = asyncio.ensure_future(c.cancel(handle(101)))
    await asyncio.sleep(0)
    gone.cancel()
    await kept
    assert bulk_calls(slurm) == ["cancel_many 101"]


async def test_a_bug_below_fails_the_callers_instead_of_hanging_them() -> None:
    slurm = slurm_with(1)

    async def broken(user: str | None) -> Any:
        raise RuntimeError("bug")

    c = Canceller(slurm.client, broken, tick=0.01)
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(c.cancel(handle(100)), 2)


async def test_waits_share_one_sweep_per_tick() -> None:
    slurm = slurm_with(100)
    c = canceller(slurm, tick=0.02)

    async def end_later() -> None:
        await asyncio.sleep(0.05)
        for job_id in range(100, 199):
            slurm.set_state(job_id, "CANCELLED")
        slurm.jobs.pop(199)  # forgotten by Slurm counts as ended

    ender = asyncio.ensure_future(end_later())
    ended = await asyncio.gather(*(c.until_final(i, 5) for i in range(100, 200)))
    await ender
    assert all(ended)
    sweeps = slurm.calls.count("jobs_state")
    assert 1 <= sweeps <= 6, sweeps
    assert not [call for call in slurm.calls if call.startswith("get_job")]


async def test_a_wait_that_outlasts_its_time_says_so() -> None:
    slurm = slurm_with(2)
    slurm.set_state(101, "CANCELLED")
    c = canceller(slurm)
    assert await c.until_final(100, 0.1) is False
    assert await c.until_final(101, 1) is True


async def test_without_a_state_sweep_waits_ask_per_job() -> None:
    slurm = slurm_with(2)
    slurm.set_state(100, "CANCELLED")
    slurm.state_sweep = False
    c = canceller(slurm)
    ended = await asyncio.gather(c.until_final(100, 1), c.until_final(101, 0.1))
    assert ended == [True, False]
    assert "get_job 100" in slurm.calls
    assert "jobs_state" not in slurm.calls


def array_with(pending: str, array_id: int = 100) -> MemorySlurm:
    slurm = MemorySlurm()
    slurm.jobs[array_id] = SlurmJobView(
        job_id=array_id,
        array_job_id=array_id,
        array_tasks=pending,
        user=OPERATOR_USER,
        raw_state=("PENDING",),
        base_state=BaseState.PENDING,
    )
    slurm.next_id = array_id + 1
    return slurm


async def test_an_array_is_final_only_once_every_task_is() -> None:
    """A started task answers the sweep under its own job id, not the array's: the array's
    own record being final says nothing about it."""
    slurm = array_with("0-3%2")
    [task_id] = slurm.start_tasks(100, [0])
    slurm.jobs[111] = SlurmJobView(  # a plain job waited for at the same time
        job_id=111, user=OPERATOR_USER, raw_state=("RUNNING",), base_state=BaseState.RUNNING
    )
    c = canceller(slurm)
    await c.cancel(handle(100))
    assert slurm.jobs[100].base_state is BaseState.CANCELLED
    slurm.set_state(task_id, "RUNNING")  # still ending (an epilog)
    assert not await c.until_final(100, 0.1, array=True)
    slurm.set_state(task_id, "CANCELLED")
    assert await c.until_final(100, 1.0, array=True)
    # Read as a plain job, the array's own record would have been enough: the array flag is
    # what waits for the task.
    slurm.set_state(task_id, "RUNNING")
    assert await c.until_final(100, 1.0)
    assert not await c.until_final(111, 0.1)


async def test_a_step_that_ends_mid_batch_fails_only_its_own_cancel() -> None:
    """One finalizer cancelled while its cancel waits in a batch (its step ends) must not fail
    the others that share the Slurm user (every tenant without a slurmUser shares one)."""
    slurm = slurm_with(2)
    preparing = asyncio.Event()

    async def slow_client_for(user: str | None) -> Any:
        preparing.set()
        await asyncio.sleep(0.05)  # a first token minted for the user, say
        return await slurm.client_for(user)

    c = Canceller(slurm.client, slow_client_for, tick=0.01)

    async def deletion(job_id: int) -> None:
        with verified.step():
            await c.cancel(handle(job_id))

    # Each finalizer in a context of its own (outside this module's step): its step ends
    # when its task is cancelled.
    loop = asyncio.get_running_loop()
    gone = loop.create_task(deletion(100), context=contextvars.Context())
    kept = loop.create_task(deletion(101), context=contextvars.Context())
    await preparing.wait()
    gone.cancel()
    results = await asyncio.gather(gone, kept, return_exceptions=True)
    assert results[1] is None, results[1]
    assert slurm.jobs[101].base_state is BaseState.CANCELLED
    assert slurm.jobs[100].base_state is BaseState.PENDING
