"""The image cache's parts put together for one cluster's controller."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.config import Settings
from slurmjob_operator.core.absence import Window
from slurmjob_operator.core.finality import is_final
from slurmjob_operator.imagecache.gate import ImageGate
from slurmjob_operator.imagecache.importer import Importer
from slurmjob_operator.imagecache.store import RecordStore
from slurmjob_operator.imagecache.sweeper import CacheSweeper, SizesHook
from slurmjob_operator.kube.ports import ConfigMapLister, ConfigMapStore
from slurmjob_operator.kube.secrets import Secrets
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.servingcert import operator_namespace
from slurmjob_operator.slurm.client import SlurmClient


class ListsSlurmJobs(Protocol):
    async def list_all(self) -> list[dict[str, Any]]: ...


def image_gate(
    settings: Settings,
    store: object,
    slurm_as: Callable[[str | None], Awaitable[SlurmClient]],
    metrics: Metrics | None = None,
) -> ImageGate | None:
    """The cluster's gate (None: images are off here, or the store keeps no ConfigMaps or
    Secrets, as the local runner's files do: an image is then refused with the reason)."""
    if not settings.images_enabled:
        return None
    if not isinstance(store, ConfigMapStore) or not isinstance(store, Secrets):
        return None
    namespace = operator_namespace(settings)
    return ImageGate(
        settings,
        RecordStore(store, namespace),
        _importer(settings, slurm_as),
        store.get_secret,
        namespace,
        metrics=metrics,
    )


def cache_sweeper(
    gate: ImageGate,
    kube: object,
    on_records: SizesHook | None = None,
) -> CacheSweeper | None:
    """The sweep of the gate's cache (None: the client cannot list ConfigMaps and
    SlurmJobs, as the local runner's files cannot)."""
    if not isinstance(kube, ConfigMapLister) or not isinstance(kube, ConfigMapStore):
        return None
    if not callable(getattr(kube, "list_all", None)):
        return None
    lister: ListsSlurmJobs = kube  # type: ignore[assignment]

    async def live() -> frozenset[str]:
        return live_uids(await lister.list_all())

    return CacheSweeper(
        gate.settings,
        gate.store,
        kube,
        gate.importer,
        operator_namespace(gate.settings),
        live,
        on_records,
    )


def live_uids(bodies: list[dict[str, Any]]) -> frozenset[str]:
    """The uids of the SlurmJobs that are not final (`core.finality`); a deleted one is
    not listed at all."""
    return frozenset(
        view.ref.uid for view in map(ResourceView.of, bodies) if not is_final(view.status)
    )


def _importer(
    settings: Settings, slurm_as: Callable[[str | None], Awaitable[SlurmClient]]
) -> Importer:
    window = Window(
        settings.slurm_rest_timeout, settings.slurm_message_timeout, settings.absence_margin
    )
    return Importer(settings, slurm_as, window)
