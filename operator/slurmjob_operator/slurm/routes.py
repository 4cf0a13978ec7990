"""The client's request table: every slurmrestd endpoint `SlurmClient` calls, by operation.

The mutating operations are derived from it, not listed by hand: every POST and DELETE but
the submit. `SlurmClient` sends each of those only with `core.verified` handles for the
jobs it changes, checked at run time (`core.verified.vouch`), so an operation added to the
table later is guarded the moment it is added.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Route:
    """`method` on `path` below `/slurm/<version>` (or `/slurmdb/<version>` when `db`);
    `{job_id}` in `path` is the job reference."""

    method: str
    path: str
    db: bool = False

    def template(self, version: str) -> str:
        return f"/{'slurmdb' if self.db else 'slurm'}/{version}{self.path}"


ROUTES: Mapping[str, Route] = MappingProxyType(
    {
        "ping": Route("GET", "/ping"),
        "submit": Route("POST", "/job/submit"),
        "get_job": Route("GET", "/job/{job_id}"),
        "list_jobs": Route("GET", "/jobs"),
        "jobs_state": Route("GET", "/jobs/state"),
        "accounting_jobs": Route("GET", "/jobs", db=True),
        "get_job_accounting": Route("GET", "/job/{job_id}", db=True),
        "hold": Route("POST", "/job/{job_id}"),
        "set_dependency": Route("POST", "/job/{job_id}"),
        "cancel": Route("DELETE", "/job/{job_id}"),
        "cancel_many": Route("DELETE", "/jobs"),
        "diag": Route("GET", "/diag"),
        "partitions": Route("GET", "/partitions"),
        "conf": Route("GET", "/conf"),
        "accounts": Route("GET", "/accounts/", db=True),
        "qos": Route("GET", "/qos/", db=True),
        "nodes": Route("GET", "/nodes"),
    }
)

#: The operations that change a job: each needs a verified handle for every job it changes.
MUTATING: frozenset[str] = frozenset(
    name
    for name, route in ROUTES.items()
    if route.method in ("POST", "DELETE") and name != "submit"
)
