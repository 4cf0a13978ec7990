"""The controller's unit tier: an in-memory resource store and an in-memory Slurm behind the
client's interface, so every lifecycle path runs in milliseconds (no tests here).

`MemorySlurm` keeps jobs as `SlurmJobView`s and takes faults per submit, in order:
`lost` (the job is created, the answer lost), `twice` (a proxy replayed the POST: two jobs,
answer lost), `unsent` (the answer lost, but no job was made), `auth`, `down`, `rejected`,
`rejected-record` (refused, but a record was made). `get_faults` fail the next GETs;
`impostors` are what a GET of those job ids (or SLUIDs) answers instead: another resource's
job under a reused id, or a server that lies.
"""

from __future__ import annotations

import copy
import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from slurmjob_operator.api import patch
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.api.status import SlurmJobStatus
from slurmjob_operator.config import RuntimeProfile, Settings
from slurmjob_operator.controller import Controller
from slurmjob_operator.core.jobview import BaseState, JobExit, JobSource, SlurmJobView
from slurmjob_operator.core.launch import LaunchRequest
from slurmjob_operator.kube import SecretError
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.dialects import SubmitReceipt
from slurmjob_operator.slurm.errors import (
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmNotFound,
    SlurmRejected,
    SlurmTransient,
    SlurmUnsupported,
)

SIF = b"#!/usr/bin/env run-singularity\n\0" + b"SIF_MAGIC\0" + b"unit runtime"


