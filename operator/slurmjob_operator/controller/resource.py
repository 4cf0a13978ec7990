"""The resource edge: the fresh read, the status write with its Events, the per-resource
locks and the cache of secret values used to redact log tails.

Every write starts from the object as the API server has it now and happens under that
resource's lock, so the submission handler, the poller and the finalizer never overwrite
each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from slurmjob_operator.api import patch
from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.api.status import SlurmJobStatus
from slurmjob_operator.controller.registry import Registry
from slurmjob_operator.core import verified
from slurmjob_operator.core.redact import MIN_REDACT_LENGTH
from slurmjob_operator.core.summary import with_summary
from slurmjob_operator.core.transition import Transition, changed
from slurmjob_operator.kube import ResourceStore, SecretError, StatusConflict
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)


class SecretTooShort(SecretError):
    """A secret value of 1 to 3 characters: it cannot be redacted without wrecking the logs
    (every "1" or "abc" replaced), so the job is not submitted. An empty value hides nothing
    and is taken."""


class RetryLater(Exception):
    """Not done yet; the handler should run again after `delay` seconds."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


class ResourceGone(RetryLater):
    """The resource was deleted while it was worked on (a refresh racing `kubectl delete`):
    nothing is left to do for it, and that is no error."""


class Stale(RetryLater):
    """A status write from a conditioned view found the resource changed since that view was
    read: nothing was written; read it again and decide again."""


class ResourceEdge:
    def __init__(self, store: ResourceStore, metrics: Metrics, registry: Registry) -> None:
        self.store = store
        self.metrics = metrics
        self.registry = registry
        self._locks: dict[str, asyncio.Lock] = {}
        self._secrets: dict[str, dict[str, str]] = {}
        # Told of every phase change written (Kueue's Workload follows the job's phase).
        self.after_phase: Callable[[ResourceView, SlurmJobStatus], Awaitable[None]] | None = None

    def lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    @contextlib.asynccontextmanager
    async def step(self, uid: str) -> AsyncIterator[None]:
        """One step on the resource: under its lock, and a `core.verified` step, so a job
        verified in it can be changed until it ends and not after."""
        async with self.lock(uid):
            with verified.step():
                yield

    async def fresh(self, ref: ObjectRef, *, conditioned: bool = False) -> ResourceView | None:
        """The resource as the API server has it now; None when it is gone or is another
        object of the same name (another uid). `conditioned`: writes from it carry its
        resourceVersion (`ResourceView.of`)."""
        body = await self.store.get(ref.namespace, ref.name)
        if body is None or (body.get("metadata") or {}).get("uid") != ref.uid:
            return None
        return ResourceView.of(body, conditioned=conditioned)

    async def on_fresh(
        self,
        ref: ObjectRef,
        act: Callable[[ResourceView], Awaitable[None]],
        *,
        quiet: bool = False,
    ) -> ResourceView | None:
        """`act` on a conditioned fresh read of `ref`; when its write finds the resource
        changed since that read (`Stale`), once more on a new read. A second `Stale` is
        raised, or with `quiet` dropped. Returns the last view read (None: gone)."""
        for again in (False, True):
            view = await self.fresh(ref, conditioned=True)
            if view is None:
                return None
            try:
                await act(view)
            except Stale:
                if not again:
                    continue
                if not quiet:
                    raise
            return view
        raise AssertionError("unreachable: the second pass returns or raises")

    async def apply(self, view: ResourceView, transition: Transition) -> ResourceView:
        """Patch the status when something visible changed, post the Events, keep the
        registry in step; the view returned carries the new status."""
        ref, old = view.ref, view.status
        # The columns' fields and `Finished` follow the status on every write, whichever
        # transition made it (`core.summary`).
        new = with_summary(transition.status, view.generation, utc_now())
        version = view.resource_version
        if changed(old, new):
            # A merge patch replaces a list whole (status.attempts): from a conditioned view
            # (the watch's copy) it is written only onto the version it was computed from.
            try:
                written = await self.store.patch_status(
                    ref, patch.diff(old.dump(), new.dump()), version
                )
            except StatusConflict as exc:
                raise Stale(str(exc), 0) from exc
            if written is None:
                raise ResourceGone(f"{ref.namespace}/{ref.name} is gone", 0)
            version = (written.get("metadata") or {}).get("resourceVersion") or version
            if old.phase != new.phase and new.phase is not None:
                self.metrics.count_transition(new.phase)
        for event in transition.events:
            await self.event(ref, event.type, event.reason, event.message)
        self.registry.observe(ref, new)
        if self.after_phase is not None and old.phase != new.phase:
            await self.after_phase(view, new)
        return view.with_status(new, version)

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        try:
            await self.store.post_event(ref, type_, reason, message)
        except Exception:  # an Event is worth a log line, never a failed reconcile
            log.exception("cannot post event %s on %s/%s", reason, ref.namespace, ref.name)

    def observe(self, ref: ObjectRef, status: SlurmJobStatus) -> None:
        self.registry.observe(ref, status)

    def forget(self, ref: ObjectRef) -> None:
        """The resource is gone: drop everything kept for it. A lock still held (a handler is
        inside it) stays; the next `forget` or the end of the process drops it."""
        self.registry.forget(ref.uid)
        self._secrets.pop(ref.uid, None)
        lock = self._locks.get(ref.uid)
        if lock is not None and not lock.locked():
            del self._locks[ref.uid]

    async def secret_values(self, view: ResourceView) -> dict[str, str]:
        """The values of the spec's secret env vars (SecretError when one cannot be read,
        SecretTooShort when one could not be hidden in the log tails)."""
        values: dict[str, str] = {}
        for ref in view.secret_refs:
            value = await self.store.read_secret_value(view.ref.namespace, ref.secret, ref.key)
            if 0 < len(value) < MIN_REDACT_LENGTH:
                raise SecretTooShort(
                    f"env {ref.env}: the value of Secret {view.ref.namespace}/{ref.secret} key "
                    f"{ref.key!r} is shorter than {MIN_REDACT_LENGTH} characters, too short to "
                    "be hidden in the log tails; use a longer value"
                )
            values[ref.env] = value
        self._secrets[view.ref.uid] = values
        return values

    async def redactions(self, view: ResourceView) -> list[str] | None:
        """The secret values to hide in log tails; None when the spec has secrets that cannot
        be read any more (then no tail is published rather than an unredacted one)."""
        uid = view.ref.uid
        if uid not in self._secrets:
            try:
                await self.secret_values(view)
            except SecretError:
                return None if view.secret_refs else []
        return list(self._secrets.get(uid, {}).values())
