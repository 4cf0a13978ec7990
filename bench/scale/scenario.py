"""One measured run: one operator (ours or the baseline), one shape, N SlurmJobs.

Shapes: `live` creates the objects while the operator runs; `backlog` creates them first and
then starts the operator (a first install against a GitOps repository, or downtime). Each run
goes through the same phases, each stamped in `marks` (wall times):

submit -> steady (W intervals, nothing changes) -> change (1 % of the jobs cancelled in Slurm
per round) -> restart (SIGKILL, start again) -> bulk delete -> clean-up.

`live` deletes after the restart's first steady cycle was seen; `backlog` deletes right after
the restart (what the issue found slowest), and measures no restart cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.testbed.handles import cancel_own

from bench.scale import requests as reqs
from bench.scale.kubeapi import BATCH_LABEL, BATCH_SIZE, Kube, Watcher, etcd_db_size
from bench.scale.sampler import Sampler
from slurmjob_operator.config import Settings
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.slurm.auth import MintedToken
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "bench-scale"
JOB_PREFIX = f"sj-{NAMESPACE}-"  # both operators name their Slurm jobs sj-<namespace>-<name>...
# What every job runs: a few KiB of log, then it waits (only 4 run at once on the testbed).
JOB_COMMAND = [
    "bash",
    "-c",
    'for i in $(seq 1 40); do echo "bench line $i: $(printf %080d 0)"; done; '
    "echo to-stderr >&2; sleep 3600",
]


# What the operators read and write in the apiserver (kopf's peering is off: --standalone).
OWN_RESOURCES = frozenset({"slurmjobs", "events"})


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Options:
    interval: float = 10.0
    steady_intervals: int = 3
    change_rounds: int = 2
    change_fraction: float = 0.01
    create_concurrency: int = 32
    submit_timeout: float = 900.0
    restart_window: float = 6.0  # intervals to wait for the first steady cycle
    delete_timeout: float = 600.0


@dataclass
class Context:
    """What every run shares: the stack, the proxy's log, the operator's environment."""

    kube: Kube
    slurm: SlurmClient  # straight to slurmrestd (not counted), as the job user
    slurm_user: str
    requests: reqs.RequestLog
    env: dict[str, str]  # for the operator under test: SLURMJOB_* pointing at the proxy
    etcd_url: str
    log_dir: Path


def spec() -> dict[str, Any]:
    return {
        "framework": {"kind": "custom", "name": "custom", "runtimeId": "custom-sif"},
        "command": JOB_COMMAND,
        "pools": [{"name": "main", "nodes": 1, "gpusPerNode": 0, "cpus": 1, "memoryGb": 1}],
        "timeLimit": "10h",
    }


def bodies(tag: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "slurmjob.io/v1alpha1",
            "kind": "SlurmJob",
            "metadata": {
                "name": f"{tag}-{i:05d}",
                "namespace": NAMESPACE,
                "labels": {BATCH_LABEL: str(i // BATCH_SIZE)},
            },
            "spec": spec(),
        }
        for i in range(n)
    ]


def batches(n: int) -> int:
    """Collection DELETEs that cover n objects of `bodies` (a batch label per BATCH_SIZE)."""
    return -(-n // BATCH_SIZE)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# -- the process under test -----------------------------------------------------------------


#: The allocator settings the image (Dockerfile) and the chart (deployment.yaml) run the operator
#: with, so that the bench measures what users run (tests/unit/test_memtrim.py keeps them equal).
#: The baseline is plain kopf and keeps Python's defaults. `--operator-env PYTHONMALLOC=pymalloc`
#: measures the operator without them.
OPERATOR_ALLOCATOR_ENV = {
    "PYTHONMALLOC": "malloc",
    "MALLOC_CONF": "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0",
    "LD_PRELOAD": "libjemalloc.so.2",
}
#: What the image sets and the chart leaves to it: the chart may run another image, where a
#: preload of a library that is not there would print an error in every process it starts.
IMAGE_ONLY_ENV = frozenset({"LD_PRELOAD"})


class Process:
    def __init__(self, kind: str, env: dict[str, str], log_path: Path) -> None:
        self.kind = kind
        self.env = {**OPERATOR_ALLOCATOR_ENV, **env} if kind == "operator" else env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        if self.kind == "operator":
            # With BENCH_TRACEMALLOC set: the allocation profile's traced run (bench.scale.traced).
            run = ["slurmjob_operator", "run", "-n", NAMESPACE]
            if self.env.get("BENCH_TRACEMALLOC"):
                return [sys.executable, "-m", "bench.scale.traced", *run]
            # With BENCH_ALLOCSTATS set: the allocator's own counts (bench.scale.allocstats).
            if self.env.get("BENCH_ALLOCSTATS"):
                return [sys.executable, "-m", "bench.scale.allocstats", *run]
            return [sys.executable, "-m", *run]
        baseline = ROOT / "bench" / "baseline_operator.py"
        return [sys.executable, "-m", "kopf", "run", "--standalone", "-n", NAMESPACE, str(baseline)]

    def start(self) -> int:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(),
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


# -- Slurm side: always the owner ----------------------------------------------------------


async def slurm_client(settings: Settings, user: str, key: Path) -> SlurmClient:
    token = MintedToken(key, user, 3600)
    return await connect(settings, open_transport(settings), token=token)


async def own_live_jobs(ctx: Context) -> dict[int, str]:
    """Live jobs of the bench (name prefix) owned by the job user: id -> name. Never another
    user's: a refused cancel hangs slurmctld 26.05.5."""
    listing = await ctx.slurm.list_jobs()
    return {j.job_id: j.name for j in listing.jobs if _own_live(ctx, j)}


