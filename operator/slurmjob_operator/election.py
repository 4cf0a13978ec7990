"""`run` with a standby: kopf, the poller and every submit run only in the process that holds
the Lease (`core.leadership` decides, `leases` reads and writes).

A standby holds no watch and writes nothing but its attempts at the Lease: kopf writes its
annotations and finalizer on every object it handles, so it is not started at all until the
Lease is won. The leader renews every retry period; when it has not renewed for the renew
deadline it stops kopf (graceful for `grace` seconds) and the process exits, before the lease
can have expired for anyone else. A clean shutdown (SIGTERM) gives the Lease up at once, so
the standby takes over without waiting for it to expire.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import kopf
from aiohttp import web

from slurmjob_operator.config import Settings
from slurmjob_operator.core.leadership import (
    Move,
    Sighting,
    Timing,
    next_move,
    observe,
    still_leading,
)
from slurmjob_operator.kube import KubeApi
from slurmjob_operator.leases import LeaseConflict, LeaseStore
from slurmjob_operator.listeners import Limits, Listener, serve_handler, serve_metrics
from slurmjob_operator.logserver import serve_logs
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)


#: The exit status of a leader that lost its Lease (the pod restarts it as a standby).
EXIT_LEADERSHIP_LOST = 3


class LeadershipLost(Exception):
    """The Lease was not renewed in time, or somebody else holds it now."""


class Elector:
    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timing: Timing,
        *,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utc_now,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.identity = identity
        self.timing = timing
        self._on_change = on_change
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._sighting: Sighting | None = None
        self.last_renewed: float | None = None
        self.last_contact: float | None = None  # last answer from the apiserver
        self.leading = False

    def _lead(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.warning(
                "%s %s the lease %s/%s",
                self.identity,
                "holds" if leading else "no longer holds",
                self.store.namespace,
                self.store.name,
            )
            if self._on_change is not None:
                self._on_change(leading)

    async def step(self) -> bool:
        """Read the Lease and take, renew or leave it; whether this process holds it now."""
        record = await self.store.read()
        now = self._clock()
        self.last_contact = now
        self._sighting = observe(self._sighting, record, now) if record is not None else None
        move, wanted = next_move(self._sighting, self.identity, now, self.timing)
        if move is Move.WAIT or wanted is None:
            return False
        stamp = self._wall()
        taking = move in (Move.CREATE, Move.TAKE)
        wanted = replace(wanted, renewed=stamp, acquired=stamp if taking else wanted.acquired)
        # The deadline counts from before the write: the apiserver applies it later, if at all.
        started = self._clock()
        try:
            written = await (
                self.store.create(wanted) if move is Move.CREATE else self.store.update(wanted)
            )
        except LeaseConflict:
            return False
        self.last_contact = self._clock()
        self.last_renewed = started
        self._sighting = Sighting(written, started)
        return True

    async def acquire(self) -> None:
        """Wait until this process holds the Lease."""
        while True:
            try:
                if await self.step():
                    self._lead(True)
                    return
            except Exception as exc:  # an apiserver that is away: keep trying
                log.warning("lease %s/%s: %s", self.store.namespace, self.store.name, exc)
            # Jitter: standbys that started together do not retry in lockstep.
            await self._sleep(self.timing.retry_period * random.uniform(1.0, 1.2))  # noqa: S311

    async def hold(self) -> None:
        """Renew every retry period; raise LeadershipLost once the renew deadline has passed
        without a renewal, or the Lease shows another holder."""
        while True:
            await self._sleep(self.timing.retry_period)
            held: bool | None
            left = self.timing.renew_deadline - (self._clock() - (self.last_renewed or 0.0))
            try:
                held = await asyncio.wait_for(self.step(), max(0.05, left))
            except Exception as exc:  # an apiserver away or slow: the deadline decides
                log.warning("renewing lease %s: %s", self.store.name, exc)
                held = None
            if held is False and self._holder_is_other():
                self._lead(False)
                raise LeadershipLost(f"the lease is held by {self._holder()}")
            if not still_leading(self.last_renewed, self._clock(), self.timing):
                self._lead(False)
                raise LeadershipLost(f"not renewed for {self.timing.renew_deadline} s")

    def _holder(self) -> str | None:
        return self._sighting.record.holder if self._sighting else None

    def _holder_is_other(self) -> bool:
        holder = self._holder()
        return holder is not None and holder != self.identity

    async def release(self) -> None:
        """Give the Lease up (a clean shutdown), so a standby need not wait for it to expire."""
        if not self.leading or self._sighting is None:
            return
        self._lead(False)
        free = replace(self._sighting.record, holder=None, renewed=self._wall(), duration=1)
        try:
            await asyncio.wait_for(self.store.update(free), self.timing.retry_period)
        except Exception as exc:  # expiry frees it anyway
            log.warning("could not give the lease up: %s", exc)

    def healthy(self) -> bool:
        """Alive for the probes: the apiserver answered within the last lease duration (a
        standby is healthy while it can watch the Lease; a leader while it renews)."""
        if self.last_contact is None:
            return False
        return self._clock() - self.last_contact < self.timing.lease_duration * 2


async def run_elected(
    elector: Elector, lead: Callable[[asyncio.Event], Awaitable[None]], *, grace: float
) -> bool:
    """Wait for the Lease, then `lead(stop)` until it returns or leadership is lost. Returns
    False when leadership was lost (the caller exits the process: whatever `lead` left running
    must not go on); True after a clean end (the Lease is given up)."""
    await elector.acquire()
    stop = asyncio.Event()
    work = asyncio.ensure_future(lead(stop))
    holding = asyncio.ensure_future(elector.hold())
    await asyncio.wait({work, holding}, return_when=asyncio.FIRST_COMPLETED)
    if holding.done():
        log.error("leadership lost (%s): stopping", holding.exception())
        stop.set()
        done, _ = await asyncio.wait({work}, timeout=grace)
        if not done:
            log.error("the operator did not stop within %s s", grace)
        return False
    holding.cancel()
    await asyncio.gather(holding, return_exceptions=True)
    await elector.release()
    work.result()
    return True


# -- the process ------------------------------------------------------------------------------

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def lease_namespace(settings: Settings, pod_namespace: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The setting, else the pod's own namespace in a cluster, else `default`."""
    if settings.lease_namespace:
        return settings.lease_namespace
    try:
        return pod_namespace.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def lease_identity(settings: Settings) -> str:
    # The host name is the pod's name in a cluster; the suffix tells a restarted process apart.
    return settings.lease_identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def lease_timing(settings: Settings) -> Timing:
    return Timing(
        lease_duration=settings.lease_duration,
        renew_deadline=settings.lease_renew_deadline,
        retry_period=settings.lease_retry_period,
    )


