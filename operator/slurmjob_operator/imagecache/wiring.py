"""The image cache's parts put together for one cluster's controller."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from slurmjob_operator.config import Settings
from slurmjob_operator.core.absence import Window
from slurmjob_operator.imagecache.gate import ImageGate
from slurmjob_operator.imagecache.importer import Importer
from slurmjob_operator.imagecache.store import RecordStore
from slurmjob_operator.kube.ports import ConfigMapStore
from slurmjob_operator.kube.secrets import Secrets
from slurmjob_operator.servingcert import operator_namespace
from slurmjob_operator.slurm.client import SlurmClient


def image_gate(
    settings: Settings,
    store: object,
    slurm_as: Callable[[str | None], Awaitable[SlurmClient]],
) -> ImageGate | None:
    """The cluster's gate (None: images are off here, or the store keeps no ConfigMaps or
    Secrets, as the local runner's files do: an image is then refused with the reason)."""
    if not settings.images_enabled:
        return None
    if not isinstance(store, ConfigMapStore) or not isinstance(store, Secrets):
        return None
    namespace = operator_namespace(settings)
    window = Window(
        settings.slurm_rest_timeout, settings.slurm_message_timeout, settings.absence_margin
    )
    return ImageGate(
        settings,
        RecordStore(store, namespace),
        Importer(settings, slurm_as, window),
        store.get_secret,
        namespace,
    )
