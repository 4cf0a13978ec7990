"""Exactly once under faults: one SlurmJob attempt is one Slurm job, whatever fails.

The operator runs as a separate process (`slurmjob-operator run`) against a real
kube-apiserver, and talks to the real slurmrestd through `tests.faults.proxy.FaultProxy`,
which forwards byte for byte except where a test arms a fault on one resource's submit. The
Slurm jobs are counted straight against slurmrestd (not through the proxy) with the project's
own client: `find_by_name`, grouped by heterogeneous leader.

Faults (on Slurm 26.05, v0.0.45, adoption by name confirmed by SLUID; and on Slurm 22.05,
v0.0.38, by name and comment alone):

- (a) the submit is forwarded and its answer dropped (reset), (b) delayed past the operator's
  timeout, (c) answered 502 after being forwarded: the job exists, the operator adopts it.
- (d) reset before forwarding, (e) the operator SIGKILLed while the proxy holds the submit,
  which is then dropped: nothing exists; the operator must not submit blindly, it keeps the
  attempt unconfirmed and searches, until a person declares the attempt lost.
- (f) SIGKILL after slurmrestd created the job and before the status write: adoption after
  the restart. (g) SIGKILL after the status write: no second submit.
- A duplicate with the same attempt identity: the oldest is kept, the other cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.faults.proxy import Action, Fault, FaultProxy
from tests.integration.sitefiles import site_env
from tests.integration.test_operator_e2e import Operator, cpu_spec, het_spec
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.config import Settings
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport

pytestmark = pytest.mark.integration

REST_TIMEOUT = 3  # seconds: the delayed answer (b) comes after it
DECLARE_LOST = "slurmjob.io/declare-lost"
FINAL = ("Succeeded", "Failed", "Cancelled", "Unknown")


@dataclass
class Bench:
    """One operator, its fault proxy and the direct way to Slurm, for one cluster."""

    op: Operator
    proxy: FaultProxy
    testbed: SlurmTestbed
    direct_env: dict[str, str]

    @property
    def has_sluid(self) -> bool:
        return self.testbed.api_version >= "v0.0.44"

    def name(self, stem: str) -> str:
        return f"{stem}-{uuid.uuid4().hex[:5]}"

    def fault(self, name: str, action: Action, **kw: Any) -> Fault:
        """A fault on the first submit of resource `name` (whatever its attempt)."""
        body = f'"sj-{self.op.namespace}-{name}-[0-9a-z]+-a'
        return self.proxy.add(Fault(action, body=body, name=name, **kw))

    def slurm_jobs(self, job_name: str) -> list[SlurmJobView]:
        """Every Slurm job named `job_name`, asked straight from slurmrestd."""

        async def find() -> list[SlurmJobView]:
            settings = Settings.from_env(self.direct_env)
            async with open_transport(settings) as transport:
                client: SlurmClient = await connect(settings, transport)
                return await client.find_by_name(job_name)

        return asyncio.run(find())

    def leaders(self, job_name: str) -> dict[int, SlurmJobView]:
        """The jobs named `job_name` by leader id, each as its leader component."""
        out: dict[int, SlurmJobView] = {}
        for job in self.slurm_jobs(job_name):
            leader = job.het_job_id or job.job_id
            if leader not in out or (job.het_job_offset or 0) < (out[leader].het_job_offset or 0):
                out[leader] = job
        return out

    def restart(self) -> None:
        self.op.kill()
        self.op.start()

    def wait(
        self, name: str, done: Callable[[dict[str, Any]], bool], what: str, within: float = 60
    ) -> dict[str, Any]:
        return self.op.wait_for(name, done, within, what)

    def reasons(self, name: str) -> list[str]:
        return [e["reason"] for e in self.op.events(name)]


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    status: dict[str, Any] = obj.get("status") or {}
    return status


def _attempts(obj: dict[str, Any]) -> list[dict[str, Any]]:
    attempts: list[dict[str, Any]] = _status(obj).get("attempts") or []
    return attempts


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for cond in _status(obj).get("conditions") or []:
        if cond["type"] == type_:
            found: dict[str, Any] = cond
            return found
    return {}


def _unconfirmed(obj: dict[str, Any]) -> bool:
    return _condition(obj, "Submitted").get("reason") == "SubmissionUnconfirmed"


def assert_exactly_once(
    bench: Bench,
    name: str,
    *,
    submits: int = 1,
    attempt: int = 1,
    phase: str = "Succeeded",
) -> dict[str, Any]:
    """The resource reached `phase` through attempt `attempt`, exactly one Slurm job carries
    that attempt's name, the status holds its id (and SLUID), and `submits` submits with that
    name reached slurmrestd."""
    obj = bench.op.wait_phase(name, *FINAL, within=90)
    status = _status(obj)
    assert status["phase"] == phase, json.dumps(status, indent=1)
    attempts = _attempts(obj)
    assert len(attempts) == attempt, attempts
    last = attempts[-1]
    leaders = bench.leaders(last["jobName"])
    assert list(leaders) == [last["jobId"]], (
        f"Slurm jobs named {last['jobName']}: {sorted(leaders)}; status has {last['jobId']}"
    )
    assert last["confirmed"] is True
    assert status["slurmJobId"] == last["jobId"]
    if bench.has_sluid:
        assert last["sluid"] == leaders[last["jobId"]].sluid
    else:
        assert "sluid" not in last
    assert bench.proxy.submits_forwarded(last["jobName"]) == submits
    return obj


def unblock_by_hand(bench: Bench, name: str, obj: dict[str, Any]) -> None:
    """What a person does after checking Slurm by hand: declare attempt 1 lost. Then
    attempt 2 is submitted and is the only Slurm job."""
    first = _attempts(obj)[0]
    bench.op.kube.kubectl(
        "annotate", "slurmjob", name, "-n", bench.op.namespace, f"{DECLARE_LOST}=1"
    )
    obj = assert_exactly_once(bench, name, attempt=2)
    assert bench.leaders(first["jobName"]) == {}
    assert _attempts(obj)[0]["jobName"] == first["jobName"]
    assert _attempts(obj)[0].get("jobId") is None
    assert _attempts(obj)[0]["declaredLost"] is True


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("26.05", marks=pytest.mark.slurm2605),
        pytest.param("22.05", marks=pytest.mark.slurm2205),
    ],
)
def bench(
    request: pytest.FixtureRequest,
    kube: KubeTestbed,
    crd: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Bench]:
    testbed: SlurmTestbed = request.getfixturevalue(
        "slurm_2605" if request.param == "26.05" else "slurm_2205"
    )
    tmp = tmp_path_factory.mktemp(f"eo{testbed.name.replace('.', '')}")
    with running_bench(kube, testbed, tmp, f"eo-{testbed.name.replace('.', '')}") as bench:
        yield bench


@contextlib.contextmanager
def running_bench(
    kube: KubeTestbed,
    testbed: SlurmTestbed,
    tmp: Path,
    prefix: str,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Bench]:
    """An operator in a namespace of its own, reaching `testbed`'s slurmrestd through a
    fault proxy; on the way out its SlurmJobs are deleted while it still runs."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    direct = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        **kube.env(),
        **site_env(testbed, "apptainer", tmp),
        "SLURMJOB_POLL_INTERVAL": "1",
        "SLURMJOB_METRICS_PORT": "0",
        "SLURMJOB_DELETE_TIMEOUT": "20",
    }
    proxy = FaultProxy(testbed.rest_url).start()
    env = {
        **direct,
        "SLURMJOB_SLURM_REST_URL": proxy.url,
        "SLURMJOB_SLURM_REST_TIMEOUT": str(REST_TIMEOUT),
        **(extra_env or {}),
    }
    op = Operator(kube, testbed, namespace, env, tmp / "operator.log")
    op.start()
    try:
        yield Bench(op, proxy, testbed, direct)
    finally:
        proxy.clear()
        if op.proc is not None and op.proc.poll() is None:
            # Let the operator cancel what is left and release its finalizers.
            kube.kubectl(
                "delete", "slurmjobs", "--all", "-n", namespace, "--timeout=40s",
                check=False, timeout=50,
            )  # fmt: skip
        op.stop()
        proxy.stop()
        print(f"--- operator log ({namespace}) ---\n{op.log_tail(150)}")
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# -- the job exists: adoption -------------------------------------------------------------


