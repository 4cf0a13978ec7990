"""What one poll interval costs slurmrestd, against the real Slurm test clusters.

The claim under test: the number of slurmrestd requests and the bytes received per poll
interval must not grow with the number of *unchanged* tracked jobs. For each size N the bench
submits N held jobs (PENDING, no CPU used), then measures in the same run:

* the operator's own `Poller.cycle()` with the real `SlurmClient`, tracking all N jobs: the
  first cycle (first sight: details of every job), steady cycles with nothing changed, and the
  cycle after k jobs were cancelled;
* the baseline a naive operator pays every interval: one `GET /job/{id}` per tracked job,
  sequential and with a few requests in flight;
* `GET /jobs` (every job the controller holds) once.

Requests are counted twice: by the client's `on_request` callback (`Metrics.on_request`, the
operator's `poll_requests` gauge) and by the transport; bytes are response body bytes as the
transport read them. Every job the bench submits carries the name prefix `PREFIX` and is
cancelled at the end; leftovers of an earlier run with that prefix are cancelled at the start.
Running clusters are re-used (SLURMJOB_TESTBED_KEEP semantics) and never stopped.

    .venv/bin/python bench/poll_cost.py --sizes 100,1000,5000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.testbed` lives next to the package, not inside it
    sys.path.insert(0, str(ROOT))

from tests.testbed import slurm as testbed  # noqa: E402
from tests.testbed.handles import cancel_own  # noqa: E402

from slurmjob_operator.api.resource import ObjectRef  # noqa: E402
from slurmjob_operator.config import Settings  # noqa: E402
from slurmjob_operator.controller import Tracked  # noqa: E402
from slurmjob_operator.controller.poller import Poller  # noqa: E402
from slurmjob_operator.core.jobview import SlurmJobView  # noqa: E402
from slurmjob_operator.metrics import Metrics  # noqa: E402
from slurmjob_operator.slurm.auth import MintedToken  # noqa: E402
from slurmjob_operator.slurm.client import SlurmClient  # noqa: E402
from slurmjob_operator.slurm.connect import connect  # noqa: E402
from slurmjob_operator.slurm.errors import SlurmNotFound, SlurmTransient  # noqa: E402
from slurmjob_operator.slurm.http import HttpResponse, HttpTransport  # noqa: E402

if TYPE_CHECKING:
    from slurmjob_operator.controller import Controller

PREFIX = "slurmjob-bench-poll-"
DOC_BEGIN = "<!-- poll-cost:begin -->"
DOC_END = "<!-- poll-cost:end -->"
DEFAULT_DOC = ROOT / "docs" / "benchmarks.md"
JOB_HELD = 2042  # ESLURM_JOB_HELD


# -- measuring ------------------------------------------------------------------------------


class MeteredTransport(HttpTransport):
    """The project's transport, counting requests and response body bytes."""

    def __init__(self) -> None:
        super().__init__(None, max_connections=32)  # what `open_transport` builds for http
        self.requests = 0
        self.received = 0

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Sequence[tuple[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout: float,  # noqa: ASYNC109 - the parent's signature
    ) -> HttpResponse:
        self.requests += 1
        response = await super().request(
            method, url, params=params, headers=headers, body=body, timeout=timeout
        )
        self.received += len(response.body)
        return response


@dataclass
class Sample:
    seconds: float
    requests: int  # as the transport counted them
    received: int  # response body bytes
    reported: int | None = None  # as the client's on_request reported them (poll cycles)
    refreshed: int | None = None  # jobs the poller handed to the controller (poll cycles)
    not_modified: bool | None = None  # v0.0.38 poll cycles: answered 304
    failed: int = 0  # baseline requests that got no answer (SlurmTransient)


async def metered(transport: MeteredTransport, work: Callable[[], Awaitable[Any]]) -> Sample:
    requests, received = transport.requests, transport.received
    started = time.perf_counter()
    await work()
    return Sample(
        seconds=time.perf_counter() - started,
        requests=transport.requests - requests,
        received=transport.received - received,
    )


@dataclass
class Row:
    """Several runs of one operation; the median run stands for it."""

    what: str
    samples: list[Sample]
    note: str = ""

    @property
    def median(self) -> Sample:
        ordered = sorted(self.samples, key=lambda s: s.seconds)
        return ordered[(len(ordered) - 1) // 2]

    @property
    def seconds(self) -> float:
        return statistics.median(s.seconds for s in self.samples)

    @property
    def span(self) -> tuple[float, float]:
        times = [s.seconds for s in self.samples]
        return min(times), max(times)


@dataclass
class SizeResult:
    jobs: int
    in_controller: int  # jobs `GET /jobs` returned (every user's, not only the bench's)
    submit_ms_each: float
    rows: dict[str, Row] = field(default_factory=dict)


@dataclass
class ClusterResult:
    name: str
    api_version: str
    release: str
    sizes: list[SizeResult] = field(default_factory=list)
    error: str | None = None  # why the run on this cluster stopped early


# -- the operator's side: a controller that only tracks --------------------------------------


class BenchController:
    """What `Poller` needs from the operator's controller, tracking a fixed set of job ids."""

    def __init__(
        self, client: SlurmClient, metrics: Metrics, token: MintedToken, job_ids: Iterable[int]
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.token = token
        self.settings = Settings(poll_interval=10.0)
        self.tracked = {
            f"uid-{i}": Tracked(ObjectRef("bench", f"job-{i}", f"uid-{i}"), i, None, None)
            for i in job_ids
        }
        self.refreshed = 0
        self.failures: list[str] = []

    def followed(self) -> list[Tracked]:
        return list(self.tracked.values())

    def phase_counts(self) -> dict[str, int]:
        return {}

    async def slurm(self) -> SlurmClient:
        return self.client

    async def report_reachability(self, reachable: bool, reason: str, message: str) -> None:
        if not reachable:
            self.failures.append(f"{reason}: {message}")

    async def refresh(
        self, tracked: Tracked, views: Sequence[SlurmJobView] | None, *, logs_only: bool = False
    ) -> None:
        self.refreshed += 1


async def poll_cycle(
    poller: Poller, controller: BenchController, transport: MeteredTransport
) -> Sample:
    before = controller.refreshed
    sample = await metered(transport, poller.cycle)
    if controller.failures:
        raise RuntimeError(f"poll cycle failed: {controller.failures[-1]}")
    reported = controller.metrics.sample(
        "slurmjob_operator_poll_requests", {"cluster": controller.settings.cluster_name}
    )
    sample.reported = int(reported) if reported is not None else None
    sample.refreshed = controller.refreshed - before
    if not controller.client.dialect.supports_jobs_state:
        sample.not_modified = sample.received == 0
    return sample


# -- jobs: submit held, cancel by prefix ----------------------------------------------------


def job_body(api_version: str, name: str, workdir: Path) -> dict[str, Any]:
    """A held one-task job that never runs: nothing but a controller record."""
    job: dict[str, Any] = {
        "name": name,
        "partition": "debug",
        "hold": True,
        "time_limit": 1,
        "current_working_directory": str(workdir),
        "standard_output": "/dev/null",
        "standard_error": "/dev/null",
    }
    script = "#!/bin/sh\ntrue\n"
    if api_version == "v0.0.38":
        return {"script": script, "job": {**job, "environment": {"PATH": "/usr/bin:/bin"}}}
    return {"job": {**job, "script": script, "environment": ["PATH=/usr/bin:/bin"]}}


async def submit_held(
    transport: MeteredTransport,
    tb: testbed.SlurmTestbed,
    token: MintedToken,
    api_version: str,
    names: Sequence[str],
    concurrency: int,
) -> list[int]:
    """Raw `POST /job/submit` bodies; the job ids in submission order."""
    workdir = tb.storage_root / "bench-poll-cost"
    workdir.mkdir(exist_ok=True)
    os.chown(workdir, tb.uid, tb.gid)
    url = f"{tb.rest_url}/slurm/{api_version}/job/submit"
    slots = asyncio.Semaphore(concurrency)

    async def one(name: str) -> int:
        body = json.dumps(job_body(api_version, name, workdir)).encode()
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "X-SLURM-USER-NAME": tb.user,
            "X-SLURM-USER-TOKEN": token.token(),
        }
        async with slots:
            response = await transport.request("POST", url, headers=headers, body=body, timeout=60)
        payload = json.loads(response.body or b"{}")
        job_id = payload.get("job_id")
        # 22.05 reports a held job as error 2042 (ESLURM_JOB_HELD) next to its job id.
        errors = [e for e in payload.get("errors") or [] if e.get("error_code") != JOB_HELD]
        if response.status != 200 or errors or not isinstance(job_id, int) or job_id <= 0:
            raise RuntimeError(f"submit {name}: HTTP {response.status}: {response.body[:300]!r}")
        return job_id

    # A TaskGroup: when one submit fails the others are cancelled and awaited, so the
    # clean-up that follows sees every job this call created.
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(n)) for n in names]
    return [t.result() for t in tasks]


