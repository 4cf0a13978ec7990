"""`kubectl slurmjob` end to end (issue 13, part 4): the plugin as a subprocess with a
kubeconfig holding only a ServiceAccount token, the real kube-apiserver's service proxy, the
operator's log endpoint and a job on Slurm 26.05 printing a line a second for ~20 s.

The test bed runs no kubelet, scheduler or controller-manager, and the apiserver proxies a
Service only to an Endpoints address that is a Pod's IP (k8s.io/kubernetes v1.36.3,
pkg/registry/core/service/storage/storage.go `ResourceLocation` / `isValidAddress`), never to
a loopback one (`ValidateEndpointIP`). So the operator runs on the host listening on the
host's non-loopback IPv4, and the test makes what a cluster would: a Pod object whose status
carries that IP, a Service without selector and an Endpoints naming the Pod; the RBAC is the
chart's (reviews for the operator, which runs as the admin here; `get` on `services/proxy` of
that one port for every authenticated user).

* a reader ServiceAccount allowed to `get slurmjobs` in the namespace: `logs -f` prints every
  line in order as the job writes them and ends by itself when the job ends; `get` and
  `describe` show the attempt and the Slurm job id;
* a ServiceAccount without that right is refused by the operator (403, its message), though
  the proxy lets it through;
* a client-certificate user (no token to forward) gets the status tail with a one-line note.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from tests.integration.helpers import cpu_spec
from tests.integration.test_operator_e2e import CRD, Operator, _operator
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

pytestmark = pytest.mark.integration

PLUGIN = Path(sys.executable).parent / "kubectl-slurmjob"
SERVICE = "slurmjob-operator-logs"
LINES = 20


def host_ipv4() -> str:
    """A non-loopback IPv4 address of this host (the apiserver refuses loopback endpoints)."""
    proc = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in proc.stdout.splitlines():
        words = line.split()
        if "inet" in words:
            return words[words.index("inet") + 1].split("/")[0]
    pytest.fail(
        "no non-loopback IPv4 address on this host: the apiserver's service proxy refuses "
        f"loopback endpoints, so the log endpoint cannot be reached ({proc.stderr.strip()})",
        pytrace=False,
    )


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


def token_kubeconfig(kube: KubeTestbed, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig holding nothing but a token the apiserver minted for the ServiceAccount."""
    token = kube.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [
            {"name": sa, "context": {"cluster": "testbed", "user": sa, "namespace": namespace}}
        ],
        "current-context": sa,
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@dataclass
class Bed:
    op: Operator
    ops_namespace: str
    reader: Path
    stranger: Path
    tmp: Path

    @property
    def testbed(self) -> SlurmTestbed:
        """For the leak scan after each test (tests/integration/conftest.py)."""
        return self.op.testbed

    def plugin(self, *args: str) -> list[str]:
        """The plugin's argv; `logs` is told where the test's log Service is."""
        where = ["--operator-namespace", self.ops_namespace, "--operator-service", SERVICE]
        return [str(PLUGIN), *args, *(where if args[0] == "logs" else [])]

    def env(self, kubeconfig: Path) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": str(self.tmp), "KUBECONFIG": str(kubeconfig)}

    def run(
        self, kubeconfig: Path, *args: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.plugin(*args),
            env=self.env(kubeconfig),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _apply(kube: KubeTestbed, *objects: dict[str, object]) -> None:
    kube.apply("\n---\n".join(yaml.safe_dump(o) for o in objects) + "\n")


@pytest.fixture(scope="module")
def bed(
    kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bed]:
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    tmp = tmp_path_factory.mktemp("kubectl-plugin")
    address = host_ipv4()
    port = free_port(address)
    ops = f"sj-ops-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", ops)
    pod = "slurmjob-operator-0"
    try:
        # What the chart and the kubelet would make: the operator's pod with its IP ...
        _apply(
            kube,
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "slurmjob-operator", "namespace": ops},
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "namespace": ops, "labels": {"app": "slurmjob"}},
                "spec": {
                    "serviceAccountName": "slurmjob-operator",
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "operator", "image": "slurmjob-operator:none"}],
                },
            },
        )
        status = {"status": {"podIP": address, "podIPs": [{"ip": address}]}}
        kube.kubectl(
            "patch", "pod", pod, "-n", ops, "--subresource=status", "--type=merge",
            "-p", json.dumps(status),
        )  # fmt: skip
        # ... the log Service (no selector: nothing here would fill its Endpoints) ...
        _apply(
            kube,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": SERVICE, "namespace": ops},
                "spec": {"ports": [{"name": "logs", "port": 8081, "targetPort": port}]},
            },
            {
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": {"name": SERVICE, "namespace": ops},
                "subsets": [
                    {
                        "addresses": [
                            {
                                "ip": address,
                                "targetRef": {"kind": "Pod", "name": pod, "namespace": ops},
                            }
                        ],
                        "ports": [{"name": "logs", "port": port, "protocol": "TCP"}],
                    }
                ],
            },
            # ... and the chart's proxy Role, bound to every authenticated user.
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "logs-proxy", "namespace": ops},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["services/proxy"],
                        "resourceNames": [f"{SERVICE}:logs", f"http:{SERVICE}:logs"],
                        "verbs": ["get"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "logs-proxy", "namespace": ops},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "logs-proxy",
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Group",
                        "name": "system:authenticated",
                    }
                ],
            },
        )
        for op in _operator(
            kube,
            slurm_2605,
            tmp,
            SLURMJOB_LOGS_PORT=str(port),
            SLURMJOB_LOGS_ADDRESS=address,
        ):
            ns = op.namespace
            for sa in ("reader", "stranger"):
                kube.kubectl("create", "serviceaccount", sa, "-n", ns)
            _apply(
                kube,
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "slurmjob-reader", "namespace": ns},
                    "rules": [
                        {
                            "apiGroups": ["slurmjob.io"],
                            "resources": ["slurmjobs"],
                            "verbs": ["get"],
                        }
                    ],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "slurmjob-reader", "namespace": ns},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": "slurmjob-reader",
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": "reader", "namespace": ns},
                        {"kind": "User", "name": "plugin-cert-user"},
                    ],
                },
            )
            yield Bed(
                op,
                ops,
                token_kubeconfig(kube, ns, "reader", tmp / "reader.kubeconfig"),
                token_kubeconfig(kube, ns, "stranger", tmp / "stranger.kubeconfig"),
                tmp,
            )
    finally:
        kube.kubectl("delete", "namespace", ops, "--wait=false", check=False)


