"""`kubectl slurmjob` end to end (issue 13, part 4; issue 21, section 3): the plugin as a
subprocess with a user's own kubeconfig, the real kube-apiserver as an aggregator, the
operator serving its log API and a job on Slurm 26.05 printing a line a second for ~20 s.

The apiserver reaches the operator as a cluster's would reach a pod: the APIService
`v1alpha1.logs.slurmjob.io` points at a selector-less Service whose EndpointSlice holds an
address of a network namespace, where a relay takes each connection on to the operator on
127.0.0.1 (`tests/k8s/netns.py`, `tests/k8s/logsapi.py`); nothing connects to this host's own
non-loopback address. The operator makes its serving certificate in a Secret of its
namespace and patches the APIService's caBundle; it runs as the admin here.

* a reader ServiceAccount allowed `get` on `slurmjobs` and `slurmjobs/log`: `logs -f` prints
  every line in order as the job writes them, through the aggregated API, and ends by itself
  when the job ends; `get` and `describe` show the attempt and the Slurm job id;
* a ServiceAccount allowed `get slurmjobs` but not the log is refused (403), and never given
  the status tail instead; the operator refuses it too when asked as the front proxy;
* a client-certificate user allowed the log reads it (the apiserver passes its identity on);
* the operator takes the X-Remote-* headers from the front proxy's certificate only;
* without the APIService, the plugin prints the status tail with a one-line note.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.helpers import cpu_spec
from tests.integration.test_operator_e2e import CRD, Operator, _operator
from tests.k8s import kube as kubebed
from tests.k8s import netns, pki
from tests.k8s.kube import KubeTestbed
from tests.k8s.logsapi import APISERVICE, LogsBackend, logs_backend
from tests.testbed.slurm import SlurmTestbed

pytestmark = pytest.mark.integration

PLUGIN = Path(sys.executable).parent / "kubectl-slurmjob"
SERVICE = "slurmjob-operator-logs"
CERT_SECRET = "slurmjob-operator-logs-cert"
CERT_USER = "plugin-cert-user"
LINES = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
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
    backend: LogsBackend
    port: int
    reader: Path
    stranger: Path
    tmp: Path

    @property
    def testbed(self) -> SlurmTestbed:
        """For the leak scan after each test (tests/integration/conftest.py)."""
        return self.op.testbed

    def env(self, kubeconfig: Path) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": str(self.tmp), "KUBECONFIG": str(kubeconfig)}

    def run(
        self, kubeconfig: Path, *args: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(PLUGIN), *args],
            env=self.env(kubeconfig),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _apply(kube: KubeTestbed, *objects: dict[str, object]) -> None:
    kube.apply("\n---\n".join(yaml.safe_dump(o) for o in objects) + "\n")


def _role(namespace: str, subjects: list[dict[str, str]]) -> list[dict[str, Any]]:
    """`get` on SlurmJobs and their log (the API group the aggregated API serves)."""
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "slurmjob-log-reader", "namespace": namespace},
            "rules": [
                {"apiGroups": ["slurmjob.io"], "resources": ["slurmjobs"], "verbs": ["get"]},
                {
                    "apiGroups": ["logs.slurmjob.io"],
                    "resources": ["slurmjobs/log"],
                    "verbs": ["get"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "slurmjob-log-reader", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "slurmjob-log-reader",
            },
            "subjects": subjects,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "slurmjob-getter", "namespace": namespace},
            "rules": [{"apiGroups": ["slurmjob.io"], "resources": ["slurmjobs"], "verbs": ["get"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "slurmjob-getter", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "slurmjob-getter",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "stranger", "namespace": namespace}],
        },
    ]


@pytest.fixture(scope="module")
def bed(
    kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bed]:
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    tmp = tmp_path_factory.mktemp("kubectl-plugin")
    port = free_port()
    ops = f"sj-ops-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", ops)
    try:
        with logs_backend(kube, ops, SERVICE, port) as backend:
            for op in _operator(
                kube,
                slurm_2605,
                tmp,
                SLURMJOB_LOGS_PORT=str(port),
                SLURMJOB_LOGS_ADDRESS="127.0.0.1",
                SLURMJOB_POD_NAMESPACE=ops,
                SLURMJOB_LOGS_SERVICE=SERVICE,
                SLURMJOB_LOGS_CERT_SECRET=CERT_SECRET,
                SLURMJOB_LOGS_APISERVICE=APISERVICE,
            ):
                ns = op.namespace
                for sa in ("reader", "stranger"):
                    kube.kubectl("create", "serviceaccount", sa, "-n", ns)
                readers = [
                    {"kind": "ServiceAccount", "name": "reader", "namespace": ns},
                    {"kind": "User", "name": CERT_USER, "apiGroup": "rbac.authorization.k8s.io"},
                ]
                _apply(kube, *_role(ns, readers))
                backend.wait_available(timeout=90)
                yield Bed(
                    op,
                    backend,
                    port,
                    token_kubeconfig(kube, ns, "reader", tmp / "reader.kubeconfig"),
                    token_kubeconfig(kube, ns, "stranger", tmp / "stranger.kubeconfig"),
                    tmp,
                )
                # The operator's teardown: the APIService goes first (logs_backend), so no
                # client's discovery meets an unavailable group.
                backend.remove_apiservice()
    finally:
        kube.kubectl("delete", "namespace", ops, "--wait=false", check=False)


def _follow(bed: Bed, kubeconfig: Path, name: str) -> tuple[int, list[tuple[float, str]], str]:
    """`logs -f`: its exit status, each stdout line with when it came, stderr."""
    ns = bed.op.namespace
    proc = subprocess.Popen(
        [str(PLUGIN), "logs", name, "-n", ns, "-f"],
        env=bed.env(kubeconfig),
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
def test_logs_follow_through_the_aggregated_api_prints_every_line_and_ends_with_the_job(
    kube: KubeTestbed, bed: Bed
) -> None:
    op = bed.op
    script = f'for i in $(seq 1 {LINES}); do echo "line-$i"; sleep 1; done'
    op.apply("ticker", cpu_spec(["bash", "-c", script]))
    op.wait_phase("ticker", "Running", within=90)
    relayed = bed.backend.relay.stats.bytes_out
    started = time.monotonic()
    code, lines, err = _follow(bed, bed.reader, "ticker")
    assert code == 0, err
    expected = [f"line-{i}" for i in range(1, LINES + 1)]
    ticks = [(when, text) for when, text in lines if text.startswith("line-")]
    assert [text for _, text in ticks] == expected, (lines, err)  # each once, in order
    # Followed, not read once at the end: the lines came over the job's run ...
    first, last = ticks[0][0], ticks[-1][0]
    assert last - first >= LINES / 2, (first - started, last - started)
    # ... from the operator, not the status tail, and no note at all ...
    assert err == ""
    # ... through the apiserver to the namespace's address (the relay's only way in). The
    # apiserver may reuse a kept-alive connection, so count the bytes it carried, not accepts.
    stats = bed.backend.relay.stats
    assert stats.bytes_out - relayed >= sum(len(text) + 1 for text in expected)
    assert stats.peers == {netns.HOST_ADDRESS}
    obj = op.wait_phase("ticker", "Succeeded", "Failed", "Cancelled", within=30)
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    job_id = str(obj["status"]["attempts"][-1]["jobId"])
    # A second read of the ended job prints it whole at once.
    once = bed.run(bed.reader, "logs", "ticker", "-n", op.namespace)
    assert once.returncode == 0, once.stderr
    assert [t for t in once.stdout.splitlines() if t.startswith("line-")] == expected
    # kubectl's own raw GET gets the same answer: the plugin asks what `get --raw` asks.
    path = f"/apis/logs.slurmjob.io/v1alpha1/namespaces/{op.namespace}/slurmjobs/ticker/log"
    raw = kube.kubectl("get", "--raw", path, kubeconfig=bed.reader)
    assert json.loads(raw.stdout)["text"].splitlines() == expected
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
def test_a_user_without_the_log_right_is_refused_and_given_no_tail(
    kube: KubeTestbed, bed: Bed
) -> None:
    op = bed.op
    op.apply("private", cpu_spec(["bash", "-c", "echo private-output"]))
    obj = op.wait_phase("private", "Succeeded", "Failed", "Cancelled", within=90)
    assert "private-output" in obj["status"]["logs"]["stdout"]["tail"]
    # The stranger may get the SlurmJob (and so read the status tail) ...
    direct = kube.kubectl(
        "get", "slurmjob", "private", "-n", op.namespace, kubeconfig=bed.stranger, check=False
    )
    assert direct.returncode == 0, direct.stderr
    # ... but not its log: refused, with the reason, and no fallback to the tail.
    proc = bed.run(bed.stranger, "logs", "private", "-n", op.namespace)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "private-output" not in proc.stdout + proc.stderr
    assert "HTTP 403" in proc.stderr, proc.stderr
    assert f"system:serviceaccount:{op.namespace}:stranger" in proc.stderr  # the user, named
    assert '"slurmjobs/log"' in proc.stderr
    assert "status keeps" not in proc.stderr
    # The reader may.
    ok = bed.run(bed.reader, "logs", "private", "-n", op.namespace)
    assert ok.returncode == 0, ok.stderr
    assert "private-output" in ok.stdout.splitlines()


@pytest.mark.slurm2605
def test_a_client_certificate_user_reads_the_log_through_the_aggregated_api(
    kube: KubeTestbed, bed: Bed
) -> None:
    op = bed.op
    op.apply("certs", cpu_spec(["bash", "-c", "echo from-the-operator"]))
    op.wait_phase("certs", "Succeeded", "Failed", "Cancelled", within=90)
    user = kube.kubeconfig_for(CERT_USER)
    proc = bed.run(user, "logs", "certs", "-n", op.namespace)
    assert proc.returncode == 0, proc.stderr
    assert "from-the-operator" in proc.stdout.splitlines()
    assert proc.stderr == ""  # the operator's answer, no note of a fallback


def _ask_operator(
    bed: Bed, name: str, cert: tuple[Path, Path] | None, headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    """A GET of the log straight to the operator on 127.0.0.1, as the aggregator would
    make it (with ``cert``) or as anyone else could."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the operator's certificate is not what is tested here
    if cert is not None:
        ctx.load_cert_chain(*map(str, cert))
    conn = http.client.HTTPSConnection("127.0.0.1", bed.port, context=ctx, timeout=10)
    try:
        path = f"/apis/logs.slurmjob.io/v1alpha1/namespaces/{bed.op.namespace}/slurmjobs/{name}/log"
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
    except (ssl.SSLError, ConnectionError) as exc:
        return 0, {"error": str(exc)}
    finally:
        conn.close()
    try:
        return response.status, json.loads(body)
    except ValueError:
        return response.status, {"raw": body.decode(errors="replace")}


