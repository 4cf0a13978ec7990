"""The accounting paths on a real slurmdbd (Slurm 26.05 with MariaDB, `MinJobAge` 20 s).

While the operator is stopped, three jobs end and slurmctld purges them:

- one that succeeded and one that failed with exit code 3, both followed before the stop:
  after the restart each reaches its true phase, exit code and times from accounting;
- one whose submit reached slurmrestd while the answer was held in the proxy and the operator
  was SIGKILLed (a lost submit): after the restart it is adopted by name and SLUID from
  accounting, with no second submit.

Each needs one purge, so the three share it (<= 80 s: slurmctld purges every 60 s). The 22.05
cluster has no accounting; the `Unknown` path there is covered by the unit tests.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.faults.proxy import Action
from tests.integration.helpers import OPERATOR
from tests.integration.sitefiles import site_env
from tests.integration.test_exactly_once import (
    FINAL,
    Bench,
    _attempts,
    _condition,
    _status,
    running_bench,
)
from tests.integration.test_operator_e2e import CRD, cpu_spec
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.core.jobview import BaseState, JobSource, SlurmJobView
from slurmjob_operator.times import rfc3339

pytestmark = pytest.mark.integration

PURGE_WITHIN = 150  # s: MinJobAge 20 + one 60 s purge cycle, with room for a slow machine


@pytest.fixture(scope="module")
def bench(
    kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bench]:
    assert slurm_2605.has_accounting
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    with running_bench(kube, slurm_2605, tmp_path_factory.mktemp("acct"), "acct") as bench:
        yield bench


def _views(bench: Bench, job_names: list[str]) -> dict[str, list[SlurmJobView]]:
    """Per name: the controller's jobs and the accounting records, asked straight."""
    return {name: bench.slurm_jobs(name) for name in job_names}


def _wait_purged(bench: Bench, job_names: list[str]) -> dict[str, list[SlurmJobView]]:
    """Until slurmctld knows none of `job_names` and accounting holds each, once."""
    deadline = time.monotonic() + PURGE_WITHIN
    seen: dict[str, list[SlurmJobView]] = {}
    while time.monotonic() < deadline:
        seen = _views(bench, job_names)
        if all(
            views and all(v.source is JobSource.ACCOUNTING for v in views)
            for views in seen.values()
        ):
            return seen
        time.sleep(3)
    raise AssertionError(
        "not purged from slurmctld (or not in accounting) within "
        f"{PURGE_WITHIN} s: {[(n, [(v.job_id, v.source) for v in vs]) for n, vs in seen.items()]}"
    )


@pytest.mark.slurm2605
def test_jobs_that_ended_and_were_purged_while_the_operator_was_down(bench: Bench) -> None:
    op = bench.op
    ok, bad, lost = bench.name("acct-ok"), bench.name("acct-bad"), bench.name("acct-lost")
    op.apply(ok, cpu_spec(["bash", "-c", "sleep 4; echo fine"]))
    op.apply(bad, cpu_spec(["bash", "-c", "sleep 4; echo broken >&2; exit 3"]))
    for name in (ok, bad):
        bench.wait(name, lambda o: bool(_attempts(o) and _attempts(o)[-1].get("jobId")), "job id")
    # The third submit reaches slurmrestd; its answer is held, then the operator dies.
    fault = bench.fault(lost, Action.HOLD_RESPONSE)
    op.apply(lost, cpu_spec(["true"]))
    assert fault.answered.wait(30), "the submit never reached slurmrestd"
    op.kill()
    fault.release(deliver=False)
    assert _attempts(op.get(lost) or {})[-1].get("jobId") is None
    for name in (ok, bad):
        assert _status(op.get(name) or {})["phase"] not in FINAL

    job_names = {n: _attempts(op.get(n) or {})[-1]["jobName"] for n in (ok, bad, lost)}
    purged = _wait_purged(bench, list(job_names.values()))
    accounted = {n: purged[job_names[n]] for n in job_names}
    assert all(len(v) == 1 for v in accounted.values()), accounted

    bench.proxy.clear()
    op.start()
    for name, phase, code in ((ok, "Succeeded", 0), (bad, "Failed", 3), (lost, "Succeeded", 0)):
        obj = op.wait_phase(name, *FINAL, within=60)
        status = _status(obj)
        assert status["phase"] == phase, json.dumps(status, indent=1)
        attempt = _attempts(obj)[-1]
        [record] = accounted[name]
        assert attempt["jobId"] == record.job_id
        assert attempt["sluid"] == record.sluid
        assert attempt["exitCode"] == code
        # The times are Slurm's, from accounting, not the moment the operator noticed.
        assert record.start_time is not None
        assert record.end_time is not None
        assert attempt["startedAt"] == rfc3339(record.start_time), attempt
        assert attempt["finishedAt"] == rfc3339(record.end_time), attempt
        assert status["phase"] != "Unknown"
    # The lost submit was adopted, not submitted again: one POST with its name in all.
    assert bench.proxy.submits_forwarded(job_names[lost]) == 1
    assert _condition(op.get(lost) or {}, "Submitted")["reason"] == "Adopted"
    assert "Adopted" in bench.reasons(lost)
    for name in (ok, bad):
        assert "JobLost" not in bench.reasons(name)
    # Accounting still holds exactly one job per attempt name.
    assert all(len(v) == 1 for v in _views(bench, list(job_names.values())).values())


