"""The submit, once every gate said go and the submit slot is held: in this order, tenancy
(a namespace of no tenant gets nothing done for it, not even a Secret read), the spec, the
cluster's refusal, Kueue's placement, the Secret read, render and the script checks, the
cluster's limits, the runtime, then the attempt recorded, the pruned-CRD check, staged and
POSTed as the tenant's Slurm user, and the receipt confirmed. An array whose count fell below
the tasks a retry would run is refused before all that.

What each failure becomes is `core.decisions.FAILURES`; here an exception is only classified
(`classify`) and the returned plan carried out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.probestatus import AttemptProbe
from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import AttemptDependency
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.adopter import Adopter
from slurmjob_operator.controller.checks import Checks, Preparing
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.limits import LimitsCache
from slurmjob_operator.controller.pipeline import (
    PreparedAttempt,
    Site,
    stage,
)
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core.arrays import next_indices
from slurmjob_operator.core.claims import (
    BudgetSpent,
    ChainSpent,
    attempt_cap,
    claimed_cluster,
    next_attempt,
    over_cap,
)
from slurmjob_operator.core.decisions import Failure, Retry, failed_step, growing_delay
from slurmjob_operator.core.dependencies import slurm_dependency
from slurmjob_operator.core.kueue import Verdict as Admitted
from slurmjob_operator.core.limits import LimitExceeded, PartitionUnavailable, ProbeExhausted
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.reconcile import not_submitted, record_attempt
from slurmjob_operator.imagecache.gate import ImageNotReady, ImagePullFailed
from slurmjob_operator.imagecache.verifygate import ArtifactNotVerified, ArtifactVerifyFailed
from slurmjob_operator.kube import SecretError
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.artifacts import ArtifactError, CachedImage, VerifiedArtifact
from slurmjob_operator.site.preflight import PreflightError
from slurmjob_operator.site.render import RenderError
from slurmjob_operator.site.tenants import TenantUnknown
from slurmjob_operator.slurm.auth import TokenError
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmAmbiguous, SlurmAuthError, SlurmError, SlurmRejected
from slurmjob_operator.storage.executors import Pool, run_in
from slurmjob_operator.storage.ledger import attempts_made
from slurmjob_operator.storage.nofollow import UnsafePath
from slurmjob_operator.storage.staging import remove_attempt
from slurmjob_operator.storage.stagingtree import StagingError, StagingNotWritable
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)

#: What may stop a submit before the attempt is recorded (nothing sent) and after it.
PREPARE_ERRORS = (
    BudgetSpent,
    SpecError,
    RenderError,
    PreflightError,
    ArtifactError,
    SecretError,
    SlurmError,
    TokenError,
    LimitExceeded,
    PartitionUnavailable,
    StagingNotWritable,
    ImageNotReady,
    ImagePullFailed,
    ArtifactNotVerified,
    ArtifactVerifyFailed,
)
SEND_ERRORS = (SlurmError, TokenError, StagingError, OSError)
#: SlurmJobs whose run of site failures is remembered (each entry is a few dozen bytes).
MAX_TRACKED_SITE_FAILURES = 10_000


def classify(exc: Exception, *, recorded: bool) -> Failure:
    """The failure class of an exception from a submit step (see `core.decisions`)."""
    if not recorded:
        if isinstance(exc, ChainSpent):  # a BudgetSpent: first
            return Failure.CHAIN_SPENT
        if isinstance(exc, BudgetSpent):
            return Failure.ATTEMPTS_SPENT
        if isinstance(exc, TenantUnknown):  # a SpecError, but not the spec's fault
            return Failure.TENANT_UNKNOWN
        if isinstance(exc, SpecError | RenderError | PreflightError):
            return Failure.SPEC_INVALID
        if isinstance(exc, ArtifactError):
            return Failure.RUNTIME_INVALID
        if isinstance(exc, SecretError):
            return Failure.SECRET_MISSING
        if isinstance(exc, ProbeExhausted):  # a LimitExceeded: first
            return Failure.PROBE_EXHAUSTED
        if isinstance(exc, LimitExceeded):
            return Failure.LIMIT_EXCEEDED
        if isinstance(exc, PartitionUnavailable):
            return Failure.PARTITION_UNAVAILABLE
        if isinstance(exc, ImageNotReady):
            return Failure.IMAGE_PULLING
        if isinstance(exc, ImagePullFailed):
            return Failure.IMAGE_PULL_FAILED
        if isinstance(exc, ArtifactNotVerified):
            return Failure.ARTIFACT_VERIFYING
        if isinstance(exc, ArtifactVerifyFailed):
            return Failure.ARTIFACT_VERIFY_FAILED
        if isinstance(exc, StagingNotWritable):
            return Failure.STAGING_NOT_WRITABLE
        if isinstance(exc, SlurmAuthError):
            return Failure.SLURM_REFUSED_CREDENTIALS
        return Failure.SLURM_UNREACHABLE
    if isinstance(exc, SlurmRejected):
        return Failure.REJECTED
    if isinstance(exc, SlurmAmbiguous):
        return Failure.AMBIGUOUS
    if isinstance(exc, SlurmAuthError | TokenError):
        return Failure.SEND_REFUSED_CREDENTIALS
    if isinstance(exc, StagingNotWritable):
        return Failure.SEND_STAGING_NOT_WRITABLE
    return Failure.SEND_FAILED


def _image_ready(artifact: object) -> tuple[str | None, Reason]:
    """What `ImageReady`=True says of what the attempt runs: an image-cache entry, or a
    registry artifact verified by a job of the cache user (nothing for one its node hashes)."""
    if isinstance(artifact, VerifiedArtifact):
        text = f"runtime {artifact.id}, sha256 {artifact.sha256} verified by {artifact.verified_by}"
        return text, Reason.ARTIFACT_VERIFIED
    return (artifact.id if isinstance(artifact, CachedImage) else None), Reason.IMAGE_CACHED


def _messages(exc: Exception) -> list[str]:
    return exc.messages if isinstance(exc, SpecError | LimitExceeded) else [str(exc)]


class Sender:
    """Prepares, records, stages and sends one attempt; carries out a failure's plan."""

    def __init__(
        self,
        settings: Settings,
        site: Site,
        edge: ResourceEdge,
        metrics: Metrics,
        slurm: Callable[[], Awaitable[SlurmClient]],
        slurm_as: Callable[[str | None], Awaitable[SlurmClient]] | None,
        clusters: Clusters,
        limits: LimitsCache,
        identity: JobIdentity,
        adopter: Adopter,
        backoff: float,
    ) -> None:
        self.cluster = settings.cluster_name
        self.settings = settings
        self.edge = edge
        self.metrics = metrics
        self.slurm = slurm
        self._slurm_as = slurm_as
        self.clusters = clusters
        self.identity = identity
        self.adopter = adopter
        self._backoff = backoff
        # SlurmJob uid -> failures in a row that only the site can fix (Retry.GROWING); an
        # entry goes when its job gets past them, the oldest when there are too many.
        self._site_failures: dict[str, int] = {}
        self.checks = Checks(settings, site, edge, slurm, clusters, limits)

    @property
    def limits(self) -> LimitsCache:
        return self.checks.limits

    @limits.setter
    def limits(self, cache: LimitsCache) -> None:
        self.checks.limits = cache

    async def _as(self, user: str | None) -> SlurmClient:
        if self._slurm_as is None:
            return await self.slurm()
        return await self._slurm_as(user)

    async def failed(
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
            await run_in(Pool.REMOVALS, remove_attempt, self.settings, staging)
        await self.edge.apply(view, transition)
        if plan.retry is Retry.GROWING:
            earlier = self._site_failures.pop(view.ref.uid, 0)
            if len(self._site_failures) >= MAX_TRACKED_SITE_FAILURES:
                del self._site_failures[next(iter(self._site_failures))]
            self._site_failures[view.ref.uid] = earlier + 1
            raise RetryLater(str(exc), growing_delay(earlier, self._backoff)) from exc
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

    async def _next_number(self, view: ResourceView, queued: bool) -> int:
        """The next attempt's number, counted from the attempt directories the operator made
        as well as the status (`core.claims`); BudgetSpent past every attempt the spec's
        budgets allow together, StagingNotWritable when the directories cannot be counted."""
        ref = view.ref
        try:
            made = await asyncio.to_thread(
                attempts_made, self.settings, ref.namespace, ref.name, ref.uid
            )
        except UnsafePath:
            # A tree the walk refuses takes no attempt either: staging says why, in its words.
            made = 0
        except OSError as exc:
            raise StagingNotWritable(f"the attempts made cannot be counted: {exc}") from exc
        number = next_attempt(view.status, made)
        spec = view.spec
        if spec is not None:
            cap = attempt_cap(
                spec.retry.limit, self.settings.probe_attempts, spec.walltime, queued=queued
            )
            refusal = over_cap(number, cap)
            if refusal is not None:
                raise BudgetSpent(refusal)
        return number

    async def _prepare(
        self,
        view: ResourceView,
        number: int,
        indices: list[int] | None,
        admitted: Admitted | None = None,
    ) -> tuple[SlurmClient, PreparedAttempt]:
        """Every check before the attempt is recorded (`controller.checks`); raises one of
        PREPARE_ERRORS. The client is the one to submit with: as the Slurm user of the tenant
        the spec was resolved for."""
        prepared = await self.checks.run(Preparing(view, number, indices, admitted))
        tenant = prepared.resolution.tenant
        return await self._as(tenant.slurm_user if tenant is not None else None), prepared

    async def submit(
        self,
        view: ResourceView,
        upstream: tuple[AttemptDependency, ...] = (),
        admitted: Admitted | None = None,
        *,
        sent: Callable[[], None] = lambda: None,
    ) -> None:
        """Render, record, stage and POST the next attempt, then confirm its receipt;
        `sent()` is called once the POST is answered (or failed), before the confirmation."""
        spec = view.spec
        try:
            number = await self._next_number(view, queued=admitted is not None)
        except (BudgetSpent, StagingNotWritable) as exc:
            await self.failed(view, exc, recorded=False)
            return
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
            await self.failed(view, refused, recorded=False)
            return
        try:
            client, prepared = await self._prepare(view, number, indices, admitted)
        except PREPARE_ERRORS as exc:
            await self.failed(view, exc, recorded=False)
            return
        launch = prepared.rendered.launch
        plan, keys = prepared.probe_plan, prepared.probe_keys
        probe = None
        if plan is not None and keys is not None:
            probe = AttemptProbe(
                key=keys.cache,
                avoid=keys.avoid,
                ladder=keys.ladder,
                cached_rung=plan.cached_rung,
                excluded=list(plan.exclude),
            )
        if upstream:
            if not await self.identity.upstream_jobs(view, upstream):
                raise RetryLater("an upstream's Slurm job is not proven its own yet", self._backoff)
            launch = launch.model_copy(update={"dependency": slurm_dependency(upstream)})
        staging = prepared.rendered.staging_dir
        image, image_reason = _image_ready(prepared.artifact)
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
                probe=probe,
                segment=prepared.segment.record() if prepared.segment is not None else None,
                image=image,
                image_reason=image_reason,
            ),
        )
        current = view.status.current_attempt
        if len(self.clusters.names) > 1 and (
            current is None or claimed_cluster(current) != self.cluster
        ):
            # The apiserver pruned the field (a CRD older than this release): the attempt
            # would be followed on whichever cluster an unnamed attempt belongs to.
            text = (
                "the installed SlurmJob CRD drops status.attempts[].cluster, which several "
                "clusters need: apply the CRD of this release (kubectl apply --server-side -f "
                "crds/slurmjob.io_slurmjobs.yaml, or helm upgrade with crds.install); nothing "
                "was sent"
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
            sent()
            await self.failed(view, exc, recorded=True, staging=staging)
            return
        sent()
        self._site_failures.pop(view.ref.uid, None)
        self.metrics.count_submission("accepted")
        await self.adopter.confirm_receipt(view, receipt.job_id)
