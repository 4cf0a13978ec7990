"""The deletions' shared listing (controller/joblisting.py): one `GET /jobs` for the callers
of the moment, each handed only the live jobs of its own names, and a caller never served a
listing that started before it asked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from slurmjob_operator.controller.joblisting import SharedListing
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.slurm.errors import SlurmTransient
from slurmjob_operator.slurm.joblists import JobListResult


def job(job_id: int, name: str, state: str = "RUNNING") -> SlurmJobView:
    return SlurmJobView(job_id=job_id, name=name, raw_state=(state,), base_state=BaseState(state))


class Listing:
    """A client whose `list_jobs` answers the jobs it holds now, after `delay` seconds."""

    def __init__(self, *jobs: SlurmJobView, delay: float = 0.0) -> None:
        self.jobs = list(jobs)
        self.delay = delay
        self.calls = 0
        self.fail: Exception | None = None

    async def list_jobs(self) -> JobListResult:
        self.calls += 1
        held = tuple(self.jobs)  # what the controller holds as the request arrives
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        return JobListResult(jobs=held)


def shared(client: Listing) -> SharedListing:
    async def slurm() -> Any:
        return client

    return SharedListing(slurm, linger=0.01)


async def test_callers_together_share_one_listing_and_get_only_their_live_jobs() -> None:
    client = Listing(
        job(1, "a"), job(2, "a", "COMPLETED"), job(3, "b"), job(4, "c"), job(5, "b", "PENDING")
    )
    listing = shared(client)
    got = await asyncio.gather(
        listing.live({"a"}), listing.live({"b", "x"}), listing.live({"nobody"})
    )
    assert [[j.job_id for j in found] for found in got] == [[1], [3, 5], []]
    assert client.calls == listing.made == 1


async def test_a_caller_arriving_during_a_listing_waits_for_the_next() -> None:
    client = Listing(job(1, "a"), delay=0.2)
    listing = shared(client)
    first = asyncio.ensure_future(listing.live({"a"}))
    await asyncio.sleep(0.05)  # the first listing is under way
    client.jobs.append(job(2, "a"))  # a job submitted after that listing was read
    second = asyncio.ensure_future(listing.live({"a"}))
    assert [j.job_id for j in await first] == [1]
    assert [j.job_id for j in await second] == [1, 2], "a listing started after it asked"
    assert client.calls == 2


async def test_a_failed_listing_fails_its_callers_and_the_next_one_is_tried() -> None:
    client = Listing(job(1, "a"))
    client.fail = SlurmTransient("slurmrestd answered 503")
    listing = shared(client)
    with pytest.raises(SlurmTransient):
        await listing.live({"a"})
    client.fail = None
    assert [j.job_id for j in await listing.live({"a"})] == [1]
