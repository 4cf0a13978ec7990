"""One listing of the controller's jobs for every deletion of the moment.

A deletion looks for its resource's live jobs by name (a status that says "final" or names
another job is only a claim), and `/jobs/state` carries no names on v0.0.40+: so it takes
`GET /jobs`, which lists every job. Deletions asking together share one: a caller waits for
the next listing that starts after it asked (never one already under way, so the jobs it
sees were read after its step began), and one listing, started a moment (`linger`) after its
first caller, serves every caller waiting when it starts. However many SlurmJobs are deleted
at once, at most one `GET /jobs` is in flight and the number made grows with the time the
deletions take, not with their count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection

from slurmjob_operator.core.jobview import SlurmJobView
from slurmjob_operator.slurm.client import SlurmClient

log = logging.getLogger(__name__)


class SharedListing:
    def __init__(
        self, slurm: Callable[[], Awaitable[SlurmClient]], *, linger: float = 0.05
    ) -> None:
        """`linger`: how long a listing waits for more callers before it starts (as the
        Canceller's batch does)."""
        self._slurm = slurm
        self.linger = linger
        self._waiting: list[tuple[frozenset[str], asyncio.Future[list[SlurmJobView]]]] = []
        self._runner: asyncio.Task[None] | None = None
        #: Listings made (for tests and the bench: requests per deletion).
        self.made = 0

    async def live(self, names: Collection[str]) -> list[SlurmJobView]:
        """The live jobs (not final) named one of `names`, from a listing started after this
        call; raises what the listing raised. Only these are handed back: the listing itself
        (every job of the controller) is dropped as soon as it is shared out, never held
        while the callers cancel and wait."""
        future: asyncio.Future[list[SlurmJobView]] = asyncio.get_running_loop().create_future()
        self._waiting.append((frozenset(names), future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="slurmjob-shared-listing")
        return await asyncio.shield(future)

    async def _run(self) -> None:
        while self._waiting:
            await asyncio.sleep(self.linger)
            batch, self._waiting = self._waiting, []
            try:
                self.made += 1
                listing = await (await self._slurm()).list_jobs()
            except Exception as exc:  # every caller gets the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            wanted = frozenset().union(*(names for names, _ in batch))
            found: dict[str, list[SlurmJobView]] = {}
            for job in listing.jobs:
                if job.name in wanted and not job.is_final:
                    found.setdefault(job.name, []).append(job)
            del listing
            for names, future in batch:
                if not future.done():
                    future.set_result([job for name in names for job in found.get(name, ())])

    async def close(self) -> None:
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
