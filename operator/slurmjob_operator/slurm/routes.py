"""The client's request table: every slurmrestd endpoint `SlurmClient` calls, by operation.

The mutating operations are derived from it, not listed by hand: every POST and DELETE but
the submit. `SlurmClient` sends each of those only with `core.verified` handles for the
jobs it changes, checked at run time (`core.verified.vouch`), so an operation added to the
table later is guarded the moment it is added.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import quote

from slurmjob_operator.core.verified import NotVerified, VerifiedJob, vouch
from slurmjob_operator.slurm.exchange import Answer, Requester


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


class Routes:
    """The table's requests for one client: its version, and the user it acts as (asked per
    request: a token file may name another user once rotated)."""

    def __init__(self, rest: Requester, version: str, acting: Callable[[], str | None]) -> None:
        self._rest = rest
        self._version = version
        self._acting = acting

    def template(self, operation: str) -> str:
        return ROUTES[operation].template(self._version)

    def vouch(self, operation: str, changes: Sequence[VerifiedJob]) -> None:
        """A mutating operation changes only live handles owned by the user the client acts
        as (checked before anything of them is read, and again as the request goes out)."""
        if operation not in MUTATING:
            return
        if not changes:
            raise NotVerified(f"{operation}: no verified job given")
        acting = self._acting()
        for job in changes:
            vouch(job, acting)

    async def send(
        self,
        operation: str,
        *,
        ref: str | None = None,
        changes: Sequence[VerifiedJob] = (),
        params: Sequence[tuple[str, str]] | None = None,
        body: Mapping[str, Any] | None = None,
        submit: bool = False,
        allow_304: bool = False,
        allow_empty: bool = False,
    ) -> Answer:
        """One request of the table; `ref` fills `{job_id}`."""
        self.vouch(operation, changes)
        route = ROUTES[operation]
        template = route.template(self._version)
        path = template if ref is None else template.replace("{job_id}", quote(ref, safe=""))
        return await self._rest.call(
            route.method,
            template,
            path,
            params=params,
            body=body,
            submit=submit,
            allow_304=allow_304,
            allow_empty=allow_empty,
        )