async def cancel_jobs(client: SlurmClient, job_ids: Iterable[int], concurrency: int) -> None:
    slots = asyncio.Semaphore(concurrency)

    async def one(job_id: int) -> None:
        async with slots:
            with contextlib.suppress(SlurmNotFound):
                await cancel_own(client, job_id)

    await asyncio.gather(*(one(i) for i in job_ids))


async def cancel_by_prefix(client: SlurmClient, concurrency: int) -> int:
    """Cancel every job still live whose name starts with PREFIX; how many there were."""
    listing = await client.list_jobs()
    live = sorted({j.job_id for j in listing.jobs if j.name.startswith(PREFIX) and not j.is_final})
    await cancel_jobs(client, live, concurrency)
    return len(live)


async def jobs_in_controller(client: SlurmClient) -> int:
    if client.dialect.supports_jobs_state:
        return len(await client.jobs_state(None))
    return len((await client.list_jobs()).jobs)


def max_job_count(tb: testbed.SlurmTestbed) -> int:
    match = re.search(r"^MaxJobCount\s*=\s*(\d+)", tb.scontrol("show", "config"), re.M)
    return int(match.group(1)) if match else 10000


async def wait_for_room(
    client: SlurmClient, tb: testbed.SlurmTestbed, needed: int, headroom: int, wait: float
) -> bool:
    """Whether `needed` more jobs fit under MaxJobCount with `headroom` left for the other
    users of the shared cluster; waits up to `wait` s for ended jobs to be purged."""
    limit = max_job_count(tb)
    deadline = time.monotonic() + wait
    while True:
        held = await jobs_in_controller(client)
        if held + needed + headroom <= limit:
            return True
        if time.monotonic() >= deadline:
            log(f"  no room: {held} jobs held, {needed} wanted, MaxJobCount={limit}")
            return False
        log(f"  waiting for room: {held} jobs held + {needed} > {limit} - {headroom}")
        await asyncio.sleep(15)


