"""Two `slurmjob-operator run` processes on one Lease, against the real kube-apiserver and
Slurm 26.05: only the holder acts; killed at random points of a burst it is replaced within
the lease duration with nothing lost and nothing submitted twice; cut off from the apiserver
it stops before the standby may take over."""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.faults.tcpgate import TcpGate
from tests.integration.helpers import cpu_spec
from tests.integration.sitefiles import site_env
from tests.integration.test_operator_e2e import CRD, Operator
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

# Short, so a takeover fits in a test: the same rules as the defaults (15 / 10 / 2).
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 6.0, 3.0, 0.5


@dataclass
class Pair:
    kube: KubeTestbed
    testbed: SlurmTestbed
    namespace: str
    lease: str
    env: dict[str, str]
    tmp: Path
    replicas: dict[str, Operator] = field(default_factory=dict)
    started: int = 0

    def start(self, env: dict[str, str] | None = None) -> Operator:
        """A new replica (a new pod: a new identity)."""
        self.started += 1
        identity = f"replica-{self.started}"
        op = Operator(
            self.kube,
            self.testbed,
            self.namespace,
            {**self.env, **(env or {}), "SLURMJOB_LEASE_IDENTITY": identity},
            self.tmp / f"{identity}.log",
        )
        op.start()
        self.replicas[identity] = op
        return op

    def holder(self) -> str | None:
        proc = self.kube.kubectl(
            "get", "lease", self.lease, "-n", self.namespace,
            "-o", "jsonpath={.spec.holderIdentity}", check=False,
        )  # fmt: skip
        return (proc.stdout.strip() or None) if proc.returncode == 0 else None

    def wait_holder(self, within: float, not_: str | None = None) -> tuple[str, float]:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            holder = self.holder()
            if holder is not None and holder != not_ and holder in self.live():
                return holder, time.monotonic()
            time.sleep(0.1)
        raise AssertionError(f"no new holder within {within} s; logs:\n{self.logs()}")

    def live(self) -> dict[str, Operator]:
        return {k: op for k, op in self.replicas.items() if op.proc and op.proc.poll() is None}

    def logs(self) -> str:
        return "\n".join(f"--- {k}\n{op.log_tail(30)}" for k, op in self.replicas.items())

    def apply(self, name: str, spec: dict[str, Any]) -> None:
        self.any().apply(name, spec)  # kubectl only: any replica's helper, alive or not

    def any(self) -> Operator:
        return next(iter(self.replicas.values()))


@pytest.fixture
def pair(kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path: Path) -> Iterator[Pair]:
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    namespace = f"ha-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    lease = f"sj-{namespace}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        **kube.env(),
        **site_env(slurm_2605, "apptainer", tmp_path),
        "SLURMJOB_POLL_INTERVAL": "1",
        "SLURMJOB_METRICS_PORT": "0",
        "SLURMJOB_DELETE_TIMEOUT": "30",
        "SLURMJOB_LEASE_NAME": lease,
        "SLURMJOB_LEASE_NAMESPACE": namespace,
        "SLURMJOB_LEASE_DURATION": str(LEASE_DURATION),
        "SLURMJOB_LEASE_RENEW_DEADLINE": str(RENEW_DEADLINE),
        "SLURMJOB_LEASE_RETRY_PERIOD": str(RETRY_PERIOD),
    }
    p = Pair(kube, slurm_2605, namespace, lease, env, tmp_path)
    try:
        yield p
    finally:
        for op in p.replicas.values():
            op.stop()
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def phases(p: Pair) -> dict[str, str | None]:
    items = yaml.safe_load(
        p.kube.kubectl("get", "slurmjobs", "-n", p.namespace, "-o", "yaml").stdout
    )["items"]
    return {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in items}


