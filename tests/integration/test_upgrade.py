"""Upgrades keep running jobs: the previous release's operator runs SlurmJobs on the real stack
(kube-apiserver, Slurm 26.05), is stopped (SIGTERM, or SIGKILL), and this checkout's operator
takes over. Every job is followed to its end by the new release from the status the old one
wrote; no attempt is submitted twice, and a retry decided by either release is honoured.

"Previous release" is the newest commit before HEAD whose ``operator/``, ``templates/`` or
``pyproject.toml`` differs from HEAD's (HEAD~1 when none does); ``SLURMJOB_UPGRADE_FROM=<rev>``
picks another one. That commit is built once, non-editable, into its own venv under
``/var/cache/slurmjob-testbed/upgrade/<sha>`` (``git archive`` + ``pip install``; a stamp file
written last marks a finished build, a file lock keeps two runs from building at once). The
upgrade installs the CRD the way docs/operations.md says: the old release's CRD first, this
checkout's before the new operator starts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import OPERATOR, cpu_spec, slurm_jobs_named
from tests.integration.sitefiles import site_env
from tests.integration.test_operator_e2e import CRD, Operator
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.api.status import SlurmJobStatus

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
UPGRADE_CACHE = Path(
    os.environ.get("SLURMJOB_UPGRADE_CACHE", "/var/cache/slurmjob-testbed/upgrade")
)
FROM_ENV = "SLURMJOB_UPGRADE_FROM"
RELEASE_PATHS = ("operator/", "templates/", "pyproject.toml")
STAMP = ".complete"
CRD_NAME = "slurmjobs.slurmjob.io"
LIVE = ("Queued", "Running")
FINAL = ("Succeeded", "Failed", "Cancelled", "Unknown")
# Fields that make an attempt what it is: the new release must keep them as the old wrote them.
IDENTITY = ("number", "jobName", "jobId", "sluid", "stagingDir", "submittedAt", "retryOf")
NCCL = "echo 'NCCL WARN Watchdog caught collective operation timeout' >&2; exit 1"
RETRY_ONCE = {"limit": 1, "backoffSeconds": 0}


# -- the previous release -------------------------------------------------------------------


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False, timeout=60
    )


def _commit(rev: str) -> str | None:
    proc = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    return proc.stdout.strip() if proc.returncode == 0 else None


def previous_release() -> str:
    """The commit the upgrade starts from (see the module docstring); skips without history."""
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: no previous release to upgrade from")
    wanted = os.environ.get(FROM_ENV)
    if wanted:
        sha = _commit(wanted)
        if sha is None:
            pytest.fail(f"{FROM_ENV}={wanted} is not a commit of {REPO}", pytrace=False)
        return sha
    parent = _commit("HEAD~1")
    if parent is None:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        pytest.skip(
            "no commit before HEAD"
            + (" (shallow clone: `git fetch --unshallow` first)" if shallow else "")
            + f": no previous release to upgrade from; {FROM_ENV}=<rev> names one"
        )
    for sha in _git("rev-list", "HEAD~1").stdout.split():
        diff = _git("diff", "--quiet", sha, "HEAD", "--", *RELEASE_PATHS)
        if diff.returncode == 1:
            return sha
        if diff.returncode != 0:
            raise AssertionError(f"git diff {sha} HEAD failed: {diff.stderr}")
    return parent


def _build(sha: str, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)  # a half-built directory from a killed run
    src, venv = root / "src", root / "venv"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", sha],
        capture_output=True,
        check=True,
        timeout=120,
    )
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    proc = subprocess.run(
        [*pip, "install", "--quiet", str(src)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        raise AssertionError(f"pip install of {sha} failed:\n{proc.stdout}{proc.stderr}")
    subprocess.run([str(venv / "bin/slurmjob-operator"), "--help"], capture_output=True, check=True)


def _prune(keep: Path, kept: int = 3) -> None:
    """Each release's venv is about 60 MB: keep the newest few (and `keep`), drop the rest."""
    builds = sorted(
        (d for d in UPGRADE_CACHE.iterdir() if d.is_dir() and d != keep),
        key=lambda d: d.stat().st_mtime,
        reverse=True,
    )
    for old in builds[kept - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def release_operator(sha: str) -> Path:
    """`<venv>/bin/slurmjob-operator` of commit `sha`, built once (cached, under a lock)."""
    root = UPGRADE_CACHE / sha
    binary = root / "venv/bin/slurmjob-operator"
    stamp = root / STAMP
    want = f"{sha} python {sys.version_info.major}.{sys.version_info.minor}\n"
    UPGRADE_CACHE.mkdir(parents=True, exist_ok=True)
    with (UPGRADE_CACHE / ".build.lock").open("a") as lock:
        deadline = time.monotonic() + 300
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        "another run held the upgrade build lock for 300 s"
                    ) from None
                time.sleep(1)
        try:
            if not (stamp.is_file() and stamp.read_text() == want and os.access(binary, os.X_OK)):
                t0 = time.monotonic()
                _build(sha, root)
                tmp = stamp.with_name(STAMP + ".tmp")
                tmp.write_text(want)
                tmp.replace(stamp)
                print(f"built release {sha[:12]} in {time.monotonic() - t0:.1f} s")
            _prune(keep=root)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return binary


