"""Exactly-once soak: randomized fault trials against the real Slurm and kube-apiserver.

Not part of `make test`. Run as root from the repository root (the test beds need it):

    SLURMJOB_TESTBED_KEEP=1 .venv/bin/python -m bench.soak --trials 200 --batch 10

It starts (or re-uses: SLURMJOB_TESTBED_KEEP=1 semantics, nothing is ever stopped) the Slurm
test cluster(s) and the kube-apiserver, then runs `slurmjob-operator run` as a subprocess whose
slurmrestd URL points at `tests.faults.proxy.FaultProxy`. Trials run in batches of `--batch`
SlurmJobs (a trivial `true` job each, `sleep 20` for `duplicate`). Each trial draws a fault
on its own submit:

    none, drop (forward, drop the answer), delay (answer after the operator's timeout),
    502-after / 500-after (forwarded, then a 5xx), reset (before forwarding), 502-before
    (not forwarded), duplicate (the same submit replayed straight to slurmrestd while the
    answer is held, then dropped), kill-before-post (SIGKILL while the proxy holds the
    request, then dropped), kill-after-post (SIGKILL while the proxy holds slurmrestd's
    answer), kill-after-status (SIGKILL once the status holds the job id).

At most one kill trial per batch; the kill also hits the other trials of the batch wherever
they are ("collateral"). The operator is restarted right after the kill. The soak plays the
person of the design: an attempt unconfirmed for `--declare-after` seconds whose job name
Slurm does not know (asked straight, not through the proxy) is declared lost with the
`slurmjob.io/declare-lost` annotation.

With `--no-person` nobody sets the annotation: an attempt unconfirmed and found nowhere must
be proven absent by the operator (the test cluster has accounting; the fencing window is
3 + 2 + 2 = 7 s), and the trial kind `late` joins the draw: the submit is held in the proxy
until the operator has proven attempt 1 absent and sent attempt 2, then let through; the job
it creates must be cancelled (column "late submits cancelled", never counted as a duplicate).

With `--ha` two `run` processes share one Lease (lease 4 s, renew deadline 3 s, retry 0.5 s):
a kill trial SIGKILLs whichever holds the Lease, at the same points, and restarts it as the
standby; the time from the kill to the other's holding the Lease is the takeover, reported
per kill (it must stay within the lease duration plus one retry period).

Checks per trial, counting Slurm jobs straight against slurmrestd by attempt job name (grouped
by heterogeneous leader):
- duplicates: Slurm jobs carrying an attempt's name beyond one, not counting the one the soak
  itself replayed in a `duplicate` trial (must be 0); whether that injected duplicate was
  found and CANCELLED is reported on its own (the duplicate trials run `sleep 20`, so that
  it is still running when the operator adopts);
- lost: the resource not Succeeded within `--trial-timeout`, or Unknown, or its last attempt
  without exactly the one Slurm job its status names, or a declared-lost attempt that has a
  Slurm job after all (must be 0);
- time to adoption (first submit received by the proxy -> job id seen in the status, for the
  attempts adopted by name) and the total time (apply -> Succeeded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from tests.faults.proxy import Action, Fault, FaultProxy  # noqa: E402
from tests.integration.sitefiles import site_env  # noqa: E402
from tests.integration.test_operator_e2e import CRD, Operator, cpu_spec  # noqa: E402
from tests.k8s.kube import KubeTestbed, start_testbed  # noqa: E402
from tests.testbed.slurm import SPECS, SlurmTestbed, start_cluster  # noqa: E402

from slurmjob_operator.config import Settings  # noqa: E402
from slurmjob_operator.core.jobview import BaseState, SlurmJobView  # noqa: E402
from slurmjob_operator.slurm.client import SlurmClient  # noqa: E402
from slurmjob_operator.slurm.connect import connect, open_transport  # noqa: E402
from slurmjob_operator.slurm.errors import SlurmError  # noqa: E402

REST_TIMEOUT = 3.0
KILLS = ("kill-before-post", "kill-after-post", "kill-after-status")
NETWORK = ("none", "drop", "delay", "502-after", "500-after", "reset", "502-before", "duplicate")
ADOPTING = ("drop", "delay", "502-after", "500-after", "duplicate", "kill-after-post")
FINAL = ("Succeeded", "Failed", "Cancelled", "Unknown")
HA_LEASE = (4.0, 3.0, 0.5)
COMMANDS = {
    # A duplicate must outlive the adoption to be cancelled: it runs a while.
    "duplicate": ["sleep", "20"],
    # The late job (attempt 1's, let through after attempt 2 went out) must still run when
    # attempt 2's end is folded, which is where it is looked for.
    "late": ["bash", "-c", 'case "$SLURM_JOB_NAME" in *-a1) sleep 90;; *) sleep 20;; esac'],
}  # --ha: lease duration, renew deadline, retry period (s)


@dataclass
class Trial:
    index: int
    batch: int
    cluster: str
    kind: str
    name: str
    fault: Fault | None = field(default=None, repr=False)
    applied_at: float = 0.0
    first_post_at: float | None = None
    job_id_seen_at: float | None = None
    final_at: float | None = None
    phase: str | None = None
    attempts: int = 0
    adopted: bool = False
    declared_lost: int = 0
    proven_absent: int = 0
    late_released: bool = False
    late_outcome: str | None = None
    collateral: bool = False
    replayed: bool = False
    duplicate_outcome: str | None = None
    duplicates: int = 0
    lost: bool = False
    problems: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def time_to_adoption(self) -> float | None:
        if not self.adopted or self.first_post_at is None or self.job_id_seen_at is None:
            return None
        return self.job_id_seen_at - self.first_post_at

    @property
    def total(self) -> float | None:
        return None if self.final_at is None else self.final_at - self.applied_at


class Soak:
    def __init__(self, args: argparse.Namespace, kube: KubeTestbed, testbed: SlurmTestbed) -> None:
        self.args = args
        self.kube = kube
        self.testbed = testbed
        self.rng = random.Random(args.seed)  # noqa: S311 - reproducible draws
        self.workdir = Path(args.workdir) / f"soak-{testbed.name.replace('.', '')}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.namespace = f"soak-{testbed.name.replace('.', '')}-{uuid.uuid4().hex[:6]}"
        self.direct_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),
            **kube.env(),
            **site_env(testbed, "apptainer", self.workdir),
            "SLURMJOB_POLL_INTERVAL": "1",
            "SLURMJOB_METRICS_PORT": "0",
            "SLURMJOB_DELETE_TIMEOUT": "20",
        }
        self.proxy = FaultProxy(testbed.rest_url).start()
        env = {
            **self.direct_env,
            "SLURMJOB_SLURM_REST_URL": self.proxy.url,
            "SLURMJOB_SLURM_REST_TIMEOUT": str(REST_TIMEOUT),
            # The fencing window of absence proofs: 3 + 2 + 2 = 7 s (the defaults give 70 s).
            "SLURMJOB_SLURM_MESSAGE_TIMEOUT": "2",
            "SLURMJOB_ABSENCE_MARGIN": "2",
        }
        if args.ha:
            # One Lease, two identities: the pair elects one leader.
            env.update(
                SLURMJOB_LEASE_NAME=f"sj-{self.namespace}",
                SLURMJOB_LEASE_DURATION=str(HA_LEASE[0]),
                SLURMJOB_LEASE_RENEW_DEADLINE=str(HA_LEASE[1]),
                SLURMJOB_LEASE_RETRY_PERIOD=str(HA_LEASE[2]),
            )
            self.ops = [
                Operator(
                    kube,
                    testbed,
                    self.namespace,
                    {**env, "SLURMJOB_LEASE_IDENTITY": f"op{i}-{self.namespace}"},
                    self.workdir / f"operator-{i}.log",
                )
                for i in range(2)
            ]
        else:
            self.ops = [Operator(kube, testbed, self.namespace, env, self.workdir / "operator.log")]
        self.takeovers: list[float] = []
        self.done: list[Trial] = []  # finished batches' trials, kept if the run is stopped
        self.kills = 0
        self.restarts_of_slurm = 0

    # -- Slurm, straight ------------------------------------------------------------------

    async def _client_call(self, names: list[str]) -> dict[str, list[SlurmJobView]]:
        settings = Settings.from_env(self.direct_env)
        async with open_transport(settings) as transport:
            client: SlurmClient = await connect(settings, transport)
            if await client.has_accounting():
                # Ended jobs leave the controller MinJobAge after their end: ask accounting
                # too (by name, merged by job id), or a purged job would look lost.
                unique = sorted(set(names))
                found = await asyncio.gather(*(client.find_by_name(n) for n in unique))
                return dict(zip(unique, found, strict=True))
            listing = await client.list_jobs()
            out: dict[str, list[SlurmJobView]] = {n: [] for n in names}
            for job in listing.jobs:
                if job.name in out:
                    out[job.name].append(job)
            return out

    def jobs_named(self, names: list[str]) -> dict[str, dict[int, SlurmJobView]]:
        """Job name -> leader id -> leader view, one GET /jobs straight from slurmrestd."""
        for attempt in range(16):  # the shared test cluster is sometimes slow or restarted
            try:
                found = asyncio.run(self._client_call(names))
                break
            except SlurmError:
                if attempt == 15:
                    raise
                time.sleep(4)
        out: dict[str, dict[int, SlurmJobView]] = {}
        for job_name, views in found.items():
            leaders: dict[int, SlurmJobView] = {}
            for v in views:
                lid = v.het_job_id or v.job_id
                if lid not in leaders or (v.het_job_offset or 0) < (
                    leaders[lid].het_job_offset or 0
                ):
                    leaders[lid] = v
            out[job_name] = leaders
        return out

    def ctld_pid(self) -> str:
        pid_file = SPECS[self.testbed.name].base / "run" / "slurmctld.pid"
        try:
            return pid_file.read_text().strip()
        except OSError:
            return ""

    # -- Kubernetes -----------------------------------------------------------------------

    def list_objects(self) -> dict[str, dict[str, Any]]:
        proc = self.kube.kubectl("get", "slurmjobs", "-n", self.namespace, "-o", "json")
        return {o["metadata"]["name"]: o for o in json.loads(proc.stdout)["items"]}

    def apply_all(self, trials: list[Trial]) -> None:
        docs = [
            {
                "apiVersion": "slurmjob.io/v1alpha1",
                "kind": "SlurmJob",
                "metadata": {"name": t.name, "namespace": self.namespace},
                "spec": cpu_spec(COMMANDS.get(t.kind, ["true"])),
            }
            for t in trials
        ]
        now = time.monotonic()
        self.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        for t in trials:
            t.applied_at = now

    # -- one batch ------------------------------------------------------------------------

    def arm(self, trial: Trial) -> None:
        body = f'"sj-{self.namespace}-{trial.name}-[0-9a-z]+-a1"'
        kinds: dict[str, tuple[Action, dict[str, Any]]] = {
            "drop": (Action.DROP_RESPONSE, {}),
            "delay": (Action.DELAY, {"delay": REST_TIMEOUT + 2}),
            "502-after": (Action.ANSWER_5XX, {"status": 502, "forward": True}),
            "500-after": (Action.ANSWER_5XX, {"status": 500, "forward": True}),
            "reset": (Action.RESET, {}),
            "502-before": (Action.ANSWER_5XX, {"status": 502}),
            "duplicate": (Action.HOLD_RESPONSE, {}),
            "kill-before-post": (Action.HOLD_REQUEST, {}),
            "late": (Action.HOLD_REQUEST, {}),
            "kill-after-post": (Action.HOLD_RESPONSE, {}),
        }
        if trial.kind in kinds:
            action, kw = kinds[trial.kind]
            trial.fault = self.proxy.add(Fault(action, body=body, name=trial.name, **kw))

    def holder(self) -> str:
        lease = f"sj-{self.namespace}"
        proc = self.kube.kubectl(
            "get", "lease", lease, "-n", "default", "-o", "jsonpath={.spec.holderIdentity}",
            check=False,
        )  # fmt: skip
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def leader(self) -> Operator:
        """The process to kill: the Lease's holder with --ha, else the one operator."""
        if len(self.ops) == 1:
            return self.ops[0]
        holder = self.holder()
        for op in self.ops:
            if op.env.get("SLURMJOB_LEASE_IDENTITY") == holder:
                return op
        raise RuntimeError(f"no operator holds the Lease (holder {holder!r})")

    def kill_and_restart(self, trials: list[Trial], killer: Trial) -> None:
        victim = self.leader()
        victim.kill()
        killed_at = time.monotonic()
        self.kills += 1
        if killer.fault is not None:
            killer.fault.release(deliver=False)
        for t in trials:
            if t is not killer and t.final_at is None:
                t.collateral = True
        if len(self.ops) > 1:
            # The standby takes the Lease once it has seen no renewal for the lease duration.
            # The killed one comes back after that, as a new pod would: started at once under
            # its own identity it would take its own Lease back, as a restarted container does.
            gone = victim.env["SLURMJOB_LEASE_IDENTITY"]
            limit = killed_at + 4 * HA_LEASE[0]
            while time.monotonic() < limit and self.holder() in ("", gone):
                time.sleep(0.1)
            took = time.monotonic() - killed_at
            self.takeovers.append(took)
            if took > HA_LEASE[0] + 2 * HA_LEASE[2] + 1:
                killer.problems.append(f"takeover took {took:.1f} s")
        victim.start()

    def run_batch(self, number: int, trials: list[Trial]) -> None:
        for t in trials:
            self.arm(t)
        pid_before = self.ctld_pid()
        self.apply_all(trials)
        killer = next((t for t in trials if t.kind in KILLS), None)
        killed = False
        unconfirmed_since: dict[str, float] = {}
        deadline = time.monotonic() + self.args.trial_timeout
        last_poll = 0.0
        while time.monotonic() < deadline:
            now = time.monotonic()
            # Hooks first: the operator gives up on a held exchange after REST_TIMEOUT.
            for t in trials:
                fault = t.fault
                if (
                    t.kind == "late"
                    and fault is not None
                    and not t.late_released
                    and len(t.status.get("attempts") or []) >= 2
                ):
                    # The operator proved attempt 1 absent and sent attempt 2: now the proxy
                    # lets the old request through, after the window.
                    t.late_released = True
                    fault.release(deliver=True)
                if t.kind == "duplicate" and fault and fault.answered.is_set() and not t.replayed:
                    t.replayed = True
                    status, _ = self.proxy.replay(fault.hits[0])
                    if status != 200:
                        t.problems.append(f"replayed submit answered {status}")
                    fault.release(deliver=False)
            if killer is not None and not killed and killer.fault is not None:
                hook = (
                    killer.fault.matched
                    if killer.kind == "kill-before-post"
                    else killer.fault.answered
                )
                if hook.is_set():
                    self.kill_and_restart(trials, killer)
                    killed = True
            if now - last_poll >= 0.5:
                last_poll = now
                objs = self.list_objects()
                for t in trials:
                    self.observe(t, objs.get(t.name), now, unconfirmed_since)
                if (
                    killer is not None
                    and not killed
                    and killer.kind == "kill-after-status"
                    and killer.job_id_seen_at is not None
                ):
                    self.kill_and_restart(trials, killer)
                    killed = True
                if all(t.final_at is not None for t in trials):
                    break
            time.sleep(0.05)
        for t in trials:
            if t.fault is not None:
                t.fault.release(deliver=False)
                self.proxy.remove(t.fault)
        if self.ctld_pid() != pid_before:
            self.restarts_of_slurm += 1
            for t in trials:
                t.problems.append("slurmctld was restarted by someone else during the batch")
        self.check(trials)
        self.kube.kubectl(
            "delete", "slurmjobs", "--all", "-n", self.namespace, "--wait=false", check=False
        )

    def observe(
        self,
        t: Trial,
        obj: dict[str, Any] | None,
        now: float,
        unconfirmed_since: dict[str, float],
    ) -> None:
        if obj is None or t.final_at is not None:
            return
        status = obj.get("status") or {}
        t.status = status
        attempts = status.get("attempts") or []
        if t.first_post_at is None:
            posts = [
                e
                for e in self.proxy.exchanges(method="POST")
                if e.job_name and e.job_name.startswith(f"sj-{self.namespace}-{t.name}-")
            ]
            if posts:
                t.first_post_at = posts[0].at
        if attempts and attempts[-1].get("jobId") and t.job_id_seen_at is None:
            t.job_id_seen_at = now
        if status.get("phase") in FINAL:
            t.final_at = now
            t.phase = status["phase"]
            return
        # The person of the design: unconfirmed for a while, and Slurm has no such job (not
        # with --no-person: the operator must prove such attempts absent itself).
        if (
            not self.args.no_person
            and attempts
            and attempts[-1].get("jobId") is None
            and not attempts[-1].get("declaredLost")
        ):
            key = attempts[-1]["jobName"]
            since = unconfirmed_since.setdefault(key, now)
            if now - since >= self.args.declare_after:
                if not self.jobs_named([key])[key]:
                    self.kube.kubectl(
                        "annotate", "slurmjob", t.name, "-n", self.namespace,
                        f"slurmjob.io/declare-lost={attempts[-1]['number']}", "--overwrite",
                    )  # fmt: skip
                    t.declared_lost += 1
                unconfirmed_since[key] = now  # look again later either way

    def check(self, trials: list[Trial]) -> None:
        names: list[str] = []
        for t in trials:
            names += [a["jobName"] for a in t.status.get("attempts") or []]
        jobs = self.jobs_named(names)
        for t in trials:
            attempts = t.status.get("attempts") or []
            t.attempts = len(attempts)
            submitted = next(
                (c for c in t.status.get("conditions") or [] if c["type"] == "Submitted"), {}
            )
            t.adopted = submitted.get("reason") == "Adopted"
            if t.phase != "Succeeded":
                t.lost = True
                t.problems.append(f"phase {t.phase or t.status.get('phase')} (not Succeeded)")
            for a in attempts:
                leaders = jobs.get(a["jobName"], {})
                # The operator's own duplicates: jobs beyond one, less the one the soak made.
                injected = 1 if (t.replayed or t.late_released) and a["number"] == 1 else 0
                if len(leaders) - injected > 1:
                    t.duplicates += len(leaders) - injected - 1
                    t.problems.append(f"{a['jobName']}: {len(leaders)} jobs")
                if a.get("declaredLost") and leaders:
                    t.lost = True
                    t.problems.append(f"{a['jobName']} declared lost but Slurm has it")
                if a.get("provenAbsentAt"):
                    t.proven_absent += 1
                    if leaders and t.kind == "late" and a["number"] == 1:
                        # The late job the soak let through: it must have been cancelled.
                        if all(v.base_state is BaseState.CANCELLED for v in leaders.values()):
                            t.late_outcome = "cancelled"
                        else:
                            t.late_outcome = "ran"
                            t.problems.append(f"{a['jobName']}: the late job was not cancelled")
                    elif leaders:
                        t.lost = True
                        t.problems.append(f"{a['jobName']} proven absent but Slurm has it")
            if attempts:
                last = attempts[-1]
                leaders = jobs.get(last["jobName"], {})
                if last.get("jobId") not in leaders:
                    t.lost = True
                    t.problems.append(
                        f"status job {last.get('jobId')} not in Slurm {sorted(leaders)}"
                    )
                if (
                    self.testbed.api_version >= "v0.0.44"
                    and last.get("jobId") in leaders
                    and leaders[last["jobId"]].sluid != last.get("sluid")
                ):
                    t.problems.append("SLUID in the status differs from Slurm's")
                    t.lost = True
                if t.replayed:
                    extra = [v for k, v in leaders.items() if k != last.get("jobId")]
                    if not extra:
                        t.problems.append("the injected duplicate is missing")
                    elif all(v.base_state is BaseState.CANCELLED for v in extra):
                        t.duplicate_outcome = "cancelled"
                    else:
                        t.duplicate_outcome = "ran out before it was found"
                        t.problems.append("the injected duplicate was not cancelled")

    # -- the whole run --------------------------------------------------------------------

    def draw(self, batch: int, size: int, first: int) -> list[Trial]:
        network = (*NETWORK, "late") if self.args.no_person else NETWORK
        kinds = [self.rng.choice(network) for _ in range(size)]
        if self.rng.random() < self.args.kill_share:
            kinds[self.rng.randrange(size)] = self.rng.choice(KILLS)
        return [
            Trial(first + i, batch, self.testbed.name, k, f"t{first + i}-{k}")
            for i, k in enumerate(kinds)
        ]

    def run(self, trials_total: int) -> list[Trial]:
        self.kube.kubectl("create", "namespace", self.namespace)
        for op in self.ops:
            op.start()
        done = self.done
        try:
            batch = 0
            while len(done) < trials_total:
                size = min(self.args.batch, trials_total - len(done))
                trials = self.draw(batch, size, len(done))
                started = time.monotonic()
                self.run_batch(batch, trials)
                bad = sum(1 for t in trials if t.problems)
                print(
                    f"[{self.testbed.name}] batch {batch}: {size} trials "
                    f"({', '.join(t.kind for t in trials)}) in {time.monotonic() - started:.1f}s"
                    f"{f', {bad} with problems' if bad else ''}",
                    flush=True,
                )
                done += trials
                batch += 1
        finally:
            self.kube.kubectl(
                "delete", "slurmjobs", "--all", "-n", self.namespace, "--timeout=60s",
                check=False, timeout=70,
            )  # fmt: skip
            for op in self.ops:
                op.stop()
            self.proxy.stop()
            self.kube.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)
        return done