def test_the_standby_acts_only_after_a_takeover_and_nothing_is_lost_or_doubled(
    pair: Pair,
) -> None:
    p = pair
    first = p.start()
    leader, _ = p.wait_holder(30)
    assert leader == "replica-1"
    standby = p.start()
    # The standby says so once it has started (imports take seconds on a busy machine) and
    # read the Lease; the leader keeps it meanwhile.
    deadline = time.monotonic() + 20
    while "standing by" not in standby.log_tail() and time.monotonic() < deadline:
        time.sleep(RETRY_PERIOD)
    assert "standing by" in standby.log_tail()
    assert p.holder() == "replica-1"
    assert "slurmjob-operator started" not in standby.log_tail(200), "a standby runs no kopf"
    names = [f"burst-{i}" for i in range(24)]
    rng = random.Random(1105)
    takeovers: list[float] = []
    for i, name in enumerate(names):
        p.apply(name, cpu_spec(["sleep", "1"], timeLimit="5m"))
        if i % 6 == 5:  # four kills during the burst, at a random moment after an apply
            time.sleep(rng.uniform(0.0, 1.5))
            holder = p.holder()
            assert holder is not None
            p.replicas[holder].kill()
            killed_at = time.monotonic()
            p.start()  # the killed pod comes back as a new standby
            _, taken_at = p.wait_holder(LEASE_DURATION + 10, not_=holder)
            takeovers.append(taken_at - killed_at)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        current = phases(p)
        if all(current.get(n) in ("Succeeded", "Failed", "Cancelled") for n in names):
            break
        time.sleep(1)
    current = phases(p)
    assert all(current.get(n) == "Succeeded" for n in names), (current, p.logs())
    for name in names:
        obj = p.any().get(name)
        assert obj is not None
        attempts = obj["status"]["attempts"]
        assert len(attempts) == 1, (name, attempts)
        assert len(p.any().slurm_jobs_named(attempts[0]["jobName"])) == 1, name
    assert len(takeovers) == 4
    # Killed (no renewal from then on): taken over once the lease ran out, never before.
    assert all(t <= LEASE_DURATION + 3 for t in takeovers), takeovers
    del first


def test_a_leader_cut_off_from_the_apiserver_stops_before_the_standby_takes_over(
    pair: Pair, kube: KubeTestbed
) -> None:
    p = pair
    host, port = kube.server.removeprefix("https://").rsplit(":", 1)
    gate = TcpGate(host, int(port)).start()
    try:
        config = yaml.safe_load(kube.kubeconfig.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://{host}:{gate.port}"
        gated = p.tmp / "gated.kubeconfig"
        gated.write_text(yaml.safe_dump(config))
        gated.chmod(0o600)
        leader = p.start({"KUBECONFIG": str(gated)})
        assert p.wait_holder(30)[0] == "replica-1"
        p.start()
        p.apply("before-cut", cpu_spec(["sleep", "1"], timeLimit="5m"))
        leader.wait_phase("before-cut", "Succeeded", within=90)
        gate.cut()
        cut_at = time.monotonic()
        exited_at = None
        taken_at = None
        while taken_at is None and time.monotonic() < cut_at + LEASE_DURATION + 15:
            if exited_at is None and leader.proc is not None and leader.proc.poll() is not None:
                exited_at = time.monotonic()
            holder = p.holder()
            if holder == "replica-2":
                taken_at = time.monotonic()
            time.sleep(0.05)
        assert exited_at is not None, f"the cut-off leader did not stop:\n{leader.log_tail()}"
        assert taken_at is not None, p.logs()
        assert leader.proc is not None
        assert leader.proc.returncode == 3, "exit status of a lost leadership"
        assert exited_at < taken_at, (exited_at - cut_at, taken_at - cut_at)
        assert exited_at - cut_at <= RENEW_DEADLINE + (LEASE_DURATION - RENEW_DEADLINE) / 2 + 1
        # The new leader goes on: a job applied now runs.
        p.apply("after-cut", cpu_spec(["sleep", "1"], timeLimit="5m"))
        p.replicas["replica-2"].wait_phase("after-cut", "Succeeded", within=90)
    finally:
        gate.stop()
