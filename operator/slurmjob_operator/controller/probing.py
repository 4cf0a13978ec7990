"""The collective probe's part of following a job: its record folded into the status once the
batch script wrote it, what it taught remembered in the probe book, and how many new attempts
a failed probe may get on this cluster.

The keys it is remembered under are made again from the resource (its namespace, its tenant's
entry, this cluster, its spec as the site resolves it), never read from the status: the
status's `probe.key` and `probe.avoid` are a claim anyone with the status can set to another
tenant's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import Attempt
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.probebook import ProbeBook
from slurmjob_operator.core.kueue import queue_of
from slurmjob_operator.core.probe import ProbeKeys, parse_record, with_probe
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.dialects import dialect_for
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.storage.locate import attempt_dir
from slurmjob_operator.storage.logs import READ_TIMEOUT
from slurmjob_operator.storage.proberecord import read_probe_record

log = logging.getLogger(__name__)


class Probing:
    def __init__(
        self,
        settings: Settings,
        slurm: Callable[[], Awaitable[SlurmClient]],
        job_uid: Callable[[str], int | None],
        keys: Callable[[ResourceView, str | None], ProbeKeys | None],
    ) -> None:
        """`keys(view, placed)`: the job's probe keys made again from the resource (None: it
        gets no probe, or no longer resolves); `placed`: the partition Kueue chose."""
        self.settings = settings
        self.slurm = slurm
        self._job_uid = job_uid
        self._keys = keys
        #: The probe cache and avoid lists (None: not kept, e.g. the local runner).
        self.probes: ProbeBook | None = None

    async def fold(
        self,
        view: ResourceView,
        attempt: Attempt,
        transition: Transition,
        now: datetime,
        placed: str | None = None,
    ) -> Transition:
        """The probe's record folded in once the batch script wrote it, and remembered in
        the probe book. A record that cannot be read or is not the script's is left alone
        (logged): the job's end is then decided as any other's. `placed`: the partition
        Slurm says the job is in (None: Slurm was not asked this time)."""
        ref = view.ref
        queued = queue_of(view.labels) is not None
        if queued and placed is None and view.spec is not None and view.spec.partition is None:
            # Kueue's flavors may have chosen the partition the keys were made with: taken
            # when Slurm's view says which (the next poll), not guessed.
            return transition
        keys = self._keys(view, placed if queued else None)
        if keys is None:
            log.info("probe record of %s/%s not taken: no probe now", ref.namespace, ref.name)
            return transition
        base = attempt_dir(self.settings.storage_root, ref, attempt.number, attempt.staging_dir)
        read = asyncio.to_thread(
            read_probe_record, self.settings, base, self._job_uid(ref.namespace)
        )
        try:
            data = await asyncio.wait_for(read, READ_TIMEOUT)
            record = parse_record(data, keys.ladder) if data is not None else None
        except (TimeoutError, OSError, ValueError) as exc:
            log.warning("probe record of %s/%s not taken: %s", ref.namespace, ref.name, exc)
            return transition
        if record is None:
            return transition
        probed = with_probe(transition.status, record, view.generation, now)
        if self.probes is not None and probed.events:  # a new outcome, not one seen before
            await self.probes.remember(keys, record)
        return Transition(probed.status, transition.events + probed.events)

    async def attempts(self) -> int:
        """New attempts a failed probe may get: none where the API version cannot exclude the
        nodes it blamed (v0.0.38), so the job fails at once instead of landing there again."""
        if self.settings.probe_attempts == 0:
            return 0
        try:
            client = await self.slurm()
        except SlurmError:
            return 0
        return self.settings.probe_attempts if dialect_for(client.version).supports_exclusion else 0
