"""The poller's cost: one sweep per interval, details only for jobs whose state moved."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.config import Settings
from slurmjob_operator.controller import Tracked
from slurmjob_operator.controller.poller import Poller
from slurmjob_operator.core.jobview import BaseState, JobStateEntry, SlurmJobView
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.sweep import RECHECK_CYCLES
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.errors import SlurmNotFound
from slurmjob_operator.slurm.joblists import JobListResult


@dataclass
class FakeClient:
    states: dict[int, str]
    jobs_state_supported: bool = True
    calls: list[str] = field(default_factory=list)
    last_change: int = 0
    metrics: Metrics | None = None
    others: int = 0  # jobs of other users in the controller

    def _count(self, name: str) -> None:
        # The real client reports every request through its on_request callback.
        self.calls.append(name)
        if self.metrics is not None:
            self.metrics.on_request(
                f"/slurm/v0.0.45/{name}", "GET", "2xx", 0.001, cluster="default"
            )

    @property
    def dialect(self) -> Any:
        return SimpleNamespace(
            supports_jobs_state=self.jobs_state_supported, supports_sluid_paths=False
        )

    def _view(self, job_id: int) -> SlurmJobView:
        state = self.states[job_id]
        return SlurmJobView(job_id=job_id, raw_state=(state,), base_state=BaseState(state))

    async def jobs_state(
        self, ids: Sequence[int] | None = None, *, batch: int = 500
    ) -> list[JobStateEntry]:
        """As the real client: one request per `batch` ids, or one for every job (then the
        controller's other jobs too, `others` of them)."""
        if ids is None:
            self._count("jobs_state_all")
            wanted: Sequence[int] = [*self.states, *range(10**6, 10**6 + self.others)]
        else:
            for _ in range(0, len(ids), batch):
                self._count("jobs_state")
            wanted = ids
        return [
            JobStateEntry(
                raw_job_id=str(i),
                job_id=i,
                raw_state=(self.states.get(i, "PENDING"),),
                base_state=BaseState(self.states.get(i, "PENDING")),
            )
            for i in wanted
            if i in self.states or i >= 10**6
        ]

    def lifecycle_ref(self, job_id: int, sluid: str | None) -> int | str:
        return job_id

    async def get_job(self, ref: int | str) -> list[SlurmJobView]:
        self._count("get_job")
        job_id = int(ref)
        if job_id not in self.states:
            raise SlurmNotFound("gone")
        return [self._view(job_id)]

    async def list_jobs(self, update_time: datetime | None = None) -> JobListResult:
        self._count("list_jobs")
        if update_time is not None and self.last_change == 0:
            return JobListResult(not_modified=True)
        self.last_change = 0
        return JobListResult(jobs=tuple(self._view(i) for i in self.states))


class FakeController:
    def __init__(self, client: FakeClient, job_ids: Sequence[int]) -> None:
        self.client = client
        self.settings = Settings(poll_interval=1.0)
        self.name = self.settings.cluster_name
        self.clusters = Clusters((self.name,))
        self.metrics = Metrics()
        self.token = SimpleNamespace(expires_at=None)
        self.tracked = {
            f"uid-{i}": Tracked(ObjectRef("ns", f"job-{i}", f"uid-{i}"), i, None, None)
            for i in job_ids
        }
        self.refreshed: list[tuple[int, bool, bool]] = []
        self.refreshed_uids: list[str] = []

    def followed(self) -> list[Tracked]:
        return list(self.tracked.values())

    def phase_counts(self) -> dict[str, int]:
        return {}

    async def slurm(self) -> FakeClient:
        return self.client

    async def report_reachability(self, reachable: bool, reason: str, message: str) -> None:
        self.reachable = reachable

    async def refresh(
        self, tracked: Tracked, views: Sequence[SlurmJobView] | None, *, logs_only: bool = False
    ) -> None:
        self.refreshed.append((tracked.job_id, views is None, logs_only))
        self.refreshed_uids.append(tracked.ref.uid)


def make(n: int, *, jobs_state: bool = True) -> tuple[Poller, FakeController, FakeClient]:
    client = FakeClient({i: "RUNNING" for i in range(1, n + 1)}, jobs_state_supported=jobs_state)
    controller = FakeController(client, list(range(1, n + 1)))
    client.metrics = controller.metrics
    return Poller(controller), controller, client  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "sweep"),
    [(1, "jobs_state"), (50, "jobs_state"), (2000, "jobs_state_all"), (10_000, "jobs_state_all")],
)
async def test_unchanged_jobs_cost_one_request_per_cycle(n: int, sweep: str) -> None:
    poller, controller, client = make(n)
    await poller.cycle()  # first sight: every job's details once
    assert client.calls.count("get_job") == n
    client.calls.clear()
    controller.refreshed.clear()
    for _ in range(3):
        await poller.cycle()
    assert client.calls == [sweep] * 3
    assert controller.refreshed == []
    assert controller.metrics.sample("slurmjob_operator_poll_requests", {"cluster": "default"}) == 1


