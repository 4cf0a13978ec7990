"""SlurmJob handlers: each unpacks what kopf gives and delegates to the controller."""

from __future__ import annotations

from typing import Any

import kopf

from slurmjob_operator import GROUP, PLURAL, VERSION
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.controller import RetryLater
from slurmjob_operator.controller.fleet import Fleet
from slurmjob_operator.handlers.diffbase import ESSENCES

RESOURCE = (GROUP, VERSION, PLURAL)


def _controller(memo: kopf.Memo) -> Fleet:
    fleet: Fleet = memo.controller
    return fleet


async def _reconcile(memo: kopf.Memo, body: kopf.Body) -> None:
    # A wait (or a failure) becomes a wake of the operator's own, not a kopf retry: the
    # handler is done, and kopf writes no progress annotation for it (`controller.wakes`).
    ref = ObjectRef.of(body)
    fleet = _controller(memo)
    await fleet.wakes.attempt(ref, fleet.reconcile(ref, body))


@kopf.on.create(*RESOURCE)
async def created(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _reconcile(memo, body)


@kopf.on.resume(*RESOURCE)
async def resumed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _reconcile(memo, body)


# spec.suspend or spec.ttlSecondsAfterFinished: the CRD lets no other field change (a spec
# changed under an older CRD is reconciled all the same).
@kopf.on.update(*RESOURCE, field="spec")
async def spec_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _reconcile(memo, body)


# A Kueue queue label added or removed: decided again (a tenant's requireQueue, admission).
@kopf.on.update(*RESOURCE, field="metadata.labels")
async def labels_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _reconcile(memo, body)


# Deletion keeps kopf's retry: the finalizer must stay until the job has ended.
@kopf.on.delete(*RESOURCE)
async def deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    try:
        await _controller(memo).finalize(body)
    except RetryLater as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from exc


# Async, so that it runs on the event loop with the poller (kopf runs a plain `def` in a
# worker thread, where it would change the registry while the poller iterates it).
@kopf.on.event(*RESOURCE)
async def watched(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED":
        ESSENCES.forget(str(body.metadata.uid))
    fleet: Fleet | None = memo.get("controller")
    if fleet is not None:
        fleet.observe_body(body, deleted=type == "DELETED")
