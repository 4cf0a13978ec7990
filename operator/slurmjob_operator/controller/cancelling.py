"""Cancelling many jobs at once, and waiting for their ends together.

`kubectl delete sj --all` makes every resource's finalizer ask at the same moment. Each cancel
asked for within `linger` seconds goes out in one `DELETE /jobs` per acting Slurm user (at most
`batch` ids each), and every finalizer waiting for its job's end is answered by one sweep per
`tick` for all of them (`/jobs/state`, batched by the client), so deleting 2,000 resources
costs a handful of requests instead of a cancel and a stream of GETs each. Where the version
has no bulk cancel (v0.0.38, a v0.0.40 before 23.11.6) the cancels go one by one, at most
`concurrency` at a time, and the waits are per-job GETs.

A caller cancelled while it waits leaves nothing behind: its future is skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from slurmjob_operator.core.jobview import group_states
from slurmjob_operator.core.verified import NotVerified, VerifiedJob, vouch
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.dialects import BulkCancelResult
from slurmjob_operator.slurm.errors import (
    SlurmError,
    SlurmNotFound,
    SlurmRejected,
    SlurmUnsupported,
)

log = logging.getLogger(__name__)

Ref = int | str


@dataclass
class _Ask:
    job: VerifiedJob
    future: asyncio.Future[None]
    sent: str = ""


def _settle(future: asyncio.Future[None], error: BaseException | None = None) -> None:
    if future.done():  # its caller gave up
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class Canceller:
    def __init__(
        self,
        slurm: Callable[[], Awaitable[SlurmClient]],
        slurm_as: Callable[[str | None], Awaitable[SlurmClient]],
        *,
        linger: float = 0.05,
        batch: int = 500,
        tick: float = 0.5,
        concurrency: int = 8,
    ) -> None:
        """`slurm`: the operator's client (it reads the states); `slurm_as(user)`: the client
        that acts as Slurm user `user` (a job's verified owner)."""
        if batch < 1 or concurrency < 1:
            raise ValueError("batch and concurrency must be at least 1")
        self._slurm = slurm
        self._slurm_as = slurm_as
        self.linger = linger
        self.batch = batch
        self.tick = tick
        self._limit = asyncio.Semaphore(concurrency)
        self._asks: dict[str, list[_Ask]] = {}
        self._waits: dict[int, list[asyncio.Future[None]]] = defaultdict(list)
        self._arrays: set[int] = set()  # the waited-for ids that are job arrays
        self._tasks: set[asyncio.Task[None]] = set()
        self._watching = False
        self._bulk = True  # until the server shows it has no bulk cancel

    # -- cancel ------------------------------------------------------------------------------

    async def cancel(self, job: VerifiedJob) -> None:
        """Cancel `job` as its owner. Returns once Slurm took the cancel (or said the job had
        already ended); raises `SlurmNotFound` when Slurm does not know the job, and the
        other `SlurmError`s as a one-job cancel would. The caller's step stays open while it
        waits, so the handle is still good when the batch goes out."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asks = self._asks.get(job.owner)
        if asks is None:
            asks = self._asks[job.owner] = []
            self._spawn(self._flush(job.owner))
        asks.append(_Ask(job, future))
        await future

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, user: str) -> None:
        await asyncio.sleep(self.linger)
        asks = [a for a in self._asks.pop(user, []) if not a.future.done()]
        try:
            await self._flush_asks(user, asks)
        except BaseException as exc:  # a waiting finalizer never hangs on a bug here
            for ask in asks:
                _settle(ask.future, exc if isinstance(exc, Exception) else SlurmError(str(exc)))
            if not isinstance(exc, Exception):
                raise

    async def _flush_asks(self, user: str, asks: list[_Ask]) -> None:
        client = await self._slurm_as(user)
        valid: list[_Ask] = []
        acting = client.user
        for ask in asks:
            if ask.future.done():  # its caller gave up while the client was awaited
                continue
            try:
                # Each handle on its own: one whose step ended meanwhile fails its own
                # caller, never the batch it would have gone out in.
                vouch(ask.job, acting)
                ask.sent = client.bulk_ref(ask.job)
            except (SlurmError, ValueError, NotVerified) as exc:  # one, not the batch
                _settle(ask.future, exc)
                continue
            valid.append(ask)
        for start in range(0, len(valid), self.batch):
            await self._send(client, valid[start : start + self.batch])

    async def _send(self, client: SlurmClient, asks: list[_Ask]) -> None:
        if self._bulk and client.dialect.supports_bulk_cancel:
            try:
                result = await client.cancel_many([a.job for a in asks])
            except SlurmUnsupported:
                log.info("slurmrestd %s has no bulk cancel: cancelling one by one", client.version)
                self._bulk = False
            except SlurmError as exc:
                for ask in asks:
                    _settle(ask.future, exc)
                return
            else:
                if not result.unmatched:
                    for ask in asks:
                        _settle(ask.future, _outcome(result, ask.sent))
                    return
                # A failure Slurm attributes to no id sent: nothing is known to be done.
                log.warning("bulk cancel answered %s; cancelling one by one", result.unmatched)
        await asyncio.gather(*(self._one(client, ask) for ask in asks))

    async def _one(self, client: SlurmClient, ask: _Ask) -> None:
        async with self._limit:
            try:
                await client.cancel(ask.job)
            except SlurmError as exc:
                _settle(ask.future, exc)
            else:
                _settle(ask.future)

    # -- wait --------------------------------------------------------------------------------

    async def until_final(self, job_id: int, within: float, *, array: bool = False) -> bool:
        """Whether job `job_id` (every het component; every task of an `array`) ended, or
        Slurm forgot it, within `within` seconds."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waits[job_id].append(future)
        if array:
            self._arrays.add(job_id)
        if not self._watching:
            self._watching = True
            self._spawn(self._watch())
        try:
            await asyncio.wait_for(future, within)
        except TimeoutError:
            return False
        return True

    async def _watch(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.tick)
                for job_id in [i for i, fs in self._waits.items() if all(f.done() for f in fs)]:
                    del self._waits[job_id]
                    self._arrays.discard(job_id)
                if not self._waits:
                    return
                try:
                    ended = await self._ended(await self._slurm(), sorted(self._waits))
                except SlurmError as exc:
                    log.warning("waiting for cancelled jobs: slurmrestd: %s", exc)
                    continue
                for job_id in ended:
                    self._arrays.discard(job_id)
                    for future in self._waits.pop(job_id, []):
                        _settle(future)
        finally:
            self._watching = False

    async def _ended(self, client: SlurmClient, job_ids: Sequence[int]) -> Iterable[int]:
        if client.dialect.supports_jobs_state:
            entries = await client.jobs_state(job_ids)
            groups = group_states(entries)
            # A started task of an array answers under its own job id, which was not asked
            # for: such an entry is some asked array's. While one is live, no array is done.
            asked = set(job_ids)
            tasks_live = any(
                e.array_task is not None and e.job_id not in asked and not e.is_final
                for e in entries
            )
            return [
                i
                for i in job_ids
                if (i not in groups or all(e.is_final for e in groups[i]))
                and not (tasks_live and i in self._arrays)
            ]
        done = await asyncio.gather(*(self._ended_one(client, i) for i in job_ids))
        return [i for i, ended in zip(job_ids, done, strict=True) if ended]

    async def _ended_one(self, client: SlurmClient, job_id: int) -> bool:
        async with self._limit:
            try:
                return all(v.is_final for v in await client.get_job(job_id))
            except SlurmNotFound:
                return True


def _outcome(result: BulkCancelResult, sent: str) -> SlurmError | None:
    if sent in result.missing:
        return SlurmNotFound(f"job {sent} not found", status=200, method="DELETE")
    refusal = result.refusal(sent)
    if refusal is not None:
        return SlurmRejected("signal refused", status=200, errors=(refusal,), method="DELETE")
    return None