def _follow(bed: Bed, name: str) -> tuple[int, list[tuple[float, str]], str]:
    """`logs -f` as the reader: its exit status, each stdout line with when it came, stderr."""
    ns = bed.op.namespace
    proc = subprocess.Popen(
        bed.plugin("logs", name, "-n", ns, "-f"),
        env=bed.env(bed.reader),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None
    assert stderr is not None
    errors: list[str] = []
    drain = threading.Thread(target=lambda: errors.append(stderr.read()), daemon=True)
    drain.start()
    # A follower that never ends would keep the loop below waiting: the job takes ~20 s.
    watchdog = threading.Timer(150, proc.kill)
    watchdog.start()
    try:
        for line in stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
        code = proc.wait(timeout=120)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    drain.join(timeout=10)
    stdout.close()
    stderr.close()
    return code, lines, "".join(errors)


@pytest.mark.slurm2605
def test_logs_follow_prints_every_line_in_order_and_ends_with_the_job(
    kube: KubeTestbed, bed: Bed
) -> None:
    op = bed.op
    script = f'for i in $(seq 1 {LINES}); do echo "line-$i"; sleep 1; done'
    op.apply("ticker", cpu_spec(["bash", "-c", script]))
    op.wait_phase("ticker", "Running", within=90)
    started = time.monotonic()
    code, lines, err = _follow(bed, "ticker")
    assert code == 0, err
    expected = [f"line-{i}" for i in range(1, LINES + 1)]
    ticks = [(when, text) for when, text in lines if text.startswith("line-")]
    assert [text for _, text in ticks] == expected, (lines, err)  # each once, in order
    # Followed, not read once at the end: the lines came over the job's run ...
    first, last = ticks[0][0], ticks[-1][0]
    assert last - first >= LINES / 2, (first - started, last - started)
    # ... through the operator, not the status tail.
    assert "does not answer" not in err
    assert "status keeps" not in err
    obj = op.wait_phase("ticker", "Succeeded", "Failed", "Cancelled", within=30)
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    job_id = str(obj["status"]["attempts"][-1]["jobId"])
    # A second read of the ended job prints it whole at once.
    once = bed.run(bed.reader, "logs", "ticker", "-n", op.namespace)
    assert once.returncode == 0, once.stderr
    assert [t for t in once.stdout.splitlines() if t.startswith("line-")] == expected
    # get and describe, as the same reader (get NAME needs no list).
    table = bed.run(bed.reader, "get", "ticker", "-n", op.namespace)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split()[:6] == ["NAME", "PHASE", "ATTEMPT", "JOBID", "SLUID", "CLUSTER"]
    assert row.split()[:4] == ["ticker", "Succeeded", "1", job_id]
    described = bed.run(bed.reader, "describe", "ticker", "-n", op.namespace)
    assert described.returncode == 0, described.stderr
    assert f"Slurm job:     {job_id}" in described.stdout
    assert "line-20" in described.stdout


@pytest.mark.slurm2605
def test_a_user_without_get_slurmjobs_is_refused_by_the_operator(
    kube: KubeTestbed, bed: Bed
) -> None:
    op = bed.op
    op.apply("private", cpu_spec(["bash", "-c", "echo private-output"]))
    op.wait_phase("private", "Succeeded", "Failed", "Cancelled", within=90)
    # The apiserver refuses the stranger the SlurmJob itself ...
    direct = op.kube.kubectl(
        "get", "slurmjob", "private", "-n", op.namespace, kubeconfig=bed.stranger, check=False
    )
    assert direct.returncode != 0
    assert "Forbidden" in direct.stderr or "forbidden" in direct.stderr
    # ... and the operator its log, though the proxy lets the request through.
    proc = bed.run(bed.stranger, "logs", "private", "-n", op.namespace)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "private-output" not in proc.stdout + proc.stderr
    assert (
        f'may not get slurmjobs.slurmjob.io "private" in namespace "{op.namespace}"' in proc.stderr
    ), proc.stderr
    assert "system:serviceaccount:" in proc.stderr  # the reviewed user, named
    # The reader may.
    ok = bed.run(bed.reader, "logs", "private", "-n", op.namespace)
    assert ok.returncode == 0, ok.stderr
    assert "private-output" in ok.stdout.splitlines()


@pytest.mark.slurm2605
def test_a_client_certificate_user_gets_the_status_tail_with_a_note(
    kube: KubeTestbed, bed: Bed
) -> None:
    op = bed.op
    op.apply("certs", cpu_spec(["bash", "-c", "echo from-the-status"]))
    obj = op.wait_phase("certs", "Succeeded", "Failed", "Cancelled", within=90)
    assert "from-the-status" in obj["status"]["logs"]["stdout"]["tail"]
    user = op.kube.kubeconfig_for("plugin-cert-user")
    proc = bed.run(user, "logs", "certs", "-n", op.namespace)
    assert proc.returncode == 0, proc.stderr
    assert "from-the-status" in proc.stdout.splitlines()
    assert proc.stderr.count("\n") == 1
    assert "no bearer token" in proc.stderr