# -- report -----------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {_pct(values, 0.95):.1f} / {max(values):.1f}"


def _dups(trials: list[Trial]) -> str:
    made = [t for t in trials if t.replayed]
    if not made:
        return "-"
    return f"{sum(t.duplicate_outcome == 'cancelled' for t in made)} of {len(made)}"


def _late(trials: list[Trial]) -> str:
    released = [t for t in trials if t.late_released]
    if not released:
        return "-"
    return f"{sum(t.late_outcome == 'cancelled' for t in released)} of {len(released)}"


_REPORTED = [f.name for f in fields(Trial) if f.name not in ("fault", "status")]


def report(trials: list[Trial], soaks: list[Soak], elapsed: float) -> dict[str, Any]:
    rows = defaultdict(list)
    for t in trials:
        rows[(t.cluster, t.kind)].append(t)
    lines = [
        "| cluster | fault | trials | adopted | declared lost | proven absent | collateral kills "
        "| duplicates | lost | injected duplicates cancelled | late submits cancelled "
        "| adoption s (median / p95 / max) "
        "| total s (median / p95 / max) |",
        "|" + " --- |" * 13,
    ]
    for (cluster, kind), ts in sorted(rows.items()):
        adoption = [t.time_to_adoption for t in ts if t.time_to_adoption is not None]
        totals = [t.total for t in ts if t.total is not None]
        lines.append(
            f"| {cluster} | {kind} | {len(ts)} | {sum(t.adopted for t in ts)} "
            f"| {sum(t.declared_lost for t in ts)} | {sum(t.proven_absent for t in ts)} "
            f"| {sum(t.collateral for t in ts)} "
            f"| {sum(t.duplicates for t in ts)} | {sum(t.lost for t in ts)} "
            f"| {_dups(ts)} | {_late(ts)} | {_fmt(adoption)} | {_fmt(totals)} |"
        )
    adoption = [t.time_to_adoption for t in trials if t.time_to_adoption is not None]
    totals = [t.total for t in trials if t.total is not None]
    lines.append(
        f"| all | all | {len(trials)} | {sum(t.adopted for t in trials)} "
        f"| {sum(t.declared_lost for t in trials)} | {sum(t.proven_absent for t in trials)} "
        f"| {sum(t.collateral for t in trials)} "
        f"| {sum(t.duplicates for t in trials)} | {sum(t.lost for t in trials)} "
        f"| {_dups(trials)} | {_late(trials)} | {_fmt(adoption)} | {_fmt(totals)} |"
    )
    table = "\n".join(lines)
    print()
    print(table)
    print()
    takeovers = [x for s in soaks for x in s.takeovers]
    print(
        f"{len(trials)} trials in {elapsed / 60:.1f} min; operator SIGKILLs: "
        f"{sum(s.kills for s in soaks)}; slurmctld restarted by others during "
        f"{sum(s.restarts_of_slurm for s in soaks)} batch(es)"
    )
    if takeovers:
        print(
            f"leader kills: {len(takeovers)}, takeover s (median / p95 / max): "
            f"{_fmt(takeovers)} (lease {HA_LEASE[0]} s)"
        )
    for t in trials:
        if t.problems:
            print(f"  trial {t.index} [{t.cluster} {t.kind}] {t.name}: {'; '.join(t.problems)}")
    return {
        "table": table,
        "elapsed_s": elapsed,
        "kills": sum(s.kills for s in soaks),
        "takeovers_s": takeovers,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
        f"{platform.platform()}, Python {platform.python_version()}",
        "trials": [
            {
                **{k: getattr(t, k) for k in _REPORTED},
                "time_to_adoption": t.time_to_adoption,
                "total": t.total,
            }
            for t in trials
        ],
    }


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="trials per cluster")
    parser.add_argument("--batch", type=int, default=10, help="SlurmJobs at a time")
    parser.add_argument(
        "--cluster", action="append", choices=("26.05", "22.05"), help="default: 26.05"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill-share", type=float, default=0.7, help="batches with a kill")
    parser.add_argument("--declare-after", type=float, default=8.0)
    parser.add_argument("--trial-timeout", type=float, default=120.0)
    parser.add_argument("--workdir", default="/tmp/slurmjob-soak")
    parser.add_argument("--json", help="write every trial here")
    parser.add_argument(
        "--ha", action="store_true", help="two operators on one Lease; kills hit the leader"
    )
    parser.add_argument(
        "--no-person",
        action="store_true",
        help="never set declare-lost: the operator must prove lost submits absent (needs "
        "accounting); adds the 'late' trial kind (a held submit released after the window)",
    )
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the operator subprocess is stopped and the batch deleted.
    signal.signal(signal.SIGTERM, _terminate)
    os.environ.setdefault("SLURMJOB_TESTBED_KEEP", "1")
    kube = start_testbed(reuse=True)
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    started = time.monotonic()
    trials: list[Trial] = []
    soaks: list[Soak] = []
    for name in args.cluster or ["26.05"]:
        soak = Soak(args, kube, start_cluster(name, reuse=True))
        soaks.append(soak)
        try:
            trials += soak.run(args.trials)
        except (KeyboardInterrupt, SystemExit):
            # Stopped (Ctrl-C, SIGTERM): report the batches that finished.
            print("stopped: reporting the finished batches", flush=True)
            trials += soak.done
            break
    summary = report(trials, soaks, time.monotonic() - started)
    print(f"machine: {summary['machine']}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str))
    bad = sum(t.duplicates for t in trials) + sum(t.lost for t in trials)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
