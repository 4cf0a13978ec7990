"""The checks after the submit slot, in order, before the attempt is recorded: nothing is
staged or sent until every one passed. Each raises one of `sender.PREPARE_ERRORS`, which the
sender classifies (`core.decisions.FAILURES` says what it becomes) and writes once.

1. tenancy: a namespace of no tenant gets nothing done for it, not even a Secret read;
2. the spec: one that does not parse is refused with its errors by field;
3. the cluster: a spec.cluster the tenant may not use, or this cluster is not;
4. Kueue's placement: where Kueue counted the quota is where the job runs;
5. the image, for a spec.framework.image: refused where the site or the tenant does not
   allow it, waited for while the image cache imports it (imagecache/gate.py); for a
   runtimeId where the site verifies registry artifacts, waited for while a job of the cache
   user verifies it (imagecache/verifygate.py);
6. the Secret values the environment names (read in the resource's own namespace only);
7. render and the script checks (`site.render`, `site.preflight`);
8. the cluster's limits (judged again on a fresh read before anything is refused);
9. the runtime artifact, or the image-cache entry against its import's record;
10. the staging tree: the directories on the way to the attempt's must be the operator's (or
   the staging owner's) and take a new entry, else StagingNotWritable before any record.

A new check is a method here and a line in `ORDER`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.limits import LimitsCache
from slurmjob_operator.controller.pipeline import (
    PreparedAttempt,
    Site,
    prepare_attempt,
    verify_runtime,
)
from slurmjob_operator.controller.probebook import ProbeBook
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.core.kueue import Verdict as Admitted
from slurmjob_operator.core.limits import check, enforce
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.imagecache.gate import FIELD, ImageGate, ImageNotReady, requested_image
from slurmjob_operator.imagecache.verifygate import ArtifactGate, ArtifactNotVerified
from slurmjob_operator.site.artifacts import (
    ArtifactChanged,
    ArtifactError,
    CachedImage,
    VerifiedArtifact,
)
from slurmjob_operator.site.resolve import resolve_site
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.storage.stagingtree import check_tree


@dataclass
class Preparing:
    """An attempt on its way through the checks, and what each found for the next."""

    view: ResourceView
    number: int
    indices: list[int] | None
    admitted: Admitted | None
    spec: SlurmJobSpec | None = None
    secrets: dict[str, str] = field(default_factory=dict)
    client: SlurmClient | None = None
    prepared: PreparedAttempt | None = None
    image: CachedImage | None = None
    verified: VerifiedArtifact | None = None


class Checks:
    def __init__(
        self,
        settings: Settings,
        site: Site,
        edge: ResourceEdge,
        slurm: Callable[[], Awaitable[SlurmClient]],
        clusters: Clusters,
        limits: LimitsCache,
    ) -> None:
        self.cluster = settings.cluster_name
        self.settings = settings
        self.site = site
        self.edge = edge
        self.slurm = slurm
        self.clusters = clusters
        self.limits = limits
        #: The probe cache and avoid lists (None: not kept; every probe runs, nothing excluded).
        self.probes: ProbeBook | None = None
        #: The image cache's gate (None: images are not enabled here; an image is refused).
        self.images: ImageGate | None = None
        #: The registry artifacts' verification (None: every job's node hashes in full).
        self.artifacts: ArtifactGate | None = None

    def order(self) -> tuple[Callable[[Preparing], Awaitable[None]], ...]:
        return (
            self.tenancy,
            self.the_spec,
            self.the_cluster,
            self.placement,
            self.image,
            self.verified_artifact,
            self.secret_values,
            self.render,
            self.cluster_limits,
            self.runtime,
            self.staging_tree,
        )

    async def run(self, preparing: Preparing) -> PreparedAttempt:
        for step in self.order():
            await step(preparing)
        assert preparing.prepared is not None
        return preparing.prepared

    async def tenancy(self, p: Preparing) -> None:
        if self.site.tenants is not None:
            self.site.tenants.scope(p.view.ref.namespace)

    async def the_spec(self, p: Preparing) -> None:
        if p.view.spec is None:
            assert p.view.spec_error is not None
            raise p.view.spec_error
        p.spec = p.view.spec

    async def the_cluster(self, p: Preparing) -> None:
        assert p.spec is not None
        refused = self.clusters.refusal(p.spec.cluster, self.cluster)
        if refused is not None:
            raise SpecError([refused])

    async def placement(self, p: Preparing) -> None:
        # The tenant's partitions and the cluster's limits are checked on it below.
        assert p.spec is not None
        if p.admitted is None:
            return
        if p.admitted.refusal is not None:
            raise SpecError([p.admitted.refusal])
        if p.admitted.partition is not None:
            p.spec = p.spec.model_copy(update={"partition": p.admitted.partition})

    async def image(self, p: Preparing) -> None:
        assert p.spec is not None
        if p.spec.framework.image is None:
            return
        scope = self.site.scope(p.view.ref.namespace)
        if self.images is None:
            requested_image(self.settings, p.spec, scope)  # refuses, naming the setting
            raise SpecError([f"{FIELD}: the image cache is not running here"])
        p.image = await self.images.entry_for(p.spec, scope, p.view.ref.uid)

    async def verified_artifact(self, p: Preparing) -> None:
        assert p.spec is not None
        if self.artifacts is None or p.spec.framework.runtime_id is None:
            return
        # The registry's artifact as render resolves it (the tenant's runtimes included): a
        # spec refused there is refused here, before a verification job is spent on it.
        catalogs = self.site.catalogs.current
        scope = self.site.scope(p.view.ref.namespace)
        resolution = resolve_site(
            p.spec, self.settings, catalogs.registry, catalogs.gpu_series, scope
        )
        if resolution.runtime is not None:
            p.verified = await self.artifacts.verified(resolution.runtime)

    async def secret_values(self, p: Preparing) -> None:
        p.secrets = await self.edge.secret_values(p.view)

    async def render(self, p: Preparing) -> None:
        assert p.spec is not None
        p.client = await self.slurm()
        ref = p.view.ref
        if self.probes is not None:
            await self.probes.refresh()  # from memory, read again only when it is old
        # A walltime segment's length may derive from the partition's MaxTime: read as a
        # refusal is (a recent read, or none), since a MaxTime unlimited refuses the spec.
        walltime = p.spec.walltime
        derived = walltime is not None and walltime.segment_time is None
        snapshot = await self.limits.snapshot(fresh=True) if derived else None
        p.prepared = await asyncio.to_thread(
            prepare_attempt,
            p.spec,
            self.site,
            namespace=ref.namespace,
            name=ref.name,
            uid=ref.uid,
            attempt=p.number,
            api_version=p.client.version,
            secret_values=p.secrets,
            array_indices=p.indices,
            probes=self.probes,
            attempts=p.view.status.attempts,
            snapshot=snapshot,
            image=p.image if p.image is not None else p.verified,
        )
        verified = p.verified
        if verified is not None and p.prepared.resolution.runtime != verified.runtime:
            # The registry was re-read since the verification: the next pass verifies anew.
            raise ArtifactNotVerified(f"runtime {verified.id} changed in the runtime registry")

    async def cluster_limits(self, p: Preparing) -> None:
        # A request that cannot fit the cluster is refused with nothing staged or to adopt.
        assert p.spec is not None
        assert p.prepared is not None
        snapshot = await self.limits.snapshot()
        if snapshot is None:
            return
        names = [pool.name for pool in p.spec.pools]
        launch = p.prepared.rendered.launch
        if not check(launch, snapshot, names).ok:
            # Judged again on what the cluster says now, before anything is refused.
            snapshot = await self.limits.snapshot(fresh=True)
            if snapshot is not None:
                plain = launch.model_copy(update={"excluded_nodes": ()})
                whole = check(plain, snapshot, names) if launch.excluded_nodes else None
                enforce(check(launch, snapshot, names), whole)

    async def runtime(self, p: Preparing) -> None:
        assert p.prepared is not None
        try:
            await asyncio.to_thread(verify_runtime, p.prepared, self.settings)
        except ArtifactError as exc:
            artifact = p.prepared.artifact
            if isinstance(artifact, VerifiedArtifact) and isinstance(exc, ArtifactChanged):
                # Changed since its verification: the next pass sees it and verifies it anew.
                raise ArtifactNotVerified(f"runtime {artifact.id}: {exc}; verified again") from exc
            if not isinstance(artifact, CachedImage) or self.images is None:
                raise
            # A cache entry gone or changed (evicted, deleted by hand): imported again.
            assert p.spec is not None
            scope = self.site.scope(p.view.ref.namespace)
            where = str(artifact.node_path)
            await self.images.forget(p.spec, scope, p.view.ref.uid, where, str(exc))
            raise ImageNotReady(f"{artifact.id}: {exc}; imported again") from exc

    async def staging_tree(self, p: Preparing) -> None:
        assert p.prepared is not None
        tenant = p.prepared.resolution.tenant
        await asyncio.to_thread(
            check_tree,
            self.settings,
            p.prepared.rendered.staging_dir,
            job_uid=tenant.uid if tenant is not None else None,
        )
