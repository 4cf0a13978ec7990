"""Which REST API version to speak to a slurmrestd, and whether it serves accounting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmjob_operator.slurm.auth import TokenProvider
from slurmjob_operator.slurm.dialects import parse_envelope
from slurmjob_operator.slurm.errors import SlurmAuthError, SlurmUnsupported, classify
from slurmjob_operator.slurm.exchange import auth_headers, exchange
from slurmjob_operator.slurm.http import HttpTransport
from slurmjob_operator.versions import SUPPORTED_VERSIONS, version_key


def served_versions(openapi: Mapping[str, Any]) -> set[str]:
    """REST API versions with at least one `/slurm/vX/` path in an OpenAPI document."""
    paths = openapi.get("paths")
    found: set[str] = set()
    if isinstance(paths, Mapping):
        for path in paths:
            parts = str(path).split("/")
            if len(parts) > 2 and parts[1] == "slurm" and parts[2].startswith("v"):
                found.add(parts[2])
    return found


def pick_version(
    openapi: Mapping[str, Any], supported: Sequence[str] = SUPPORTED_VERSIONS
) -> str | None:
    """The newest supported version the document serves, or None."""
    usable = served_versions(openapi) & set(supported)
    return max(usable, key=version_key) if usable else None


@dataclass(frozen=True)
class Discovery:
    """What a slurmrestd serves: the chosen version, every served one, and whether the
    accounting (`/slurmdb/`) paths of that version exist (None: not known, no document)."""

    version: str
    served: frozenset[str]
    accounting: bool | None


def _serves_accounting(openapi: Mapping[str, Any], version: str) -> bool:
    paths = openapi.get("paths")
    prefix = f"/slurmdb/{version}/"
    return isinstance(paths, Mapping) and any(str(p).startswith(prefix) for p in paths)


async def discover(
    transport: HttpTransport,
    base_url: str,
    *,
    token: TokenProvider | None = None,
    user: str | None = None,
    request_timeout: float = 30.0,
    supported: Sequence[str] = SUPPORTED_VERSIONS,
    wanted: str | None = None,
) -> Discovery:
    """The newest REST API version in `supported` that the server serves (or check that
    `wanted` is served), from `/openapi/v3` (then `/openapi.json`).

    Without a document, probes `GET /slurm/vX/ping` newest first, moving on at 404. Slurm
    22.05 wants both auth headers even for the OpenAPI document, so pass them. Probing the
    `/slurmdb/` paths instead is no option: 26.05 answers an unserved one with two HTTP
    responses on one connection (see `slurm.http`).
    """
    base = base_url.rstrip("/")
    candidates = [wanted] if wanted else list(supported)
    for path in ("/openapi/v3", "/openapi.json"):
        status, payload, _ = await exchange(
            transport,
            "GET",
            base + path,
            template=path,
            headers=auth_headers(token, user),
            request_timeout=request_timeout,
        )
        if status == 401:
            raise SlurmAuthError(
                "authentication refused", status=status, endpoint=path, method="GET"
            )
        if status == 200 and isinstance(payload, Mapping) and "paths" in payload:
            served = served_versions(payload)
            chosen = pick_version(payload, candidates)
            if chosen is None:
                listed = ", ".join(sorted(served, key=version_key)) or "none"
                raise SlurmUnsupported(
                    f"server serves REST API versions {listed}; "
                    f"{'not ' + wanted if wanted else 'none of them is supported'}"
                )
            return Discovery(chosen, frozenset(served), _serves_accounting(payload, chosen))
    for version in sorted(candidates, key=version_key, reverse=True):
        template = f"/slurm/{version}/ping"
        status, payload, text = await exchange(
            transport,
            "GET",
            base + template,
            template=template,
            headers=auth_headers(token, user),
            request_timeout=request_timeout,
        )
        env = parse_envelope(payload)
        error = classify(
            status,
            env.errors,
            json_body=isinstance(payload, Mapping),
            text=text,
            endpoint=template,
            method="GET",
        )
        if error is None:
            return Discovery(version, frozenset({version}), None)
        if isinstance(error, SlurmUnsupported):
            continue
        raise error
    raise SlurmUnsupported(f"slurmrestd at {base_url} serves none of {', '.join(candidates)}")


async def discover_version(
    transport: HttpTransport,
    base_url: str,
    *,
    token: TokenProvider | None = None,
    user: str | None = None,
    request_timeout: float = 30.0,
    supported: Sequence[str] = SUPPORTED_VERSIONS,
) -> str:
    """The newest REST API version in `supported` that the server serves (see `discover`)."""
    found = await discover(
        transport,
        base_url,
        token=token,
        user=user,
        request_timeout=request_timeout,
        supported=supported,
    )
    return found.version