@dataclass(frozen=True)
class Release:
    sha: str
    operator: Path
    crd: Path


@pytest.fixture(scope="module")
def old_release() -> Release:
    sha = previous_release()
    binary = release_operator(sha)
    crd = UPGRADE_CACHE / sha / "src/crds/slurmjob.io_slurmjobs.yaml"
    return Release(sha, binary, crd if crd.is_file() else CRD)


# -- one operator process of a given release --------------------------------------------------


@dataclass
class ReleaseOperator(Operator):
    """`slurmjob-operator run -n <namespace>` of one release (`binary`), as the e2e tests run it."""

    binary: Path = OPERATOR

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "run", "-n", self.namespace],
                env=self.process_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.log_path.parent,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# -- the jobs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    name: str
    spec: dict[str, Any]
    attempts_at_switch: int  # what the old release must have recorded before it is stopped
    attempts_at_end: int
    marker: str  # in the final stdout tail


def _jobs() -> list[Job]:
    """In the order they are applied: the cluster has 4 CPUs (2 nodes of 2), Slurm starts them
    in submission order, and the switch comes within seconds of the last apply, long before the
    first 20 s sleep ends."""

    def echo(name: str, seconds: int) -> list[str]:
        return ["bash", "-c", f"sleep {seconds}; echo upgrade-ok-{name}"]

    node = [{"name": "main", "nodes": 1, "gpusPerNode": 0, "cpus": 2, "memoryGb": 1}]
    return [
        # Retried by the old release before the switch (applied alone, first, so that attempt 1
        # never waits for a free CPU): the new release follows attempt 2.
        Job(
            "retried-before",
            cpu_spec(
                [
                    "bash",
                    "-c",
                    f'if [ "$SLURMJOB_ATTEMPT" = 1 ]; then {NCCL}; fi; '
                    "sleep 20; echo upgrade-ok-retried-before-$SLURMJOB_ATTEMPT",
                ],
                retry=RETRY_ONCE,
            ),
            2,
            2,
            "upgrade-ok-retried-before-2",
        ),
        # Attempt 1 (old release) fails after the switch: the new release retries it once.
        Job(
            "retried-after",
            cpu_spec(
                [
                    "bash",
                    "-c",
                    f'if [ "$SLURMJOB_ATTEMPT" = 1 ]; then sleep 20; {NCCL}; fi; '
                    "echo upgrade-ok-retried-after-$SLURMJOB_ATTEMPT",
                ],
                retry=RETRY_ONCE,
            ),
            1,
            2,
            "upgrade-ok-retried-after-2",
        ),
        *(
            Job(f"plain-{i}", cpu_spec(echo(f"plain-{i}", 20)), 1, 1, f"upgrade-ok-plain-{i}")
            for i in range(3)
        ),
        # A whole node, applied last: queued behind the others at the switch.
        Job(
            "whole-node",
            cpu_spec(echo("whole-node", 15), pools=node),
            1,
            1,
            "upgrade-ok-whole-node",
        ),
    ]


# A spec the new release's validation refuses (a reserved env name) and an older one accepted:
# the new release must still follow such a job to its end (the refusal is for new attempts).
REFUSED_NOW_SPEC = cpu_spec(
    ["bash", "-c", "sleep 20; echo upgrade-ok-refused-now"],
    env=[{"name": "LD_LIBRARY_PATH", "value": "/opt/none"}],
)


def _accepted(python: Path, spec: dict[str, Any]) -> bool:
    """Whether the `slurmjob_operator` installed for `python` validates `spec`."""
    code = (
        "import json, sys\n"
        "from slurmjob_operator.api.errors import SpecError, parse_spec\n"
        "try:\n    parse_spec(json.loads(sys.argv[1]))\n"
        "except SpecError:\n    sys.exit(3)\n"
    )
    proc = subprocess.run(
        [str(python), "-c", code, json.dumps(spec)], capture_output=True, timeout=60, check=False
    )
    assert proc.returncode in (0, 3), proc.stderr
    return proc.returncode == 0


