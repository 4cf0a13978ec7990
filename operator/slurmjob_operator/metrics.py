"""Prometheus metrics of the operator, on a registry of their own.

Nothing is registered or served at import time: a `Metrics` instance creates its collectors on
the registry it is given (a fresh `CollectorRegistry` by default, so tests are isolated).
`listeners.serve_metrics` serves that registry on `/metrics`, under the limits every listener
of the operator has (prometheus_client's own server gives each connection a thread).

Requests per poll cycle are counted through a context variable: `on_request` (the slurmrestd
client's callback) adds to the cycle that is open *in the calling task's context*, so requests
made by the poll sweep and the tasks it spawns count, while a submit running concurrently in a
handler does not.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Final, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from slurmjob_operator.api.status import Phase
from slurmjob_operator.core.decisions import SubmissionResult
from slurmjob_operator.imagemetrics import ImageCacheMetrics

__all__ = [
    "PREFIX",
    "SUBMISSION_RESULTS",
    "Metrics",
    "PollCycle",
    "SubmissionResult",
]

PREFIX: Final = "slurmjob_operator"

SUBMISSION_RESULTS: tuple[str, ...] = get_args(SubmissionResult)

# slurmrestd answers in milliseconds for one job and takes seconds for a full /jobs at scale.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CYCLE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class PollCycle:
    """One open poll cycle: how many slurmrestd requests it made, and (once closed) how long
    it took."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.started = time.monotonic()
        self.seconds: float | None = None

    def count(self) -> None:
        with self._lock:
            self.requests += 1