def test_a_response_dropped_after_forward_is_adopted(bench: Bench) -> None:
    name = bench.name("drop")
    fault = bench.fault(name, Action.DROP_RESPONSE)
    bench.op.apply(name, cpu_spec(["true"]))
    assert fault.answered.wait(30), "the submit never reached slurmrestd"
    obj = assert_exactly_once(bench, name)
    assert _condition(obj, "Submitted")["reason"] == "Adopted"
    reasons = bench.reasons(name)
    assert "SubmissionUnconfirmed" in reasons
    assert "Adopted" in reasons


def test_b_response_delayed_past_the_timeout_is_adopted(bench: Bench) -> None:
    name = bench.name("delay")
    fault = bench.fault(name, Action.DELAY, delay=REST_TIMEOUT + 3)
    bench.op.apply(name, cpu_spec(["true"]))
    assert fault.answered.wait(30)
    assert_exactly_once(bench, name)
    assert "Adopted" in bench.reasons(name)


def test_c_502_after_forward_is_adopted(bench: Bench) -> None:
    name = bench.name("bad-gw")
    fault = bench.fault(name, Action.ANSWER_5XX, status=502, forward=True)
    bench.op.apply(name, cpu_spec(["true"]))
    assert fault.answered.wait(30)
    assert_exactly_once(bench, name)
    assert "Adopted" in bench.reasons(name)