def _refused_now(release: Release) -> list[Job]:
    """The refused-now job, when this upgrade is one that starts refusing its spec."""
    old_python = release.operator.parent / "python"
    if _accepted(old_python, REFUSED_NOW_SPEC) and not _accepted(
        Path(sys.executable), REFUSED_NOW_SPEC
    ):
        return [Job("refused-now", REFUSED_NOW_SPEC, 1, 1, "upgrade-ok-refused-now")]
    return []


def _status(obj: dict[str, Any] | None) -> dict[str, Any]:
    status: dict[str, Any] = (obj or {}).get("status") or {}
    return status


def _live_with(attempts: int) -> Callable[[dict[str, Any]], bool]:
    """Queued or Running on attempt `attempts`, its Slurm job id confirmed."""

    def done(obj: dict[str, Any]) -> bool:
        status = _status(obj)
        tried = status.get("attempts") or []
        return (
            status.get("phase") in LIVE
            and len(tried) == attempts
            and bool(tried[-1].get("jobId"))
            and tried[-1].get("confirmed") is True
        )

    return done


def _final(obj: dict[str, Any]) -> bool:
    return _status(obj).get("phase") in FINAL


def _covers(new: Any, old: Any, where: str = "status") -> list[str]:
    """Where `new` (the new release's reading) lost or changed something `old` held."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [where]
        return [m for k, v in old.items() for m in _covers(new.get(k), v, f"{where}.{k}")]
    if isinstance(old, list):
        if not isinstance(new, list) or len(new) != len(old):
            return [where]
        return [
            m
            for i, (n, o) in enumerate(zip(new, old, strict=True))
            for m in _covers(n, o, f"{where}[{i}]")
        ]
    return [] if new == old else [f"{where}: {old!r} -> {new!r}"]


def _launch_events(op: Operator, name: str) -> dict[str, str]:
    """Submitted and Adopted Events of `name`: Event name -> reason."""
    return {
        e["metadata"]["name"]: e["reason"]
        for e in op.events(name)
        if e["reason"] in ("Submitted", "Adopted")
    }


def _leftover_slurm_jobs(testbed: SlurmTestbed, namespace: str) -> list[str]:
    out = testbed.run("squeue", "-h", "-o", "%i %j", check=False).stdout
    prefix = f"sj-{namespace}-"
    return [
        i for i, _, n in (line.partition(" ") for line in out.splitlines()) if n.startswith(prefix)
    ]


# -- the upgrade -----------------------------------------------------------------------------


@pytest.fixture
def bench(
    kube: KubeTestbed, slurm_2605: SlurmTestbed, old_release: Release, tmp_path: Path
) -> Iterator[tuple[ReleaseOperator, ReleaseOperator]]:
    """The old and the new operator on one fresh namespace; cleaned up whatever happens."""
    namespace = f"upg-{uuid.uuid4().hex[:6]}"
    kube.apply(old_release.crd)
    kube.wait_established(CRD_NAME)
    kube.kubectl("create", "namespace", namespace)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        **kube.env(),
        **site_env(slurm_2605, "apptainer", tmp_path),
        "SLURMJOB_POLL_INTERVAL": "1",
        "SLURMJOB_METRICS_PORT": "0",
        "SLURMJOB_DELETE_TIMEOUT": "30",
    }
    old = ReleaseOperator(
        kube,
        slurm_2605,
        namespace,
        env,
        tmp_path / "old" / "operator.log",
        binary=old_release.operator,
    )
    new = ReleaseOperator(kube, slurm_2605, namespace, env, tmp_path / "new" / "operator.log")
    old.log_path.parent.mkdir()
    new.log_path.parent.mkdir()
    try:
        yield old, new
    finally:
        old.kill()
        kube.apply(CRD, check=False)  # this checkout's CRD stays installed for later tests
        if not new.running():
            new.start()
        deleted = kube.kubectl(
            "delete", "slurmjob", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=75
        )
        if deleted.returncode != 0:  # the operator could not finish: cancel by hand
            print(f"cleanup: delete failed: {deleted.stderr}")
            names = kube.kubectl("get", "slurmjob", "-n", namespace, "-o", "name", check=False)
            for ref in names.stdout.split():
                kube.kubectl(
                    "patch", ref, "-n", namespace, "--type=merge",
                    "-p", '{"metadata": {"finalizers": null}}', check=False,
                )  # fmt: skip
        new.stop()
        leftovers = _leftover_slurm_jobs(slurm_2605, namespace)
        if leftovers:
            print(f"cleanup: cancelling leftover Slurm jobs {leftovers}")
            slurm_2605.run("scancel", *leftovers, check=False)
        for label, op in (("old", old), ("new", new)):
            print(f"--- {label} operator log ({namespace}) ---\n{op.log_tail(120)}")
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        assert not leftovers, f"Slurm jobs left behind by the cleanup: {leftovers}"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_upgrade_keeps_running_jobs(
    bench: tuple[ReleaseOperator, ReleaseOperator],
    old_release: Release,
    kube: KubeTestbed,
    stop: signal.Signals,
) -> None:
    old, new = bench
    jobs = _jobs()
    # Before the whole-node job: it must not wait behind a node-sized job at the switch.
    jobs[-1:-1] = _refused_now(old_release)
    t0 = time.monotonic()

    # The previous release accepts every job; each has a confirmed Slurm job id.
    old.start()
    for i, job in enumerate(jobs):
        old.apply(job.name, job.spec)
        if i == 0:  # retried-before: on attempt 2 before the others take the CPUs
            old.wait_for(job.name, _live_with(2), within=30, what="attempt 2 (old release)")
    for job in jobs:
        old.wait_for(
            job.name,
            _live_with(job.attempts_at_switch),
            within=45,
            what=f"Queued/Running on attempt {job.attempts_at_switch} with a job id (old release)",
        )

    # The switch.
    t_switch = time.monotonic()
    assert old.proc is not None
    if stop is signal.SIGTERM:
        old.proc.send_signal(signal.SIGTERM)
        try:
            old.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            old.kill()
            raise AssertionError(f"the old operator ignored SIGTERM:\n{old.log_tail()}") from None
    else:
        old.kill()
    t_stopped = time.monotonic()
    before = {job.name: old.get(job.name) or {} for job in jobs}
    events_before = {job.name: _launch_events(old, job.name) for job in jobs}
    for job in jobs:
        status = _status(before[job.name])
        assert status.get("phase") in LIVE, (
            f"{job.name} is no longer live at the switch (too slow a start?): {status}"
        )
        assert len(status["attempts"]) == job.attempts_at_switch, status
        # What the old release wrote is read by the new release's model, losing nothing.
        lost = _covers(SlurmJobStatus.parse(status).dump(), status)
        assert not lost, f"{job.name}: the new SlurmJobStatus drops {lost}"

    kube.apply(CRD)  # the upgrade order docs/operations.md gives: CRD first, then the operator
    kube.wait_established(CRD_NAME)
    new.start()
    try:
        after = {
            job.name: new.wait_for(job.name, _final, within=150, what="a final phase (new release)")
            for job in jobs
        }
    except AssertionError as exc:  # other tests' jobs holding the nodes show here
        queue = new.testbed.run("squeue", "-h", "-o", "%i %j %T %R", check=False).stdout
        raise AssertionError(f"{exc}\nsqueue:\n{queue}") from None
    t_end = time.monotonic()

    figures = []
    for job in jobs:
        old_status, obj = _status(before[job.name]), after[job.name]
        status = _status(obj)
        assert status["phase"] == "Succeeded", (job.name, status)
        parsed = SlurmJobStatus.parse(status)
        assert parsed.logs is not None
        assert parsed.logs.stdout is not None
        assert job.marker in parsed.logs.stdout.tail, (job.name, parsed.logs)
        attempts = status["attempts"]
        assert len(attempts) == job.attempts_at_end, (job.name, attempts)
        for was, now in zip(old_status["attempts"], attempts, strict=False):
            assert {k: was.get(k) for k in IDENTITY} == {k: now.get(k) for k in IDENTITY}, (
                job.name,
                was,
                now,
            )
        if job.attempts_at_end == 2:
            assert attempts[0]["retryAction"] == "Retry", attempts
            assert attempts[1]["retryOf"] == 1, attempts
        assert status["slurmJobId"] == attempts[-1]["jobId"]
        # One Slurm job per attempt, the one in the status.
        for attempt in attempts:
            found = slurm_jobs_named(new.env, attempt["jobName"])
            leaders = [j.het_job_id or j.job_id for j in found]
            assert leaders == [attempt["jobId"]], (job.name, attempt["jobName"], found)
        # The new release announced no submission or adoption of the old release's attempts;
        # only a retry it decided itself is a new submission.
        new_events = {
            k: v
            for k, v in _launch_events(new, job.name).items()
            if k not in events_before[job.name]
        }
        expected = ["Submitted"] * (job.attempts_at_end - job.attempts_at_switch)
        assert sorted(new_events.values()) == expected, (job.name, new_events)
        figures.append(f"{job.name}: jobs {[a['jobId'] for a in attempts]}")

    at_switch = sorted(_status(o)["phase"] for o in before.values())
    announced = sum(len(e) for e in events_before.values())
    print(
        f"upgrade {old_release.sha[:12]} -> working tree ({stop.name}): "
        f"phases at the switch {at_switch}, {announced} Submitted/Adopted Events before it; "
        f"switch at {t_switch - t0:.1f} s, old stopped in {t_stopped - t_switch:.1f} s, "
        f"all final {t_end - t0:.1f} s after the first apply; " + "; ".join(figures)
    )