def _own_live(ctx: Context, job: SlurmJobView) -> bool:
    return job.name.startswith(JOB_PREFIX) and job.user == ctx.slurm_user and not job.is_final


def holds_cpus(job: SlurmJobView) -> bool:
    """Started and not over: running, suspended, or ended but still COMPLETING (a cancelled
    job's base state is CANCELLED while its COMPLETING flag holds the nodes)."""
    return not job.is_final and job.base_state is not BaseState.PENDING


async def cancel_all(ctx: Context, job_ids: list[int], concurrency: int = 16) -> list[float]:
    """Cancel each job; the wall time each cancel was answered (the state changed by then)."""
    slots = asyncio.Semaphore(concurrency)
    times: list[float] = []

    async def one(job_id: int) -> None:
        async with slots:
            with contextlib.suppress(SlurmNotFound):
                await cancel_own(ctx.slurm, job_id)
            times.append(time.time())

    await asyncio.gather(*(one(j) for j in job_ids))
    return times


#: How long a clean-up waits for the cluster's CPUs to be free (COMPLETING holds them too).
CLEAN_UP_WAIT = 60.0


async def _quiet(ctx: Context, seconds: float) -> None:
    """Until no bench job is live and no job of any user holds CPUs (running or completing;
    read only, never cancelled): a job that ends during the next run's steady window frees
    CPUs, that run's queued jobs start there, and their per-job reads are counted in it. A
    bench job cancelled by the clean-up, or an earlier test's job under the smoke in
    `make test`, is such a job."""
    for _ in range(int(seconds / 0.5)):
        listing = await ctx.slurm.list_jobs()
        if not any(holds_cpus(j) or _own_live(ctx, j) for j in listing.jobs):
            return
        await asyncio.sleep(0.5)
    log(f"clean-up: jobs still hold CPUs after {seconds:g} s; the run starts anyway")


#: The longest wait for the bench's jobs to stop changing state before the steady window.
SETTLE_WAIT = 60.0


async def _settled(ctx: Context, interval: float) -> None:
    """Until no bench job has changed state for two intervals (at most SETTLE_WAIT): a job the
    scheduler starts after its submit is a change the operator reads once, by its id, at its
    next sweep (at most an interval later); the steady window must not count that read."""
    seen: dict[int, tuple[str, ...]] = {}
    changed = time.monotonic()
    deadline = changed + SETTLE_WAIT
    while time.monotonic() < deadline:
        listing = await ctx.slurm.list_jobs()
        now = {j.job_id: j.raw_state for j in listing.jobs if _own_live(ctx, j)}
        if now != seen:
            seen, changed = now, time.monotonic()
        elif time.monotonic() - changed >= 2 * interval:
            return
        await asyncio.sleep(max(0.5, interval / 4))
    log(f"the bench's jobs still change state after {SETTLE_WAIT:g} s; steady window starts")


