"""The one `coordination.k8s.io/v1` Lease leader election reads and writes.

Only get, create and update (a replace carrying the resourceVersion read, so that of two
writers one sees a conflict): the verbs the chart's Role grants, in one namespace.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator.core.leadership import LeaseRecord


class LeaseConflict(Exception):
    """Somebody else wrote the Lease (or created it) since it was read."""


def _micro(value: datetime | None) -> datetime | None:
    return value.astimezone(UTC) if value is not None else None


def _record(lease: k8s.V1Lease) -> LeaseRecord:
    spec = lease.spec or k8s.V1LeaseSpec()
    return LeaseRecord(
        holder=spec.holder_identity or None,
        duration=spec.lease_duration_seconds,
        acquired=_micro(spec.acquire_time),
        renewed=_micro(spec.renew_time),
        transitions=spec.lease_transitions or 0,
        version=lease.metadata.resource_version if lease.metadata else None,
    )


def _micro_text(value: datetime | None) -> str | None:
    # MicroTime is parsed with exactly six fraction digits: isoformat() drops them at .000000.
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if value else None


def _body(name: str, namespace: str, record: LeaseRecord) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if record.version is not None:
        metadata["resourceVersion"] = record.version
    spec = {
        "holderIdentity": record.holder or "",
        "leaseDurationSeconds": record.duration,
        "acquireTime": _micro_text(record.acquired),
        "renewTime": _micro_text(record.renewed),
        "leaseTransitions": record.transitions,
    }
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {k: v for k, v in spec.items() if v is not None},
    }


class LeaseStore:
    def __init__(self, api: k8s.ApiClient, namespace: str, name: str) -> None:
        self._leases = k8s.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name

    async def read(self) -> LeaseRecord | None:
        try:
            lease = await self._leases.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return _record(lease)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        body = _body(self.name, self.namespace, replace(record, version=None))
        try:
            return _record(await self._leases.create_namespaced_lease(self.namespace, body))
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict("the Lease was created by somebody else") from exc
            raise

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        body = _body(self.name, self.namespace, record)
        try:
            lease = await self._leases.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict("the Lease was written by somebody else") from exc
            raise
        return _record(lease)
