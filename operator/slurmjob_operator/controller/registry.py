"""What the poller follows and the jobs-by-phase gauge counts: one registry, written only by
`Registry.observe` (after every status write and every watch event) and `Registry.forget`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.api.status import Phase, SlurmJobStatus, get_condition
from slurmjob_operator.core.arrays import shown_index
from slurmjob_operator.core.following import is_lost
from slurmjob_operator.core.reconcile import SLURM_REACHABLE


@dataclass(frozen=True)
class Tracked:
    """A submitted, not yet final job the poller follows."""

    ref: ObjectRef
    job_id: int
    sluid: str | None
    staging_dir: str | None  # as the status says: compared, never used (storage.locate)
    attempt: int | None = None  # its number, which with `ref` locates its files
    # Slurm's state as the status last recorded it (base state and flags, sorted): after a
    # restart the poller compares the sweep with it instead of fetching every job's details.
    native: tuple[str, ...] = ()
    running: bool = False  # only a running job's log files are looked at between changes
    # The SlurmReachable condition's (status, reason) as recorded: a reachability report
    # visits only the resources whose condition it changes (after a restart: none).
    reachable: tuple[str, str] | None = None
    # A job array: its tasks answer a state sweep under their own job ids (`poller`), and the
    # log files looked at are those of task `log_index`.
    array: bool = False
    log_index: int | None = None


def follows(status: SlurmJobStatus) -> bool:
    """Whether the poller must ask Slurm about the current attempt."""
    attempt = status.current_attempt
    return (
        status.phase is not None
        and not status.phase.is_terminal
        and status.next_attempt_at is None
        # A job Slurm forgot without a trace cannot come back: stop asking for it.
        and not is_lost(status)
        and attempt is not None
        and attempt.job_id is not None
        and attempt.confirmed
    )


class Registry:
    """Everything here runs on the event loop (the watch handler is async), so the poller's
    snapshot (`followed`) never sees a dict change size under it."""

    def __init__(self) -> None:
        self._tracked: dict[str, Tracked] = {}
        self._phases: dict[str, str] = {}

    def observe(self, ref: ObjectRef, status: SlurmJobStatus) -> None:
        if status.phase is not None:
            self._phases[ref.uid] = status.phase.value
        attempt = status.current_attempt
        if attempt is not None and attempt.job_id is not None and follows(status):
            cond = get_condition(status.conditions, SLURM_REACHABLE)
            native = (attempt.native_state, *attempt.native_flags) if attempt.native_state else ()
            self._tracked[ref.uid] = Tracked(
                ref,
                attempt.job_id,
                attempt.sluid,
                attempt.staging_dir,
                attempt.number,
                native=tuple(sorted(native)),
                running=status.phase is Phase.RUNNING,
                reachable=(cond.status, cond.reason) if cond is not None else None,
                array=attempt.array is not None,
                log_index=shown_index(status),
            )
        else:
            self._tracked.pop(ref.uid, None)

    def forget(self, uid: str) -> None:
        self._tracked.pop(uid, None)
        self._phases.pop(uid, None)

    def followed(self) -> list[Tracked]:
        """A snapshot: the poller awaits between items, and the registry changes meanwhile."""
        return list(self._tracked.values())

    def is_followed(self, uid: str) -> bool:
        return uid in self._tracked

    def phase_counts(self) -> Counter[str]:
        return Counter(self._phases.values())
