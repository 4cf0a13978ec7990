"""Metrics on a fresh registry per test, read back with `get_sample_value`."""

from __future__ import annotations

import asyncio
import math
import socket
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from slurmjob_operator.api.status import Phase
from slurmjob_operator.config import Settings
from slurmjob_operator.listeners import Limits, serve_metrics
from slurmjob_operator.metrics import SUBMISSION_RESULTS, Metrics
from slurmjob_operator.slurm.exchange import OnRequest

JOB = "/slurm/v0.0.45/job/{job_id}"


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_nothing_registered_globally_and_registries_are_isolated() -> None:
    a, b = Metrics(), Metrics()
    a.count_submission("accepted")
    assert value(a, "slurmjob_operator_submissions_total", result="accepted") == 1
    assert value(b, "slurmjob_operator_submissions_total", result="accepted") == 0
    assert (
        REGISTRY.get_sample_value("slurmjob_operator_submissions_total", {"result": "accepted"})
        is None
    )


def test_given_registry_is_used() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    assert m.registry is reg
    m.set_reachable("east", True)
    assert reg.get_sample_value("slurmjob_operator_slurmrestd_reachable", {"cluster": "east"})


def test_submissions_by_result(metrics: Metrics) -> None:
    for result in SUBMISSION_RESULTS:
        assert value(metrics, "slurmjob_operator_submissions_total", result=result) == 0
    metrics.count_submission("accepted")
    metrics.count_submission("accepted")
    metrics.submissions_total.labels(result="ambiguous").inc()
    assert value(metrics, "slurmjob_operator_submissions_total", result="accepted") == 2
    assert value(metrics, "slurmjob_operator_submissions_total", result="ambiguous") == 1
    with pytest.raises(ValueError, match="unknown submission result"):
        metrics.count_submission("maybe")  # type: ignore[arg-type]


def test_adoptions_and_transitions(metrics: Metrics) -> None:
    metrics.count_adoption("name")
    metrics.adoptions_total.labels(how="name").inc()
    assert value(metrics, "slurmjob_operator_adoptions_total", how="name") == 2
    for phase in Phase:
        assert value(metrics, "slurmjob_operator_transitions_total", phase=phase.value) == 0
    metrics.count_transition(Phase.RUNNING)
    metrics.count_transition("Running")
    assert value(metrics, "slurmjob_operator_transitions_total", phase="Running") == 2


def test_on_request_matches_the_client_callback(metrics: Metrics) -> None:
    callback: OnRequest = metrics.requests_of("east")
    callback(JOB, "GET", "2xx", 0.02)
    callback(JOB, "get", "2xx", 0.2)
    callback(JOB, "DELETE", "timeout", 30.0)
    metrics.requests_of("west")(JOB, "GET", "2xx", 0.5)
    labels = {"cluster": "east", "endpoint": JOB, "method": "GET", "status_class": "2xx"}
    assert value(metrics, "slurmjob_operator_slurmrestd_request_seconds_count", **labels) == 2
    assert value(
        metrics, "slurmjob_operator_slurmrestd_request_seconds_sum", **labels
    ) == pytest.approx(0.22)
    assert (
        value(
            metrics,
            "slurmjob_operator_slurmrestd_request_seconds_bucket",
            **labels,
            le="0.025",
        )
        == 1
    )
    assert (
        value(
            metrics,
            "slurmjob_operator_slurmrestd_request_seconds_count",
            cluster="east",
            endpoint=JOB,
            method="DELETE",
            status_class="timeout",
        )
        == 1
    )
    west = {**labels, "cluster": "west"}
    assert value(metrics, "slurmjob_operator_slurmrestd_request_seconds_count", **west) == 1
    # Outside a poll cycle requests are timed but not counted for a cycle.
    assert value(metrics, "slurmjob_operator_poll_requests", cluster="east") is None


def test_poll_cycle_counts_its_requests(metrics: Metrics) -> None:
    with metrics.cycle("east") as cycle:
        for _ in range(3):
            metrics.on_request("/slurm/v0.0.45/jobs/state", "GET", "2xx", 0.1, cluster="east")
    assert cycle.requests == 3
    assert cycle.seconds is not None
    assert value(metrics, "slurmjob_operator_poll_requests", cluster="east") == 3
    assert value(metrics, "slurmjob_operator_poll_cycle_seconds_count", cluster="east") == 1
    with metrics.cycle("west"):
        pass
    # Each cluster's poller has its own figures: west's empty cycle leaves east's alone.
    assert value(metrics, "slurmjob_operator_poll_requests", cluster="west") == 0
    assert value(metrics, "slurmjob_operator_poll_requests", cluster="east") == 3
    assert value(metrics, "slurmjob_operator_poll_cycle_seconds_count", cluster="east") == 1


def test_poll_cycle_is_recorded_when_it_fails(metrics: Metrics) -> None:
    def failing_cycle() -> None:
        with metrics.cycle("east"):
            metrics.on_request(JOB, "GET", "5xx", 0.1, cluster="east")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing_cycle()
    assert value(metrics, "slurmjob_operator_poll_requests", cluster="east") == 1
    assert value(metrics, "slurmjob_operator_poll_cycle_seconds_count", cluster="east") == 1