# -- one cluster ----------------------------------------------------------------------------


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Options:
    cycles: int
    repeats: int
    concurrency: int
    changed: int
    headroom: int
    wait_for_room: float


async def bench_cluster(name: str, sizes: Sequence[int], opts: Options) -> ClusterResult:
    status = testbed.cluster_status(name)
    if "down" in status or "rest=ok" not in status:
        raise RuntimeError(
            f"cluster {name} is not running ({status}); start it with `make dev-up` "
            "(the bench re-uses running clusters and never starts or stops them itself)"
        )
    tb = testbed.start_cluster(name, reuse=True)  # healthy and running: re-used as is
    settings = Settings(
        slurm_rest_url=tb.rest_url,
        slurm_rest_api_version=tb.api_version,
        slurm_rest_user=tb.user,
        slurm_jwt_key_file=tb.jwt_key_file,
        slurm_rest_timeout=300.0,
    )
    token = MintedToken(tb.jwt_key_file, tb.user, 3600)
    metrics = Metrics()
    transport = MeteredTransport()
    client = await connect(settings, transport, token=token, on_request=metrics.on_request)
    ping = await client.ping()
    result = ClusterResult(name, client.version, ping.release or "?")
    log(f"== Slurm {result.release} ({client.version}) at {tb.rest_url}")
    run = uuid.uuid4().hex[:6]
    live: list[int] = []
    submitted = 0
    try:
        left = await cancel_by_prefix(client, opts.concurrency)
        if left:
            log(f"  cancelled {left} jobs left by an earlier run")
        for n in sizes:
            needed = max(0, n - len(live))
            if not await wait_for_room(client, tb, needed, opts.headroom, opts.wait_for_room):
                log(f"  skipping N={n}")
                continue
            names = [f"{PREFIX}{run}-{submitted + i}" for i in range(needed)]
            log(f"-- N={n}: submitting {needed} held jobs")
            started = time.perf_counter()
            live += await submit_held(transport, tb, token, client.version, names, opts.concurrency)
            submit_seconds = time.perf_counter() - started
            submitted += needed
            try:
                size = await bench_size(client, metrics, token, transport, live[:n], opts)
            except Exception as exc:  # keep what was measured so far; clean up below
                result.error = f"N={n}: {type(exc).__name__}: {exc}"
                log(f"  stopped: {result.error}")
                break
            size.submit_ms_each = 1000 * submit_seconds / needed if needed else float("nan")
            result.sizes.append(size)
            k = min(opts.changed, n)
            changed = set(live[n - k : n])
            live = [i for i in live if i not in changed]  # ended: the operator stops tracking
    finally:
        log("  cleaning up")
        try:
            await cancel_jobs(client, live, opts.concurrency)
            left = await cancel_by_prefix(client, opts.concurrency)
            if left:
                log(f"  cancelled {left} more jobs by name prefix")
        except Exception as exc:
            note = f"clean-up incomplete ({exc}); run again with --cleanup-only"
            result.error = f"{result.error}; {note}" if result.error else note
            log(f"  {note}")
        await transport.close()
    return result


