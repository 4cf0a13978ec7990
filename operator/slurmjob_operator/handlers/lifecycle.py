"""Operator-wide handlers: settings, the shared clients and the poller, their cleanup, login."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from typing import Any

import aiohttp
import kopf

from slurmjob_operator import FINALIZER, GROUP
from slurmjob_operator.certkeeper import cert_keeper_from_settings
from slurmjob_operator.config import Settings
from slurmjob_operator.controller import Controller
from slurmjob_operator.controller.catalogreload import CatalogReload
from slurmjob_operator.controller.fairness import FairLimiter
from slurmjob_operator.controller.fleet import Fleet
from slurmjob_operator.controller.poller import Poller
from slurmjob_operator.controller.probebook import probe_book
from slurmjob_operator.controller.removals import RemovalSweep
from slurmjob_operator.controller.wakes import Wakes, reconcile_failed
from slurmjob_operator.handlers.diffbase import ESSENCES, UnmarkedProgress
from slurmjob_operator.kube import KubeApi
from slurmjob_operator.listeners import Limits, Listener, serve_metrics
from slurmjob_operator.logserver import serve_logs
from slurmjob_operator.memtrim import resident_bytes, trim_periodically
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.servingcert import operator_namespace
from slurmjob_operator.site.clusters import cluster_names, load_clusters
from slurmjob_operator.slurm.connect import open_transport
from slurmjob_operator.storage.executors import close_pools, open_pools

log = logging.getLogger(__name__)


def configure(settings: kopf.OperatorSettings, config: Settings) -> None:
    """Every kopf setting the operator changes, in one place."""
    # Our own prefix for everything kopf stores on the resources.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = UnmarkedProgress(prefix=GROUP)
    # What a change is compared against, in memory: no annotation PATCH after each handled
    # creation or change (`handlers.diffbase`).
    settings.persistence.diffbase_storage = ESSENCES
    # The operator posts its own Events for transitions; kopf's only for its own trouble.
    settings.posting.level = logging.WARNING
    # Watch streams are re-established before proxies and load balancers cut them.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 30
    # The CRD and the namespaces are fixed at start: no Namespace listing or CRD watching, so
    # the ServiceAccount needs no cluster-wide verbs beyond the SlurmJobs themselves.
    settings.scanning.disabled = True
    # Memory at scale (docs/benchmarks.md): the first list read in pages, not in one answer of
    # every object, and a resource's worker gone soon after its events, so that a burst's
    # objects are not kept alive across the heap (the periodic trim can then give it back).
    settings.watching.chunk_size = config.watch_page_size or None
    settings.queueing.idle_timeout = config.worker_idle_timeout


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = Settings.from_env()
    configure(settings, config)
    sites = load_clusters(config)
    clusters = cluster_names(sites, config.cluster_name)
    kube = await KubeApi.connect()
    # Under leader election `run` made it before the Lease was won (a standby serves the
    # leader gauge too); kopf passes it in the memo.
    metrics = memo.get("metrics") or Metrics()
    if not memo.get("metrics_serving") and memo.get("metrics_listener") is None:
        # Kept in the memo at once: a retried startup finds it serving.
        memo.metrics_listener = await serve_metrics(
            config, metrics.registry, Limits.from_settings(config)
        )
    slots = FairLimiter[str](config.submit_concurrency, on_waiting=metrics.waiting_submissions.set)
    # One wake service for every cluster's part: a wake reads the resource and routes it.
    wakes = Wakes(
        backoff=max(1.0, min(30.0, config.poll_interval * 5)),
        on_error=reconcile_failed(metrics),
    )
    metrics.wakes_pending.set_function(lambda: len(wakes))
    members: list[Controller] = []
    # One probe book for every cluster's part: the ConfigMap's bound is weighed in one memory.
    probes = probe_book(config, kube)
    opened = []
    try:
        for site in sites:
            opened.append(open_transport(site.settings))
            members.append(
                Controller(
                    site.settings,
                    kube,
                    opened[-1],
                    metrics,
                    clusters=clusters,
                    submit_slots=slots,
                    wakes=wakes,
                    probes=probes,
                )
            )
    except BaseException:
        # kopf retries a failed startup: nothing opened here may be left behind.
        for transport in opened:
            await transport.close()
        await kube.close()
        raise
    fleet = Fleet(members, clusters)
    # The bounded pools of blocking file work (`storage.executors`).
    open_pools()
    if config.logs_port and not memo.get("logs_serving"):
        # Without leader election nobody started it before kopf (`election.run_with_lease`).
        try:
            memo.logs_listener = await serve_logs(config, kube, memo.get("namespaces") or ())
        except BaseException:
            for transport in opened:
                await transport.close()
            await kube.close()
            raise
    memo.controller = fleet
    # Only the leader runs this handler: it keeps the log API's own serving certificate.
    keeper = cert_keeper_from_settings(config, kube)
    if keeper is not None:
        memo.cert_keeper = asyncio.create_task(keeper.run(), name="slurmjob-serving-cert")
    metrics.resident_memory_bytes.set_function(lambda: float(resident_bytes() or 0))
    memo.memory_trim = asyncio.create_task(
        trim_periodically(config.memory_trim_interval, metrics.memory_returned_bytes_total.inc),
        name="slurmjob-memory-trim",
    )
    # The leader keeps the archive to its retention and size cap (the first cluster's
    # settings: the archive root is the operator's, not a cluster's).
    memo.archive_sweep = (
        asyncio.create_task(members[0].archiver.sweep_periodically(), name="slurmjob-archive")
        if members[0].archiver.enabled
        else None
    )
    # The image cache's sweep, per cluster whose gate has one (docs/images.md, "Eviction").
    memo.image_sweeps = [
        asyncio.create_task(member.image_sweeper.run(), name=f"slurmjob-images-{member.name}")
        for member in members
        if member.image_sweeper is not None
    ]
    # The one sweep that finishes the checkpoint removals finalizers leave, on every
    # cluster's storage root (`controller.removals`); after a restart it finds them there.
    sweep = RemovalSweep(site.settings.storage_root for site in sites)
    for member in members:
        member.sweep_removals_with(sweep)
    memo.removal_sweep = asyncio.create_task(sweep.run(), name="slurmjob-removals")
    # Every cluster's runtime registry and GPU series catalog, re-read when their files change.
    pod = os.environ.get("HOSTNAME")
    event = (
        functools.partial(kube.post_pod_event, operator_namespace(config), pod)
        if pod and isinstance(kube, KubeApi)
        else None
    )
    reload = CatalogReload(
        [(m.name, m.site.catalogs) for m in members], metrics.catalogs, event=event
    )
    memo.catalog_reload = asyncio.create_task(reload.run(), name="slurmjob-catalogs")
    memo.pollers = [
        asyncio.create_task(
            Poller(member, phase_counts=fleet.phase_counts, primary=index == 0).run(),
            name=f"slurmjob-poller-{member.name}",
        )
        for index, member in enumerate(members)
    ]
    for site in sites:
        log.info(
            "slurmjob-operator started: cluster %s, slurmrestd %s, profile %s, storage root %s",
            site.name,
            site.settings.slurm_rest_url,
            site.settings.slurm_runtime_profile.value,
            site.settings.storage_root,
        )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    tasks = [
        memo.get("cert_keeper"),
        memo.get("memory_trim"),
        memo.get("archive_sweep"),
        memo.get("removal_sweep"),
        memo.get("catalog_reload"),
    ]
    for task in [*(memo.get("pollers") or []), *(memo.get("image_sweeps") or []), *tasks]:
        if task is None:
            continue
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for name in ("logs_listener", "metrics_listener"):
        listener: Listener | None = memo.get(name)
        if listener is not None:
            await listener.close()
    fleet: Fleet | None = memo.get("controller")
    if fleet is not None:
        await fleet.wakes.close()
        for member in fleet.members:
            await member.transport.close()
        await fleet.default.kube.close()
    close_pools()


#: Connections kopf's client keeps open to the apiserver at most, besides one per watch stream.
#: kopf's own session has no limit: a backlog of 10,000 SlurmJobs at start opened a TLS
#: connection per object (each worker patches its object's finalizer at once), and the memory
#: of those connections stayed with the process.
KUBE_CONNECTIONS = 32


@kopf.on.login()
async def login(memo: kopf.Memo, **kwargs: Any) -> kopf.AiohttpSession | None:
    """The pod's ServiceAccount in a cluster, else the kubeconfig (KUBECONFIG), on a session
    with a bounded number of connections."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(
        **kwargs
    ) or kopf.login_with_kubeconfig(**kwargs)
    if info is None:
        return None
    streams = int(memo.get("watch_streams", 1))
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=KUBE_CONNECTIONS + streams, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        auth=info.as_aiohttp_basic_auth(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(
        server=info.server,
        priority=info.priority,
        default_namespace=info.default_namespace,
        expiration=info.expiration,
        aiohttp_session=session,
    )