def test_f_killed_after_the_post_before_the_status_write_adopts(bench: Bench) -> None:
    name = bench.name("kill-mid")
    fault = bench.fault(name, Action.HOLD_RESPONSE)
    bench.op.apply(name, cpu_spec(["true"]))
    assert fault.answered.wait(30), "the submit never reached slurmrestd"
    bench.op.kill()  # slurmrestd created the job; its answer is held in the proxy
    fault.release(deliver=False)
    obj = bench.op.get(name) or {}
    assert _attempts(obj)[-1].get("jobId") is None  # the status never heard of the job
    bench.op.start()
    obj = assert_exactly_once(bench, name)
    assert _condition(obj, "Submitted")["reason"] == "Adopted"
    assert "Adopted" in bench.reasons(name)


def test_g_killed_after_the_status_write_submits_nothing_again(bench: Bench) -> None:
    name = bench.name("kill-late")
    bench.op.apply(name, cpu_spec(["bash", "-c", "sleep 3; echo done"]))
    bench.wait(name, lambda o: bool(_attempts(o) and _attempts(o)[-1].get("jobId")), "a job id")
    bench.restart()
    assert_exactly_once(bench, name)
    assert "Adopted" not in bench.reasons(name)


def test_a_duplicate_with_the_same_identity_is_cancelled(bench: Bench) -> None:
    name = bench.name("dup")
    fault = bench.fault(name, Action.HOLD_RESPONSE)
    bench.op.apply(name, cpu_spec(["bash", "-c", "sleep 2"]))
    assert fault.answered.wait(30)
    # While the first answer is held, the very same submit (same name, same comment) again.
    [first] = fault.hits
    status, _ = bench.proxy.replay(first)
    assert status == 200
    job_name = first.job_name
    assert job_name is not None
    original, duplicate = sorted(bench.leaders(job_name))
    fault.release(deliver=False)
    obj = bench.op.wait_phase(name, *FINAL, within=90)
    assert _status(obj)["phase"] == "Succeeded", _status(obj)
    assert _attempts(obj)[-1]["jobId"] == original  # the oldest is kept
    [dup_view] = [j for j in bench.slurm_jobs(job_name) if j.job_id == duplicate]
    assert dup_view.base_state is BaseState.CANCELLED
    events = [e for e in bench.op.events(name) if e["reason"] == "DuplicateCancelled"]
    assert events, bench.reasons(name)
    assert str(duplicate) in events[0]["message"]


