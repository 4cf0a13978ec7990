"""The one way to a Slurm job the operator may change: a `VerifiedJob`.

A job id in a status is a claim (anyone who may write `slurmjobs/status` writes it, and Slurm
reuses ids). So nothing that changes a job (cancel, bulk cancel, hold, release, a dependency
update, a signal: every mutating call of `slurm.client`) takes an id: it takes a
`VerifiedJob`, and a `VerifiedJob` is made here and nowhere else, by `verify` or
`verify_named`, from views read during the current step, and only when:

* every view read is the job's (its name and the comment carrying the resource's uid and
  attempt, `decisions.belongs`; or the exact name and comment of an operator-made probe),
  they are one job (one leader, one array), and each is slurmctld's own (an accounting
  record may lack the comment and the user, and its job has left the controller);
* the job's Slurm user is one the resource may own (`owners`: the tenant's `slurmUser` on
  this cluster, or the operator's own user); a job whose user Slurm does not show is not
  verified;
* a step is open (`step`): the handle dies with the step that read the job, so a handle
  kept across steps (the job may have ended, its id been reused) is refused.

Nothing else makes one: a handle copied (`copy`, `dataclasses.replace`) or forged (`cast`, a
call of the class) is not in this module's record of minted handles, and `vouch`, which every
mutating call makes at run time, refuses it. A test scans the package for any construction
outside this module.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum

from slurmjob_operator.api.status import Attempt
from slurmjob_operator.core.decisions import belongs
from slurmjob_operator.core.jobview import JobSource, SlurmJobView, by_leader, job_of, leader


class NotVerified(RuntimeError):
    """A mutating call got no live handle of this module's, or one for another user: a bug,
    never something to retry."""


class Step:
    """One step of work on one resource (or one doctor probe): handles minted in it are good
    until it ends."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = True


_STEP: ContextVar[Step | None] = ContextVar("slurmjob_step", default=None)


@contextlib.contextmanager
def step() -> Iterator[Step]:
    """Open a step for the code inside (nested: the outer one stays the step)."""
    outer = _STEP.get()
    if outer is not None and outer.open:
        yield outer
        return
    current = Step()
    token = _STEP.set(current)
    try:
        yield current
    finally:
        current.open = False
        _STEP.reset(token)


@dataclass(frozen=True, eq=False)
class VerifiedJob:
    """A Slurm job proven to be a resource's, as read in the current step.

    `job_id`: the job's own id (a heterogeneous job's leader, an array's); `components`: every
    heterogeneous component's id read, the leader's last; `tasks`: the job ids of the array
    tasks read (started tasks have ids of their own); `owner`: the Slurm user the job belongs
    to, the one every change is made as; `cluster`: the cluster it was read on."""

    job_id: int
    sluid: str | None
    components: tuple[int, ...]
    tasks: tuple[int, ...]
    owner: str
    cluster: str
    step: Step


# id -> handle, for the handles minted here and still alive; a copy has another id.
_MINTED: weakref.WeakValueDictionary[int, VerifiedJob] = weakref.WeakValueDictionary()
# id -> the fields as verified: a handle changed in place (`object.__setattr__` gets past
# `frozen`) no longer matches them.
_FIELDS: dict[int, tuple[object, ...]] = {}


def _fields(job: VerifiedJob) -> tuple[object, ...]:
    return (job.job_id, job.sluid, job.components, job.tasks, job.owner, job.cluster, job.step)


class Why(StrEnum):
    IDENTITY = "identity"  # a view is not the attempt's job (name, comment, id)
    OWNER = "owner"  # the job's Slurm user is not one the resource may own
    NOTHING = "nothing"  # the read found nothing
    CLUSTER = "cluster"  # the resource may not have jobs changed on this cluster


@dataclass(frozen=True)
class Unverified:
    """Why a read did not make a handle; `view`: the first view that failed (None when
    nothing was read)."""

    why: Why
    view: SlurmJobView | None = None


def _mint(views: Sequence[SlurmJobView], owner: str, cluster: str) -> VerifiedJob:
    current = _STEP.get()
    if current is None or not current.open:
        raise NotVerified("a job is verified only inside a step (core.verified.step)")
    head = leader(views)
    job_id = job_of(head)
    others = sorted({v.job_id for v in views if v.het_job_id == job_id} - {job_id})
    components = (*others, job_id)
    tasks = tuple(sorted({v.job_id for v in views if v.array_job_id == job_id} - {job_id}))
    # An array has no SLUID of its own: each one names a single task's record.
    sluid = head.sluid if head.array_job_id is None else None
    handle = VerifiedJob(job_id, sluid, components, tasks, owner, cluster, current)
    _MINTED[id(handle)] = handle
    _FIELDS[id(handle)] = _fields(handle)
    weakref.finalize(handle, _FIELDS.pop, id(handle), None)
    return handle


def _owned(
    views: Sequence[SlurmJobView],
    matches: Callable[[SlurmJobView], bool],
    owners: frozenset[str],
    cluster: str,
) -> VerifiedJob | Unverified:
    if not views:
        return Unverified(Why.NOTHING)
    if any(view.source is not JobSource.CONTROLLER for view in views):
        # Only slurmctld's own view shows a live job's comment and user; an accounting
        # record (which may have neither) is of a job that has left the controller, and
        # nothing is left to change there.
        return Unverified(Why.NOTHING)
    for view in views:
        if not matches(view):
            return Unverified(Why.IDENTITY, view)
    if len(by_leader(views)) != 1:
        return Unverified(Why.IDENTITY, views[-1])
    users = {view.user for view in views}
    if len(users) != 1:
        return Unverified(Why.OWNER, views[0])
    (user,) = users
    if user is None or user not in owners:
        return Unverified(Why.OWNER, views[0])
    return _mint(views, user, cluster)


def verify(
    views: Sequence[SlurmJobView],
    uid: str,
    attempt: Attempt,
    *,
    owners: frozenset[str],
    cluster: str,
) -> VerifiedJob | Unverified:
    """A handle on the attempt's job from `views` (one job's, read in this step), or why not.
    An attempt without a job id is matched on its name and comment alone (an adoption's
    duplicates, an unconfirmed attempt's job on deletion)."""
    return _owned(views, lambda view: belongs(view, uid, attempt), owners, cluster)


def verify_named(
    views: Sequence[SlurmJobView],
    name: str,
    comment: str | None,
    *,
    owners: frozenset[str],
    cluster: str,
) -> VerifiedJob | Unverified:
    """A handle on a job the operator made outside any resource (doctor's probe), by its
    exact name and comment."""
    return _owned(
        views, lambda view: view.name == name and view.comment == comment, owners, cluster
    )


def vouch(job: object, acting: str | None) -> VerifiedJob:
    """`job`, when it is a live handle minted here for a change made as Slurm user `acting`;
    raises `NotVerified` otherwise. Every mutating call makes this check."""
    if not isinstance(job, VerifiedJob) or _MINTED.get(id(job)) is not job:
        raise NotVerified(f"not a verified job: {type(job).__name__}")
    if _FIELDS.get(id(job)) != _fields(job):
        raise NotVerified(f"Slurm job {job.job_id}'s handle was changed after it was verified")
    if not job.step.open:
        raise NotVerified(f"Slurm job {job.job_id} was verified in a step that has ended")
    if acting is None or acting != job.owner:
        raise NotVerified(
            f"Slurm job {job.job_id} belongs to Slurm user {job.owner!r}; a change is made as "
            f"that user only, not as {acting!r}"
        )
    return job
