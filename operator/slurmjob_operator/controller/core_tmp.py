"""Carries out what the decision core (`reconcile`) decides, against Kubernetes and Slurm.

One `Controller` per process, kept in kopf's memo. Every write to a resource happens under
that resource's lock and starts from the object as the API server has it now, so the
submission handler and the poller never overwrite each other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import (
    Attempt,
    Logs,
    Phase,
    SlurmJobStatus,
    get_condition,
    merge_patch,
)
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.pipeline import Site, prepare_attempt, stage, verify_runtime
from slurmjob_operator.core import naming
from slurmjob_operator.core.jobview import SlurmJobView, by_leader
from slurmjob_operator.core.reconcile import (
    DECLARE_LOST_ANNOTATION,
    SUSPENDED,
    Step,
    Transition,
    changed,
    confirmed,
    declared_lost,
    invalid_spec,
    is_lost,
    lost,
    next_step,
    not_retried,
    not_submitted,
    observed,
    reachability,
    record_attempt,
    rejected,
    retry_scheduled,
    submitted,
    suspension,
    unconfirmed,
    waiting,
    with_logs,
)
from slurmjob_operator.core.retries import decide
from slurmjob_operator.core.states import Observation, observe
from slurmjob_operator.kube import ObjectRef, ResourceStore, SecretError
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.artifacts import ArtifactError
from slurmjob_operator.site.preflight import PreflightError
from slurmjob_operator.site.render import RenderError
from slurmjob_operator.slurm.auth import TokenError, TokenProvider
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, make_token_provider
from slurmjob_operator.slurm.errors import (
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmError,
    SlurmNotFound,
    SlurmRejected,
    SlurmUnsupported,
)
from slurmjob_operator.slurm.http import HttpTransport
from slurmjob_operator.storage.logs import aread_logs
from slurmjob_operator.storage.staging import (
    SCRIPT_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    StagingError,
    aremove_attempt,
    aremove_resource_dir,
    aremove_secrets,
)

log = logging.getLogger(__name__)


class RetryLater(Exception):
    """Not done yet; the handler should run again after `delay` seconds."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


@dataclass(frozen=True)
class Tracked:
    """A submitted, not yet final job the poller follows."""

    ref: ObjectRef
    job_id: int
    sluid: str | None
    staging_dir: str | None


def _now() -> datetime:
    return datetime.now(tz=UTC)


def _generation(body: Mapping[str, Any]) -> int | None:
    value = (body.get("metadata") or {}).get("generation")
    return int(value) if value is not None else None


def lifecycle_ref(client: SlurmClient, job_id: int, sluid: str | None) -> int | str:
    """The SLUID where the version takes it in paths (v0.0.45), else the numeric job id."""
    return sluid if sluid and client.dialect.supports_sluid_paths else job_id