# -- nothing was created: no blind resubmit -------------------------------------------------


def _stays_unconfirmed(bench: Bench, name: str) -> dict[str, Any]:
    """The attempt is unconfirmed, shown so, no job exists and no submit reaches Slurm while
    the operator keeps searching."""
    obj = bench.wait(name, _unconfirmed, "Submitted=Unknown SubmissionUnconfirmed")
    job_name = _attempts(obj)[-1]["jobName"]
    searches = len(bench.proxy.exchanges(method="GET"))
    time.sleep(3)  # several searches (one per poll interval)
    obj = bench.op.get(name) or {}
    assert _status(obj)["phase"] == "Submitting"
    assert _unconfirmed(obj)
    assert len(_attempts(obj)) == 1
    assert bench.proxy.submits_forwarded(job_name) == 0
    assert bench.leaders(job_name) == {}
    assert len(bench.proxy.exchanges(method="GET")) > searches  # still searching
    assert "SubmissionUnconfirmed" in bench.reasons(name)
    return obj


def test_d_reset_before_forward_never_resubmits_blindly(bench: Bench) -> None:
    name = bench.name("reset")
    fault = bench.fault(name, Action.RESET)
    bench.op.apply(name, cpu_spec(["true"]))
    assert fault.finished.wait(30)
    obj = _stays_unconfirmed(bench, name)
    unblock_by_hand(bench, name, obj)


def test_e_killed_before_the_post_reaches_slurm_never_resubmits_blindly(bench: Bench) -> None:
    name = bench.name("kill-early")
    fault = bench.fault(name, Action.HOLD_REQUEST)
    bench.op.apply(name, cpu_spec(["true"]))
    assert fault.matched.wait(30)
    bench.op.kill()  # the submit is held in the proxy, not yet at slurmrestd...
    fault.release(deliver=False)  # ...and then dropped
    assert fault.finished.wait(10)
    assert not fault.forwarded.is_set()
    bench.op.start()
    obj = _stays_unconfirmed(bench, name)
    unblock_by_hand(bench, name, obj)


def test_declare_lost_annotation_unblocks_an_unconfirmed_attempt(bench: Bench) -> None:
    name = bench.name("lost")
    # 502 without forwarding: nothing exists, but 502 is ambiguous for a submit.
    fault = bench.fault(name, Action.ANSWER_5XX, status=502)
    bench.op.apply(name, cpu_spec(["true"]))
    assert fault.finished.wait(30)
    obj = _stays_unconfirmed(bench, name)
    first = _attempts(obj)[0]
    bench.op.kube.kubectl(
        "annotate", "slurmjob", name, "-n", bench.op.namespace, f"{DECLARE_LOST}=1"
    )
    obj = assert_exactly_once(bench, name, attempt=2)
    lost = _attempts(obj)[0]
    assert lost["jobName"] == first["jobName"]
    assert lost.get("jobId") is None
    assert lost["declaredLost"] is True
    assert lost["reason"] == "DeclaredLost"
    assert "DeclaredLost" in bench.reasons(name)
    assert bench.leaders(first["jobName"]) == {}


# -- a proxy in front of slurmrestd --------------------------------------------------------


def test_503_after_forward_is_not_submitted_again(bench: Bench) -> None:
    name = bench.name("unavail")
    fault = bench.fault(name, Action.ANSWER_5XX, status=503, forward=True)
    bench.op.apply(name, cpu_spec(["true"]))
    assert fault.answered.wait(30)
    assert_exactly_once(bench, name)


def test_heterogeneous_job_is_adopted_by_its_leader(bench: Bench) -> None:
    if not bench.has_sluid:
        pytest.skip("the heterogeneous case runs on 26.05 only (time)")
    name = bench.name("het")
    fault = bench.fault(name, Action.DROP_RESPONSE)
    bench.op.apply(name, het_spec(["bash", "-c", "echo world=$WORLD_SIZE"]))
    assert fault.answered.wait(30)
    obj = assert_exactly_once(bench, name)
    assert set(_status(obj)["nodes"].split(",")) == {"n1", "n2"}