async def clean_up(ctx: Context, process: Process | None) -> None:
    """No objects, no live bench jobs, no operator left; safe to call at any point."""
    if process is not None:
        process.stop()
    for _ in range(3):
        try:
            live = await own_live_jobs(ctx)
            if live:
                log(f"cancelling {len(live)} live bench jobs")
                await cancel_all(ctx, sorted(live))
            await _quiet(ctx, CLEAN_UP_WAIT)
        except SlurmError as exc:
            log(f"clean-up: Slurm: {exc}")
        items = await ctx.kube.list_all(NAMESPACE)
        if not items:
            return
        await ctx.kube.drop_finalizers(NAMESPACE, [o["metadata"]["name"] for o in items])
        await ctx.kube.delete_in_batches(NAMESPACE, batches(len(items)))
        await ctx.kube.delete_collection(NAMESPACE)  # what no batch label names
        await asyncio.sleep(2)
    left = len(await ctx.kube.list_all(NAMESPACE))
    if left:
        raise RuntimeError(f"clean-up left {left} SlurmJobs in {NAMESPACE}")


# -- waiting on the watch -------------------------------------------------------------------


async def wait_until(check: Any, within: float, alive: Process | None = None) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        if alive is not None and not alive.alive():
            raise RuntimeError(f"{alive.kind} exited; see {alive.log_path}")
        await asyncio.sleep(0.25)
    return bool(check())