class Controller:
    def __init__(
        self,
        settings: Settings,
        kube: ResourceStore,
        transport: HttpTransport,
        metrics: Metrics,
        *,
        token: TokenProvider | None = None,
    ) -> None:
        self.settings = settings
        self.site = Site.load(settings)
        self.kube = kube
        self.transport = transport
        self.metrics = metrics
        self.token = token or make_token_provider(settings)
        self.tracked: dict[str, Tracked] = {}
        self.phases: dict[str, str] = {}
        self._client: SlurmClient | None = None
        self._connecting = asyncio.Lock()
        self._locks: dict[str, asyncio.Lock] = {}
        self._secrets: dict[str, dict[str, str]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._reachable: bool | None = None
        # How soon to try again when Slurm or a Secret is not there yet: a few poll intervals.
        self._backoff = max(1.0, min(30.0, settings.poll_interval * 5))

    # -- plumbing -------------------------------------------------------------------------

    async def slurm(self) -> SlurmClient:
        """The client, connected (and the version chosen) on first use."""
        if self._client is None:
            async with self._connecting:
                if self._client is None:
                    self._client = await connect(
                        self.settings,
                        self.transport,
                        token=self.token,
                        on_request=self.metrics.on_request,
                    )
                    log.info("slurmrestd speaks %s", self._client.version)
        return self._client

    def _lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    async def _fresh(self, ref: ObjectRef) -> dict[str, Any] | None:
        body = await self.kube.get(ref.namespace, ref.name)
        if body is None or (body.get("metadata") or {}).get("uid") != ref.uid:
            return None
        return body

    async def _apply(
        self, ref: ObjectRef, old: SlurmJobStatus, transition: Transition
    ) -> SlurmJobStatus:
        """Patch the status when something visible changed, then post the Events."""
        new = transition.status
        if changed(old, new):
            patch = merge_patch(old.dump(), new.dump())
            if await self.kube.patch_status(ref, patch) is None:
                raise RetryLater(f"{ref.namespace}/{ref.name} is gone", 0)
            if old.phase != new.phase and new.phase is not None:
                self.metrics.count_transition(new.phase)
        for event in transition.events:
            try:
                await self.kube.post_event(ref, event.type, event.reason, event.message)
            except Exception:  # an Event is worth a log line, never a failed reconcile
                log.exception(
                    "cannot post event %s on %s/%s", event.reason, ref.namespace, ref.name
                )
        self._observe_status(ref, new)
        return new

    def _observe_status(self, ref: ObjectRef, status: SlurmJobStatus) -> None:
        """Keep the poller's list and the jobs-by-phase gauge in step with a status."""
        if status.phase is not None:
            self.phases[ref.uid] = status.phase.value
        attempt = status.current_attempt
        live = (
            status.phase is not None
            and not status.phase.is_terminal
            and status.next_attempt_at is None
            # A job Slurm forgot without a trace cannot come back: stop asking for it.
            and not is_lost(status)
        )
        if live and attempt is not None and attempt.job_id is not None and attempt.confirmed:
            self.tracked[ref.uid] = Tracked(ref, attempt.job_id, attempt.sluid, attempt.staging_dir)
        else:
            self.tracked.pop(ref.uid, None)

    def observe_body(self, body: Mapping[str, Any], *, deleted: bool = False) -> None:
        """Called for every watch event: what the poller must follow."""
        ref = ObjectRef.of(body)
        if deleted:
            self.forget(ref)
            return
        self._observe_status(ref, SlurmJobStatus.parse(body.get("status")))

    def forget(self, ref: ObjectRef) -> None:
        self.tracked.pop(ref.uid, None)
        self.phases.pop(ref.uid, None)
        self._secrets.pop(ref.uid, None)
        self._locks.pop(ref.uid, None)

    async def _secret_values(self, ref: ObjectRef, spec: SlurmJobSpec) -> dict[str, str]:
        values: dict[str, str] = {}
        for env in spec.secret_env:
            source = env.value_from
            assert source is not None  # secret_env holds only valueFrom entries
            values[env.name] = await self.kube.read_secret_value(
                ref.namespace, source.secret_key_ref.name, source.secret_key_ref.key
            )
        self._secrets[ref.uid] = values
        return values

    async def _redactions(self, ref: ObjectRef, body: Mapping[str, Any]) -> list[str] | None:
        """The secret values to hide in log tails; None when the spec has secrets that cannot
        be read any more (then no tail is published rather than an unredacted one)."""
        if ref.uid not in self._secrets:
            try:
                spec = parse_spec(body.get("spec"))
            except SpecError:
                return []
            try:
                await self._secret_values(ref, spec)
            except SecretError:
                return None if spec.secret_env else []
        return list(self._secrets.get(ref.uid, {}).values())

    # -- submission ---------------------------------------------------------------------

    async def reconcile(self, ref: ObjectRef) -> None:
        """Drive a resource's submission side one step (create, resume and spec updates)."""
        async with self._lock(ref.uid):
            body = await self._fresh(ref)
            if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
                return
            status = SlurmJobStatus.parse(body.get("status"))
            step = next_step(status)
            if step in (Step.SUBMIT, Step.RETRY):
                gated = await self._gate(ref, body, status)
                if gated is None:
                    return
                status = gated
            if step is Step.SUBMIT:
                await self._submit(ref, body, status)
            elif step is Step.ADOPT:
                await self._adopt(ref, body, status)
            elif step is Step.CONFIRM:
                await self._confirm(ref, body, status)
            elif step is Step.RETRY:
                due = _parse_time(status.next_attempt_at)
                wait = (due - _now()).total_seconds() if due else 0.0
                if wait > 0:
                    raise RetryLater(f"retry due at {status.next_attempt_at}", wait)
                await self._submit(ref, body, status)
            elif step is Step.TRACK:
                self._observe_status(ref, status)
                await self._sync_hold(ref, body, status)
            else:
                self._observe_status(ref, status)

    async def _gate(
        self, ref: ObjectRef, body: Mapping[str, Any], status: SlurmJobStatus
    ) -> SlurmJobStatus | None:
        """spec.suspend before anything is submitted: None while suspended."""
        generation, now = _generation(body), _now()
        if _suspend_wanted(body):
            await self._apply(
                ref,
                status,
                suspension(
                    status,
                    True,
                    "Suspended",
                    "spec.suspend is true: nothing is submitted",
                    generation,
                    now,
                ),
            )
            return None
        cond = get_condition(status.conditions, SUSPENDED)
        if cond is not None and cond.status == "True":
            return await self._apply(
                ref,
                status,
                suspension(status, False, "Resumed", "spec.suspend is false", generation, now),
            )
        return status

    async def _sync_hold(
        self, ref: ObjectRef, body: Mapping[str, Any], status: SlurmJobStatus
    ) -> None:
        """Hold a queued job while spec.suspend is true; release it when it is false again."""
        wanted = _suspend_wanted(body)
        cond = get_condition(status.conditions, SUSPENDED)
        held = cond is not None and cond.status == "True"
        attempt = status.current_attempt
        if wanted == held or attempt is None or attempt.job_id is None:
            return
        generation, now = _generation(body), _now()
        client = await self.slurm()
        if wanted and status.phase is not Phase.QUEUED:
            transition = suspension(
                status,
                False,
                "NotHeld",
                "spec.suspend is true but the Slurm job already left the queue; Slurm holds "
                "only pending jobs, so it keeps running",
                generation,
                now,
            )
        else:
            try:
                await client.hold(attempt.job_id, wanted)
            except SlurmError as exc:
                raise RetryLater(f"cannot {'hold' if wanted else 'release'}: {exc}", 10) from exc
            verb = "held" if wanted else "released"
            transition = suspension(
                status,
                wanted,
                "Held" if wanted else "Released",
                f"Slurm job {attempt.job_id} {verb} (spec.suspend is {str(wanted).lower()})",
                generation,
                now,
            )
        await self._apply(ref, status, transition)

    async def report_reachability(self, reachable: bool, reason: str, message: str) -> None:
        """slurmrestd answered (or refused) the last sweep: say so on every followed job,
        once per change."""
        if self._reachable is reachable:
            return
        complete = True
        for item in list(self.tracked.values()):
            try:
                async with self._lock(item.ref.uid):
                    body = await self._fresh(item.ref)
                    if body is None:
                        continue
                    status = SlurmJobStatus.parse(body.get("status"))
                    transition = reachability(
                        status, reachable, reason, message, _generation(body), _now()
                    )
                    await self._apply(item.ref, status, transition)
            except Exception:  # one resource must not keep the others from hearing it
                log.exception("cannot report reachability on %s", item.ref.name)
                complete = False
        if complete:
            self._reachable = reachable

    async def _submit(
        self, ref: ObjectRef, body: Mapping[str, Any], status: SlurmJobStatus
    ) -> None:
        generation, now = _generation(body), _now()
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError as exc:
            await self._apply(
                ref,
                status,
                invalid_spec(status, exc.messages, generation, now, "InvalidSpec"),
            )
            return
        try:
            secrets = await self._secret_values(ref, spec)
        except SecretError as exc:
            await self._apply(
                ref, status, waiting(status, "SecretNotFound", str(exc), generation, now)
            )
            raise RetryLater(str(exc), self._backoff) from exc
        try:
            client = await self.slurm()
        except (SlurmError, TokenError) as exc:
            reason = "SlurmAuthFailed" if isinstance(exc, SlurmAuthError) else "SlurmUnavailable"
            await self._apply(ref, status, waiting(status, reason, str(exc), generation, now))
            raise RetryLater(str(exc), self._backoff) from exc
        number = len(status.attempts) + 1
        try:
            prepared = await asyncio.to_thread(
                prepare_attempt,
                spec,
                self.site,
                namespace=ref.namespace,
                name=ref.name,
                uid=ref.uid,
                attempt=number,
                api_version=client.version,
                secret_values=secrets,
            )
        except SpecError as exc:
            await self._apply(
                ref,
                status,
                invalid_spec(status, exc.messages, generation, now, "InvalidSpec"),
            )
            return
        except (RenderError, PreflightError) as exc:
            await self._apply(
                ref, status, invalid_spec(status, [str(exc)], generation, now, "InvalidSpec")
            )
            return
        launch = prepared.rendered.launch
        staging = prepared.rendered.staging_dir
        try:
            # Before the attempt is recorded: a wrong artifact is refused with nothing to adopt.
            await verify_runtime(prepared, self.settings)
        except ArtifactError as exc:
            self.metrics.count_submission("rejected")
            await self._apply(
                ref,
                status,
                invalid_spec(status, [str(exc)], generation, now, "RuntimeArtifactInvalid"),
            )
            return
        recorded = await self._apply(
            ref,
            status,
            record_attempt(
                status,
                number=number,
                job_name=launch.job_name,
                staging_dir=str(staging),
                generation=generation,
                now=now,
            ),
        )
        try:
            await stage(prepared, self.settings)
            receipt = await client.submit(launch)
        except SlurmRejected as exc:
            self.metrics.count_submission("rejected")
            if exc.job_id is not None:
                # Slurm created a record despite refusing the job (200 + errors): end it.
                await self._cancel_quietly(client, exc.job_id)
            await aremove_attempt(staging)
            await self._apply(ref, recorded, rejected(recorded, str(exc), generation, _now()))
            return
        except SlurmAmbiguous as exc:
            self.metrics.count_submission("ambiguous")
            await self._apply(ref, recorded, unconfirmed(recorded, str(exc), generation, _now()))
            raise RetryLater(str(exc), self.settings.poll_interval) from exc
        except (SlurmError, TokenError, StagingError, OSError) as exc:
            auth = isinstance(exc, SlurmAuthError | TokenError)
            self.metrics.count_submission("auth" if auth else "transient")
            await aremove_attempt(staging)
            reason = "SlurmAuthFailed" if auth else "SubmitFailed"
            await self._apply(
                ref, recorded, not_submitted(recorded, reason, str(exc), generation, _now())
            )
            raise RetryLater(str(exc), self._backoff) from exc
        self.metrics.count_submission("accepted")
        done = await self._apply(
            ref, recorded, submitted(recorded, receipt.job_id, generation, _now())
        )
        await self._confirm(ref, body, done)

    async def _confirm(
        self, ref: ObjectRef, body: Mapping[str, Any], status: SlurmJobStatus
    ) -> None:
        """Fetch the job once by its numeric id: record the SLUID, take its state."""
        attempt = status.current_attempt
        assert attempt is not None
        assert attempt.job_id is not None
        client = await self.slurm()
        try:
            views: list[SlurmJobView] | None = await client.get_job(attempt.job_id)
        except SlurmNotFound:
            views = None  # purged already (a long outage): accounting, else Unknown
        except SlurmError as exc:
            raise RetryLater(str(exc), self._backoff) from exc
        if views is None:
            await self._fold(ref, body, status, confirmed(status, None), None)
            return
        # A quick job may already have ended: the same fold as the poller's (log tails, retry).
        await self._fold(ref, body, status, confirmed(status, _leader(views).sluid), views)

    async def _adopt(self, ref: ObjectRef, body: Mapping[str, Any], status: SlurmJobStatus) -> None:
        """The last POST's answer was lost: look for the job by its unique name and adopt it."""
        attempt = status.current_attempt
        assert attempt is not None
        generation = _generation(body)
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        if annotations.get(DECLARE_LOST_ANNOTATION) == str(attempt.number):
            after = await self._apply(ref, status, declared_lost(status, generation, _now()))
            await self._submit(ref, body, after)
            return
        try:
            client = await self.slurm()
            found = await client.find_by_name(attempt.job_name)
        except SlurmError as exc:
            raise RetryLater(str(exc), self.settings.poll_interval) from exc
        mine = [job for job in found if _carries(job, ref, attempt)]
        # One entry per job, as its leader component (a het job's components share a name).
        leaders = sorted(
            (_leader(views) for views in by_leader(mine).values()),
            key=lambda j: (j.sluid or "", j.job_id),
        )
        if not leaders and attempt.staging_dir and not await _staged(attempt.staging_dir):
            # The operator stopped before the attempt's files were complete, and they are
            # always complete before the POST: this attempt was never sent. Start it over.
            await aremove_attempt(Path(attempt.staging_dir))
            after = await self._apply(
                ref,
                status,
                not_submitted(
                    status,
                    "SubmitInterrupted",
                    f"attempt {attempt.number} was interrupted before it was sent; "
                    "submitting it again",
                    generation,
                    _now(),
                ),
            )
            await self._submit(ref, body, after)
            return
        if not leaders:
            await self._apply(
                ref,
                status,
                unconfirmed(status, "the job is not visible in Slurm yet", generation, _now()),
            )
            raise RetryLater(f"job {attempt.job_name} not found yet", self.settings.poll_interval)
        keep, extra = leaders[0], leaders[1:]
        for duplicate in extra:
            await self._cancel_quietly(client, duplicate.job_id)
            self.metrics.duplicates_total.inc()
            await self.kube.post_event(
                ref,
                "Warning",
                "DuplicateCancelled",
                f"Slurm job {duplicate.job_id} duplicated attempt {attempt.number} "
                f"(kept {keep.job_id}); cancelled",
            )
        self.metrics.count_adoption("name")
        adopted = await self._apply(
            ref,
            status,
            submitted(status, keep.job_id, generation, _now(), sluid=keep.sluid, adopted=True),
        )
        await self._confirm(ref, body, adopted)

    async def _cancel_quietly(self, client: SlurmClient, ref: int | str) -> None:
        try:
            await client.cancel(ref)
        except SlurmNotFound:
            pass
        except SlurmError:
            log.exception("cannot cancel Slurm job %s", ref)

    # -- following jobs -----------------------------------------------------------------

    async def refresh(
        self,
        tracked: Tracked,
        views: Sequence[SlurmJobView] | None,
        *,
        logs_only: bool = False,
    ) -> None:
        """Fold a changed Slurm state (None: the job is gone from the controller) and the log
        tails into the resource's status; `logs_only` when only the log files moved."""
        ref = tracked.ref
        async with self._lock(ref.uid):
            body = await self._fresh(ref)
            if body is None:
                self.forget(ref)
                return
            status = SlurmJobStatus.parse(body.get("status"))
            attempt = status.current_attempt
            moved_on = status.next_attempt_at is not None or (
                status.phase is not None and status.phase.is_terminal
            )
            if attempt is None or attempt.job_id != tracked.job_id or moved_on:
                self._observe_status(ref, status)
                return
            await self._fold(ref, body, status, status, views, logs_only=logs_only)

    async def _fold(
        self,
        ref: ObjectRef,
        body: Mapping[str, Any],
        old: SlurmJobStatus,
        status: SlurmJobStatus,
        views: Sequence[SlurmJobView] | None,
        *,
        logs_only: bool = False,
    ) -> None:
        """Fold Slurm's view (None: gone from the controller), the log tails and, for a failed
        attempt, the retry rules into `status` (built on `old`) and write it."""
        attempt = status.current_attempt
        assert attempt is not None
        generation, now = _generation(body), _now()
        obs: Observation | None = None
        if logs_only:
            transition = Transition(status)
        else:
            if views is None:
                views = await self._from_accounting(attempt)
            if not views:
                transition = lost(
                    status,
                    f"Slurm job {attempt.job_id} is no longer known to the controller and "
                    "there is no accounting record; it is not resubmitted",
                    generation,
                    now,
                )
            else:
                obs = observe(views)
                transition = observed(status, obs, generation, now)
        new = transition.status
        logs: Logs | None = None
        if attempt.staging_dir:
            logs = await self._logs(ref, body, attempt.staging_dir)
            if logs is not None:
                new = with_logs(new, logs)
            if obs is not None and obs.final:
                # The script deletes it when it runs; a job that ended without running must
                # not leave secret values on the shared storage.
                await aremove_secrets(Path(attempt.staging_dir))
        transition = Transition(new, transition.events)
        if obs is not None and obs.final and obs.phase is Phase.FAILED:
            transition = self._after_failure(body, transition, obs, logs, generation, now)
        await self._apply(ref, old, transition)
        if transition.status.next_attempt_at is not None:
            self._retry_later(ref, transition.status.next_attempt_at)

    def _after_failure(
        self,
        body: Mapping[str, Any],
        transition: Transition,
        obs: Observation,
        logs: Logs | None,
        generation: int | None,
        now: datetime,
    ) -> Transition:
        """Ask the retry rules about a failed attempt; schedule a new one when they say so."""
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError:
            return transition
        tails = [logs.stdout, logs.stderr] if logs is not None else []
        text = "\n".join(t.tail for t in tails if t is not None)
        status = transition.status
        decision = decide(spec.retry, obs, text, status.attempts[:-1])
        if not decision.retries:
            return Transition(not_retried(status, decision), transition.events)
        scheduled = retry_scheduled(status, decision, generation, now)
        return Transition(scheduled.status, transition.events + scheduled.events)

    def _retry_later(self, ref: ObjectRef, due: str) -> None:
        """Submit the scheduled retry when it is due (a restart finds it again on resume)."""

        async def later() -> None:
            when = _parse_time(due)
            while True:
                await asyncio.sleep(max(0.0, (when - _now()).total_seconds()) if when else 0)
                try:
                    await self.reconcile(ref)
                    return
                except RetryLater as exc:
                    when = _now() + timedelta(seconds=exc.delay)
                except Exception:
                    log.exception("retry of %s/%s failed; trying again", ref.namespace, ref.name)
                    when = _now() + timedelta(seconds=self._backoff)

        task = asyncio.get_running_loop().create_task(later())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _logs(self, ref: ObjectRef, body: Mapping[str, Any], staging_dir: str) -> Logs | None:
        """The attempt's log tails; None (keep what the status has) when they cannot be read
        or when secret values cannot be resolved to redact them."""
        base = Path(staging_dir)
        redact = await self._redactions(ref, body)
        if redact is None:
            return None
        try:
            return await aread_logs(base / STDOUT_FILE, base / STDERR_FILE, redact)
        except OSError as exc:
            log.warning("cannot read the logs of %s/%s: %s", ref.namespace, ref.name, exc)
            return None

    async def _from_accounting(self, attempt: Attempt) -> list[SlurmJobView]:
        client = await self.slurm()
        try:
            assert attempt.job_id is not None
            return await client.get_job_accounting(
                lifecycle_ref(client, attempt.job_id, attempt.sluid)
            )
        except (SlurmUnsupported, SlurmNotFound):
            return []

    # -- deletion -----------------------------------------------------------------------

    async def finalize(self, ref: ObjectRef, body: Mapping[str, Any]) -> None:
        """Cancel the job unless it is final, wait for its end, archive the log tails, remove
        the staging directory; raises RetryLater while the job is still ending."""
        async with self._lock(ref.uid):
            # kopf's body predates the lock: a retry may have submitted a new attempt since.
            body = await self._fresh(ref) or body
            status = SlurmJobStatus.parse(body.get("status"))
            attempt = status.current_attempt
            live = status.phase is None or not status.phase.is_terminal
            if attempt is not None and live:
                client = await self.slurm()
                await self._end_job(ref, client, attempt)
                fresh = await self._fresh(ref)
                if fresh is not None and attempt.staging_dir:
                    current = SlurmJobStatus.parse(fresh.get("status"))
                    logs = await self._logs(ref, fresh, attempt.staging_dir)
                    if logs is not None:
                        await self._apply(ref, current, Transition(with_logs(current, logs)))
            await aremove_resource_dir(self.settings.storage_root, ref.namespace, ref.name, ref.uid)
        self.forget(ref)

    async def _end_job(self, ref: ObjectRef, client: SlurmClient, attempt: Attempt) -> None:
        if attempt.job_id is None:
            # An unconfirmed submission may still have created a job: cancel what carries
            # this attempt's name and identity.
            for job in await client.find_by_name(attempt.job_name):
                if _carries(job, ref, attempt):
                    await self._cancel_quietly(client, job.job_id)
            return
        target = lifecycle_ref(client, attempt.job_id, attempt.sluid)
        try:
            await client.cancel(target)
        except SlurmNotFound:
            return
        deadline = asyncio.get_running_loop().time() + self.settings.delete_timeout
        while asyncio.get_running_loop().time() < deadline:
            try:
                views = await client.get_job(target)
            except SlurmNotFound:
                return
            if all(v.is_final for v in views):
                via = f" through its SLUID {target}" if isinstance(target, str) else ""
                await self.kube.post_event(
                    ref,
                    "Normal",
                    "Cancelled",
                    f"Slurm job {attempt.job_id} cancelled{via} on deletion",
                )
                return
            await asyncio.sleep(0.5)
        raise RetryLater(f"Slurm job {attempt.job_id} is still ending", 5)


def _carries(job: SlurmJobView, ref: ObjectRef, attempt: Attempt) -> bool:
    """Whether a job found by the attempt's name is this attempt's: its comment names the
    resource's uid and the attempt (a job without our comment, e.g. from accounting where the
    comment may be cut, is taken on its unique name alone)."""
    ident = naming.parse_comment(job.comment)
    return ident is None or (ident.uid == ref.uid and ident.attempt == attempt.number)


async def _staged(staging_dir: str) -> bool:
    return await asyncio.to_thread((Path(staging_dir) / SCRIPT_FILE).is_file)


def _suspend_wanted(body: Mapping[str, Any]) -> bool:
    return bool((body.get("spec") or {}).get("suspend", False))


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _leader(views: Sequence[SlurmJobView]) -> SlurmJobView:
    return min(views, key=lambda v: (v.het_job_offset or 0, v.job_id))
