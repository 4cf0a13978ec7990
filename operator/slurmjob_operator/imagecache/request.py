"""What a SlurmJob's `spec.framework.image` asks of the cache: its reference, parsed and
matched against the registries its tenant lists, in the scope its entry belongs to (the
tenant's own when the import uses the tenant's credentials, else shared) and the format of
the cluster's runtime. From the spec and the tenants file only, never from a status."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurmjob_operator.imagecache.layout import record_key, scope_word
from slurmjob_operator.imagecache.record import ImageRecord
from slurmjob_operator.imagecache.reference import ImageReference, parse_reference
from slurmjob_operator.site.catalogs import ArtifactFormat


class ImageRefused(ValueError):
    """A SlurmJob may not use this image here; the message says why."""


@dataclass(frozen=True)
class ImageRequest:
    """What a SlurmJob asks for: a reference in a scope, in its runtime's format."""

    scope: str
    reference: ImageReference
    format: ArtifactFormat
    #: Whose share of the cache the entry counts in: the asking tenant's scope (a shared
    #: entry too, so one tenant's anonymous pulls cannot flush another's), None without
    #: tenants. From the tenants file, never from a status.
    charged: str | None = None

    @property
    def key(self) -> str:
        return record_key(self.scope, self.reference)


def image_scope(tenant: str | None, with_credentials: bool) -> str:
    """Whose entry an import makes: the tenant's when it pulls with the tenant's
    credentials, else shared."""
    if with_credentials and tenant is None:
        raise ValueError("a pull with credentials belongs to a tenant")
    return scope_word(tenant if with_credentials else None)


def image_request(
    image: str,
    *,
    tenant: str | None,
    allowed_registries: Sequence[str],
    with_credentials: bool,
    fmt: ArtifactFormat,
) -> ImageRequest:
    """The request for a SlurmJob's `spec.framework.image`, from the spec and the tenants
    file only; `ImageReferenceError` or `ImageRefused` when it may not be used."""
    reference = parse_reference(image)
    if not reference.matches_registry(allowed_registries):
        raise ImageRefused(
            f"image {reference.canonical}: registry {reference.registry} (with this path) is "
            "not among the registries listed for the tenant"
        )
    charged = scope_word(tenant) if tenant is not None else None
    return ImageRequest(image_scope(tenant, with_credentials), reference, fmt, charged)


def may_use(record: ImageRecord, tenant: str | None, allowed_registries: Sequence[str]) -> str:
    """Why a SlurmJob of `tenant` (from the tenants file, never from a status) may not use
    `record`, or '' when it may: shared entries serve every tenant that lists the registry,
    a tenant's entries only that tenant."""
    reference = record.parsed_reference
    if not reference.matches_registry(allowed_registries):
        return f"{reference.canonical}: the tenant does not list registry {reference.registry}"
    owner = record.tenant
    if owner is not None and owner != tenant:
        return f"{reference.canonical}: the cache entry {record.key} is another tenant's"
    return ""