async def serve_health(url: str, healthy: Callable[[], bool], limits: Limits) -> Listener:
    """`GET <path>` of `url` (e.g. http://0.0.0.0:8080/healthz): 200 while `healthy()`, 503
    otherwise; for the liveness and readiness probes of leader and standby alike."""
    parts = urlsplit(url)
    path = parts.path or "/"

    async def probe(request: web.BaseRequest) -> web.StreamResponse:
        if request.path != path:
            return web.Response(status=404)
        ok = healthy()
        return web.json_response({"ok": ok}, status=200 if ok else 503)

    host = parts.hostname or "0.0.0.0"  # noqa: S104
    return await serve_handler(probe, host, parts.port or 80, limits, name="health")


async def run_with_lease(
    settings: Settings, *, namespaces: Sequence[str], liveness: str | None
) -> bool:
    """The operator under leader election; False when leadership was lost."""
    metrics = Metrics()
    metrics.leader.set(0)
    kube = await KubeApi.connect()
    store = LeaseStore(kube.api, lease_namespace(settings), settings.lease_name)

    def changed(leading: bool) -> None:
        metrics.leader.set(1 if leading else 0)

    elector = Elector(store, lease_identity(settings), lease_timing(settings), on_change=changed)
    limits = Limits.from_settings(settings)
    listeners: list[Listener] = []

    def keep(listener: Listener | None) -> None:
        if listener is not None:
            listeners.append(listener)

    async def close_listeners() -> None:
        for listener in reversed(listeners):
            await listener.close()

    try:
        keep(await serve_metrics(settings, metrics.registry, limits))
        if liveness:
            keep(await serve_health(liveness, elector.healthy, limits))
        # Standbys serve the logs too: the read needs nothing of the leader's, and the
        # Service may send a request to any replica.
        keep(await serve_logs(settings, kube, namespaces))
    except BaseException:
        await close_listeners()
        await kube.close()
        raise
    log.info("standing by for lease %s/%s as %s", store.namespace, store.name, elector.identity)

    async def lead(stop: asyncio.Event) -> None:
        await kopf.operator(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            stop_flag=stop,
            memo=kopf.Memo(
                metrics=metrics,
                watch_streams=len(namespaces) or 1,
                logs_serving=True,
                metrics_serving=True,
            ),
        )

    try:
        grace = (settings.lease_duration - settings.lease_renew_deadline) / 2
        clean = await run_elected(elector, lead, grace=grace)
        if not clean:
            # Now, not after the cleanup below: the connections and the event loop's teardown
            # (which waits for worker threads) could take the process past the moment the
            # standby may take over.
            logging.shutdown()
            os._exit(EXIT_LEADERSHIP_LOST)
        return clean
    finally:
        await close_listeners()
        await kube.close()
