"""End to end: `kubectl apply` against a real kube-apiserver, the operator as a separate
process (`slurmjob-operator run`), and a real Slurm underneath.

Slurm 26.05 (v0.0.45, SLUID) carries the full set; Slurm 22.05 (v0.0.38, no SLUID) a smoke
subset proving the name-only path. Each operator watches its own namespace. The tests that need
26.05's nodes to themselves (a node set down, both nodes held, a heterogeneous job over both)
are test_operator_nodes_e2e.py's, an exclusive module; these run in a lane.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration import leaks
from tests.integration.helpers import (
    OPERATOR,
    ask_slurm,
    cpu_spec,
    het_pools,
    slurm_job,
    slurm_jobs_named,
)
from tests.integration.sitefiles import site_env
from tests.k8s.kube import KubeTestbed
from tests.testbed.handles import cancel_own
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.core.jobview import BaseState, SlurmJobView

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds/slurmjob.io_slurmjobs.yaml"


@dataclass
class Operator:
    """One `slurmjob-operator run` process for one namespace and one Slurm cluster."""

    kube: KubeTestbed
    testbed: SlurmTestbed
    namespace: str
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    #: More namespaces the same process watches (a second tenant's).
    also_watched: tuple[str, ...] = ()

    def process_env(self) -> dict[str, str]:
        """The environment of `run`: each test's operator elects itself on a Lease of its own
        (the tests share one apiserver), under a name kept across restarts, as a pod's is."""
        return {
            "SLURMJOB_LEASE_NAME": f"sj-{self.namespace}",
            "SLURMJOB_LEASE_IDENTITY": f"op-{self.namespace}",
            **self.env,
        }

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(OPERATOR), "run", "-n", self.namespace]
            + [arg for ns in self.also_watched for arg in ("-n", ns)],
            env=self.process_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- kubectl helpers ------------------------------------------------------------------

    def apply(self, name: str, spec: dict[str, Any]) -> None:
        manifest = {
            "apiVersion": "slurmjob.io/v1alpha1",
            "kind": "SlurmJob",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }
        self.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))

    def get(self, name: str) -> dict[str, Any] | None:
        proc = self.kube.kubectl(
            "get", "slurmjob", name, "-n", self.namespace, "-o", "json", check=False
        )
        if proc.returncode != 0:
            if "NotFound" in proc.stderr:
                return None
            raise AssertionError(proc.stderr)
        obj: dict[str, Any] = json.loads(proc.stdout)
        return obj

    def wait_for(
        self,
        name: str,
        done: Callable[[dict[str, Any]], bool],
        within: float = 60,
        what: str = "",
    ) -> dict[str, Any]:
        deadline = time.monotonic() + within
        obj: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            obj = self.get(name)
            if obj is not None and done(obj):
                return obj
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.5)
        status = json.dumps((obj or {}).get("status"), indent=1)
        raise AssertionError(
            f"{name}: {what} not reached in {within} s; status {status}\n"
            f"operator log:\n{self.log_tail()}"
        )

    def wait_phase(self, name: str, *phases: str, within: float = 60) -> dict[str, Any]:
        return self.wait_for(
            name,
            lambda o: (o.get("status") or {}).get("phase") in phases,
            within,
            f"phase {'/'.join(phases)}",
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        proc = self.kube.kubectl(
            "get",
            "events",
            "-n",
            self.namespace,
            "--field-selector",
            f"involvedObject.name={name}",
            "-o",
            "json",
        )
        items: list[dict[str, Any]] = json.loads(proc.stdout)["items"]
        return items

    def slurm_jobs_named(self, job_name: str) -> list[SlurmJobView]:
        return slurm_jobs_named(self.env, job_name)

    def slurm_job(self, job_id: int) -> list[SlurmJobView]:
        return slurm_job(self.env, job_id)


#: Both releases, for a module fixture parametrised over them (see `release_testbed`).
RELEASES = [
    pytest.param("26.05", marks=pytest.mark.slurm2605),
    pytest.param("22.05", marks=pytest.mark.slurm2205),
]


def release_testbed(request: pytest.FixtureRequest) -> SlurmTestbed:
    """The cluster of a fixture parametrised over `RELEASES`."""
    testbed: SlurmTestbed = request.getfixturevalue(
        "slurm_2605" if request.param == "26.05" else "slurm_2205"
    )
    return testbed


def _operator(
    kube: KubeTestbed,
    testbed: SlurmTestbed,
    tmp: Path,
    profile: str = "apptainer",
    **overrides: str | None,
) -> Iterator[Operator]:
    namespace = f"e2e-{testbed.name.replace('.', '')}-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        **kube.env(),
        **site_env(testbed, profile, tmp),
        "SLURMJOB_POLL_INTERVAL": "1",
        "SLURMJOB_METRICS_PORT": "0",
        "SLURMJOB_DELETE_TIMEOUT": "30",
    }
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    op = Operator(kube, testbed, namespace, env, tmp / "operator.log")
    op.start()
    try:
        yield op
    finally:
        op.stop()
        print(f"--- operator log ({namespace}) ---\n{op.log_tail(200)}")
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def op_2605(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    yield from _operator(kube, slurm_2605, tmp_path_factory.mktemp("op2605"))


@pytest.fixture(scope="module")
def op_2205(
    kube: KubeTestbed, crd: None, slurm_2205: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    yield from _operator(kube, slurm_2205, tmp_path_factory.mktemp("op2205"))


def het_spec(command: list[str], second_series: str = "a100") -> dict[str, Any]:
    """A heterogeneous GPU job for the tests of what the operator does with one (queueing,
    exactly once, node failures): the command once per node (launch shape `nodes`), in the
    base image. Real Ray, which a GPU job runs by default, costs a head, a worker and a
    dashboard per job: it is proven in test_slurm_jobs.py."""
    return {
        "framework": {"kind": "custom", "name": "custom", "runtimeId": "custom-sif"},
        "command": command,
        "pools": het_pools(second_series),
        "launch": {"shape": "nodes"},
        "timeLimit": "10m",
    }


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next(
        (c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), None
    )


def _attempt(obj: dict[str, Any]) -> dict[str, Any]:
    attempt: dict[str, Any] = obj["status"]["attempts"][-1]
    return attempt


# -- Slurm 26.05: the full set ------------------------------------------------------------


@pytest.mark.slurm2605
def test_cpu_job_succeeds_with_its_stdout_tail(op_2605: Operator) -> None:
    op = op_2605
    op.apply("cpu", cpu_spec(["bash", "-c", "echo hello-from-slurm; echo warn >&2"]))
    obj = op.wait_phase("cpu", "Succeeded", "Failed", "Cancelled")
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    assert "hello-from-slurm" in obj["status"]["logs"]["stdout"]["tail"]
    attempt = _attempt(obj)
    assert attempt["confirmed"] is True
    assert attempt["sluid"].startswith("s")
    assert attempt["exitCode"] == 0
    assert obj["status"]["slurmJobId"] == attempt["jobId"]
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    # `kubectl wait` works on the condition, and on Finished whatever the outcome.
    for condition in ("Succeeded", "Finished"):
        op.kube.kubectl(
            "wait",
            f"--for=condition={condition}",
            "--timeout=5s",
            "slurmjob/cpu",
            "-n",
            op.namespace,
        )
    finished = _condition(obj, "Finished")
    assert finished is not None
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")
    # The columns, as the apiserver prints them (a JSONPath filter for Reason, the status
    # fields for Attempt and Duration).
    wide = op.kube.kubectl("get", "slurmjob/cpu", "-n", op.namespace, "-o", "wide").stdout
    header, row = wide.splitlines()[:2]
    names = ["NAME", "PHASE", "REASON", "SLURM JOB", "ATTEMPT", "QUEUE", "AGE", "CLUSTER"]
    names += ["NODES", "STARTED", "DURATION"]
    starts = [header.index(name) for name in names]  # kubectl aligns the cells under them
    cells = {
        name: row[start:end].strip()
        for name, start, end in zip(names, starts, [*starts[1:], None], strict=True)
    }
    assert cells["PHASE"] == "Succeeded"
    assert cells["REASON"] == _condition(obj, "Ready")["reason"]  # type: ignore[index]
    assert cells["SLURM JOB"] == str(attempt["jobId"])
    assert cells["ATTEMPT"] == "1"
    assert cells["DURATION"] == obj["status"]["duration"]
    reasons = [e["reason"] for e in op.events("cpu")]
    assert "Submitted" in reasons
    assert "Succeeded" in reasons


@pytest.mark.slurm2605
def test_secret_env_reaches_the_job_but_never_the_status(op_2605: Operator) -> None:
    op = op_2605
    secret_value = leaks.secret("tok-" + uuid.uuid4().hex)
    op.kube.kubectl(
        "create",
        "secret",
        "generic",
        "hf",
        "-n",
        op.namespace,
        f"--from-literal=token={secret_value}",
    )
    op.apply(
        "secret",
        cpu_spec(
            ["bash", "-c", 'echo "token=$HF_TOKEN len=${#HF_TOKEN}"'],
            env=[
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
            ],
        ),
    )
    obj = op.wait_phase("secret", "Succeeded", "Failed", "Cancelled")
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    tail = obj["status"]["logs"]["stdout"]["tail"]
    assert f"len={len(secret_value)}" in tail  # the job saw the real value...
    assert secret_value not in json.dumps(obj)  # ...which the status never shows
    assert "token=***" in tail
    staging = Path(_attempt(obj)["stagingDir"])
    assert not (staging / "secrets.env").exists()
    assert secret_value not in (staging / "job.sh").read_text()


@pytest.mark.slurm2605
def test_exit_3_fails_with_exit_code_and_stderr_tail(op_2605: Operator) -> None:
    op = op_2605
    op.apply("fails", cpu_spec(["bash", "-c", "echo it-broke >&2; exit 3"]))
    obj = op.wait_phase("fails", "Succeeded", "Failed", "Cancelled")
    assert obj["status"]["phase"] == "Failed"
    assert _attempt(obj)["exitCode"] == 3
    assert "it-broke" in obj["status"]["logs"]["stderr"]["tail"]
    failed = _condition(obj, "Failed")
    assert failed is not None
    assert failed["status"] == "True"
    finished = _condition(obj, "Finished")
    assert finished is not None
    assert (finished["status"], finished["reason"]) == ("True", "Failed")


@pytest.mark.slurm2605
def test_deleting_a_running_job_cancels_it_through_its_sluid(op_2605: Operator) -> None:
    op = op_2605
    op.apply("long", cpu_spec(["sleep", "600"]))
    obj = op.wait_phase("long", "Running")
    attempt = _attempt(obj)
    staging = Path(attempt["stagingDir"])
    assert staging.is_dir()
    op.kube.kubectl("delete", "slurmjob", "long", "-n", op.namespace, "--timeout=60s", timeout=70)
    assert op.get("long") is None
    [job] = op.slurm_job(attempt["jobId"])
    assert job.base_state is BaseState.CANCELLED
    messages = [e["message"] for e in op.events("long") if e["reason"] == "Cancelled"]
    assert any(attempt["sluid"] in m for m in messages), messages
    assert not staging.parent.exists(), "the staging directory is removed on deletion"


@pytest.mark.slurm2605
def test_a_status_claiming_another_resources_job_neither_folds_nor_cancels_it(
    op_2605: Operator,
) -> None:
    op = op_2605
    op.apply("victim", cpu_spec(["sleep", "600"]))
    op.apply("claimer", cpu_spec(["sleep", "600"]))
    victim = _attempt(op.wait_phase("victim", "Running", within=120))
    own = _attempt(op.wait_phase("claimer", "Running", within=120))
    try:
        # Someone with status write access points the claimer at the victim's job.
        patch = [
            {"op": "replace", "path": "/status/attempts/0/jobId", "value": victim["jobId"]},
            {"op": "replace", "path": "/status/attempts/0/sluid", "value": victim["sluid"]},
        ]
        op.kube.kubectl(
            "patch", "slurmjob", "claimer", "-n", op.namespace, "--subresource=status",
            "--type=json", "-p", json.dumps(patch),
        )  # fmt: skip
        op.wait_for(
            "claimer",
            lambda o: _attempt(o)["jobId"] == victim["jobId"],
            within=10,
            what="the patched jobId",
        )
        op.kube.kubectl(
            "delete", "slurmjob", "claimer", "-n", op.namespace, "--timeout=60s", timeout=70
        )
        assert op.get("claimer") is None
        [job] = op.slurm_job(victim["jobId"])
        assert job.base_state is BaseState.RUNNING, "the victim's job is not cancelled"
        victim_obj = op.get("victim")
        assert victim_obj is not None
        assert victim_obj["status"]["phase"] == "Running"
        # The deletion looked for the claimer's own jobs by name, whatever id its status
        # claims (issue 42): its own job is cancelled, the victim's is never looked at.
        [mine] = op.slurm_job(own["jobId"])
        assert mine.base_state is BaseState.CANCELLED
        messages = [e["message"] for e in op.events("claimer")]
        assert not any("victim" in m for m in messages), "the other job's name is not shown"
    finally:
        ask_slurm(op.env, lambda client: cancel_own(client, own["jobId"]))
        op.kube.kubectl(
            "delete", "slurmjob", "victim", "-n", op.namespace, "--timeout=60s", timeout=70
        )


@pytest.mark.slurm2605
def test_deleting_a_finished_job_leaves_no_staging_directory(op_2605: Operator) -> None:
    op = op_2605
    op.apply("short", cpu_spec(["true"]))
    obj = op.wait_phase("short", "Succeeded")
    staging = Path(_attempt(obj)["stagingDir"])
    assert staging.is_dir()
    op.kube.kubectl("delete", "slurmjob", "short", "-n", op.namespace, "--timeout=60s", timeout=70)
    assert op.get("short") is None
    assert not staging.parent.exists()


@pytest.mark.slurm2605
def test_invalid_manifests_reach_nothing_in_slurm(op_2605: Operator) -> None:
    op = op_2605
    # Refused by the CRD itself (CEL): the apiserver answers with the rule's message.
    bad = cpu_spec(["true"])
    bad["framework"]["image"] = "nvcr.io/nvidia/pytorch:24.01"
    manifest = {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": {"name": "with-image", "namespace": op.namespace},
        "spec": bad,
    }
    proc = op.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert proc.returncode != 0
    assert "image" in proc.stderr
    # Accepted by the schema, refused against the site: the series has no constraint.
    op.apply("no-constraint", het_spec(["true"], second_series="l40s"))
    obj = op.wait_for(
        "no-constraint",
        lambda o: (_condition(o, "Ready") or {}).get("reason") == "InvalidSpec",
        what="Ready=False InvalidSpec",
    )
    ready = _condition(obj, "Ready")
    assert ready is not None
    assert ready["status"] == "False"
    assert "spec.pools[1].gpuSeries" in ready["message"]
    # Decided again when the SlurmJob is edited (a label; of the spec only suspend and the TTL
    # can change): not Finished, so `kubectl wait` keeps waiting.
    finished = _condition(obj, "Finished")
    assert finished is not None
    assert (finished["status"], finished["reason"]) == ("False", "InvalidSpec")
    assert obj["status"].get("attempts", []) == []
    uid8 = obj["metadata"]["uid"][:8]
    assert op.slurm_jobs_named(f"sj-{op.namespace}-no-constraint-{uid8}-a1") == []
    assert "InvalidSpec" in [e["reason"] for e in op.events("no-constraint")]


@pytest.mark.slurm2605
def test_operator_killed_and_restarted_submits_nothing_twice(op_2605: Operator) -> None:
    op = op_2605
    names = [f"restart-{i}" for i in range(3)]
    for name in names:
        op.apply(name, cpu_spec(["bash", "-c", "sleep 4; echo done"]))
    time.sleep(1.0)  # some are mid-submit, some queued
    op.kill()
    op.start()
    for name in names:
        obj = op.wait_phase(name, "Succeeded", "Failed", "Cancelled", within=90)
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        attempts = obj["status"]["attempts"]
        assert len(attempts) == 1
        jobs = op.slurm_jobs_named(attempts[0]["jobName"])
        leaders = {j.het_job_id or j.job_id for j in jobs}
        assert leaders == {attempts[0]["jobId"]}, jobs


@pytest.mark.slurm2605
def test_log_pattern_failure_is_retried_up_to_the_limit(op_2605: Operator) -> None:
    op = op_2605
    op.apply(
        "nccl",
        cpu_spec(
            [
                "bash",
                "-c",
                "echo 'NCCL WARN Watchdog caught collective operation timeout' >&2; exit 1",
            ],
            retry={"limit": 2, "backoffSeconds": 0},
        ),
    )
    obj = op.wait_for(
        "nccl",
        lambda o: (
            (o.get("status") or {}).get("phase") == "Failed"
            and len(o["status"].get("attempts", [])) == 3
        ),
        within=90,
        what="Failed after 3 attempts",
    )
    attempts = obj["status"]["attempts"]
    assert [a["retryAction"] for a in attempts] == ["Retry", "Retry", "Fail"]
    assert [a.get("retryOf") for a in attempts] == [None, 1, 2]
    assert len({a["jobName"] for a in attempts}) == 3
    assert len({a["stagingDir"] for a in attempts}) == 3
    assert len({a["jobId"] for a in attempts}) == 3
    assert "RetryScheduled" in [e["reason"] for e in op.events("nccl")]


@pytest.mark.slurm2605
def test_plain_exit_1_fails_at_once(op_2605: Operator) -> None:
    op = op_2605
    op.apply("plain", cpu_spec(["bash", "-c", "exit 1"], retry={"limit": 3, "backoffSeconds": 0}))
    obj = op.wait_phase("plain", "Failed", "Succeeded")
    assert obj["status"]["phase"] == "Failed"
    time.sleep(2)  # nothing else comes
    obj = op.get("plain") or {}
    assert [a["retryAction"] for a in obj["status"]["attempts"]] == ["Fail"]


@pytest.mark.slurm2605
def test_refused_token_is_reported_and_a_rotated_file_recovers_without_restart(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path: Path
) -> None:
    token_file = tmp_path / "slurm-jwt"
    token_file.write_text("SLURM_JWT=not.a.valid-token\n")
    ops = _operator(
        kube,
        slurm_2605,
        tmp_path,
        SLURMJOB_SLURM_JWT_KEY_FILE=None,
        SLURMJOB_SLURM_JWT_FILE=str(token_file),
    )
    op = next(ops)
    try:
        op.apply("auth", cpu_spec(["bash", "-c", "echo authenticated"]))
        obj = op.wait_for(
            "auth",
            lambda o: (_condition(o, "Ready") or {}).get("reason") == "SlurmAuthFailed",
            what="Ready=False SlurmAuthFailed",
        )
        assert obj["status"]["phase"] == "Pending"
        assert obj["status"].get("attempts", []) == []
        assert "SlurmAuthFailed" in [e["reason"] for e in op.events("auth")]
        # Rotate the token file: the operator re-reads it, no restart.
        token_file.write_text(f"SLURM_JWT={slurm_2605.token(600)}\n")
        obj = op.wait_phase("auth", "Succeeded", "Failed", within=90)
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        assert op.proc is not None
        assert op.proc.poll() is None  # the same process throughout
    finally:
        with contextlib.suppress(StopIteration):
            next(ops)


# -- Slurm 22.05: the name-only path ------------------------------------------------------


@pytest.mark.slurm2205
def test_2205_cpu_job_succeeds_without_sluid(op_2205: Operator) -> None:
    op = op_2205
    op.apply("cpu", cpu_spec(["bash", "-c", "echo hello-2205"]))
    obj = op.wait_phase("cpu", "Succeeded", "Failed", "Cancelled")
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    assert "hello-2205" in obj["status"]["logs"]["stdout"]["tail"]
    assert "sluid" not in _attempt(obj)


@pytest.mark.slurm2205
def test_2205_delete_running_job_cancels_it(op_2205: Operator) -> None:
    op = op_2205
    op.apply("long", cpu_spec(["sleep", "600"]))
    obj = op.wait_phase("long", "Running")
    job_id = _attempt(obj)["jobId"]
    op.kube.kubectl("delete", "slurmjob", "long", "-n", op.namespace, "--timeout=60s", timeout=70)
    [job] = op.slurm_job(job_id)
    assert job.base_state is BaseState.CANCELLED