class MemoryStore:
    """The `ResourceStore` in memory: merge-patched status, uid preconditions, Events kept."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.events: list[tuple[str, str, str]] = []  # (type, reason, message)
        self.patches = 0

    def create(self, name: str, spec: Mapping[str, Any], namespace: str = "team-a") -> ObjectRef:
        body = {
            "apiVersion": "slurmjob.io/v1alpha1",
            "kind": "SlurmJob",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "generation": 1,
            },
            "spec": copy.deepcopy(dict(spec)),
        }
        self.objects[(namespace, name)] = body
        return ObjectRef.of(body)

    def body(self, ref: ObjectRef) -> dict[str, Any]:
        return self.objects[(ref.namespace, ref.name)]

    def status(self, ref: ObjectRef) -> SlurmJobStatus:
        return SlurmJobStatus.parse(self.body(ref).get("status"))

    def update(self, ref: ObjectRef, **metadata_or_spec: Any) -> None:
        """Change the spec (generation + 1) or set annotations, as `kubectl` would."""
        body = self.body(ref)
        if "annotations" in metadata_or_spec:
            body["metadata"]["annotations"] = metadata_or_spec.pop("annotations")
        if metadata_or_spec:
            body["spec"].update(metadata_or_spec)
            body["metadata"]["generation"] += 1

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        body = self.objects.get((namespace, name))
        return copy.deepcopy(body) if body is not None else None

    async def patch_status(
        self, ref: ObjectRef, change: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        body = self.objects.get((ref.namespace, ref.name))
        if body is None or body["metadata"]["uid"] != ref.uid:
            return None
        body["status"] = patch.apply(body.get("status") or {}, dict(change))
        self.patches += 1
        return copy.deepcopy(body)

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str:
        values = self.secrets.get((namespace, name))
        if values is None:
            raise SecretError(f"Secret {namespace}/{name} does not exist")
        if key not in values:
            raise SecretError(f"Secret {namespace}/{name} has no key {key!r}")
        return values[key]

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    async def close(self) -> None:
        return None


@dataclass
class MemorySlurm:
    """What the controller asks of a `SlurmClient`, kept in memory."""

    version: str = "v0.0.45"
    sluid_paths: bool = True
    accounting: bool = True
    jobs: dict[int, SlurmJobView] = field(default_factory=dict)
    purged: dict[int, SlurmJobView] = field(default_factory=dict)  # still in accounting
    faults: list[str] = field(default_factory=list)
    get_faults: int = 0
    impostors: dict[int | str, SlurmJobView] = field(default_factory=dict)
    connect_error: Exception | None = None
    calls: list[str] = field(default_factory=list)
    next_id: int = 100

    @property
    def dialect(self) -> SimpleNamespace:
        return SimpleNamespace(supports_sluid_paths=self.sluid_paths, supports_jobs_state=True)

    async def client(self) -> MemorySlurm:
        if self.connect_error is not None:
            raise self.connect_error
        return self

    def lifecycle_ref(self, job_id: int, sluid: str | None) -> int | str:
        return sluid if sluid and self.sluid_paths else job_id

    # -- what tests change ------------------------------------------------------------------

    def set_state(self, job_id: int, state: str, return_code: int | None = None) -> None:
        self.jobs[job_id] = self.jobs[job_id].model_copy(
            update={
                "raw_state": (state,),
                "base_state": BaseState(state),
                "exit": JobExit(return_code=return_code),
                "nodes": "n1" if state != "PENDING" else None,
            }
        )

    def purge(self, job_id: int) -> None:
        """Slurm forgets the job (MinJobAge); accounting keeps it."""
        self.purged[job_id] = self.jobs.pop(job_id)

    def named(self, name: str) -> list[SlurmJobView]:
        return [j for j in [*self.jobs.values(), *self.purged.values()] if j.name == name]

    # -- the client's interface ---------------------------------------------------------------

    def _create(self, req: LaunchRequest) -> int:
        job_id = self.next_id
        self.next_id += 1
        self.jobs[job_id] = SlurmJobView(
            job_id=job_id,
            sluid=f"s{job_id:08d}",
            name=req.job_name,
            comment=req.comment,
            raw_state=("PENDING",),
            base_state=BaseState.PENDING,
            working_directory=req.working_directory,
        )
        return job_id

    async def submit(self, req: LaunchRequest) -> SubmitReceipt:
        self.calls.append("submit")
        fault = self.faults.pop(0) if self.faults else None
        if fault == "auth":
            raise SlurmAuthError("token refused", status=401)
        if fault == "down":
            raise SlurmTransient("connection refused")
        if fault == "rejected":
            raise SlurmRejected("Invalid partition name specified", status=500)
        if fault == "rejected-record":
            raise SlurmRejected("Job violates accounting policy", job_id=self._create(req))
        job_id = self._create(req)
        if fault == "twice":
            self._create(req)
        if fault == "unsent":
            self.next_id -= 1
            del self.jobs[job_id]
        if fault in ("lost", "twice", "unsent"):
            raise SlurmAmbiguous("the connection was reset after the request was sent")
        return SubmitReceipt(job_id=job_id)

    def _find(self, ref: int | str) -> SlurmJobView:
        for job in self.jobs.values():
            if ref in (job.job_id, job.sluid):
                return job
        raise SlurmNotFound(f"job {ref} not found")

    async def get_job(self, ref: int | str) -> list[SlurmJobView]:
        self.calls.append(f"get_job {ref}")
        if self.get_faults:
            self.get_faults -= 1
            raise SlurmTransient("slurmctld is busy")
        if ref in self.impostors:
            return [self.impostors[ref]]
        return [self._find(ref)]

    async def find_by_name(self, name: str) -> list[SlurmJobView]:
        self.calls.append(f"find_by_name {name}")
        return sorted(self.named(name), key=lambda j: j.job_id)

    async def get_job_accounting(self, ref: int | str) -> list[SlurmJobView]:
        self.calls.append(f"accounting {ref}")
        if not self.accounting:
            raise SlurmUnsupported("no accounting")
        return [
            j.model_copy(update={"source": JobSource.ACCOUNTING})
            for j in self.purged.values()
            if ref in (j.job_id, j.sluid)
        ]

    async def hold(self, job_id: int, held: bool) -> tuple[()]:
        self.calls.append(f"{'hold' if held else 'release'} {job_id}")
        return ()

    async def cancel(self, ref: int | str) -> None:
        self.calls.append(f"cancel {ref}")
        job = self._find(ref)
        if not job.is_final:
            self.set_state(job.job_id, "CANCELLED")


class StubToken:
    expires_at = None

    def token(self) -> str:
        return "unit-token"


def make_settings(root: Path, **overrides: Any) -> Settings:
    """Settings for a storage root under `root`, with one apptainer runtime `custom-sif`."""
    storage = root / "storage"
    (storage / "runtimes").mkdir(parents=True, exist_ok=True)
    (storage / "runtimes" / "unit.sif").write_bytes(SIF)
    registry = root / "runtimes.yaml"
    entry = {
        "id": "custom-sif",
        "format": "sif",
        "path": "runtimes/unit.sif",
        "sha256": hashlib.sha256(SIF).hexdigest(),
    }
    registry.write_text(json.dumps({"runtimes": [entry]}))
    values: dict[str, Any] = {
        "storage_root": storage,
        "runtime_registry_file": registry,
        "slurm_runtime_profile": RuntimeProfile.APPTAINER,
        "slurm_partition": "debug",
        "poll_interval": 0.05,
        "delete_timeout": 2.0,
        "metrics_port": 0,
    }
    values.update(overrides)
    return Settings(**values)


def cpu_spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "framework": {"kind": "custom", "name": "custom", "runtimeId": "custom-sif"},
        "command": ["python3", "-c", "print('hi')"],
        "pools": [{"name": "main", "nodes": 1, "gpusPerNode": 0, "cpus": 1, "memoryGb": 1}],
        "timeLimit": "10m",
    }
    spec.update(extra)
    return spec


@dataclass
class Bed:
    settings: Settings
    store: MemoryStore
    slurm: MemorySlurm
    controller: Controller
    metrics: Metrics


def make_bed(root: Path, slurm: MemorySlurm | None = None, **settings: Any) -> Bed:
    config = make_settings(root, **settings)
    store = MemoryStore()
    fake = slurm or MemorySlurm()
    metrics = Metrics()
    controller = Controller(
        config,
        store,
        None,  # type: ignore[arg-type]  # the in-memory Slurm replaces the transport
        metrics,
        token=StubToken(),  # type: ignore[arg-type]
        link=fake,  # type: ignore[arg-type]
    )
    return Bed(config, store, fake, controller, metrics)
