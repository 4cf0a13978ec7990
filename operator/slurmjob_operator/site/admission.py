"""The parameters of the chart's admission policy (`gen.admission`): the static rules the
reconciler checks against a SlurmJob, from the tenants file and the settings that feed them,
as one flat map of strings.

The map is what the operator itself read: `slurmjob-operator admission-params` prints it from
the same settings and tenants file (`load_tenants`, the clusters file's names), and the chart
renders the same map from its values (`slurmjob-operator.admissionParams`); a unit test renders
both and compares them. The policy carries it as a CEL map literal (JSON is one), so there is
no parameter object to go missing, and CEL reads each value with `split`.

Keys (every value a string; lists are joined with `", "`, which no name can contain):

* `site/tenancy` (`true`: a tenants file; namespaces of no tenant are refused), `site/clusters`
  (the clusters' names, the default first), `site/maxTotal` (SLURMJOB_MAX_TOTAL_TIME in
  minutes), `site/images` (SLURMJOB_IMAGES_ENABLED), `site/registries`
  (SLURMJOB_IMAGE_REGISTRIES), `site/mpi` (SLURMJOB_MPI_PLUGINS);
* `namespace/<ns>`: the tenant of the namespace;
* `tenant/<t>/<key>`: the tenant's `clusters` (sorted; empty: every cluster), `default`
  (defaultCluster), `queue` (requireQueue), `images` (imageRegistries), `others` (every other
  tenant's mount sources on any cluster, sorted), and its own limits `accounts`, `partitions`,
  `qos`, `mounts` (mountSources, normalised), `maxTime` and `maxTotal` (minutes; empty: unset);
* `tenant/<t>@<cluster>/<key>`: a limit the tenant's section for that cluster gives (empty:
  unset there); a key the section leaves out is the tenant's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from slurmjob_operator.api.spec import parse_time_limit
from slurmjob_operator.config import ConfigError, Settings
from slurmjob_operator.site.clusters import load_clusters
from slurmjob_operator.site.storagepaths import shown
from slurmjob_operator.site.tenantentry import Tenant, TenantLimits
from slurmjob_operator.site.tenants import Tenants, load_tenants

#: How list values are joined (no account, partition, QOS, source, registry or name has it).
SEP = ", "
#: cel-go's limit on an expression's size (code points): the map must fit in one.
MAX_LITERAL = 100_000

# Each limit's key, and the field of `TenantLimits` (and of a cluster section) it renders.
_LIMITS = (
    ("accounts", "accounts"),
    ("partitions", "partitions"),
    ("qos", "qos"),
    ("mounts", "mount_sources"),
    ("maxTime", "max_time_limit"),
    ("maxTotal", "max_total_time"),
)


class ParamsTooLarge(ConfigError):
    """The map does not fit in one CEL expression."""


def _join(values: Iterable[str] | None) -> str:
    return SEP.join(values or ())


def _minutes(value: int | str | None) -> str:
    return "" if value is None else str(parse_time_limit(value))


def _limit(field: str, value: Any) -> str:
    if field in ("max_time_limit", "max_total_time"):
        return _minutes(value)
    return _join(value)


def _tenant(tenant: Tenant, every: Sequence[Tenant]) -> dict[str, str]:
    at = f"tenant/{tenant.name}/"
    others = {shown(s) for t in every if t.name != tenant.name for s in t.every_source_parts}
    out = {
        f"{at}clusters": _join(sorted(tenant.clusters or {})),
        f"{at}default": tenant.default_cluster or "",
        f"{at}queue": "true" if tenant.require_queue else "false",
        f"{at}images": _join(tenant.image_registries),
        f"{at}others": _join(sorted(others)),
    }
    own: TenantLimits = tenant
    for key, field in _LIMITS:
        out[f"{at}{key}"] = _limit(field, getattr(own, field))
    for cluster, section in (tenant.clusters or {}).items():
        given = section.given
        for key, field in _LIMITS:
            if field in given:
                out[f"tenant/{tenant.name}@{cluster}/{key}"] = _limit(field, given[field])
    return out


def admission_params(
    settings: Settings, tenants: Tenants | None, clusters: Sequence[str]
) -> dict[str, str]:
    """The policy's parameters from the settings, the tenants file as written (not a
    `for_cluster` view) and the clusters' names, the default first."""
    out = {
        "site/tenancy": "true" if tenants is not None else "false",
        "site/clusters": _join(clusters),
        "site/maxTotal": _minutes(settings.max_total_time),
        "site/images": "true" if settings.images_enabled else "false",
        "site/registries": _join(settings.allowed_image_registries),
        "site/mpi": _join(settings.allowed_mpi_plugins),
    }
    for tenant in tenants.tenants if tenants is not None else ():
        for namespace in tenant.namespaces:
            out[f"namespace/{namespace}"] = tenant.name
        out.update(_tenant(tenant, tenants.tenants if tenants is not None else ()))
    size = len(literal(out))
    if size > MAX_LITERAL:
        raise ParamsTooLarge(
            f"the admission policy's parameters are {size} characters, more than the "
            f"{MAX_LITERAL} one CEL expression may hold: set admission.enabled=false"
        )
    return out


def literal(params: Mapping[str, str]) -> str:
    """The map as the CEL map literal the policy carries (JSON, keys sorted)."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


def values_snippet(params: Mapping[str, str]) -> dict[str, Any]:
    """The chart values that carry the map (`admission.params`), for tenants the chart cannot
    read (`catalogs.existingConfigMap`)."""
    return {"admission": {"params": dict(sorted(params.items()))}}


def values_yaml(params: Mapping[str, str]) -> str:
    """`values_snippet` as the values file `slurmjob-operator admission-params` prints."""
    return yaml.safe_dump(values_snippet(params), sort_keys=False, width=1000)


def params_from_env() -> dict[str, str]:
    """The map from the settings of the environment (SLURMJOB_*), the clusters file and the
    tenants file, read as the operator reads them at its start."""
    settings = Settings.from_env()
    names = [site.name for site in load_clusters(settings)]
    return admission_params(settings, load_tenants(settings.tenants_file, names), names)
