"""Changing a job the tests or the benches submitted themselves: every mutating client call
takes a `core.verified` handle, made the one way there is, from a read of the job now, taken
on the job's own name and comment and owned by the user the client acts as."""

from __future__ import annotations

import asyncio

from slurmjob_operator.core import verified
from slurmjob_operator.core.jobview import leader
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.dialects import CancelResult
from slurmjob_operator.slurm.errors import SlurmTransient


async def own_job(client: SlurmClient, ref: int | str) -> verified.VerifiedJob:
    """A handle on job `ref` as Slurm shows it now; call inside `verified.step()`. Raises
    `SlurmNotFound` when Slurm does not know it, AssertionError when it is another user's."""
    for tries_left in (2, 1, 0):
        try:
            views = await client.get_job(ref)
            break
        except SlurmTransient:  # 22.05's slurmrestd resets a connection now and then
            if not tries_left:
                raise
            await asyncio.sleep(0.5)
    head = leader(views)
    mine = frozenset({client.user} if client.user else ())
    made = verified.verify_named(views, head.name, head.comment, owners=mine, cluster="test")
    assert isinstance(made, verified.VerifiedJob), f"job {ref} is not this client's: {made}"
    return made


async def cancel_own(client: SlurmClient, ref: int | str) -> CancelResult:
    """Cancel a job of the client's own user, read and verified first."""
    with verified.step():
        return await client.cancel(await own_job(client, ref))
