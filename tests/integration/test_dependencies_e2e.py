"""spec.dependsOn on the real stack (Slurm 26.05 and 22.05 under one operator each).

- A two-step chain: the second is submitted while the first runs, with `afterok` on the
  first's Slurm job, and starts only after the first ended.
- The retry case: the first fails once (exit 3, retried by its rules); the second, pending
  in Slurm on the first attempt's job, is repointed to the retry's job and runs after it.
- An upstream that fails for good: the dependent's job is cancelled, it ends DependencyFailed.
- The TTL after the end: an upstream due for deletion is kept while its dependent runs; what
  the TTL deletes is in the log archive afterwards (logs, script, status, namespace uid).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import RETRY_EXIT_3, cpu_spec
from tests.integration.test_operator_e2e import (
    RELEASES,
    Operator,
    _condition,
    _operator,
    release_testbed,
)
from tests.k8s.kube import KubeTestbed

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=RELEASES)
def deps_op(
    request: pytest.FixtureRequest,
    kube: KubeTestbed,
    crd: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    tmp = tmp_path_factory.mktemp("deps")
    archive = tmp / "archive"
    archive.mkdir(mode=0o700, exist_ok=True)
    overrides = {"SLURMJOB_ARCHIVE_ROOT": str(archive)}
    yield from _operator(kube, release_testbed(request), tmp, **overrides)


def _attempts(obj: dict[str, Any]) -> list[dict[str, Any]]:
    attempts: list[dict[str, Any]] = obj["status"]["attempts"]
    return attempts


def _phase(o: dict[str, Any]) -> str | None:
    phase: str | None = (o.get("status") or {}).get("phase")
    return phase


def test_the_second_step_waits_in_slurm_for_the_first(deps_op: Operator) -> None:
    op = deps_op
    op.apply("step1", cpu_spec(["bash", "-c", "sleep 6; echo step1-done"]))
    op.wait_phase("step1", "Running", "Succeeded", within=60)
    op.apply("step2", cpu_spec(["echo", "step2-done"], dependsOn=[{"name": "step1"}]))
    queued = op.wait_for(
        "step2",
        lambda o: bool((o.get("status") or {}).get("attempts")) and _phase(o) == "Queued",
        within=60,
        what="step2 queued behind step1",
    )
    step1 = op.get("step1") or {}
    [dependency] = _attempts(queued)[0]["dependencies"]
    assert dependency["name"] == "step1"
    assert dependency["type"] == "afterok"
    assert dependency["jobId"] == _attempts(step1)[0]["jobId"]
    done = op.wait_phase("step2", "Succeeded", "Failed", within=120)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    step1 = op.wait_phase("step1", "Succeeded")
    assert done["status"]["startTime"] >= step1["status"]["completionTime"]
    assert "step2-done" in done["status"]["logs"]["stdout"]["tail"]


def test_a_retried_first_step_is_followed_by_the_second(deps_op: Operator) -> None:
    op = deps_op
    first = 'if [ "$SLURMJOB_ATTEMPT" = 1 ]; then sleep 4; exit 3; fi; sleep 2; echo pre-ok'
    op.apply("pre", cpu_spec(["bash", "-c", first], retry=RETRY_EXIT_3))
    op.wait_phase("pre", "Running", within=60)
    op.apply("post", cpu_spec(["echo", "post-ok"], dependsOn=[{"name": "pre"}]))
    op.wait_for(
        "post",
        lambda o: bool((o.get("status") or {}).get("attempts")),
        within=60,
        what="post submitted",
    )
    post = op.wait_phase("post", "Succeeded", "Failed", within=180)
    pre = op.wait_phase("pre", "Succeeded", "Failed", within=60)
    assert pre["status"]["phase"] == "Succeeded", pre["status"]
    assert post["status"]["phase"] == "Succeeded", post["status"]
    pre_attempts = _attempts(pre)
    assert [a["retryAction"] for a in pre_attempts[:1]] == ["Retry"]
    assert len(pre_attempts) == 2
    [post_attempt] = _attempts(post)  # never resubmitted: repointed
    [dependency] = post_attempt["dependencies"]
    assert (dependency["attempt"], dependency["jobId"]) == (2, pre_attempts[1]["jobId"])
    assert "DependencyRepointed" in [e["reason"] for e in op.events("post")]
    assert post["status"]["startTime"] >= pre["status"]["completionTime"]


def test_a_first_step_that_fails_for_good_fails_the_second(deps_op: Operator) -> None:
    op = deps_op
    op.apply("doomed", cpu_spec(["bash", "-c", "sleep 4; exit 1"]))
    op.wait_phase("doomed", "Running", within=60)
    op.apply("after-doomed", cpu_spec(["echo", "never"], dependsOn=[{"name": "doomed"}]))
    obj = op.wait_phase("after-doomed", "Failed", "Succeeded", "Cancelled", within=120)
    failed = _condition(obj, "Failed")
    assert failed is not None
    assert failed["reason"] == "DependencyFailed", obj["status"]
    assert "SlurmJob doomed ended Failed" in failed["message"]
    attempts = _attempts(obj)
    if attempts:  # submitted behind the upstream's job: cancelled in Slurm
        jobs = op.slurm_job(attempts[0]["jobId"])
        assert all(j.is_final for j in jobs), jobs
        assert "log" not in obj["status"] or "never" not in str(obj["status"].get("logs"))


def test_a_missing_upstream_waits(deps_op: Operator) -> None:
    op = deps_op
    op.apply("orphan", cpu_spec(["true"], dependsOn=[{"name": "not-there-yet"}]))
    obj = op.wait_for(
        "orphan",
        lambda o: (_condition(o, "Ready") or {}).get("reason") == "WaitingForDependency",
        within=60,
        what="WaitingForDependency",
    )
    assert obj["status"]["phase"] == "Pending"
    assert not obj["status"].get("attempts")
    op.apply("not-there-yet", cpu_spec(["true"]))
    assert op.wait_phase("orphan", "Succeeded", "Failed", within=120)["status"]["phase"] == (
        "Succeeded"
    )


def _until_gone(op: Operator, name: str, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if op.get(name) is None:
            return
        time.sleep(0.5)
    raise AssertionError(f"{name} still there after {within} s: {op.get(name)}")


def test_the_ttl_deletes_a_finished_chain_but_never_an_upstream_still_needed(
    deps_op: Operator,
) -> None:
    """spec.ttlSecondsAfterFinished on the real apiserver (issue 25): the upstream, due at
    once, stays while its dependent runs; both go once the dependent finished, through the
    finalizer (its staging files with them), and the log archive keeps what they wrote."""
    op = deps_op
    if op.testbed.name != "26.05":
        pytest.skip("the TTL is the apiserver's side alone: one Slurm release proves it")
    # The dependent first: the upstream must never be deleted before anyone names it.
    op.apply(
        "ttl-train",
        cpu_spec(
            ["bash", "-c", "sleep 6; echo train-done"],
            dependsOn=[{"name": "ttl-prep"}],
            ttlSecondsAfterFinished=2,
        ),
    )
    op.apply("ttl-prep", cpu_spec(["echo", "prep-done"], ttlSecondsAfterFinished=0))
    op.wait_phase("ttl-prep", "Succeeded", within=60)
    running = op.wait_phase("ttl-train", "Running", "Succeeded", within=60)
    staging = _attempts(running)[-1]["stagingDir"]
    prep = op.get("ttl-prep")
    assert prep is not None, "its TTL passed, but a running SlurmJob depends on it"
    assert not (prep.get("metadata") or {}).get("deletionTimestamp")
    done = op.wait_phase("ttl-train", "Succeeded", "Failed", within=60)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    finished = _condition(done, "Finished")
    assert finished is not None
    assert finished["status"] == "True"
    uids = {"ttl-train": done["metadata"]["uid"], "ttl-prep": prep["metadata"]["uid"]}
    _until_gone(op, "ttl-train", 40)
    _until_gone(op, "ttl-prep", 60)
    assert not Path(staging).exists(), "the finalizer removed the staging files"
    namespace_uid = op.kube.kubectl(
        "get", "namespace", op.namespace, "-o", "jsonpath={.metadata.uid}"
    ).stdout.strip()
    archive = Path(op.env["SLURMJOB_ARCHIVE_ROOT"])
    for name, word in (("ttl-train", "train-done"), ("ttl-prep", "prep-done")):
        entry = archive / op.namespace / uids[name]
        record = json.loads((entry / "record.json").read_text())
        assert (record["name"], record["namespaceUid"]) == (name, namespace_uid)
        assert record["phase"] == "Succeeded"
        assert word in (entry / "attempt-1" / "stdout.log").read_text()
        assert (entry / "attempt-1" / "job.sh").read_text().startswith("#!")
        assert json.loads((entry / "status.json").read_text())["phase"] == "Succeeded"
        assert oct(entry.stat().st_mode & 0o777) == oct(0o700)
