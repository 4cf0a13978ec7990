"""The controller's unit tier: an in-memory resource store and an in-memory Slurm behind the
client's interface, so every lifecycle path runs in milliseconds (no tests here).

`MemorySlurm` keeps jobs as `SlurmJobView`s and takes faults per submit, in order:
`lost` (the job is created, the answer lost), `twice` (a proxy replayed the POST: two jobs,
answer lost), `unsent` (the answer lost, but no job was made), `auth`, `down`, `rejected`,
`rejected-record` (refused, but a record was made). `get_faults` fail the next GETs;
`impostors` are what a GET of those job ids (or SLUIDs) answers instead: another resource's
job under a reused id, or a server that lies.

Users: `client()` is the operator's client (Slurm user `OPERATOR_USER`), `client_for(user)` a
client acting as `user` (`MemoryUserClient`). `acted` records every call with the user it was
made as (None: the operator). A job belongs to the user who submitted it, and, as on a
cluster whose operator user is no Slurm operator or admin, only that user may cancel, hold
or release it (`SlurmRejected` "Access/permission denied"); `admins` lifts that.

Job arrays are kept as Slurm 26.05 keeps them (see tests/data/slurm-captures/slurm-26.05.5):
the array's own record (its id the submit's answer) stands for the pending tasks by its task
string; `start_tasks` gives each started task a record of its own, with a new job id, and the
last task to start takes over the array's own record. `/jobs/state` answers a pending task as
"<array id>_<index>" and a started one as "<its own job id>_<index>".

`submit_delay` slows every submit by that many seconds (the POST in flight), and
`submitting` / `max_submitting` count the submits in flight now and at most; `submitted`
lists the job names of the submits made, in the order their POSTs completed.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import itertools
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from slurmjob_operator.api import patch
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.api.spec import MUTABLE_AFTER_CREATION
from slurmjob_operator.api.status import SlurmJobStatus
from slurmjob_operator.config import RuntimeProfile, Settings
from slurmjob_operator.controller import Controller, RetryLater
from slurmjob_operator.core.indices import compact, expand
from slurmjob_operator.core.jobview import (
    BaseState,
    JobExit,
    JobSource,
    JobStateEntry,
    SlurmJobView,
)
from slurmjob_operator.core.launch import LaunchRequest
from slurmjob_operator.core.verified import VerifiedJob, vouch
from slurmjob_operator.kube import SecretError, StatusConflict
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.dialects import BulkCancelResult, SubmitReceipt
from slurmjob_operator.slurm.errors import (
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmMessage,
    SlurmNotFound,
    SlurmRejected,
    SlurmTransient,
    SlurmUnsupported,
)
from slurmjob_operator.slurm.joblists import JobListResult
from slurmjob_operator.slurm.nodes import ConfFacts, NodeInfo, PartitionInfo

SIF = b"#!/usr/bin/env run-singularity\n\0" + b"SIF_MAGIC\0" + b"unit runtime"
OPERATOR_USER = "slurmci"


class MemoryConfigMaps:
    """ConfigMaps in memory, read whole and merge-patched as `kube.ports.ConfigMapStore`
    says (a None value removes its key)."""

    def __init__(self) -> None:
        self.configmaps: dict[tuple[str, str], dict[str, str]] = {}
        self.configmap_reads = 0

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        self.configmap_reads += 1
        data = self.configmaps.get((namespace, name))
        return dict(data) if data is not None else None

    async def merge_configmap(
        self, namespace: str, name: str, data: Mapping[str, str | None]
    ) -> None:
        current = self.configmaps.setdefault((namespace, name), {})
        for key, value in data.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value


class MemoryStore(MemoryConfigMaps):
    """The `ResourceStore` in memory: merge-patched status, uid and resourceVersion
    preconditions (every change of an object gives it a new version), Events kept."""

    def __init__(self) -> None:
        super().__init__()
        self._versions = itertools.count(1)
        self.conflicts = 0
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.events: list[tuple[str, str, str]] = []  # (type, reason, message)
        self.patches = 0
        self.gets = 0
        self.deleted: list[str] = []  # names deleted by the TTL after the end
        self.namespace_uids: dict[str, str] = {}  # set one to "recreate" its namespace

    async def namespace_uid(self, name: str) -> str | None:
        """Every namespace exists, with a uid of its own until a test changes it."""
        return self.namespace_uids.setdefault(name, str(uuid.uuid5(uuid.NAMESPACE_DNS, name)))

    def create(self, name: str, spec: Mapping[str, Any], namespace: str = "team-a") -> ObjectRef:
        body = {
            "apiVersion": "slurmjob.io/v1alpha1",
            "kind": "SlurmJob",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "generation": 1,
                "resourceVersion": str(next(self._versions)),
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
        """Change the spec (generation + 1) or set annotations, as `kubectl` would: only the
        spec's mutable fields, as the CRD's transition rules allow (a test of what an older
        CRD let through changes the body itself)."""
        immutable = set(metadata_or_spec) - {"annotations", *MUTABLE_AFTER_CREATION}
        if immutable:
            raise AssertionError(f"the apiserver refuses a change of spec.{sorted(immutable)}")
        body = self.body(ref)
        if "annotations" in metadata_or_spec:
            body["metadata"]["annotations"] = metadata_or_spec.pop("annotations")
        if metadata_or_spec:
            body["spec"].update(metadata_or_spec)
            body["metadata"]["generation"] += 1
        body["metadata"]["resourceVersion"] = str(next(self._versions))

    def touch(self, ref: ObjectRef, **labels: str) -> None:
        """A change that is not the operator's (a user's label edit): a new version."""
        body = self.body(ref)
        body["metadata"].setdefault("labels", {}).update(labels)
        body["metadata"]["resourceVersion"] = str(next(self._versions))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        body = self.objects.get((namespace, name))
        return copy.deepcopy(body) if body is not None else None

    async def patch_status(
        self, ref: ObjectRef, change: Mapping[str, Any], resource_version: str | None = None
    ) -> dict[str, Any] | None:
        body = self.objects.get((ref.namespace, ref.name))
        if body is None or body["metadata"]["uid"] != ref.uid:
            return None
        if resource_version is not None and resource_version != body["metadata"].get(
            "resourceVersion"
        ):
            self.conflicts += 1
            raise StatusConflict(f"{ref.namespace}/{ref.name} changed")
        body["status"] = patch.apply(body.get("status") or {}, dict(change))
        body["metadata"]["resourceVersion"] = str(next(self._versions))
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

    async def delete_slurmjob(self, ref: ObjectRef, resource_version: str) -> bool:
        """A delete with uid and resourceVersion preconditions; the finalizer keeps the object,
        marked as being deleted."""
        body = self.objects.get((ref.namespace, ref.name))
        if body is None or body["metadata"]["uid"] != ref.uid:
            return False
        if body["metadata"].get("resourceVersion") != resource_version:
            self.conflicts += 1
            return False
        body["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
        body["metadata"]["resourceVersion"] = str(next(self._versions))
        self.deleted.append(ref.name)
        return True

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
    acted: list[tuple[str, str | None]] = field(default_factory=list)
    admins: frozenset[str] = frozenset()
    user_clients: dict[str, MemoryUserClient] = field(default_factory=dict)
    next_id: int = 100
    submit_delay: float = 0.0
    submitting: int = 0
    max_submitting: int = 0
    submitted: list[str] = field(default_factory=list)
    bulk_cancel: bool = True
    state_sweep: bool = True
    arrays_submitted: list[str] = field(default_factory=list)  # each array submit's `array`
    # `GET /diag`'s dbd_agent_queue_size, one reading per call (the last one repeats); an
    # exception in the list is raised by that call.
    dbd_queues: list[int | Exception | None] = field(default_factory=lambda: [0])
    # What `partitions()`, `list_nodes()`, `account_names()` and `qos_names()` answer (an
    # exception is raised instead); by default one roomy partition `debug`, no node sizes.
    partition_list: list[PartitionInfo] | Exception = field(
        default_factory=lambda: [PartitionInfo(name="debug", states=frozenset({"UP"}))]
    )
    node_list: list[NodeInfo] | Exception = field(default_factory=list)
    accounts: frozenset[str] | None = None
    qos: frozenset[str] | None = None
    enforced: frozenset[str] | None = None  # AccountingStorageEnforce; None: no GET /conf
    private_data: frozenset[str] = frozenset()
    dependency_parameters: frozenset[str] = frozenset()
    partition_reads: int = 0  # not in `calls`: the tests of calls are about jobs
    dependency: dict[int, str] = field(default_factory=dict)  # each job's Slurm dependency
    requests: list[LaunchRequest] = field(default_factory=list)  # every job created, in order

    @property
    def dialect(self) -> SimpleNamespace:
        return SimpleNamespace(
            supports_sluid_paths=self.sluid_paths,
            supports_jobs_state=self.state_sweep,
            supports_bulk_cancel=self.bulk_cancel,
            job_ref_path=str,
        )

    async def client(self) -> MemorySlurm:
        if self.connect_error is not None:
            raise self.connect_error
        return self

    @property
    def user(self) -> str:
        return OPERATOR_USER

    async def client_for(self, user: str | None) -> MemorySlurm | MemoryUserClient:
        base = await self.client()
        if user is None or user == OPERATOR_USER:
            return base
        # One per user, as SlurmLink keeps them.
        return self.user_clients.setdefault(user, MemoryUserClient(self, user))

    def was_cancelled(self, job_id: int) -> bool:
        """Whether a cancel (one job's or a bulk one) named the job, by its id or its SLUID."""
        job = self.jobs.get(job_id) or self.purged.get(job_id)
        names = {str(job_id)} | ({job.sluid} if job is not None and job.sluid else set())
        for call in self.calls:
            verb, _, rest = call.partition(" ")
            if verb in ("cancel", "cancel_many") and names & set(rest.split()):
                return True
        return False

    def made_as(self, user: str | None) -> list[str]:
        """The calls made as `user` (None: the operator's own)."""
        return [call for call, who in self.acted if who == user]

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

    def array_records(self, array_id: int) -> list[SlurmJobView]:
        return [j for j in self.jobs.values() if j.array_job_id == array_id]

    def task(self, array_id: int, index: int) -> SlurmJobView:
        [job] = [j for j in self.array_records(array_id) if j.array_task_id == index]
        return job

    def pending_tasks(self, array_id: int) -> list[int]:
        own = self.jobs[array_id]
        return expand(own.array_tasks.partition("%")[0]) if own.array_tasks else []

    def start_tasks(self, array_id: int, indices: Sequence[int]) -> list[int]:
        """Start pending tasks of an array: their job ids (the last one left takes the
        array's own record, as Slurm does)."""
        started = []
        for index in indices:
            own = self.jobs[array_id]
            pending = self.pending_tasks(array_id)
            assert index in pending, f"task {index} of {array_id} is not pending"
            rest = [i for i in pending if i != index]
            running: dict[str, Any] = {
                "raw_state": ("RUNNING",),
                "base_state": BaseState.RUNNING,
                "nodes": "n1",
                "array_task_id": index,
                "array_tasks": None,
            }
            if not rest:
                self.jobs[array_id] = own.model_copy(update=running)
                started.append(array_id)
                continue
            limit = own.array_tasks.partition("%")[2] if own.array_tasks else ""
            self.jobs[array_id] = own.model_copy(
                update={"array_tasks": compact(rest) + (f"%{limit}" if limit else "")}
            )
            job_id = self.next_id
            self.next_id += 1
            self.jobs[job_id] = own.model_copy(
                update={"job_id": job_id, "sluid": f"s{job_id:08d}", **running}
            )
            started.append(job_id)
        return started

    def end_task(
        self, array_id: int, index: int, state: str = "COMPLETED", code: int | None = 0
    ) -> None:
        self.set_state(self.task(array_id, index).job_id, state, code)

    def purge(self, job_id: int) -> None:
        """Slurm forgets the job (MinJobAge); accounting keeps it."""
        self.purged[job_id] = self.jobs.pop(job_id)

    def named(self, name: str) -> list[SlurmJobView]:
        return [j for j in [*self.jobs.values(), *self.purged.values()] if j.name == name]

    # -- the client's interface (the operator's own) ---------------------------------------

    async def submit(self, req: LaunchRequest) -> SubmitReceipt:
        return await self.do_submit(req, None)

    async def get_job(self, ref: int | str) -> list[SlurmJobView]:
        return await self.do_get_job(ref, None)

    async def find_by_name(self, name: str) -> list[SlurmJobView]:
        return await self.do_find_by_name(name, None)

    async def list_jobs(self) -> JobListResult:
        """`GET /jobs`: every job the controller holds (purged ones are in accounting only)."""
        self._record("list_jobs", None)
        return JobListResult(jobs=tuple(sorted(self.jobs.values(), key=lambda j: j.job_id)))

    async def get_job_accounting(self, ref: int | str) -> list[SlurmJobView]:
        return await self.do_get_job_accounting(ref, None)

    def bulk_ref(self, job: VerifiedJob) -> str:
        return str(self.lifecycle_ref(job.job_id, job.sluid))

    async def hold(self, job: VerifiedJob, held: bool) -> tuple[()]:
        vouch(job, OPERATOR_USER)
        for component in job.components:
            await self.do_hold(component, held, None)
        return ()

    async def set_dependency(self, job: VerifiedJob, dependency: str) -> tuple[()]:
        vouch(job, OPERATOR_USER)
        return await self.do_set_dependency(job.job_id, dependency, None)

    async def cancel(self, job: VerifiedJob) -> None:
        vouch(job, OPERATOR_USER)
        await self.do_cancel(job.job_id, None)

    async def jobs_state(
        self, job_ids: Sequence[int] | None = None, *, batch: int = 500
    ) -> list[JobStateEntry]:
        return await self.do_jobs_state(job_ids, None)

    async def cancel_many(self, jobs: Sequence[VerifiedJob]) -> BulkCancelResult:
        for job in jobs:
            vouch(job, OPERATOR_USER)
        return await self.do_cancel_many([self.bulk_ref(job) for job in jobs], None)

    # -- the same, as a given user -----------------------------------------------------------

    def _record(self, call: str, user: str | None) -> None:
        self.calls.append(call)
        self.acted.append((call, user))

    def _create(self, req: LaunchRequest, user: str | None = None) -> int:
        job_id = self.next_id
        self.next_id += 1
        self.requests.append(req)
        self.jobs[job_id] = SlurmJobView(
            job_id=job_id,
            sluid=f"s{job_id:08d}",
            name=req.job_name,
            comment=req.comment,
            user=user or OPERATOR_USER,
            raw_state=("PENDING",),
            base_state=BaseState.PENDING,
            working_directory=req.working_directory,
            array_job_id=job_id if req.array else None,
            array_tasks=req.array,
            standard_output=req.standard_output,
        )
        if req.array:
            self.arrays_submitted.append(req.array)
        if req.dependency:
            self.dependency[job_id] = req.dependency
        return job_id

    def _may_change(self, job: SlurmJobView, user: str | None) -> None:
        who = user or OPERATOR_USER
        if job.user is not None and job.user != who and who not in self.admins:
            raise SlurmRejected(
                f"Access/permission denied: {who} may not change job {job.job_id} of {job.user}"
            )

    async def do_submit(self, req: LaunchRequest, user: str | None) -> SubmitReceipt:
        self._record("submit", user)
        self.submitting += 1
        self.max_submitting = max(self.max_submitting, self.submitting)
        try:
            await asyncio.sleep(self.submit_delay)  # 0: still a point where others may run
        finally:
            self.submitting -= 1
        self.submitted.append(req.job_name)
        fault = self.faults.pop(0) if self.faults else None
        if fault == "auth":
            raise SlurmAuthError("token refused", status=401)
        if fault == "down":
            raise SlurmTransient("connection refused")
        if fault == "rejected":
            raise SlurmRejected("Invalid partition name specified", status=500)
        if fault == "rejected-record":
            raise SlurmRejected("Job violates accounting policy", job_id=self._create(req, user))
        job_id = self._create(req, user)
        if fault == "twice":
            self._create(req, user)
        if fault == "unsent":
            self.next_id -= 1
            del self.jobs[job_id]
            self.dependency.pop(job_id, None)
        if fault in ("lost", "twice", "unsent"):
            raise SlurmAmbiguous("the connection was reset after the request was sent")
        return SubmitReceipt(job_id=job_id)

    def _find(self, ref: int | str) -> SlurmJobView:
        for job in self.jobs.values():
            if ref in (job.job_id, job.sluid):
                return job
        raise SlurmNotFound(f"job {ref} not found")

    async def do_get_job(self, ref: int | str, user: str | None) -> list[SlurmJobView]:
        self._record(f"get_job {ref}", user)
        if self.get_faults:
            self.get_faults -= 1
            raise SlurmTransient("slurmctld is busy")
        if ref in self.impostors:
            return [self.impostors[ref]]
        job = self._find(ref)
        if job.array_job_id == job.job_id:  # an array's id answers every task of it
            return self.array_records(job.job_id)
        return [job]

    async def do_find_by_name(self, name: str, user: str | None) -> list[SlurmJobView]:
        self._record(f"find_by_name {name}", user)
        # Purged jobs are found only where accounting answers, as with the real client.
        kept = (
            self.named(name)
            if self.accounting
            else [j for j in self.jobs.values() if j.name == name]
        )
        return sorted(kept, key=lambda j: j.job_id)

    async def partitions(self) -> list[PartitionInfo]:
        self.partition_reads += 1
        if isinstance(self.partition_list, Exception):
            raise self.partition_list
        return list(self.partition_list)

    async def list_nodes(self) -> list[NodeInfo]:
        if isinstance(self.node_list, Exception):
            raise self.node_list
        return list(self.node_list)

    async def conf(self) -> ConfFacts | None:
        if self.enforced is None and not self.dependency_parameters:
            return None
        return ConfFacts(
            enforce=self.enforced or frozenset(),
            private_data=self.private_data,
            dependency_parameters=self.dependency_parameters,
        )

    async def account_names(self) -> frozenset[str]:
        if self.accounts is None:
            raise SlurmTransient("no accounts here")
        return self.accounts

    async def qos_names(self) -> frozenset[str]:
        if self.qos is None:
            raise SlurmTransient("no QOS here")
        return self.qos

    async def has_accounting(self) -> bool:
        return self.accounting

    async def dbd_queue(self) -> int | None:
        self._record("diag", None)
        reading = self.dbd_queues.pop(0) if len(self.dbd_queues) > 1 else self.dbd_queues[0]
        if isinstance(reading, Exception):
            raise reading
        return reading

    async def do_get_job_accounting(self, ref: int | str, user: str | None) -> list[SlurmJobView]:
        self._record(f"accounting {ref}", user)
        if not self.accounting:
            raise SlurmUnsupported("no accounting")
        return [
            j.model_copy(update={"source": JobSource.ACCOUNTING})
            for j in self.purged.values()
            if ref in (j.job_id, j.sluid, j.array_job_id)
        ]

    async def do_hold(self, job_id: int, held: bool, user: str | None) -> tuple[()]:
        self._record(f"{'hold' if held else 'release'} {job_id}", user)
        job = self._find(job_id)
        self._may_change(job, user)
        if job.base_state is BaseState.PENDING and job.job_id in self.jobs:
            self.jobs[job.job_id] = job.model_copy(
                update={"reason": "JobHeldUser" if held else None}
            )
        return ()

    async def do_set_dependency(self, job_id: int, dependency: str, user: str | None) -> tuple[()]:
        self._record(f"dependency {job_id} {dependency}", user)
        self._may_change(self._find(job_id), user)
        self.dependency[job_id] = dependency
        return ()

    async def do_jobs_state(
        self, job_ids: Sequence[int] | None, user: str | None
    ) -> list[JobStateEntry]:
        self._record("jobs_state", user)
        entries: list[JobStateEntry] = []
        for job in self.jobs.values():
            asked = job_ids is None or job.job_id in job_ids or job.array_job_id in job_ids
            if not asked:
                continue
            if job.array_job_id is None:
                tasks: list[tuple[int, int | None]] = [(job.job_id, None)]
            elif job.array_task_id is not None:
                tasks = [(job.job_id, job.array_task_id)]
            else:
                tasks = [(job.job_id, i) for i in self.pending_tasks(job.job_id)]
            for job_id, task in tasks:
                entries.append(
                    JobStateEntry(
                        raw_job_id=str(job_id) if task is None else f"{job_id}_{task}",
                        job_id=job_id,
                        array_task=None if task is None else str(task),
                        raw_state=job.raw_state,
                        base_state=job.base_state,
                    )
                )
        return entries

    async def do_cancel(self, ref: int | str, user: str | None) -> None:
        self._record(f"cancel {ref}", user)
        job = self._find(ref)
        self._may_change(job, user)
        self._cancel_job(job)

    def _cancel_job(self, job: SlurmJobView) -> None:
        """As scancel: an array's id cancels every task of the array."""
        targets = self.array_records(job.job_id) if job.array_job_id == job.job_id else [job]
        for target in targets:
            if not target.is_final:
                self.set_state(target.job_id, "CANCELLED")

    async def do_cancel_many(self, refs: Sequence[int | str], user: str | None) -> BulkCancelResult:
        """`DELETE /jobs`: each id's failure in the answer, as Slurm 26.05 reports them."""
        sent = [str(ref) for ref in refs]
        self._record(f"cancel_many {' '.join(sent)}", user)
        missing: set[str] = set()
        refused: list[tuple[str, SlurmMessage]] = []
        for ref in sent:
            try:
                job = self._find(int(ref) if ref.isdigit() else ref)
                self._may_change(job, user)
            except SlurmNotFound:
                missing.add(ref)
                continue
            except SlurmRejected as exc:
                refused.append((ref, SlurmMessage(error_number=1, error=str(exc))))
                continue
            self._cancel_job(job)
        return BulkCancelResult(
            sent=tuple(sent), missing=frozenset(missing), refused=tuple(refused)
        )


@dataclass
class MemoryUserClient:
    """`MemorySlurm` as one Slurm user: the same jobs, each call recorded with `user`."""

    slurm: MemorySlurm
    user: str

    @property
    def version(self) -> str:
        return self.slurm.version

    @property
    def dialect(self) -> SimpleNamespace:
        return self.slurm.dialect

    def lifecycle_ref(self, job_id: int, sluid: str | None) -> int | str:
        return self.slurm.lifecycle_ref(job_id, sluid)

    async def submit(self, req: LaunchRequest) -> SubmitReceipt:
        return await self.slurm.do_submit(req, self.user)

    async def get_job(self, ref: int | str) -> list[SlurmJobView]:
        return await self.slurm.do_get_job(ref, self.user)

    async def find_by_name(self, name: str) -> list[SlurmJobView]:
        return await self.slurm.do_find_by_name(name, self.user)

    async def get_job_accounting(self, ref: int | str) -> list[SlurmJobView]:
        return await self.slurm.do_get_job_accounting(ref, self.user)

    def bulk_ref(self, job: VerifiedJob) -> str:
        return self.slurm.bulk_ref(job)

    async def hold(self, job: VerifiedJob, held: bool) -> tuple[()]:
        vouch(job, self.user)
        for component in job.components:
            await self.slurm.do_hold(component, held, self.user)
        return ()

    async def set_dependency(self, job: VerifiedJob, dependency: str) -> tuple[()]:
        vouch(job, self.user)
        return await self.slurm.do_set_dependency(job.job_id, dependency, self.user)

    async def cancel(self, job: VerifiedJob) -> None:
        vouch(job, self.user)
        await self.slurm.do_cancel(job.job_id, self.user)

    async def jobs_state(
        self, job_ids: Sequence[int] | None = None, *, batch: int = 500
    ) -> list[JobStateEntry]:
        return await self.slurm.do_jobs_state(job_ids, self.user)

    async def cancel_many(self, jobs: Sequence[VerifiedJob]) -> BulkCancelResult:
        for job in jobs:
            vouch(job, self.user)
        return await self.slurm.do_cancel_many([self.bulk_ref(job) for job in jobs], self.user)


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


async def reconcile_once(bed: Bed, ref: Any) -> RetryLater | None:
    """One run of the submission handler; the RetryLater it asks for, if any."""
    try:
        await bed.controller.reconcile(ref)
    except RetryLater as exc:
        return exc
    return None


class KeepingStore(MemoryStore):
    """A `MemoryStore` that keeps a SlurmJob after its deletion, as `LocalStore` does."""

    keeps_deleted: Literal[True] = True


def make_bed(
    root: Path,
    slurm: MemorySlurm | None = None,
    store: MemoryStore | None = None,
    **settings: Any,
) -> Bed:
    config = make_settings(root, **settings)
    store = store or MemoryStore()
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