@pytest.mark.parametrize(("n", "requests"), [(500, 1), (1000, 2), (1001, 1)])
async def test_batches_until_one_unfiltered_sweep_is_cheaper(n: int, requests: int) -> None:
    poller, _, client = make(n)
    await poller.cycle()
    client.calls.clear()
    await poller.cycle()
    assert len(client.calls) == requests
    assert client.calls[0] == ("jobs_state_all" if n > 1000 else "jobs_state")


async def test_a_cluster_much_bigger_than_what_is_tracked_keeps_to_batches() -> None:
    poller, _, client = make(1500)
    client.others = 20_000  # the controller holds 14 times more jobs than are tracked
    await poller.cycle()  # finds out how big the cluster is
    client.calls.clear()
    for _ in range(RECHECK_CYCLES):
        await poller.cycle()
    assert client.calls == ["jobs_state"] * 3 * RECHECK_CYCLES
    client.calls.clear()
    await poller.cycle()
    assert client.calls == ["jobs_state_all"], "looked at again after RECHECK_CYCLES sweeps"
    client.calls.clear()
    await poller.cycle()
    assert client.calls == ["jobs_state"] * 3, "still too big: batches again"
    client.others = 0
    for _ in range(RECHECK_CYCLES):
        await poller.cycle()
    client.calls.clear()
    await poller.cycle()
    await poller.cycle()
    assert client.calls == ["jobs_state_all"] * 2, "the cluster shrank: one request from now on"


async def test_only_the_changed_job_is_fetched() -> None:
    poller, controller, client = make(100)
    await poller.cycle()
    client.calls.clear()
    controller.refreshed.clear()
    client.states[42] = "COMPLETED"
    await poller.cycle()
    assert client.calls == ["jobs_state", "get_job"]
    assert controller.refreshed == [(42, False, False)]


async def test_two_resources_claiming_one_job_id_are_both_refreshed() -> None:
    """A status's job id is only a claim: a second resource claiming job 2 must not hide the
    first from the poller (the fold's identity check tells them apart)."""
    poller, controller, client = make(3)
    controller.tracked["uid-x"] = Tracked(ObjectRef("other", "claimer", "uid-x"), 2, None, None)
    await poller.cycle()
    assert sorted(controller.refreshed_uids) == ["uid-1", "uid-2", "uid-3", "uid-x"]
    assert client.calls.count("get_job") == 3, "one detail read per job id, not per claimant"