async def test_poll_cycle_counts_only_its_own_tasks(metrics: Metrics) -> None:
    release = asyncio.Event()
    request = metrics.requests_of("east")

    async def handler() -> None:  # e.g. a submit in a kopf handler, running meanwhile
        await release.wait()
        request("/slurm/v0.0.45/job/submit", "POST", "2xx", 0.1)

    async def fetch() -> None:
        await asyncio.sleep(0)
        request(JOB, "GET", "2xx", 0.1)

    other = asyncio.create_task(handler())
    with metrics.cycle("east") as cycle:
        await asyncio.gather(fetch(), fetch())
        release.set()
        await other
        request("/slurm/v0.0.45/jobs/state", "GET", "2xx", 0.1)
    assert cycle.requests == 3
    assert value(metrics, "slurmjob_operator_poll_requests", cluster="east") == 3


def test_jobs_by_phase_zeroes_phases_no_longer_present(metrics: Metrics) -> None:
    for phase in Phase:
        assert value(metrics, "slurmjob_operator_jobs", phase=phase.value) == 0
    metrics.set_jobs_by_phase(Counter([Phase.RUNNING, Phase.RUNNING, Phase.QUEUED]))
    assert value(metrics, "slurmjob_operator_jobs", phase="Running") == 2
    assert value(metrics, "slurmjob_operator_jobs", phase="Queued") == 1
    metrics.set_jobs_by_phase({"Succeeded": 3, "Odd": 1})
    assert value(metrics, "slurmjob_operator_jobs", phase="Running") == 0
    assert value(metrics, "slurmjob_operator_jobs", phase="Queued") == 0
    assert value(metrics, "slurmjob_operator_jobs", phase="Succeeded") == 3
    assert value(metrics, "slurmjob_operator_jobs", phase="Odd") == 1
    metrics.set_jobs_by_phase({})
    assert value(metrics, "slurmjob_operator_jobs", phase="Odd") == 0
    assert value(metrics, "slurmjob_operator_jobs", phase="Succeeded") == 0


def test_token_expiry_and_reachability_by_cluster(metrics: Metrics) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    metrics.set_token_expiry(now + timedelta(minutes=5), cluster="east", now=now)
    metrics.set_token_expiry(now + timedelta(minutes=1), cluster="west", now=now)
    assert value(metrics, "slurmjob_operator_token_expiry_seconds", cluster="east") == 300
    assert value(metrics, "slurmjob_operator_token_expiry_seconds", cluster="west") == 60
    metrics.set_token_expiry(now - timedelta(seconds=10), cluster="east", now=now)
    assert value(metrics, "slurmjob_operator_token_expiry_seconds", cluster="east") == -10
    metrics.set_token_expiry(None, cluster="east")
    got = value(metrics, "slurmjob_operator_token_expiry_seconds", cluster="east")
    assert got is not None
    assert math.isnan(got)
    assert value(metrics, "slurmjob_operator_token_expiry_seconds", cluster="west") == 60
    with pytest.raises(ValueError, match="timezone-aware"):
        metrics.set_token_expiry(datetime(2026, 1, 1), cluster="east")  # noqa: DTZ001
    metrics.set_reachable("east", False)
    metrics.set_reachable("west", True)
    assert value(metrics, "slurmjob_operator_slurmrestd_reachable", cluster="east") == 0
    assert value(metrics, "slurmjob_operator_slurmrestd_reachable", cluster="west") == 1


def test_every_metric_is_prefixed(metrics: Metrics) -> None:
    names = {m.name for m in metrics.registry.collect()}
    assert names == {
        "slurmjob_operator_submissions",
        "slurmjob_operator_adoptions",
        "slurmjob_operator_duplicates",
        "slurmjob_operator_proven_absent",
        "slurmjob_operator_late_submits_cancelled",
        "slurmjob_operator_job_changes_refused",
        "slurmjob_operator_reconcile_errors",
        "slurmjob_operator_wakes_pending",
        "slurmjob_operator_memory_returned_bytes",
        "slurmjob_operator_resident_memory_bytes",
        "slurmjob_operator_transitions",
        "slurmjob_operator_slurmrestd_request_seconds",
        "slurmjob_operator_poll_cycle_seconds",
        "slurmjob_operator_poll_requests",
        "slurmjob_operator_jobs",
        "slurmjob_operator_token_expiry_seconds",
        "slurmjob_operator_slurmrestd_reachable",
        "slurmjob_operator_waiting_submissions",
        "slurmjob_operator_leader",
        "slurmjob_operator_catalog_reload_errors",
        "slurmjob_operator_catalog_stale",
        "slurmjob_operator_catalog_loaded_timestamp_seconds",
        "slurmjob_operator_image_cache_hits",
        "slurmjob_operator_image_cache_misses",
        "slurmjob_operator_image_import_seconds",
        "slurmjob_operator_image_cache_bytes",
        "slurmjob_operator_image_cache_entries",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_the_metrics_listener_serves_this_registry(metrics: Metrics) -> None:
    """Served by `listeners.serve_metrics` (no thread per connection; its limits are
    test_listeners.py's), which the operator starts with SLURMJOB_METRICS_PORT."""
    settings = Settings(metrics_port=0)
    limits = Limits.from_settings(settings)
    assert await serve_metrics(settings, metrics.registry, limits) is None  # 0: disabled
    port = _free_port()
    settings = Settings(metrics_port=port, metrics_address="127.0.0.1")
    listener = await serve_metrics(settings, metrics.registry, limits)
    assert listener is not None
    metrics.count_submission("auth")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body: str = resp.read().decode()
            return body

    try:
        body = await asyncio.to_thread(scrape)
    finally:
        await listener.close()
    assert 'slurmjob_operator_submissions_total{result="auth"} 1.0' in body
    assert "python_gc_objects_collected_total" not in body  # not the global registry
    with pytest.raises(OSError):  # noqa: PT011 - connection refused, whatever its subclass
        await asyncio.to_thread(scrape)