async def wait_ready(ctx: Context, process: Process, watches_before: int) -> float:
    """When the process under test has its watch on SlurmJobs open."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if await ctx.kube.open_watches() > watches_before:
            return time.time()
        if not process.alive():
            raise RuntimeError(f"{process.kind} exited; see {process.log_path}")
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{process.kind} opened no watch in 120 s; see {process.log_path}")


# -- one run --------------------------------------------------------------------------------


async def run(ctx: Context, kind: str, shape: str, n: int, opts: Options) -> dict[str, Any]:
    tag = f"{'op' if kind == 'operator' else 'base'}-{shape}"
    result: dict[str, Any] = {"operator": kind, "shape": shape, "n": n}
    marks: dict[str, float] = {}
    result["marks"] = marks
    process = Process(kind, ctx.env, ctx.log_dir / f"{tag}-{n}.log")
    watcher = Watcher(ctx.kube, NAMESPACE)
    samplers: list[Sampler] = []
    await clean_up(ctx, None)
    await watcher.start()
    marks["begin"] = time.time()
    try:
        await _run_phases(ctx, process, watcher, samplers, tag, n, shape, opts, result)
    except Exception as exc:  # keep what was measured; the report shows the error
        result["error"] = f"{type(exc).__name__}: {exc}"
        log(f"run {tag} N={n} stopped: {result['error']}")
    finally:
        for sampler in samplers:
            await sampler.stop()
        marks["end"] = time.time()
        result["rss_series"] = [
            [round(t - marks["begin"], 2), rss] for s in samplers for t, rss, _ in s.samples
        ]
        # Also when a phase failed: the peak so far is still a measurement.
        result["rss_peak"] = max((rss for _, rss in result["rss_series"]), default=None)
        await watcher.stop()
        await clean_up(ctx, process)
    return result


def _start(process: Process, samplers: list[Sampler]) -> float:
    started = time.time()
    sampler = Sampler(process.start())
    sampler.start()
    samplers.append(sampler)
    return started


async def _run_phases(
    ctx: Context,
    process: Process,
    watcher: Watcher,
    samplers: list[Sampler],
    tag: str,
    n: int,
    shape: str,
    opts: Options,
    result: dict[str, Any],
) -> None:
    marks = result["marks"]
    interval = opts.interval
    created: dict[str, float] = {}

    async def create() -> None:
        marks["create"] = time.time()
        created.update(
            await ctx.kube.create_all(NAMESPACE, bodies(tag, n), opts.create_concurrency)
        )
        marks["created"] = max(created.values())
        seconds = marks["created"] - marks["create"]
        result["create"] = {"seconds": seconds, "per_second": n / seconds if seconds else None}
        log(f"{tag}: {n} created in {seconds:.1f} s")

    watches = await ctx.kube.open_watches()
    if shape == "live":
        marks["start"] = _start(process, samplers)
        marks["ready"] = await wait_ready(ctx, process, watches)
        await asyncio.sleep(3)
        empty = samplers[0].between(marks["ready"], time.time())
        result["rss_empty"] = statistics.median(s[1] for s in empty) if empty else None
        api_s0 = await ctx.kube.apiserver_requests()
        await create()
        origin = created
    else:
        await create()
        api_s0 = await ctx.kube.apiserver_requests()
        marks["start"] = _start(process, samplers)
        origin = dict.fromkeys(created, marks["start"])

    # -- apply -> Submitted
    def submitted() -> int:
        return sum(1 for name in created if (watcher.seen.get(name) or _NONE).submitted)

    done = await wait_until(lambda: submitted() >= n, opts.submit_timeout, process)
    marks["submitted"] = time.time()
    api_s1 = await ctx.kube.apiserver_requests()
    latencies = [
        watcher.seen[name].submitted - origin[name]  # type: ignore[operator]
        for name in created
        if name in watcher.seen and watcher.seen[name].submitted
    ]
    last = max((watcher.seen[k].submitted or 0) for k in created if k in watcher.seen)
    first_origin = min(origin.values())
    result["submit"] = {
        "all": done,
        "count": len(latencies),
        "seconds": last - first_origin,
        "per_second": len(latencies) / (last - first_origin) if last > first_origin else None,
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "max": max(latencies, default=None),
        # What submitting cost the apiserver, per SlurmJob (the bench's own creates, `POST
        # slurmjobs`, are in it for the live shape; watch events are not requests).
        "apiserver_per_object": {
            k: round((api_s1[k] - api_s0.get(k, 0)) / n, 2)
            for k in sorted(api_s1)
            if k.split()[-1].split("/")[0] in OWN_RESOURCES and api_s1[k] > api_s0.get(k, 0)
        },
    }
    # The operator's own: without the bench's creates and the watches (which are not made per
    # SlurmJob). Issue 24's bound is 4, the Event included.
    result["submit"]["apiserver_per_submission"] = round(
        sum(
            v
            for k, v in result["submit"]["apiserver_per_object"].items()
            if k != "POST slurmjobs" and not k.startswith("WATCH ")
        ),
        2,
    )
    log(f"{tag}: {len(latencies)}/{n} submitted, {result['submit']['per_second'] or 0:.1f}/s")
    if not done:
        raise RuntimeError(f"only {len(latencies)} of {n} submitted in {opts.submit_timeout} s")

    # -- steady: nothing changes for W intervals (once the jobs' states have settled)
    await _settled(ctx, interval)
    marks["steady"] = time.time()
    api0 = await ctx.kube.apiserver_requests()
    await asyncio.sleep(opts.steady_intervals * interval)
    api1 = await ctx.kube.apiserver_requests()
    marks["steady_end"] = time.time()
    result["steady"] = await _window(
        ctx, samplers[-1], api0, api1, marks["steady"], marks["steady_end"], interval
    )
    result["etcd"] = await etcd_db_size(ctx.etcd_url)
    sizes = [s.status_bytes for name, s in watcher.seen.items() if name in created]
    result["status_bytes"] = {"mean": statistics.fmean(sizes), "max": max(sizes)} if sizes else {}
    log(f"{tag}: steady {result['steady']['slurm']['requests']:.1f} req/interval")

    # -- change: 1 % of the jobs cancelled in Slurm per round, as their owner
    owned = await own_live_jobs(ctx)
    queued = [
        (name, s.job_id)
        for name, s in sorted(watcher.seen.items())
        if name in created and s.phase == "Queued" and s.job_id in owned
    ]
    k = max(1, round(n * opts.change_fraction))
    step = max(1, len(queued) // max(1, k * opts.change_rounds))
    picks = queued[::step][: k * opts.change_rounds]
    cancelled_at: dict[str, float] = {}
    marks["change"] = time.time()
    api0 = await ctx.kube.apiserver_requests()
    for round_ in range(opts.change_rounds):
        batch = picks[round_ * k : (round_ + 1) * k]
        times = await cancel_all(ctx, [job_id for _, job_id in batch if job_id])
        for (name, _), t in zip(batch, sorted(times), strict=False):
            cancelled_at[name] = max(times) if times else t  # conservative: the batch's last
        await asyncio.sleep(interval)

    def seen_cancelled() -> bool:
        return all("Cancelled" in watcher.seen[name].phases for name in cancelled_at)

    await wait_until(seen_cancelled, 3 * interval + 30, process)
    api1 = await ctx.kube.apiserver_requests()
    marks["change_end"] = time.time()
    delays = [
        watcher.seen[name].phases["Cancelled"] - t
        for name, t in cancelled_at.items()
        if "Cancelled" in watcher.seen[name].phases
    ]
    result["change"] = {
        "per_round": k,
        "rounds": opts.change_rounds,
        "cancelled": len(cancelled_at),
        "seen": len(delays),
        "delays": sorted(delays),
        "p50": percentile(delays, 0.5),
        "p99": percentile(delays, 0.99),
        "max": max(delays, default=None),
        "window": await _window(
            ctx, samplers[-1], api0, api1, marks["change"], marks["change_end"], interval
        ),
    }
    log(f"{tag}: propagation p50 {result['change']['p50']} p99 {result['change']['p99']}")

    # -- restart: SIGKILL, start again
    live_jobs = sum(1 for name in created if watcher.seen[name].phase not in ("Cancelled",))
    process.kill()
    marks["killed"] = time.time()
    marks["restart"] = _start(process, samplers)
    if shape == "live":
        deadline = marks["restart"] + opts.restart_window * interval
        steady_at: float | None = None
        while time.time() < deadline and steady_at is None:
            await asyncio.sleep(1)
            window = ctx.requests.between(marks["restart"], time.time())
            if kind_is_operator(process):
                steady_at = reqs.first_steady_cycle(window)
            else:
                steady_at = reqs.full_round(window, live_jobs)
        before = ctx.requests.between(marks["restart"], steady_at or time.time())
        result["restart"] = {
            "steady": steady_at is not None,
            "seconds": (steady_at - marks["restart"]) if steady_at else None,
            **reqs.summary(before),
            "live_jobs": live_jobs,
        }
        restart = result["restart"]
        log(f"{tag}: restart {restart['requests']} requests, {restart['seconds']} s")
        await asyncio.sleep(interval)
    else:
        await asyncio.sleep(1)  # the process is up; its watch has not listed yet

    # -- bulk delete
    names = [name for name in created]
    marks["delete"] = time.time()
    await ctx.kube.delete_in_batches(NAMESPACE, batches(len(names)))

    def deleted() -> int:
        return sum(1 for name in names if watcher.seen.get(name, _NONE).deleted)

    await wait_until(lambda: deleted() >= len(names), opts.delete_timeout, process)
    marks["delete_end"] = time.time()
    times = sorted(t for name in names if (t := watcher.seen.get(name, _NONE).deleted))
    seconds = (times[-1] - marks["delete"]) if times else None
    first_minute = sum(1 for t in times if t - marks["delete"] <= 60)
    result["delete"] = {
        "after_restart": shape == "backlog",
        "deleted": len(times),
        "of": len(names),
        "seconds": seconds,
        "per_second": len(times) / seconds if seconds else None,
        "first_minute": first_minute,
        "curve": [round(t - marks["delete"], 2) for t in times[:: max(1, len(times) // 200)]],
        # What the deletions asked slurmrestd: the jobs looked for by name in listings the
        # moment's deletions share, not a read per SlurmJob (issue 42).
        "slurm": reqs.summary(ctx.requests.between(marks["delete"], marks["delete_end"])),
    }
    log(f"{tag}: deleted {len(times)}/{len(names)} in {seconds} s")
    rss = [s[1] for sampler in samplers for s in sampler.samples]
    result["rss_peak"] = max(rss, default=None)
    cpu = [s for sampler in samplers for s in sampler.samples]
    result["samples"] = len(cpu)


_NONE = type("Nothing", (), {"submitted": None, "deleted": None, "phases": {}, "phase": None})()


def kind_is_operator(process: Process) -> bool:
    return process.kind == "operator"


def own_apiserver_requests(by_kind: dict[str, float]) -> float:
    """The ones a SlurmJob operator makes: the counter also holds kube-apiserver's own
    (lease renewals, its informers' re-watches), which are the same for both operators."""
    return sum(v for k, v in by_kind.items() if k.split()[-1].split("/")[0] in OWN_RESOURCES)


async def _window(
    ctx: Context,
    sampler: Sampler,
    api0: dict[str, float],
    api1: dict[str, float],
    t0: float,
    t1: float,
    interval: float,
) -> dict[str, Any]:
    intervals = (t1 - t0) / interval
    await asyncio.sleep(1.2)  # the proxy flushes its log every 0.5 s
    samples = sampler.between(t0, t1)
    api = {k: (api1.get(k, 0) - api0.get(k, 0)) / intervals for k in api1}
    api = {k: v for k, v in sorted(api.items()) if v}
    return {
        "seconds": t1 - t0,
        "intervals": intervals,
        "slurm": reqs.summary(ctx.requests.between(t0, t1), intervals),
        "apiserver": {
            "requests": sum(api.values()),
            "operator": own_apiserver_requests(api),
            "by_kind": api,
        },
        "cpu_per_interval": (samples[-1][2] - samples[0][2]) / intervals if samples else None,
        "rss_median": statistics.median(s[1] for s in samples) if samples else None,
    }


def dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=1, default=str)