async def bench_size(
    client: SlurmClient,
    metrics: Metrics,
    token: MintedToken,
    transport: MeteredTransport,
    job_ids: Sequence[int],
    opts: Options,
) -> SizeResult:
    n = len(job_ids)
    rows: dict[str, Row] = {}
    if not client.dialect.supports_jobs_state:
        # `update_time` has one-second resolution and the poller asks from 1 s before its
        # last sweep: let the submissions age out of that window.
        await asyncio.sleep(2.5)
    controller = BenchController(client, metrics, token, job_ids)
    poller = Poller(cast("Controller", controller))
    log("   first poll cycle")
    rows["first"] = Row(
        "poll cycle, first sight", [await poll_cycle(poller, controller, transport)]
    )
    log(f"   {opts.cycles} steady poll cycles")
    steady = [await poll_cycle(poller, controller, transport) for _ in range(opts.cycles)]
    rows["steady"] = Row(f"poll cycle, nothing changed (median of {opts.cycles})", steady)

    failed = 0

    async def get_one(job_id: int) -> None:
        nonlocal failed
        try:
            await client.get_job(job_id)
        except SlurmTransient as exc:  # counted and shown, not fatal: part of the answer
            failed += 1
            if failed <= 3:
                log(f"   GET /job/{job_id}: {exc}")

    async def each_sequential() -> None:
        for job_id in job_ids:
            await get_one(job_id)

    slots = asyncio.Semaphore(opts.concurrency)

    async def each_concurrent() -> None:
        async def one(job_id: int) -> None:
            async with slots:
                await get_one(job_id)

        await asyncio.gather(*(one(i) for i in job_ids))

    async def per_job(work: Callable[[], Awaitable[None]]) -> Sample:
        nonlocal failed
        failed = 0
        sample = await metered(transport, work)
        sample.failed = failed
        return sample

    log(f"   per-job GETs x{opts.repeats}, sequential and {opts.concurrency} at a time")
    rows["per_job"] = Row(
        f"`GET /job/{{id}}` per job, sequential (median of {opts.repeats})",
        [await per_job(each_sequential) for _ in range(opts.repeats)],
    )
    rows["per_job_conc"] = Row(
        f"`GET /job/{{id}}` per job, {opts.concurrency} in flight (median of {opts.repeats})",
        [await per_job(each_concurrent) for _ in range(opts.repeats)],
    )
    counts: list[int] = []

    async def list_all() -> None:
        counts.append(len((await client.list_jobs()).jobs))

    log(f"   GET /jobs x{opts.repeats}")
    rows["list"] = Row(
        f"`GET /jobs`, every job (median of {opts.repeats})",
        [await metered(transport, list_all) for _ in range(opts.repeats)],
    )
    k = min(opts.changed, n)
    log(f"   cancel {k} jobs, one more poll cycle")
    await cancel_jobs(client, job_ids[n - k :], opts.concurrency)
    rows["changed"] = Row(
        f"poll cycle after {k} jobs were cancelled",
        [await poll_cycle(poller, controller, transport)],
    )
    return SizeResult(jobs=n, in_controller=max(counts), submit_ms_each=0.0, rows=rows)


# -- reporting ------------------------------------------------------------------------------


def fmt_bytes(n: float) -> str:
    if n < 1000:
        return f"{n:.0f} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"


def fmt_seconds(s: float) -> str:
    if s < 0.01:
        return f"{s * 1000:.1f} ms"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    return f"{s:.2f} s"


def fmt_factor(x: float) -> str:
    if x >= 10:
        return f"{x:,.0f}x"
    return f"{x:.1f}x"