@pytest.mark.parametrize(
    ("cluster", "outcome"),
    [
        pytest.param("26.05", "ok", marks=pytest.mark.slurm2605),
        pytest.param("22.05", "warn", marks=pytest.mark.slurm2205),
    ],
)
def test_doctor_says_whether_purged_jobs_can_be_read(
    request: pytest.FixtureRequest,
    cluster: str,
    outcome: str,
    tmp_path: Path,
) -> None:
    testbed: SlurmTestbed = request.getfixturevalue(
        "slurm_2605" if cluster == "26.05" else "slurm_2205"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        **site_env(testbed, "apptainer", tmp_path),
    }
    proc = subprocess.run(
        [str(OPERATOR), "doctor", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["accounting"]["outcome"] == outcome, checks["accounting"]
    if outcome == "ok":
        assert "/slurmdb/v0.0.45" in checks["accounting"]["detail"]
    else:
        assert "JobLost" in checks["accounting"]["detail"]


# -- proven absent: no person needed -------------------------------------------------------

# A fencing window of 3 + 2 + 2 = 7 s (the REST timeout, MessageTimeout and the margin).
SHORT_WINDOW = {"SLURMJOB_SLURM_MESSAGE_TIMEOUT": "2", "SLURMJOB_ABSENCE_MARGIN": "2"}


@pytest.fixture(scope="module")
def proof_bench(
    kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bench]:
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    tmp = tmp_path_factory.mktemp("proof")
    with running_bench(kube, slurm_2605, tmp, "proof", SHORT_WINDOW) as bench:
        yield bench


@pytest.mark.slurm2605
def test_a_submit_that_never_reached_slurm_is_proven_absent(proof_bench: Bench) -> None:
    bench = proof_bench
    name = bench.name("reset")
    fault = bench.fault(name, Action.RESET)  # the connection reset, nothing forwarded
    bench.op.apply(name, cpu_spec(["true"]))
    assert fault.finished.wait(30)
    obj = bench.op.wait_phase(name, *FINAL, within=90)
    assert _status(obj)["phase"] == "Succeeded", json.dumps(_status(obj), indent=1)
    first, second = _attempts(obj)
    assert first.get("provenAbsentAt")
    assert not first.get("declaredLost")
    assert first.get("jobId") is None
    assert second["jobId"]
    assert "slurmjob.io/declare-lost" not in (obj["metadata"].get("annotations") or {})
    assert bench.proxy.submits_forwarded(first["jobName"]) == 0
    assert bench.proxy.submits_forwarded(second["jobName"]) == 1
    assert bench.slurm_jobs(first["jobName"]) == []
    assert "ProvenAbsent" in bench.reasons(name)


@pytest.mark.slurm2605
def test_a_submit_released_after_the_window_is_cancelled_as_late(proof_bench: Bench) -> None:
    bench = proof_bench
    name = bench.name("late")
    fault = bench.fault(name, Action.HOLD_REQUEST)  # held in the proxy, not yet at slurmrestd
    # Attempt 1's job (if it ever runs) sleeps long; attempt 2's ends soon after.
    script = 'case "$SLURM_JOB_NAME" in *-a1) sleep 120;; *) sleep 15;; esac'
    bench.op.apply(name, cpu_spec(["bash", "-c", script]))
    assert fault.matched.wait(30)
    obj = bench.wait(
        name,
        lambda o: len(_attempts(o)) == 2 and bool(_attempts(o)[1].get("jobId")),
        "attempt 2 submitted after attempt 1 was proven absent",
        within=60,
    )
    first = _attempts(obj)[0]
    assert first.get("provenAbsentAt")
    fault.release(deliver=True)  # the proxy lets the old request through, too late
    assert fault.finished.wait(30)
    assert fault.forwarded.is_set()
    done = bench.op.wait_phase(name, *FINAL, within=90)
    assert _status(done)["phase"] == "Succeeded", json.dumps(_status(done), indent=1)
    events = [e for e in bench.op.events(name) if e["reason"] == "LateSubmitCancelled"]
    assert events, bench.reasons(name)
    [late] = bench.slurm_jobs(first["jobName"])
    assert late.base_state is BaseState.CANCELLED
    assert str(late.job_id) in events[0]["message"]
    assert "fencing window of 7 s" in events[0]["message"]
    # Not a duplicate of attempt 2: that one ran to its end.
    [kept] = bench.slurm_jobs(_attempts(done)[1]["jobName"])
    assert kept.base_state is BaseState.COMPLETED