async def test_after_a_restart_only_jobs_that_moved_cost_a_request() -> None:
    """The statuses' recorded states stand in for the last sweep: 2,000 followed jobs, one of
    which ended while the operator was down, cost the sweep and one detail read."""
    poller, controller, client = make(2000)
    for uid, item in list(controller.tracked.items()):
        controller.tracked[uid] = dataclasses.replace(item, native=("RUNNING",))
    client.states[7] = "COMPLETED"
    await poller.cycle()
    assert client.calls == ["jobs_state_all", "get_job"]
    assert controller.refreshed == [(7, False, False)]


async def test_log_files_of_queued_jobs_are_not_looked_at(tmp_path: Path) -> None:
    poller, controller, _ = make(3)
    looked: list[str] = []
    poller._signature = lambda item: looked.append(item.ref.uid) or (None, None)  # type: ignore[method-assign]
    for uid, item in list(controller.tracked.items()):
        running = uid == "uid-2"
        controller.tracked[uid] = dataclasses.replace(item, native=("RUNNING",), running=running)
    await poller.cycle()
    looked.clear()
    await poller.cycle()
    assert looked == ["uid-2"], "only the running job's files, and nothing else"


async def test_a_line_written_while_the_tails_are_read_is_read_at_the_next_look() -> None:
    """The files are signed before the read, not after it: a line the job writes between the
    read and the signing (a job that writes one line and then waits, on a loaded machine) is
    a change at the next look, never taken as read (CI: a tail missing for a minute)."""
    poller, controller, _ = make(1)
    controller.settings = Settings(poll_interval=1.0, log_refresh=0)
    version = [0]
    poller._signature = lambda item: (version[0], None)  # type: ignore[method-assign]
    controller.tracked["uid-1"] = dataclasses.replace(
        controller.tracked["uid-1"], native=("PENDING",), running=True
    )
    refresh = controller.refresh

    async def read_then_write(*args: Any, **kwargs: Any) -> None:
        await refresh(*args, **kwargs)
        version[0] += 1  # the job's line lands just after the read

    controller.refresh = read_then_write  # type: ignore[method-assign]
    await poller.cycle()  # PENDING -> RUNNING: read, and the line lands
    assert controller.refreshed == [(1, False, False)]
    controller.refresh = refresh  # type: ignore[method-assign]
    await poller.cycle()
    assert controller.refreshed[1:] == [(1, True, True)], "the tails are read again"
    await poller.cycle()
    assert len(controller.refreshed) == 2, "and not again while nothing changes"


async def test_a_vanished_job_is_handed_over_as_gone() -> None:
    poller, controller, client = make(3)
    await poller.cycle()
    controller.refreshed.clear()
    del client.states[2]
    await poller.cycle()
    assert controller.refreshed == [(2, True, False)]


async def test_v0038_not_modified_listing_costs_one_request() -> None:
    poller, controller, client = make(500, jobs_state=False)
    await poller.cycle()
    assert client.calls == ["list_jobs"]  # the full list carries the details: no per-job GET
    assert len(controller.refreshed) == 500
    client.calls.clear()
    controller.refreshed.clear()
    await poller.cycle()
    assert client.calls == ["list_jobs"]
    assert controller.refreshed == []


async def test_nothing_tracked_means_no_request() -> None:
    poller, _, client = make(0)
    await poller.cycle()
    assert client.calls == []


def test_the_registry_keeps_the_recorded_state_for_the_next_start() -> None:
    from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus
    from slurmjob_operator.controller.registry import Registry

    attempt = Attempt(
        number=1,
        job_name="sj",
        job_id=9,
        confirmed=True,
        native_state="RUNNING",
        native_flags=["CONFIGURING"],
    )
    registry = Registry()
    ref = ObjectRef("ns", "a", "uid-a")
    registry.observe(ref, SlurmJobStatus(phase=Phase.RUNNING, attempts=[attempt]))
    [item] = registry.followed()
    assert item.native == ("CONFIGURING", "RUNNING")
    assert item.running
    registry.observe(ref, SlurmJobStatus(phase=Phase.QUEUED, attempts=[attempt]))
    assert not registry.followed()[0].running
