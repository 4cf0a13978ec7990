"""The submission side of a resource: the spec.suspend gate, the submit (render, record,
stage, POST), the confirmation of the receipt, the adoption of a job whose answer was lost,
and holding or releasing a queued job.

What changes a tenant's job (the POST, a cancel, hold and release) is done as the tenant's
`slurmUser` (`slurm_as`); what only reads (confirmation, adoption lookups) as the operator
(`slurmlink`).

What each failure becomes is `core.decisions.FAILURES`; here an exception is only classified
(`classify`) and the returned plan carried out.

At most `submit_concurrency` submits at once; the others wait for a slot of the controller's
`FairLimiter`, served round-robin by namespace (lock order: `Submission.reconcile`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import Attempt, AttemptDependency, Phase, SlurmJobStatus
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.dependencies import Dependencies
from slurmjob_operator.controller.fairness import FairLimiter
from slurmjob_operator.controller.following import Following
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.limits import LimitsCache
from slurmjob_operator.controller.pipeline import (
    PreparedAttempt,
    Site,
    prepare_attempt,
    stage,
    verify_runtime,
)
from slurmjob_operator.controller.queues import Queues
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core.absence import Mode, Next, Verdict, Window, mode, next_check, verdict
from slurmjob_operator.core.arrays import next_indices
from slurmjob_operator.core.decisions import (
    AdoptAction,
    Failure,
    Hold,
    Retry,
    adoption,
    awaits_upstream,
    belongs,
    declared_lost_now,
    failed_step,
    gate,
    hold_action,
    hold_transition,
    settled_refusal,
)
from slurmjob_operator.core.dependencies import (
    Action,
    Kind,
    repoint,
    slurm_dependency,
    waiting_interval,
)
from slurmjob_operator.core.following import (
    admission_conditions,
    dependency_failed,
    dependency_repointed,
    evicted,
    kueue_held,
    kueue_hold,
    kueue_release,
)
from slurmjob_operator.core.jobview import BaseState, SlurmJobView, by_leader, job_of, leader
from slurmjob_operator.core.kueue import QUEUE_LABEL, Admission, kueue_says, queue_of
from slurmjob_operator.core.kueue import Verdict as Admitted
from slurmjob_operator.core.limits import LimitExceeded, PartitionUnavailable, check, enforce
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.reconcile import (
    DECLARE_LOST_ANNOTATION,
    Step,
    confirmed,
    declared_lost,
    invalid_spec,
    next_step,
    not_submitted,
    proven_absent,
    record_attempt,
    submitted,
    unconfirmed,
    waiting,
)
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.core.verified import VerifiedJob
from slurmjob_operator.kube import SecretError, WorkloadError
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.artifacts import ArtifactError
from slurmjob_operator.site.preflight import PreflightError
from slurmjob_operator.site.render import RenderError
from slurmjob_operator.site.tenants import TenantUnknown
from slurmjob_operator.slurm.auth import TokenError
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import (
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmError,
    SlurmNotFound,
    SlurmRejected,
)
from slurmjob_operator.storage.locate import attempt_dir
from slurmjob_operator.storage.staging import StagingError, is_staged, remove_attempt
from slurmjob_operator.times import parse_rfc3339, rfc3339, utc_now

log = logging.getLogger(__name__)

#: What may stop a submit before the attempt is recorded (nothing sent) and after it.
PREPARE_ERRORS = (
    SpecError,
    RenderError,
    PreflightError,
    ArtifactError,
    SecretError,
    SlurmError,
    TokenError,
    LimitExceeded,
    PartitionUnavailable,
)
SEND_ERRORS = (SlurmError, TokenError, StagingError, OSError)
#: How long (x 0.5 s) an evicted job's end is waited for under its lock before trying later.
EVICTION_WAIT_ROUNDS = 60


def classify(exc: Exception, *, recorded: bool) -> Failure:
    """The failure class of an exception from a submit step (see `core.decisions`)."""
    if not recorded:
        if isinstance(exc, TenantUnknown):  # a SpecError, but not the spec's fault
            return Failure.TENANT_UNKNOWN
        if isinstance(exc, SpecError | RenderError | PreflightError):
            return Failure.SPEC_INVALID
        if isinstance(exc, ArtifactError):
            return Failure.RUNTIME_INVALID
        if isinstance(exc, SecretError):
            return Failure.SECRET_MISSING
        if isinstance(exc, LimitExceeded):
            return Failure.LIMIT_EXCEEDED
        if isinstance(exc, PartitionUnavailable):
            return Failure.PARTITION_UNAVAILABLE
        if isinstance(exc, SlurmAuthError):
            return Failure.SLURM_REFUSED_CREDENTIALS
        return Failure.SLURM_UNREACHABLE
    if isinstance(exc, SlurmRejected):
        return Failure.REJECTED
    if isinstance(exc, SlurmAmbiguous):
        return Failure.AMBIGUOUS
    if isinstance(exc, SlurmAuthError | TokenError):
        return Failure.SEND_REFUSED_CREDENTIALS
    return Failure.SEND_FAILED


def _started(status: SlurmJobStatus) -> bool:
    """Whether an attempt ever started: its dependencies were met then."""
    return any(a.started_at is not None for a in status.attempts)


def _held(job: SlurmJobView) -> bool:
    """Pending and held (Slurm's reason JobHeldUser or JobHeldAdmin)."""
    return job.base_state is BaseState.PENDING and (job.reason or "").startswith("JobHeld")


def _messages(exc: Exception) -> list[str]:
    return exc.messages if isinstance(exc, SpecError | LimitExceeded) else [str(exc)]


class Submission:
    def __init__(
        self,
        settings: Settings,
        site: Site,
        edge: ResourceEdge,
        metrics: Metrics,
        slurm: Callable[[], Awaitable[SlurmClient]],
        following: Following,
        backoff: float,
        *,
        slurm_as: Callable[[str | None], Awaitable[SlurmClient]] | None = None,
        limiter: FairLimiter[str] | None = None,
        clusters: Clusters | None = None,
        limits: LimitsCache | None = None,
        dependencies: Dependencies | None = None,
        queues: Queues | None = None,
        identity: JobIdentity | None = None,
    ) -> None:
        """`slurm_as(user)`: the client acting as a tenant's Slurm user (None: `slurm`);
        `identity`: what makes a job's handle before it is changed (None: one of its own);
        `limiter`: the slots submits are made in, by namespace (None: its own); `clusters`:
        every cluster's name (this one is `settings.cluster_name`); `limits`: the cluster's
        limits a request is checked against (None: read through `slurm`, per poll interval)."""
        self.cluster = settings.cluster_name
        self.clusters = clusters or Clusters((self.cluster,))
        self.window = Window(
            settings.slurm_rest_timeout, settings.slurm_message_timeout, settings.absence_margin
        )
        # (uid, attempt) -> monotonic time this process first found the unconfirmed attempt
        # nowhere: any request for it was sent before (by this process, or by one that died
        # or stopped leading before this one took over).
        self._unfound_since: dict[tuple[str, int], float] = {}
        self.settings = settings
        self.site = site
        self.edge = edge
        self.metrics = metrics
        self.slurm = slurm
        self._slurm_as = slurm_as
        self.following = following
        self._backoff = backoff
        self._limiter = limiter or FairLimiter[str](settings.submit_concurrency)
        self.limits = limits or LimitsCache(self.cluster, slurm, settings.poll_interval)
        self.dependencies = dependencies
        self.queues = queues
        self.identity = identity or JobIdentity(self.cluster, site, edge, metrics, slurm, slurm_as)
        # How soon a dependent that waits looks again, besides being woken by a change.
        self._dependency_wait = waiting_interval(settings.poll_interval)
        # Kueue's admission is looked for this often while it waits, besides the Workload
        # watch (SLURMJOB_KUEUE) waking it on every change.
        self._admission_wait = max(1.0, min(10.0, settings.poll_interval))
        self._again_pending: set[str] = set()

    async def reconcile(self, ref: ObjectRef, seen: ResourceView | None = None) -> None:
        """Drive a resource's submission side one step (create, resume and spec updates).

        Only a submit (render, record, stage, POST, confirmation) holds a slot. The slot is
        taken first, then the lock: the first step only finds a submit due, and the lock is
        let go while the slot is awaited (a waiter blocks no finalizer or poller, and no slot
        is awaited under a lock: `controller.fairness`); the second step reads the resource
        again, suspended, deleted or submitted by a concurrent retry meanwhile.

        `seen`: the resource as the watch delivered it (the handler's body). Where it shows
        nothing to do but follow the job, or a submit that is due, no read is made for the
        first step; anything else (a write to make) is decided on a fresh read, since a patch
        computed from a stale status could undo a newer one. A restart's resume of 10,000
        followed SlurmJobs costs no GET, a create one GET instead of two."""
        if seen is not None and seen.ref.uid == ref.uid and not seen.deleting:
            settled = self._settled(seen)
            if settled is not None:
                if not settled:
                    return
                async with self._limiter.slot(ref.namespace):
                    await self._step(ref, slot=True)
                return
        if not await self._step(ref, slot=False):
            return
        async with self._limiter.slot(ref.namespace):
            await self._step(ref, slot=True)

    def _settled(self, seen: ResourceView) -> bool | None:
        """From the watch's copy alone: True when a submit is due now (not suspended, no
        retry in the future), False when the job only needs following, None when a fresh read
        must decide."""
        step = next_step(seen.status)
        if awaits_upstream(seen.status) or (seen.depends_on and not _started(seen.status)):
            return None  # the upstreams are read first (a fresh read, before any slot)
        if queue_of(seen.labels):
            return None  # Kueue is asked first, and an eviction looked for (a fresh read)
        if step is Step.TRACK and hold_action(seen.status, seen.suspend) is Hold.NOTHING:
            self.edge.observe(seen.ref, seen.status)
            return False
        if step is Step.SUBMIT and not seen.suspend:
            blocked, transition = gate(seen.status, False, seen.generation, utc_now())
            if not blocked and transition is None:
                return True
        return None

    async def _step(self, ref: ObjectRef, *, slot: bool) -> bool:
        """One step under the resource's lock. True: a submit is due and `slot` (one is held)
        is False; nothing was sent."""
        async with self.edge.step(ref.uid):
            view = await self.edge.fresh(ref)
            if view is None or view.deleting:
                return False
            step = next_step(view.status)
            if step is Step.ADOPT:
                gave_way = await self._adopt(view)
                if gave_way is None:
                    return False
                # The attempt gave way to a new one: SUBMIT or RETRY now, behind the gate.
                view, step = gave_way, next_step(gave_way.status)
            if step is Step.CONFIRM:
                await self._confirm(view)
                return False
            if step not in (Step.SUBMIT, Step.RETRY):
                self.edge.observe(ref, view.status)
                if step is Step.TRACK:
                    try:
                        followed = await self._follow_admission(view)
                    except RetryLater as exc:
                        # A followed job has no handler retry pending (a Workload event's
                        # reconcile drops RetryLater): it is tried again from here.
                        self._again(ref, exc.delay)
                        raise
                    if followed is None:
                        return False
                    await self._sync_hold(followed)
                    await self._follow_dependencies(followed)
                return False
            blocked, transition = gate(view.status, view.suspend, view.generation, utc_now())
            if transition is not None:
                view = await self.edge.apply(view, transition)
            if blocked:
                await self._inactive(view)
                return False
            upstream: tuple[AttemptDependency, ...] = ()
            if settled_refusal(view.status, view.generation):
                return False  # final for this generation: only a spec change tries again
            if self._queue_required(view):
                text = (
                    f"metadata.labels: the tenant of namespace {view.ref.namespace} requires a "
                    f"Kueue LocalQueue (label {QUEUE_LABEL}); nothing was submitted"
                )
                await self.edge.apply(
                    view,
                    invalid_spec(
                        view.status, [text], view.generation, utc_now(), Reason.INVALID_SPEC
                    ),
                )
                return False
            view, admitted = await self._admitted(view)
            # Until an attempt has started, every new one (a first, a retry of one that never
            # ran, one after a lost submit) waits on its upstreams as the first did.
            if not _started(view.status):
                ready = await self._dependencies_ready(view)
                if ready is None:
                    return False
                upstream = ready
            if step is Step.RETRY:
                due = parse_rfc3339(view.status.next_attempt_at)
                wait = (due - utc_now()).total_seconds() if due else 0.0
                if wait > 0:
                    raise RetryLater(f"retry due at {view.status.next_attempt_at}", wait)
            if not slot:
                return True
            await self._submit(view, upstream, admitted)
            return False

    async def _as(self, user: str | None) -> SlurmClient:
        if self._slurm_as is None:
            return await self.slurm()
        return await self._slurm_as(user)

    # -- submit ---------------------------------------------------------------------------

    async def _failed(
        self, view: ResourceView, exc: Exception, *, recorded: bool, staging: Path | None = None
    ) -> None:
        """Carry out what the failure table says of a failed submit step."""
        transition, plan = failed_step(
            view.status,
            classify(exc, recorded=recorded),
            _messages(exc),
            view.generation,
            utc_now(),
        )
        if plan.metric is not None:
            self.metrics.count_submission(plan.metric)
        if plan.cancel_created and isinstance(exc, SlurmRejected) and exc.job_id is not None:
            # Slurm created a record despite refusing the job (200 + errors): end it, once a
            # read shows it is this attempt's (the id is only what the answer said).
            await self._cancel_refused(view, exc.job_id)
        if plan.discard_attempt and staging is not None:
            await asyncio.to_thread(remove_attempt, self.settings, staging)
        await self.edge.apply(view, transition)
        if plan.retry is Retry.BACKOFF:
            raise RetryLater(str(exc), self._backoff) from exc
        if plan.retry is Retry.POLL:
            raise RetryLater(str(exc), self.settings.poll_interval) from exc

    async def _cancel_refused(self, view: ResourceView, job_id: int) -> None:
        attempt = view.status.current_attempt
        if attempt is None:
            return
        try:
            job = await self.identity.read(view, attempt, "it is not cancelled", job_id)
        except SlurmError as exc:
            log.info("%s: refused record %s not cancelled: %s", view.ref.name, job_id, exc)
            return
        if job is not None:
            await self.identity.cancel_quietly(job)

    async def _prepare(
        self,
        view: ResourceView,
        number: int,
        indices: list[int] | None,
        admitted: Admitted | None = None,
    ) -> tuple[SlurmClient, PreparedAttempt]:
        """Everything before the attempt is recorded; raises one of PREPARE_ERRORS. The client
        is the one to submit with: as the Slurm user of the tenant the spec was resolved for."""
        if self.site.tenants is not None:
            # First: a namespace of no tenant gets nothing done for it, not even a Secret read.
            self.site.tenants.scope(view.ref.namespace)
        spec: SlurmJobSpec | None = view.spec
        if spec is None:
            assert view.spec_error is not None
            raise view.spec_error
        refused = self.clusters.refusal(spec.cluster, self.cluster)
        if refused is not None:
            raise SpecError([refused])
        if admitted is not None:
            # Where Kueue counted the quota is where the job runs (`core.kueue.placement`);
            # the tenant's partitions and the cluster's limits are checked on it below.
            if admitted.refusal is not None:
                raise SpecError([admitted.refusal])
            if admitted.partition is not None:
                spec = spec.model_copy(update={"partition": admitted.partition})
        secrets = await self.edge.secret_values(view)
        client = await self.slurm()
        prepared = await asyncio.to_thread(
            prepare_attempt,
            spec,
            self.site,
            namespace=view.ref.namespace,
            name=view.ref.name,
            uid=view.ref.uid,
            attempt=number,
            api_version=client.version,
            secret_values=secrets,
            array_indices=indices,
        )
        # Before the attempt is recorded: a request that cannot fit the cluster, or a wrong
        # artifact, is refused with nothing staged and nothing to adopt.
        snapshot = await self.limits.snapshot()
        if snapshot is not None:
            names = [pool.name for pool in spec.pools]
            verdict = check(prepared.rendered.launch, snapshot, names)
            if not verdict.ok:
                # Judged again on what the cluster says now, before anything is refused.
                snapshot = await self.limits.snapshot(fresh=True)
                if snapshot is not None:
                    enforce(check(prepared.rendered.launch, snapshot, names))
        await asyncio.to_thread(verify_runtime, prepared, self.settings)
        tenant = prepared.resolution.tenant
        return await self._as(tenant.slurm_user if tenant is not None else None), prepared

    async def _submit(
        self,
        view: ResourceView,
        upstream: tuple[AttemptDependency, ...] = (),
        admitted: Admitted | None = None,
    ) -> None:
        number = len(view.status.attempts) + 1
        spec = view.spec
        # A job array's retry submits only the tasks that did not succeed (`core.arrays`).
        indices = (
            next_indices(view.status.attempts, spec.array.count)
            if spec is not None and spec.array is not None
            else None
        )
        if indices == []:
            refused = SpecError(
                [
                    "spec.array.count: lowered below every task the retry would run; a retry "
                    "runs only the tasks that did not succeed, so the count cannot shrink "
                    "under them"
                ]
            )
            await self._failed(view, refused, recorded=False)
            return
        try:
            client, prepared = await self._prepare(view, number, indices, admitted)
        except PREPARE_ERRORS as exc:
            await self._failed(view, exc, recorded=False)
            return
        launch = prepared.rendered.launch
        if upstream:
            launch = launch.model_copy(update={"dependency": slurm_dependency(upstream)})
        staging = prepared.rendered.staging_dir
        view = await self.edge.apply(
            view,
            record_attempt(
                view.status,
                number=number,
                job_name=launch.job_name,
                staging_dir=str(staging),
                generation=view.generation,
                now=utc_now(),
                # Named only with several clusters: a status the previous release (one
                # cluster) cannot read would stop it following its jobs after a rollback.
                cluster=self.cluster if len(self.clusters.names) > 1 else None,
                array_indices=indices,
                dependencies=upstream,
            ),
        )
        current = view.status.current_attempt
        if len(self.clusters.names) > 1 and (current is None or current.cluster != self.cluster):
            # The apiserver pruned the field (a CRD older than this release): the attempt
            # would be followed on whichever cluster an unnamed attempt belongs to.
            text = (
                "the installed SlurmJob CRD drops status.attempts[].cluster, which several "
                "clusters need: apply the CRD of this release (kubectl apply --server-side -f "
                "charts/slurmjob-operator/crds/); nothing was sent"
            )
            log.error("%s/%s: %s", view.ref.namespace, view.ref.name, text)
            # Before anything is staged or sent: the attempt is forgotten, as if never made.
            await self.edge.apply(
                view,
                not_submitted(view.status, Reason.SUBMIT_FAILED, text, view.generation, utc_now()),
            )
            raise RetryLater(text, self._backoff)
        try:
            await asyncio.to_thread(stage, prepared, self.settings)
            # As the tenant's Slurm user: the job is its, and runs as its uid.
            receipt = await client.submit(launch)
        except SEND_ERRORS as exc:
            await self._failed(view, exc, recorded=True, staging=staging)
            return
        self.metrics.count_submission("accepted")
        view = await self.edge.apply(
            view, submitted(view.status, receipt.job_id, view.generation, utc_now())
        )
        await self._confirm(view)

    # -- confirm and adopt ----------------------------------------------------------------

    async def _confirm(self, view: ResourceView) -> None:
        """Fetch the job once by its numeric id: record the SLUID, take its state."""
        attempt = view.status.current_attempt
        assert attempt is not None
        assert attempt.job_id is not None
        client = await self.slurm()
        try:
            views: list[SlurmJobView] | None = await client.get_job(attempt.job_id)
        except SlurmNotFound:
            views = None  # purged already (a long outage): accounting, else Unknown
        except SlurmError as exc:
            raise RetryLater(str(exc), self._backoff) from exc
        sluid = leader(views).sluid if views else None
        # A quick job may already have ended: the same fold as the poller's (log tails, retry).
        # It refuses a job that is not this attempt's (the receipt's id, or the adopted one's,
        # is only a claim until the job's name and comment say so): nothing is confirmed.
        if not await self.following.fold(view, confirmed(view.status, sluid), views):
            raise RetryLater(
                f"Slurm job {attempt.job_id} is not attempt {attempt.number}'s job", self._backoff
            )

    async def _adopt(self, view: ResourceView) -> ResourceView | None:
        """The last POST's answer was lost: look for the job by its unique name and adopt it.
        The view when the attempt gave way to a new one instead (declared lost, or never
        sent): the caller submits that, through the gate and holding a slot."""
        status = view.status
        attempt = status.current_attempt
        assert attempt is not None
        if declared_lost_now(attempt, view.annotations):
            return await self.edge.apply(view, declared_lost(status, view.generation, utc_now()))
        try:
            client = await self.slurm()
            found = await client.find_by_name(attempt.job_name)
        except SlurmError as exc:
            raise RetryLater(str(exc), self.settings.poll_interval) from exc
        # Derived from the resource: a status can be written by others (storage.locate).
        staging = attempt_dir(
            self.settings.storage_root, view.ref, attempt.number, attempt.staging_dir
        )
        staged = not attempt.staging_dir or await asyncio.to_thread(
            is_staged, self.settings, staging
        )
        owners = await self.identity.owners(view)
        if owners is None:
            raise RetryLater("not this cluster's to adopt", self.settings.poll_interval)
        decision = adoption(found, view.ref.uid, attempt, staged=staged, owners=owners)
        for impostor in decision.impostors:
            await self.identity.refused_owner(view.ref, attempt, impostor, "it is not adopted")
        if decision.action is AdoptAction.RESTART:
            # The operator stopped before the attempt's files were complete, and they are
            # always complete before the POST: this attempt was never sent. Start it over.
            assert attempt.staging_dir is not None
            await asyncio.to_thread(remove_attempt, self.settings, staging)
            text = (
                f"attempt {attempt.number} was interrupted before it was sent; submitting it again"
            )
            return await self.edge.apply(
                view,
                not_submitted(status, Reason.SUBMIT_INTERRUPTED, text, view.generation, utc_now()),
            )
        key = (view.ref.uid, attempt.number)
        if decision.action is AdoptAction.WAIT:
            gave_way = await self._prove_absent(view, client, attempt, key)
            if gave_way is not None:
                return gave_way
            text = f"the job is not visible in Slurm yet; {self._way_out(client, attempt)}"
            await self.edge.apply(view, unconfirmed(status, text, view.generation, utc_now()))
            raise RetryLater(f"job {attempt.job_name} not found yet", self.settings.poll_interval)
        self._unfound_since.pop(key, None)
        keep = decision.keep
        assert keep is not None
        # The job's own id: an array's, not one of its tasks' (whose record may be all that
        # is left of it), which names every task for a cancel, a hold or a look-up.
        kept = job_of(keep)
        groups = by_leader(found)
        for duplicate in decision.duplicates:
            other = job_of(duplicate)
            job = await self.identity.check(
                view, attempt, groups[other], "the duplicate is not cancelled"
            )
            if job is None:
                continue
            await self.identity.cancel_quietly(job)
            self.metrics.duplicates_total.inc()
            await self.edge.event(
                view.ref,
                "Warning",
                "DuplicateCancelled",
                f"Slurm job {other} duplicated attempt {attempt.number} (kept {kept}); cancelled",
            )
        self.metrics.count_adoption("name")
        # An array has no SLUID of its own: each one names a single task's record.
        sluid = keep.sluid if keep.array_job_id is None else None
        view = await self.edge.apply(
            view,
            submitted(status, kept, view.generation, utc_now(), sluid=sluid, adopted=True),
        )
        await self._confirm(view)
        return None

    def _way_out(self, client: SlurmClient, attempt: Attempt) -> str:
        if mode(client.accounting) is Mode.PROOF:
            return (
                "with accounting answering it is proven absent, and the next attempt submitted, "
                f"once not found {self.window.seconds:.0f} s after it could last have been sent"
            )
        return (
            "without accounting only a person can declare it lost, after checking Slurm: "
            f"annotate {DECLARE_LOST_ANNOTATION}={attempt.number}"
        )

    async def _prove_absent(
        self, view: ResourceView, client: SlurmClient, attempt: Attempt, key: tuple[str, int]
    ) -> ResourceView | None:
        """The view with the attempt proven absent (`core.absence`), or None: not yet, not
        provable here, or found after all (the next search adopts it)."""
        now = time.monotonic()
        waited = now - self._unfound_since.setdefault(key, now)
        step = next_check(waited, self.window, await client.has_accounting())
        if step is not Next.PROVE:
            return None
        try:
            before = await client.dbd_queue()
            found = await client.find_by_name(attempt.job_name)
            after = await client.dbd_queue()
        except SlurmError as exc:
            log.info("proving %s absent: %s", attempt.job_name, exc)
            return None
        mine = any(belongs(job, view.ref.uid, attempt) for job in found)
        outcome = verdict(before, mine, after)
        if outcome is not Verdict.PROVEN:
            if outcome is Verdict.LAGGING:
                log.info(
                    "%s not proven absent: slurmctld has job records queued for slurmdbd "
                    "(%s before the lookup, %s after)",
                    attempt.job_name,
                    before,
                    after,
                )
            return None
        self._unfound_since.pop(key, None)
        self.metrics.proven_absent_total.inc()
        return await self.edge.apply(
            view, proven_absent(view.status, waited, view.generation, utc_now())
        )

    # -- Kueue ----------------------------------------------------------------------------

    def _queue_required(self, view: ResourceView) -> bool:
        """The tenant requires a queue (`requireQueue`) and the SlurmJob names none."""
        tenant = self.site.tenant_of(view.ref.namespace)
        return tenant is not None and tenant.require_queue and queue_of(view.labels) is None

    async def _admitted(self, view: ResourceView) -> tuple[ResourceView, Admitted | None]:
        """Kueue's admission of the SlurmJob's Workload (None: no queue label, nothing to
        wait for), its conditions written on the SlurmJob. Not admitted yet: written as
        WaitingForAdmission, and RetryLater raised."""
        spec = view.spec
        if self.queues is None or spec is None or queue_of(view.labels) is None:
            return view, None
        found = await self.queues.admission(view, spec)
        now = utc_now()
        told = admission_conditions(view.status, found, view.generation, now)
        if found.admission is Admission.ADMITTED:
            return await self.edge.apply(view, told), found
        if found.admission is Admission.EVICTED:
            # Its job has ended (no new attempt is made while one runs): give the quota back
            # if that was not done yet (a crash between the two writes).
            try:
                await self.queues.give_back(view, found)
            except WorkloadError as exc:
                self._again(view.ref, self._admission_wait)  # a Workload event's drops it
                raise RetryLater(str(exc), self._admission_wait) from exc
        text = f"Kueue: {found.message or found.reason or found.admission.value}"
        wait = waiting(told.status, Reason.WAITING_FOR_ADMISSION, text, view.generation, now)
        await self.edge.apply(view, Transition(wait.status, told.events + wait.events))
        raise RetryLater(text, self._admission_wait)

    async def _inactive(self, view: ResourceView) -> None:
        """spec.suspend before anything ran: the Workload is made (or kept) inactive, so it
        holds no quota; a reservation it had is given back once Kueue evicts it."""
        spec = view.spec
        if self.queues is None or spec is None or queue_of(view.labels) is None:
            return
        found = await self.queues.admission(view, spec, suspended=True, place=False)
        now = utc_now()
        view = await self.edge.apply(
            view, admission_conditions(view.status, found, view.generation, now)
        )
        if found.admission is Admission.EVICTED:
            try:
                await self._give_back(view, found, now)
            except RetryLater as exc:
                self._again(view.ref, exc.delay)  # a Workload event's reconcile drops it
                raise

    def _again(self, ref: ObjectRef, delay: float) -> None:
        """Reconcile `ref` again after `delay` (one pending per resource)."""
        if ref.uid in self._again_pending:
            return
        self._again_pending.add(ref.uid)
        due = rfc3339(utc_now() + timedelta(seconds=max(delay, 1.0)))

        def done() -> None:
            self._again_pending.discard(ref.uid)

        self.following.reconcile_at(ref, due, done)

    async def _follow_admission(self, view: ResourceView) -> ResourceView | None:
        """Kueue's verdict on a job in Slurm. Evicted while still pending: held in Slurm and
        the quota given back, then released once Kueue admits it again (the same job: never
        two for one admission). Evicted while running (or when the hold did not take, or the
        new admission places it elsewhere): cancelled, its end waited for, the attempt
        recorded as evicted (no retry spent) and the quota given back. The view to follow the
        job on with (its hold, its dependencies), or None when Kueue holds it or it was just
        ended. Raises RetryLater while the job is still ending."""
        attempt = view.status.current_attempt
        spec = view.spec
        if (
            self.queues is None
            or spec is None
            or attempt is None
            or attempt.job_id is None
            or attempt.retry_action is not None
            # Cancelled: the fold of the job this eviction cancelled may have come first.
            or view.status.phase not in (Phase.QUEUED, Phase.RUNNING, Phase.CANCELLED)
        ):
            return view
        kept = kueue_held(view.status)
        if queue_of(view.labels) is None:
            if not kept:
                return view
            # Held for Kueue, then the label went: held on (nothing releases it without an
            # admission: a label removed is no way around a queue).
            text = (
                f"Slurm job {attempt.job_id} stays held: Kueue evicted it and the label "
                f"{QUEUE_LABEL} was removed since; put it back, or delete the SlurmJob"
            )
            if view.status.message != text:
                await self.edge.apply(
                    view, Transition(view.status.model_copy(update={"message": text}))
                )
            return None
        # Where the admission places the job matters only to a held job about to be released.
        place = kept and view.status.phase is Phase.QUEUED
        found = await self.queues.admission(view, spec, suspended=view.suspend, place=place)
        if kept:
            if view.status.phase is Phase.QUEUED:
                return await self._held_for_kueue(view, attempt, found)
            if found.admission is Admission.ADMITTED:
                told = admission_conditions(view.status, found, view.generation, utc_now())
                return await self.edge.apply(view, told)
            if found.admission is Admission.EVICTED or kueue_says(found):
                # Released by someone else and started without an admission: ended.
                await self._end_evicted(
                    view, attempt, found, "NotAdmitted", "started while held for Kueue"
                )
                return None
            # Kueue could not be asked, or its answer cannot be trusted: asked again.
            raise RetryLater(f"Kueue: {found.message or found.reason}", self._admission_wait)
        if found.admission is not Admission.EVICTED:
            return view
        pending = view.status.phase is Phase.QUEUED and attempt.started_at is None
        if pending and await self._hold_evicted(view, attempt, found):
            return None
        await self._end_evicted(view, attempt, found, found.reason, found.message)
        return None

    async def _components(
        self, view: ResourceView, attempt: Attempt, refused: str
    ) -> tuple[list[SlurmJobView], VerifiedJob | None] | None:
        """The attempt's job as Slurm shows it now, with its handle (([], None) when gone);
        None when the id is not the attempt's job or not the resource's to change (said, and
        nothing done to it)."""
        assert attempt.job_id is not None
        owners = await self.identity.owners(view)
        if owners is None:
            return None
        try:
            views = await (await self.slurm()).get_job(attempt.job_id)
        except SlurmNotFound:
            return [], None
        except SlurmError as exc:
            raise RetryLater(f"job {attempt.job_id}: {exc}", self._backoff) from exc
        job = await self.identity.check(view, attempt, views, refused, owners=owners)
        return None if job is None else (views, job)

    async def _hold_evicted(self, view: ResourceView, attempt: Attempt, found: Admitted) -> bool:
        """Hold the evicted job while it is still pending: True when it is held (or is not
        the attempt's job, and is left alone); False when it has started, is gone, or the
        hold did not take, and it must be ended instead."""
        assert self.queues is not None
        assert attempt.job_id is not None
        job_id = attempt.job_id
        read = await self._components(view, attempt, "not held")
        if read is not None and read[1] is not None:
            try:
                await self._hold(read[1], True)
            except SlurmError as exc:  # Slurm refuses to hold a job that has started
                log.info("%s: evicted job %s not held: %s", view.ref.name, job_id, exc)
            # Held only if every component is pending and held now: read it again.
            read = await self._components(view, attempt, "not held")
        if read is not None and (not read[0] or not all(_held(v) for v in read[0])):
            return False
        # Held; or the id is not the attempt's job, which is left alone: either way the
        # quota goes back, so that what preempted it is admitted.
        now = utc_now()
        told = admission_conditions(view.status, found, view.generation, now)
        held = kueue_hold(told.status, found.reason, found.message)
        view = await self.edge.apply(view, Transition(held.status, told.events + held.events))
        await self._give_back(view, found, now)
        return True

    async def _give_back(self, view: ResourceView, found: Admitted, now: datetime) -> None:
        """Clear the evicted Workload's quota reservation; QuotaReserved=False on the
        SlurmJob too."""
        assert self.queues is not None
        try:
            await self.queues.give_back(view, found)
        except WorkloadError as exc:
            raise RetryLater(str(exc), self._admission_wait) from exc
        back = Admitted(Admission.WAITING, "Pending", "quota given back after the eviction")
        await self.edge.apply(view, admission_conditions(view.status, back, view.generation, now))

    async def _held_for_kueue(
        self, view: ResourceView, attempt: Attempt, found: Admitted
    ) -> ResourceView | None:
        """A job held in Slurm since its eviction: released once Kueue admits it again where
        it was submitted (cancelled, and submitted anew, when the admission places it
        elsewhere or is refused); held on, its quota given back, until then."""
        assert self.queues is not None
        assert attempt.job_id is not None
        now = utc_now()
        if found.admission is Admission.EVICTED:
            await self._give_back(view, found, now)
            return None
        if found.admission is not Admission.ADMITTED:
            await self.edge.apply(
                view, admission_conditions(view.status, found, view.generation, now)
            )
            return None
        read = await self._components(view, attempt, "not released")
        if read is None:
            return None
        views, job = read
        moved = found.partition is not None and any(v.partition != found.partition for v in views)
        if found.refusal is not None or moved or job is None:
            why = found.refusal or "admitted again elsewhere than where its job was held"
            await self._end_evicted(view, attempt, found, "Readmitted", why)
            # The new attempt is due now and no Workload event will come: tried again at once
            # by whoever called (a handler retry, or the wake of `_again`).
            raise RetryLater("evicted attempt ended: the next one is due", 0.0)
        if not view.suspend:
            try:
                await self._hold(job, False)
            except SlurmError as exc:
                raise RetryLater(
                    f"cannot release job {attempt.job_id}: {exc}", self._backoff
                ) from exc
        told = admission_conditions(view.status, found, view.generation, now)
        released = kueue_release(told.status, view.suspend, view.generation, now)
        return await self.edge.apply(
            view, Transition(released.status, told.events + released.events)
        )

    async def _end_evicted(
        self, view: ResourceView, attempt: Attempt, found: Admitted, reason: str, message: str
    ) -> None:
        """Cancel the evicted job, wait for its end, record the attempt evicted and give the
        quota back (if Kueue still counts it)."""
        assert self.queues is not None
        assert attempt.job_id is not None
        job_id = attempt.job_id
        try:
            try:
                job = await self.identity.read(view, attempt, "it is not cancelled")
            except SlurmNotFound:
                job = None
            if job is not None:
                await self._end_now(job)
        except SlurmError as exc:
            raise RetryLater(f"evicted job {job_id}: {exc}", self._backoff) from exc
        # Ended, gone, or not the attempt's job (left alone): the attempt is over for Kueue
        # either way, and the quota goes back.
        now = utc_now()
        ended = evicted(view.status, reason, message, view.generation, now)
        told = admission_conditions(ended.status, found, view.generation, now)
        view = await self.edge.apply(view, Transition(told.status, ended.events + told.events))
        if found.admission is Admission.EVICTED:
            await self._give_back(view, found, now)

    async def _end_now(self, job: VerifiedJob) -> None:
        """Cancel an evicted job and wait for its end, under the resource's lock: the
        poller's fold of the cancelled job must find the attempt evicted, not end the
        SlurmJob Cancelled."""
        with contextlib.suppress(SlurmNotFound):
            await (await self.identity.acting(job)).cancel(job)
        client = await self.slurm()
        ref = client.lifecycle_ref(job.job_id, job.sluid)
        for _ in range(EVICTION_WAIT_ROUNDS):
            try:
                views = await client.get_job(ref)
            except SlurmNotFound:
                return
            if all(v.is_final for v in views):
                return
            await asyncio.sleep(0.5)
        raise RetryLater(f"evicted job {job.job_id} is still ending", 1.0)

    # -- dependencies ---------------------------------------------------------------------

    async def _dependencies_ready(self, view: ResourceView) -> tuple[AttemptDependency, ...] | None:
        """Before the first attempt: the Slurm dependencies to submit with (none when every
        upstream is settled already), or None when it must not be submitted now (waiting,
        written; or failed for good, written). Raises RetryLater while it waits."""
        spec = view.spec
        if spec is None or not spec.depends_on or self.dependencies is None:
            return ()
        limits = await self.limits.snapshot()
        allowed = limits is None or not limits.kills_invalid_dependencies
        resolution, spec_wrong = await self.dependencies.resolve(view, spec, slurm_allowed=allowed)
        now = utc_now()
        if resolution.kind is Kind.READY:
            return resolution.slurm
        if resolution.kind is Kind.FAIL:
            reason = Reason.INVALID_SPEC if spec_wrong else Reason.DEPENDENCY_FAILED
            await self.edge.apply(
                view,
                invalid_spec(view.status, [resolution.message], view.generation, now, reason),
            )
            return None
        await self.edge.apply(
            view,
            waiting(
                view.status,
                Reason.WAITING_FOR_DEPENDENCY,
                resolution.message,
                view.generation,
                now,
            ),
        )
        raise RetryLater(resolution.message, self._dependency_wait)

    async def _follow_dependencies(self, view: ResourceView) -> None:
        """A job waiting in Slurm on its upstreams' jobs: repoint it when one was retried,
        cancel it when one ended failed for good (`core.dependencies.repoint`)."""
        attempt = view.status.current_attempt
        if self.dependencies is None or attempt is None or attempt.job_id is None:
            return
        if not awaits_upstream(view.status) or not attempt.dependencies:
            return
        names = tuple(d.name for d in attempt.dependencies)
        upstreams = await self.dependencies.current(view, names)
        plan = repoint(attempt.dependencies, upstreams)
        if plan.action is Action.NOTHING:
            return
        update = plan.action is Action.UPDATE
        try:
            try:
                job = await self.identity.read(
                    view, attempt, "its dependency is not changed" if update else "not cancelled"
                )
            except SlurmNotFound:
                if update:
                    return  # gone: nothing queued to repoint (the fold says how it ended)
            else:
                if job is None:
                    return  # not the attempt's job: left alone, and nothing written
                acting = await self.identity.acting(job)
                if update:
                    dependency = slurm_dependency(plan.records) or ""
                    for warning in await acting.set_dependency(job, dependency):
                        log.warning("repointing Slurm job %s: %s", job.job_id, warning)
                else:
                    # Written Failed only once Slurm no longer has it queued: a cancel that
                    # did not go through is tried again, never left behind a final status.
                    with contextlib.suppress(SlurmNotFound):
                        await acting.cancel(job)
        except SlurmError as exc:
            raise RetryLater(f"dependencies of job {attempt.job_id}: {exc}", self._backoff) from exc
        now = utc_now()
        if plan.action is Action.UPDATE:
            await self.edge.apply(
                view, dependency_repointed(view.status, plan.records, plan.message)
            )
        else:
            await self.edge.apply(
                view, dependency_failed(view.status, plan.message, view.generation, now)
            )

    # -- hold and release -----------------------------------------------------------------

    async def _hold(self, job: VerifiedJob, held: bool) -> None:
        """Hold (or release) the job as its owner: every heterogeneous component (the
        client's `hold`), so none keeps nodes reserved in the backfill plan, blocking the jobs
        Kueue admitted in the held one's place."""
        await (await self.identity.acting(job)).hold(job, held)

    async def _sync_hold(self, view: ResourceView) -> None:
        """Hold a queued job while spec.suspend is true; release it when it is false again."""
        action = hold_action(view.status, view.suspend)
        if action is Hold.NOTHING:
            return
        attempt = view.status.current_attempt
        assert attempt is not None
        assert attempt.job_id is not None
        if action is not Hold.CANNOT_HOLD:
            try:
                # The status's job id is only a claim: hold or release only the attempt's job.
                job = await self.identity.read(view, attempt, "not held")
                if job is None:
                    return
                await self._hold(job, action is Hold.HOLD)
            except SlurmError as exc:
                verb = "hold" if action is Hold.HOLD else "release"
                raise RetryLater(f"cannot {verb}: {exc}", 10) from exc
        await self.edge.apply(
            view, hold_transition(view.status, action, view.generation, utc_now())
        )