def compare(base: float, value: float, noun: str, fewer: str, more: str) -> str:
    if value == 0:
        return f"no {noun}"
    ratio = base / value
    if 0.95 <= ratio <= 1.05:
        return f"same {noun}"
    return f"{fmt_factor(ratio)} {fewer}" if ratio > 1 else f"{fmt_factor(1 / ratio)} {more}"


def versus(row: Row, base: Row) -> str:
    """How `row` compares with the sequential per-job GETs of the same size."""
    if row is base:
        return "baseline"
    m, b = row.median, base.median
    return ", ".join(
        [
            compare(base.seconds, row.seconds, "time", "faster", "slower"),
            compare(b.requests, m.requests, "requests", "fewer requests", "more requests"),
            compare(b.received, m.received, "body bytes", "fewer bytes", "more bytes"),
        ]
    )


def row_cells(size: SizeResult, key: str, row: Row, base: Row) -> list[str]:
    m = row.median
    requests = f"{m.requests:,}"
    failures = sum(s.failed for s in row.samples)
    if failures:
        requests += f" ({failures:,} unanswered over {len(row.samples)} runs)"
    if m.reported is not None and m.reported != m.requests:
        requests += f" (on_request: {m.reported:,})"
    if key == "steady" and len({s.requests for s in row.samples}) > 1:
        requests += (
            f" ({min(s.requests for s in row.samples)}-{max(s.requests for s in row.samples)})"
        )
    received = fmt_bytes(m.received)
    if m.not_modified:
        received += " (304)"
    elapsed = fmt_seconds(row.seconds)
    if len(row.samples) > 1:
        lo, hi = row.span
        elapsed += f" ({fmt_seconds(lo)}-{fmt_seconds(hi)})"
    what = row.what
    if m.refreshed is not None:
        what += f"; {m.refreshed:,} jobs refreshed"
    if key == "list":
        what += f"; {size.in_controller:,} jobs returned"
    return [f"{size.jobs:,}", what, requests, received, elapsed, versus(row, base)]


ORDER = ("first", "steady", "changed", "per_job", "per_job_conc", "list")


def markdown(results: Sequence[ClusterResult]) -> str:
    out: list[str] = []
    for cluster in results:
        out.append(f"### Slurm {cluster.release} (REST API {cluster.api_version})")
        out.append("")
        out.append(
            "| jobs tracked | what | requests | received | wall time | vs per-job GETs "
            "(sequential) |"
        )
        out.append("| ---: | --- | ---: | ---: | ---: | --- |")
        for size in cluster.sizes:
            base = size.rows["per_job"]
            for key in ORDER:
                row = size.rows[key]
                out.append("| " + " | ".join(row_cells(size, key, row, base)) + " |")
        out.append("")
        if cluster.error:
            out.append(f"The run on this cluster stopped early: {cluster.error}")
            out.append("")
        submits = ", ".join(
            f"N={s.jobs:,}: {s.submit_ms_each:.1f} ms"
            for s in cluster.sizes
            if s.submit_ms_each == s.submit_ms_each
        )
        if submits:
            out.append(f"Held-job submission (wall time per job submitted): {submits}.")
            out.append("")
    headlines = [headline(c, s) for c in results for s in c.sizes]
    if headlines:
        out.append("In short:")
        out.append("")
        out.extend(f"- {h}" for h in headlines)
        out.append("")
    return "\n".join(out)


def headline(cluster: ClusterResult, size: SizeResult) -> str:
    steady, base = size.rows["steady"], size.rows["per_job"]
    changed = size.rows["changed"]
    s, b, c = steady.median, base.median, changed.median
    factor = base.seconds / steady.seconds if steady.seconds > 0 else float("inf")
    return (
        f"{cluster.release}, {size.jobs:,} jobs: steady cycle {s.requests:,} "
        f"request{'s' if s.requests != 1 else ''}, {fmt_bytes(s.received)}, "
        f"{fmt_seconds(steady.seconds)} vs per-job GETs {b.requests:,} requests, "
        f"{fmt_bytes(b.received)}, {fmt_seconds(base.seconds)}: {fmt_factor(factor)} faster; "
        f"after {c.refreshed} changes: {c.requests:,} request{'s' if c.requests != 1 else ''}, "
        f"{fmt_bytes(c.received)}, "
        f"{fmt_seconds(changed.seconds)}"
    )


def machine(results: Sequence[ClusterResult]) -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    slurm = ", ".join(f"{c.release} ({c.api_version})" for c in results)
    return (
        f"{os.cpu_count()} CPUs (`nproc`), {cpu}; Linux {platform.release()}; "
        f"Python {platform.python_version()}; Slurm {slurm}; slurmrestd and the bench on the "
        "same machine over loopback, each Slurm cluster with two slurmd nodes on that machine."
    )