@pytest.mark.slurm2605
def test_the_operator_takes_the_users_name_from_the_front_proxy_only(
    kube: KubeTestbed, bed: Bed
) -> None:
    op = bed.op
    op.apply("proxied", cpu_spec(["bash", "-c", "echo proxied-output"]))
    op.wait_phase("proxied", "Succeeded", "Failed", "Cancelled", within=90)
    front = kubebed.PKI
    front_proxy = (front.crt(pki.FRONT_PROXY_CLIENT), front.key(pki.FRONT_PROXY_CLIENT))
    reader = {"X-Remote-User": f"system:serviceaccount:{op.namespace}:reader"}
    stranger = {"X-Remote-User": f"system:serviceaccount:{op.namespace}:stranger"}
    # As the front proxy, for the reader: the log.
    status, body = _ask_operator(bed, "proxied", front_proxy, reader)
    assert status == 200, body
    assert "proxied-output" in body["text"]
    # As the front proxy, for the stranger: the operator's own review refuses.
    status, body = _ask_operator(bed, "proxied", front_proxy, stranger)
    assert (status, body.get("kind"), body.get("code")) == (403, "SlurmJobLogError", 403), body
    # The headers from anyone else count for nothing: no client certificate, or a user's
    # (signed by the cluster's client CA, not the front proxy's).
    user_kubeconfig = yaml.safe_load(kube.kubeconfig_for(CERT_USER).read_text())
    assert user_kubeconfig["users"][0]["name"] == CERT_USER
    user_cert = (front.crt(f"user-{CERT_USER}"), front.key(f"user-{CERT_USER}"))
    for cert in (None, user_cert):
        status, body = _ask_operator(bed, "proxied", cert, reader)
        assert status in (0, 401), (cert, status, body)
        assert "proxied-output" not in json.dumps(body)


@pytest.mark.slurm2605
def test_without_the_apiservice_the_plugin_prints_the_status_tail_with_a_note(
    kube: KubeTestbed, bed: Bed
) -> None:
    """Last in this module: it deletes the APIService."""
    op = bed.op
    op.apply("absent", cpu_spec(["bash", "-c", "echo from-the-status"]))
    obj = op.wait_phase("absent", "Succeeded", "Failed", "Cancelled", within=90)
    assert "from-the-status" in obj["status"]["logs"]["stdout"]["tail"]
    bed.backend.remove_apiservice()
    deadline = time.monotonic() + 30
    while True:  # the aggregator drops the group once its informer has seen the deletion
        proc = bed.run(bed.reader, "logs", "absent", "-n", op.namespace)
        if "no log API here" in proc.stderr or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert proc.returncode == 0, proc.stderr
    assert "from-the-status" in proc.stdout.splitlines()
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "no log API here" in proc.stderr
    assert "status keeps" in proc.stderr
    assert APISERVICE not in kube.kubectl("get", "apiservices", "-o", "name").stdout