class Metrics:
    """The operator's metrics, all named `slurmjob_operator_*`.

    Collectors (attributes, for direct use):

    * `submissions_total{result}`: submit POSTs by outcome (`SUBMISSION_RESULTS`).
    * `adoptions_total{how}`: jobs found again instead of submitted (e.g. `how="name"`).
    * `duplicates_total`: Slurm jobs cancelled because they duplicated an attempt.
    * `proven_absent_total`, `late_submits_cancelled_total`: unconfirmed submits proven absent
      (`core.absence`), and jobs of such attempts that appeared later and were cancelled.
    * `reconcile_errors_total`, `wakes_pending`: reconciles that failed unexpectedly (each
      looked at again after a backoff: `controller.wakes`), and wakes pending.
    * `memory_returned_bytes_total`, `resident_memory_bytes`: resident bytes the periodic trim
      gave back to the system (`memtrim`), and the process's resident set (to size against the
      container's limit).
    * `job_changes_refused_total{why}`: changes to a job refused for want of a verified
      handle (`core.verified`): `identity`, `owner` or `cluster`.
    * `transitions_total{phase}`: phase changes, by the new phase.
    * `slurmrestd_request_seconds{cluster,endpoint,method,status_class}`: latency histogram;
      endpoint is the path template, status_class "2xx".."5xx", "timeout" or "error".
    * `poll_cycle_seconds{cluster}`: histogram of poll cycle durations.
    * `poll_requests{cluster}`: slurmrestd requests made by the last finished poll cycle.
    * `jobs{phase}`: tracked SlurmJobs by phase, every cluster's (`set_jobs_by_phase`).
    * `token_expiry_seconds{cluster}`: seconds until the cluster's slurmrestd token expires
      (`set_token_expiry`); NaN when unknown.
    * `slurmrestd_reachable{cluster}`: 1 when the cluster's slurmrestd answered the last poll,
      0 when it failed or refused the credentials (`set_reachable`).

    Every slurmrestd, poll and token metric carries the `cluster` label (the name `spec.cluster`
    uses; `SLURMJOB_CLUSTER_NAME` with one cluster), so that several clusters never overwrite
    each other's figures.
    * `waiting_submissions`: submissions waiting for a slot (`SLURMJOB_SUBMIT_CONCURRENCY`
      bounds those in progress; set by the controller's `FairLimiter`).
    * `catalogs`: the re-read site catalogs' (`CatalogMetrics`).
    * `images`: the image cache's, by scope (`imagemetrics.ImageCacheMetrics`).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.submissions_total = Counter(
            f"{PREFIX}_submissions",
            "Job submissions to slurmrestd, by result.",
            ["result"],
            registry=reg,
        )
        self.adoptions_total = Counter(
            f"{PREFIX}_adoptions",
            "Slurm jobs adopted (found again after a lost answer or a restart) instead of "
            "submitted, by how they were found.",
            ["how"],
            registry=reg,
        )
        self.duplicates_total = Counter(
            f"{PREFIX}_duplicates",
            "Slurm jobs cancelled because they carried the identity of an attempt that "
            "already had an (older) job.",
            registry=reg,
        )
        self.proven_absent_total = Counter(
            f"{PREFIX}_proven_absent",
            "Unconfirmed submits proven absent (neither in the controller nor in accounting "
            "after the fencing window), whose next attempt went out without a person.",
            registry=reg,
        )
        self.late_submits_cancelled_total = Counter(
            f"{PREFIX}_late_submits_cancelled",
            "Jobs of attempts proven absent that appeared after all and were cancelled.",
            registry=reg,
        )
        self.reconcile_errors_total = Counter(
            f"{PREFIX}_reconcile_errors",
            "Reconciles of a SlurmJob that failed unexpectedly (a bug or an unforeseen answer); "
            "each is looked at again after a backoff, never dropped.",
            registry=reg,
        )
        self.wakes_pending = Gauge(
            f"{PREFIX}_wakes_pending",
            "SlurmJobs with a wake pending: a wait (Kueue, upstreams, a retry's due time, an "
            "eviction ending) or a failed reconcile to look at again.",
            registry=reg,
        )
        self.memory_returned_bytes_total = Counter(
            f"{PREFIX}_memory_returned_bytes",
            "Resident bytes the periodic malloc_trim gave back to the system "
            "(SLURMJOB_MEMORY_TRIM_INTERVAL).",
            registry=reg,
        )
        self.resident_memory_bytes = Gauge(
            f"{PREFIX}_resident_memory_bytes",
            "The operator process's resident set; the chart's memory limit is sized against its "
            "peak (docs/helm.md, Sizing).",
            registry=reg,
        )
        self.job_changes_refused_total = Counter(
            f"{PREFIX}_job_changes_refused",
            "Changes to a Slurm job (cancel, hold, release, dependency) refused because the "
            "job could not be verified as the resource's, by why: identity (name, comment or "
            "id), owner (its Slurm user), cluster (the tenant may not use the cluster).",
            ["why"],
            registry=reg,
        )
        self.transitions_total = Counter(
            f"{PREFIX}_transitions",
            "SlurmJob phase transitions, by the new phase.",
            ["phase"],
            registry=reg,
        )
        self.slurmrestd_request_seconds = Histogram(
            f"{PREFIX}_slurmrestd_request_seconds",
            "Latency of slurmrestd requests, by cluster, endpoint template, method and status "
            "class.",
            ["cluster", "endpoint", "method", "status_class"],
            buckets=REQUEST_BUCKETS,
            registry=reg,
        )
        self.poll_cycle_seconds = Histogram(
            f"{PREFIX}_poll_cycle_seconds",
            "Duration of one poll cycle over the cluster's tracked jobs.",
            ["cluster"],
            buckets=CYCLE_BUCKETS,
            registry=reg,
        )
        self.poll_requests = Gauge(
            f"{PREFIX}_poll_requests",
            "slurmrestd requests made by the cluster's last poll cycle.",
            ["cluster"],
            registry=reg,
        )
        self.jobs = Gauge(
            f"{PREFIX}_jobs",
            "Tracked SlurmJobs, by phase.",
            ["phase"],
            registry=reg,
        )
        self.token_expiry_seconds = Gauge(
            f"{PREFIX}_token_expiry_seconds",
            "Seconds until the cluster's slurmrestd token expires (NaN when unknown).",
            ["cluster"],
            registry=reg,
        )
        self.slurmrestd_reachable = Gauge(
            f"{PREFIX}_slurmrestd_reachable",
            "1 when the cluster's slurmrestd answered the last poll, 0 when it failed or "
            "refused the credentials.",
            ["cluster"],
            registry=reg,
        )
        self.waiting_submissions = Gauge(
            f"{PREFIX}_waiting_submissions",
            "Submissions (render, stage, POST) waiting for one of the SLURMJOB_SUBMIT_CONCURRENCY "
            "slots; served round-robin across namespaces.",
            registry=reg,
        )
        self.leader = Gauge(
            f"{PREFIX}_leader",
            "1 in the replica that holds the Lease and runs the operator, 0 in a standby.",
            registry=reg,
        )
        self.images = ImageCacheMetrics(reg, PREFIX)
        self.catalogs = CatalogMetrics(reg)
        for result in SUBMISSION_RESULTS:
            self.submissions_total.labels(result=result)
        for phase in Phase:
            self.transitions_total.labels(phase=phase.value)
            self.jobs.labels(phase=phase.value).set(0)
        self._job_phases: set[str] = {p.value for p in Phase}
        self._cycle: ContextVar[PollCycle | None] = ContextVar(
            f"{PREFIX}_poll_cycle_{id(self)}", default=None
        )

    # -- counters ----------------------------------------------------------------------

    def count_submission(self, result: SubmissionResult) -> None:
        if result not in SUBMISSION_RESULTS:
            raise ValueError(f"unknown submission result {result!r}")
        self.submissions_total.labels(result=result).inc()

    def count_adoption(self, how: str) -> None:
        self.adoptions_total.labels(how=how).inc()

    def count_transition(self, phase: Phase | str) -> None:
        self.transitions_total.labels(phase=str(phase)).inc()

    # -- slurmrestd requests and poll cycles ---------------------------------------------

    def on_request(
        self, endpoint: str, method: str, status_class: str, seconds: float, *, cluster: str
    ) -> None:
        """One slurmrestd request of `cluster` (see `requests_of`)."""
        self.slurmrestd_request_seconds.labels(
            cluster=cluster, endpoint=endpoint, method=method.upper(), status_class=status_class
        ).observe(max(0.0, seconds))
        current = self._cycle.get()
        if current is not None:
            current.count()

    def requests_of(self, cluster: str) -> Callable[[str, str, str, float], None]:
        """The slurmrestd client's `OnRequest` callback for the clients of `cluster`."""
        return functools.partial(self.on_request, cluster=cluster)

    @contextlib.contextmanager
    def cycle(self, cluster: str) -> Iterator[PollCycle]:
        """Measure one poll cycle: its duration goes to `poll_cycle_seconds` and the number of
        slurmrestd requests made inside it (this context and tasks started from it) to
        `poll_requests`. Also recorded when the body raises. Usable around `await`s."""
        current = PollCycle()
        token = self._cycle.set(current)
        try:
            yield current
        finally:
            self._cycle.reset(token)
            current.seconds = time.monotonic() - current.started
            self.poll_cycle_seconds.labels(cluster=cluster).observe(current.seconds)
            self.poll_requests.labels(cluster=cluster).set(current.requests)

    # -- gauges ------------------------------------------------------------------------

    def set_jobs_by_phase(self, counts: Mapping[str, int]) -> None:
        """Set `jobs{phase}` from this cycle's counts; phases not in `counts` read 0."""
        given = {str(phase): n for phase, n in counts.items()}
        for phase in self._job_phases - given.keys():
            self.jobs.labels(phase=phase).set(0)
        for phase, n in given.items():
            self.jobs.labels(phase=phase).set(n)
        self._job_phases |= given.keys()

    def set_token_expiry(
        self, expires_at: datetime | None, *, cluster: str, now: datetime | None = None
    ) -> None:
        """`token_expiry_seconds{cluster}` = expires_at - now (negative once expired); NaN
        when the expiry is unknown. Call it every poll cycle."""
        gauge = self.token_expiry_seconds.labels(cluster=cluster)
        if expires_at is None:
            gauge.set(float("nan"))
            return
        if expires_at.tzinfo is None:
            raise ValueError("expires_at must be timezone-aware")
        moment = now if now is not None else datetime.now(tz=UTC)
        gauge.set((expires_at - moment).total_seconds())

    def set_reachable(self, cluster: str, reachable: bool) -> None:
        self.slurmrestd_reachable.labels(cluster=cluster).set(1 if reachable else 0)

    def sample(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """One sample's current value (full name, e.g. `slurmjob_operator_jobs`), for tests
        and the CLI."""
        return self.registry.get_sample_value(name, dict(labels or {}))


# -- the site catalogs re-read while the operator runs (controller.catalogreload) -----------


class CatalogMetrics:
    """The runtime registry's and the GPU series catalog's, by `cluster` and `catalog`
    (`runtime-registry`, `gpu-series`): a handful of series, one per file.

    * `catalog_reload_errors_total`: edits of the file refused (each refused content once);
      the last good copy stayed in use.
    * `catalog_stale`: 1 while the file holds a refused edit (the copy in use is older than
      the file), 0 when the copy in use is the file's.
    * `catalog_loaded_timestamp_seconds`: when the copy in use was read (Unix time).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["cluster", "catalog"]
        self.reload_errors_total = Counter(
            f"{PREFIX}_catalog_reload_errors",
            "Edits of a site catalog file (runtime registry, GPU series) refused because they "
            "do not read, parse or validate; the last good copy stays in use.",
            labels,
            registry=registry,
        )
        self.stale = Gauge(
            f"{PREFIX}_catalog_stale",
            "1 while a site catalog's file holds a refused edit and the last good copy is in "
            "use, 0 when the copy in use is the file's.",
            labels,
            registry=registry,
        )
        self.loaded_timestamp_seconds = Gauge(
            f"{PREFIX}_catalog_loaded_timestamp_seconds",
            "When the copy in use of a site catalog was read from its file (Unix time).",
            labels,
            registry=registry,
        )

    def observe(
        self, cluster: str, catalog: str, *, loaded_at: float, stale: bool, refused: bool = False
    ) -> None:
        """The state of one file after a look at it; `refused`: this look refused an edit."""
        errors = self.reload_errors_total.labels(cluster=cluster, catalog=catalog)  # 0 at first
        if refused:
            errors.inc()
        self.stale.labels(cluster=cluster, catalog=catalog).set(1 if stale else 0)
        self.loaded_timestamp_seconds.labels(cluster=cluster, catalog=catalog).set(loaded_at)