def report(results: Sequence[ClusterResult], command: str) -> str:
    when = datetime.now(tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            f"Measured {when} with `{command}`.",
            "",
            f"Machine: {machine(results)}",
            "",
            markdown(results),
        ]
    )


def write_doc(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    fresh = f"{DOC_BEGIN}\n{block.rstrip()}\n{DOC_END}"
    pattern = re.compile(re.escape(DOC_BEGIN) + r".*?" + re.escape(DOC_END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: fresh, text)
    else:
        text = text.rstrip() + "\n\n" + fresh + "\n"
    path.write_text(text)


# -- main -----------------------------------------------------------------------------------


def sizes_arg(text: str) -> list[int]:
    sizes = sorted({int(part.replace("_", "")) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("sizes are positive integers, e.g. 100,1000")
    return sizes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=sizes_arg, default=[100, 1000, 5000], help="N on 26.05")
    p.add_argument("--sizes-2205", type=sizes_arg, default=[100, 1000], help="N on 22.05 (v0.0.38)")
    p.add_argument(
        "--clusters", default="26.05,22.05", help="which test clusters, e.g. 26.05 or 26.05,22.05"
    )
    p.add_argument("--cycles", type=int, default=7, help="steady poll cycles per size (>= 5)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each baseline per size")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight for baselines")
    p.add_argument("--changed", type=int, default=10, help="k: jobs cancelled before last cycle")
    p.add_argument(
        "--headroom",
        type=int,
        default=2000,
        help="job slots under MaxJobCount to leave to other users of the shared clusters",
    )
    p.add_argument(
        "--wait-for-room", type=float, default=330.0, help="s to wait for ended jobs to purge"
    )
    p.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="markdown file to update")
    p.add_argument("--no-doc", action="store_true", help="print only, leave the doc alone")
    p.add_argument("--json", type=Path, help="also write the raw samples here")
    p.add_argument(
        "--cleanup-only", action="store_true", help="cancel leftover bench jobs and exit"
    )
    return p.parse_args(argv)


async def cleanup_only(clusters: Sequence[str]) -> None:
    for name in clusters:
        tb = testbed.start_cluster(name, reuse=True)
        token = MintedToken(tb.jwt_key_file, tb.user, 600)
        settings = Settings(
            slurm_rest_url=tb.rest_url,
            slurm_rest_api_version=tb.api_version,
            slurm_rest_user=tb.user,
            slurm_jwt_key_file=tb.jwt_key_file,
            slurm_rest_timeout=300.0,
        )
        async with MeteredTransport() as transport:
            client = await connect(settings, transport, token=token)
            log(f"{name}: cancelled {await cancel_by_prefix(client, 8)} jobs")


async def main_async(args: argparse.Namespace) -> list[ClusterResult]:
    opts = Options(
        cycles=args.cycles,
        repeats=args.repeats,
        concurrency=args.concurrency,
        changed=args.changed,
        headroom=args.headroom,
        wait_for_room=args.wait_for_room,
    )
    results: list[ClusterResult] = []
    for name in [c.strip() for c in args.clusters.split(",") if c.strip()]:
        sizes = args.sizes_2205 if name == "22.05" else args.sizes
        try:
            results.append(await bench_cluster(name, sizes, opts))
        except Exception as exc:  # e.g. the cluster is down: report the others
            log(f"{name}: {type(exc).__name__}: {exc}")
            results.append(ClusterResult(name, "?", name, error=f"{type(exc).__name__}: {exc}"))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault(testbed.KEEP_ENV, "1")  # re-use running clusters, never stop them
    clusters = [c.strip() for c in args.clusters.split(",") if c.strip()]
    if args.cleanup_only:
        asyncio.run(cleanup_only(clusters))
        return 0
    if args.cycles < 5:
        raise SystemExit("--cycles must be at least 5")
    results = asyncio.run(main_async(args))
    command = ".venv/bin/python bench/poll_cost.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    text = report(results, command.strip())
    print(text)
    if args.json:
        raw = [
            {
                "cluster": c.name,
                "release": c.release,
                "api_version": c.api_version,
                "sizes": [asdict(s) for s in c.sizes],
            }
            for c in results
        ]
        args.json.write_text(json.dumps(raw, indent=2))
    if not args.no_doc:
        write_doc(args.doc, text)
        log(f"updated {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
