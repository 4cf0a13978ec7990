"""From a validated spec to a staged, submittable attempt: site resolution, rendering, the
version's submit body and the preflight checks, in the one order every caller uses."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.api.spec import SlurmJobSpec, parse_time_limit
from slurmjob_operator.api.status import Attempt
from slurmjob_operator.config import ConfigError, Settings
from slurmjob_operator.core.claims import ChainSpent, chain_room
from slurmjob_operator.core.limits import PartitionUnavailable, Snapshot
from slurmjob_operator.core.probe import (
    ProbeKeys,
    ProbeLookup,
    ProbePlan,
    probe_keys,
)
from slurmjob_operator.core.segments import (
    SegmentPlan,
    SegmentRefused,
    SegmentTimeUnknown,
    chain_limit,
    check_total,
    partition_time,
    plan_segment,
    segment_minutes,
)
from slurmjob_operator.site.artifacts import (
    Artifact,
    CachedImage,
    VerifiedArtifact,
    artifact_path,
    verify_artifact,
    verify_recorded,
)
from slurmjob_operator.site.catalogwatch import CatalogWatch
from slurmjob_operator.site.clusters import cluster_names, load_clusters
from slurmjob_operator.site.preflight import check_rendered
from slurmjob_operator.site.probe import probe_runs
from slurmjob_operator.site.render import RenderContext, RenderedAttempt, render_attempt
from slurmjob_operator.site.resolve import SiteResolution, resolve_site
from slurmjob_operator.site.tenantentry import Tenant
from slurmjob_operator.site.tenants import (
    Tenants,
    TenantScope,
    check_against_registry,
    load_tenants,
)
from slurmjob_operator.slurm.dialects import dialect_for
from slurmjob_operator.storage import checkpoint
from slurmjob_operator.storage.acl import AclError, require_supported
from slurmjob_operator.storage.staging import stage_attempt

#: Used by `render` when no resource exists yet: the uid only shapes names and paths.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Site:
    """The site's settings, its tenants (read once) and its catalogs (re-read while the
    operator runs: `catalogs.current` is the copy in use)."""

    settings: Settings
    catalogs: CatalogWatch
    tenants: Tenants | None = None
    """The tenants file; None: single-tenant (every namespace's jobs are taken)."""

    @classmethod
    def load(cls, settings: Settings, clusters: Sequence[str] | None = None) -> Site:
        """The site as the part for cluster `settings.cluster_name` sees it: the tenants'
        limits and users on that cluster. `clusters`: every cluster's name, which the
        tenants file may use (None: that one alone)."""
        catalogs = CatalogWatch.load(settings)
        try:
            parse_time_limit(settings.max_total_time)
        except ValueError as exc:
            raise ConfigError(f"SLURMJOB_MAX_TOTAL_TIME: {exc}") from None
        known = list(clusters) if clusters is not None else [settings.cluster_name]
        tenants = load_tenants(settings.tenants_file, clusters=known)
        if tenants is not None and settings.tenants_file is not None:
            # Every registry, the one read now and each edit after it, against all tenants.
            every, path = tenants, settings.tenants_file
            catalogs.require(lambda registry: check_against_registry(every, registry, path))
            tenants = tenants.for_cluster(settings.cluster_name)
        return cls(settings=settings, catalogs=catalogs, tenants=tenants)

    def scope(self, namespace: str) -> TenantScope | None:
        """The tenant of the namespace (None when single-tenant); `TenantUnknown` when tenancy
        is on and the namespace belongs to no tenant."""
        return self.tenants.scope(namespace) if self.tenants is not None else None

    def tenant_of(self, namespace: str) -> Tenant | None:
        """The tenant of the namespace; None when single-tenant or when no tenant lists it
        (its jobs, if any, predate the tenants file and are the operator's own)."""
        return self.tenants.get(namespace) if self.tenants is not None else None

    def tenant_name(self, namespace: str) -> str | None:
        """The name of the namespace's tenant (`tenant_of`); what the archive's shares go by."""
        tenant = self.tenant_of(namespace)
        return tenant.name if tenant is not None else None

    def slurm_user(self, namespace: str) -> str | None:
        """The Slurm user the namespace's jobs are submitted, cancelled, held and released
        as; None: the operator's own."""
        tenant = self.tenant_of(namespace)
        return tenant.slurm_user if tenant is not None else None

    def job_uid(self, namespace: str) -> int | None:
        """The uid the namespace's jobs run as when their files are shared through ACLs (the
        tenant's `uid`); None: the job user of the settings (`nofollow.job_owner`)."""
        tenant = self.tenant_of(namespace)
        return tenant.uid if tenant is not None else None

    @property
    def slurm_users(self) -> frozenset[str]:
        """Every tenant's `slurmUser`, and the image cache's user where images are enabled
        or artifacts verified: the only users the operator acts as besides its own."""
        uses_cache = self.settings.images_enabled or self.settings.artifact_verify_jobs
        cache = self.settings.image_cache_user if uses_cache else None
        extra = frozenset({cache}) if cache is not None else frozenset()
        if self.tenants is None:
            return extra
        own = (t.slurm_user for t in self.tenants.tenants if t.slurm_user is not None)
        return frozenset(own) | extra

    def check_tenant_users(self) -> None:
        """Refuse (ConfigError) what would make a tenant's jobs fail one by one: a `slurmUser`
        the operator cannot mint tokens for, a `uid` on a storage root without POSIX ACLs.
        Blocking (a probe directory on the storage root)."""
        if self.tenants is None:
            return
        own = [t for t in self.tenants.tenants if t.slurm_user is not None]
        if own and self.settings.slurm_jwt_key_file is None:
            names = ", ".join(f"{t.name} (slurmUser {t.slurm_user})" for t in own)
            raise ConfigError(
                f"SLURMJOB_SLURM_JWT_KEY_FILE: required by tenant(s) {names} of "
                f"{self.settings.tenants_file}: their jobs are submitted as their own Slurm "
                "user, with tokens minted for it (a token file carries one user's token only)"
            )
        with_uid = [t.name for t in self.tenants.tenants if t.uid is not None]
        if with_uid:
            try:
                require_supported(self.settings.storage_root)
            except AclError as exc:
                raise ConfigError(
                    f"SLURMJOB_STORAGE_ROOT: tenant(s) {', '.join(with_uid)} have a uid, so "
                    f"their attempt files are shared through POSIX ACLs, but {exc.strerror}"
                ) from exc


@dataclass(frozen=True)
class PreparedAttempt:
    """One attempt, rendered and checked; nothing staged or sent yet."""

    rendered: RenderedAttempt
    resolution: SiteResolution
    body: dict[str, Any]
    api_version: str
    probe_keys: ProbeKeys | None = None
    """Where this attempt's probe outcome is remembered (None: it has no probe)."""
    probe_plan: ProbePlan | None = None
    segment: SegmentPlan | None = None
    """The walltime segment this attempt runs (None: no spec.walltime)."""
    artifact: Artifact | None = None
    """What the job runs: the registry's artifact (hashed, or verified once) or a cache entry."""


def _probe_keys(
    spec: SlurmJobSpec, site: Site, resolution: SiteResolution, namespace: str
) -> ProbeKeys | None:
    """The job's probe keys (None: it gets no probe), from the namespace, the tenant entry the
    site resolved for it, this cluster and what the spec resolved to; never from a status."""
    if resolution.runtime is None or not probe_runs(spec, resolution.runtime):
        return None
    tenant = resolution.tenant
    series = ",".join(sorted({s.name for s in resolution.series.values() if s is not None}))
    probe = resolution.runtime.probe
    assert probe is not None  # probe_runs
    # The cache holds a rung's index: a changed program or ladder is a new key.
    ladder = probe.model_dump_json()
    runtime = f"{resolution.runtime.sha256}/{hashlib.sha256(ladder.encode()).hexdigest()}"
    return probe_keys(
        namespace,
        tenant.name if tenant is not None else None,
        tenant is not None and (tenant.slurm_user is not None or tenant.uid is not None),
        (site.settings.cluster_name, resolution.partition),
        runtime,
        series,
        probe.rungs,
    )


def _probe(
    spec: SlurmJobSpec,
    site: Site,
    resolution: SiteResolution,
    namespace: str,
    api_version: str,
    probes: ProbeLookup | None,
) -> tuple[ProbeKeys | None, ProbePlan | None]:
    """The attempt's probe keys and plan: the cache's rung, the tenant's avoided nodes (only
    where the API version can exclude nodes)."""
    keys = _probe_keys(spec, site, resolution, namespace) if probes is not None else None
    if probes is None or keys is None:
        return None, None
    exclude = probes.avoided(keys.avoid) if dialect_for(api_version).supports_exclusion else ()
    cached = probes.cached_rung(keys.cache)
    if cached is not None and cached >= keys.ladder:
        cached = None  # not a rung of this ladder: probe again
    return keys, ProbePlan(cached, exclude)


def probe_keys_of(
    spec: SlurmJobSpec, site: Site, namespace: str, placed: str | None = None
) -> ProbeKeys | None:
    """The probe keys of a submitted job, made again when its record is remembered, as the
    submit made them: `placed` is the partition Kueue's flavors chose (the spec naming none).
    None when the spec no longer resolves on this site (the tenant or runtime changed) or
    gets no probe: then nothing is remembered."""
    if placed is not None and spec.partition is None:
        spec = spec.model_copy(update={"partition": placed})
    catalogs = site.catalogs.current
    try:
        resolution = resolve_site(
            spec, site.settings, catalogs.registry, catalogs.gpu_series, site.scope(namespace)
        )
    except SpecError:  # TenantUnknown too
        return None
    return _probe_keys(resolution.applied_to(spec), site, resolution, namespace)


def _segment(
    spec: SlurmJobSpec,
    site: Site,
    resolution: SiteResolution,
    namespace: str,
    attempts: Sequence[Attempt],
    snapshot: Snapshot | None,
    number: int,
) -> SegmentPlan | None:
    """The next walltime segment: SpecError when its time cannot be had on this partition and
    tenant, PartitionUnavailable (wait) when the MaxTime it derives from cannot be read,
    ChainSpent when the chain, counted from what the operator verified, is spent."""
    if spec.walltime is None:
        return None
    scope = site.scope(namespace)
    tenant_max = scope.limits.max_time_minutes if scope is not None else None
    tenant = scope.tenant.name if scope is not None else None
    site_max = parse_time_limit(site.settings.max_total_time)
    limit = chain_limit(
        site_max, scope.limits.max_total_minutes if scope is not None else None, tenant
    )
    try:
        check_total(spec.walltime, limit)
        full = segment_minutes(
            spec.walltime, partition_time(resolution.partition, snapshot), tenant_max, tenant
        )
    except SegmentRefused as exc:
        raise SpecError([str(exc)]) from None
    except SegmentTimeUnknown as exc:
        raise PartitionUnavailable(str(exc)) from None
    room = chain_room(spec.walltime, attempts, number, full, limit)
    if isinstance(room, str):
        raise ChainSpent(room)
    return plan_segment(spec.walltime, attempts, min(full, room))


def prepare_attempt(
    spec: SlurmJobSpec,
    site: Site,
    *,
    namespace: str,
    name: str,
    uid: str,
    attempt: int,
    api_version: str,
    secret_values: Mapping[str, str],
    array_indices: Sequence[int] | None = None,
    probes: ProbeLookup | None = None,
    attempts: Sequence[Attempt] = (),
    snapshot: Snapshot | None = None,
    image: CachedImage | VerifiedArtifact | None = None,
) -> PreparedAttempt:
    """Resolve, render, build the submit body and run the preflight checks. `image` is the
    image-cache entry a spec.framework.image runs (the cache's record, made ready before), or
    the runtimeId's artifact as its verification job recorded it (SLURMJOB_ARTIFACT_VERIFY_JOBS).

    Raises SpecError (the spec does not fit the site or its tenant's limits; TenantUnknown,
    a SpecError, when the namespace belongs to no tenant), RenderError or PreflightError; a
    failure here means nothing may be submitted.
    """
    # One copy of the catalogs for the whole attempt: a re-read swaps it, never half of it.
    catalogs = site.catalogs.current
    resolution = resolve_site(
        spec, site.settings, catalogs.registry, catalogs.gpu_series, site.scope(namespace)
    )
    # The tenant's defaults (account, QOS, time limit) are rendered as if the spec said them.
    spec = resolution.applied_to(spec)
    keys, plan = _probe(spec, site, resolution, namespace, api_version, probes)
    segment = _segment(spec, site, resolution, namespace, attempts, snapshot, attempt)
    artifact = image if image is not None else resolution.runtime
    if artifact is None:
        raise SpecError(["spec.framework.image: the image cache has no entry for it yet"])
    ctx = RenderContext(
        namespace=namespace,
        name=name,
        uid=uid,
        attempt=attempt,
        artifact=artifact,
        gpu_series=resolution.series,
        exclusive=resolution.exclusive,
        partition=resolution.partition,
        settings=site.settings,
        secret_values=secret_values,
        array_indices=tuple(array_indices) if array_indices is not None else None,
        probe=plan,
        segment=segment,
    )
    rendered = render_attempt(spec, ctx)
    body = dialect_for(api_version).submit_body(rendered.launch)
    check_rendered(rendered, secret_values, json.dumps(body))
    return PreparedAttempt(rendered, resolution, body, api_version, keys, plan, segment, artifact)


def verify_runtime(prepared: PreparedAttempt, settings: Settings) -> None:
    """The runtime artifact's magic and sha256, or a cache entry or verified artifact against
    its job's record (ArtifactError when wrong: never submitted). Blocking: may hash GBs."""
    artifact = prepared.artifact
    if isinstance(artifact, CachedImage | VerifiedArtifact):
        verify_recorded(artifact)
    elif artifact is not None:
        verify_artifact(artifact_path(settings, artifact), artifact)


def stage(prepared: PreparedAttempt, settings: Settings) -> None:
    """Write the attempt's files (blocking); `job.sh` is written last, so its presence proves
    the staging finished (and its absence that no submit of this attempt was ever sent).

    A tenant with a `uid` gets its files through ACLs (the operator keeps them: no CAP_CHOWN),
    whatever SLURMJOB_STAGING_OWNER says; the other jobs are handed to that owner, if any."""
    tenant = prepared.resolution.tenant
    rendered = prepared.rendered
    job_uid = tenant.uid if tenant is not None else None
    if job_uid is not None:
        stage_attempt(settings, rendered.staging_dir, rendered.files, job_uid=job_uid)
    else:  # the staging owner of the settings, if any
        stage_attempt(settings, rendered.staging_dir, rendered.files)
    if prepared.segment is not None:  # beside the attempt directory, in the resource's
        checkpoint.make(settings, rendered.staging_dir.parent, job_uid=job_uid)


def render_manifest(
    manifest: Mapping[str, Any],
    *,
    api_version: str,
    uid: str | None = None,
    attempt: int = 1,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """The submit body for a SlurmJob manifest (what `slurmjob-operator render` prints).

    Secret values cannot be read here (no cluster), so each is a placeholder: they only ever
    reach the attempt's secrets file, never the body.
    """
    settings = settings or Settings.from_env()
    spec = parse_spec(manifest.get("spec"))
    meta = manifest.get("metadata") or {}
    # With several clusters, as the cluster the operator would send it to renders it.
    sites = load_clusters(settings)
    clusters = cluster_names(sites, settings.cluster_name)
    first = Site.load(sites[0].settings, clusters.names)
    namespace = str(meta.get("namespace") or "default")
    tenant_default = first.tenants.default_cluster(namespace) if first.tenants else None
    wanted = clusters.choose(spec.cluster, tenant_default)
    refused = clusters.refusal(spec.cluster, wanted)
    if refused is not None:
        raise SpecError([refused])
    chosen = next(s for s in sites if s.name == wanted)
    site = first if chosen is sites[0] else Site.load(chosen.settings, clusters.names)
    secrets = {e.name: f"<secret {e.name}>" for e in spec.secret_env}
    prepared = prepare_attempt(
        spec,
        site,
        namespace=namespace,
        name=str(meta.get("name") or "unnamed"),
        uid=uid or str(meta.get("uid") or PLACEHOLDER_UID),
        attempt=attempt,
        api_version=api_version,
        secret_values=secrets,
    )
    return prepared.body
