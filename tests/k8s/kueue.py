"""Kueue's manager (built from Go modules by tests/k8s/build.sh) against the test bed's
kube-apiserver, for the Kueue integration tests.

Kueue runs **without its webhooks registered**: the test bed has no pods, services or network
path for the apiserver to call a webhook through a Service, and nothing here needs Kueue's
defaulting or validation of the objects the tests and the operator write (they are written
complete). Its webhook server still starts (controller-runtime always serves it), on
127.0.0.1 with a self-signed certificate; no ValidatingWebhookConfiguration or
MutatingWebhookConfiguration names it, so the apiserver never calls it. With
`internalCertManagement` off, Kueue reads its metrics certificate from the fixed path
/etc/kueue/metrics/certs: the same self-signed pair is written there. The visibility API
server (an aggregated API) is turned off (`VisibilityOnDemand=false`).

The CRDs are the module's own `config/components/crd/bases` (copied next to the binary by
build.sh), applied server-side without the conversion-webhook patches: v1beta2, the storage
version, is what the operator and the tests use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.k8s.kube import (
    BASE,
    CACHE_DIR,
    SYSTEM_PATH,
    KubeTestbed,
    TestbedError,
    _require_version,
    keep_requested,
)
from tests.testbed import procs

KUEUE_DIR = BASE / "kueue"
CERTS = KUEUE_DIR / "certs"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")  # fixed in Kueue's main.go
PID_FILE = BASE / "run" / "kueue.pid"
#: The kube-apiserver pid the running Kueue was started against.
SERVED_BY = KUEUE_DIR / "apiserver.pid"
RUN_DIR = BASE / "run"
LOG_FILE = BASE / "log" / "kueue.log"
HOST = "127.0.0.1"
HEALTH_PORT = 28081
METRICS_PORT = 28443
WEBHOOK_PORT = 29443
NAMESPACE = "kueue-system"

_CHILD: list[subprocess.Popen[bytes]] = []

CONFIG = f"""\
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: {NAMESPACE}
health:
  healthProbeBindAddress: {HOST}:{HEALTH_PORT}
metrics:
  bindAddress: {HOST}:{METRICS_PORT}
webhook:
  host: {HOST}
  port: {WEBHOOK_PORT}
  certDir: {CERTS}
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
integrations:
  frameworks: []
"""


@dataclasses.dataclass(frozen=True)
class Kueue:
    version: str
    log: Path


def version() -> str:
    return _require_version("kueue", "sigs.k8s.io/kueue")


def _paths() -> tuple[Path, Path]:
    v = version()
    binary = CACHE_DIR / f"kueue-{v}" / "kueue"
    crds = CACHE_DIR / f"kueue-{v}" / "crds"
    if not os.access(binary, os.X_OK) or not (crds / "kueue.x-k8s.io_workloads.yaml").is_file():
        raise TestbedError(f"Kueue {v} is not built: run `bash tests/k8s/build.sh` first")
    return binary, crds


def _log(msg: str) -> None:
    procs.log("kueue-testbed", msg)


def _healthy() -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{HEALTH_PORT}/readyz", timeout=2) as answer:
            return answer.status == 200, f"readyz {answer.status}"
    except (urllib.error.URLError, OSError) as exc:
        return False, str(exc)


def _certificates() -> None:
    CERTS.mkdir(parents=True, exist_ok=True)
    crt, key = CERTS / "tls.crt", CERTS / "tls.key"
    if not (crt.is_file() and key.is_file()):
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                "-keyout", str(key), "-out", str(crt), "-days", "3650",
                "-subj", "/CN=kueue-testbed", "-addext", f"subjectAltName=IP:{HOST}",
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
    key.chmod(0o600)
    METRICS_CERTS.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        shutil.copyfile(CERTS / name, METRICS_CERTS / name)
    (METRICS_CERTS / "tls.key").chmod(0o600)


def start_kueue(kube: KubeTestbed, reuse: bool | None = None) -> Kueue:
    """Install Kueue's CRDs and start its manager (or re-use a healthy one)."""
    binary, crds = _paths()
    if procs.shared_requested():
        procs.attach("Kueue", lambda: _healthy()[0], error=TestbedError)
        return Kueue(version(), LOG_FILE)
    for crd in sorted(crds.glob("*.yaml")):
        kube.apply(crd)
    kube.wait_established("workloads.kueue.x-k8s.io")
    kube.kubectl("create", "namespace", NAMESPACE, check=False)
    reuse = keep_requested() if reuse is None else reuse
    apiserver = (
        (RUN_DIR / "kube-apiserver.pid").read_text().strip()
        if (RUN_DIR / "kube-apiserver.pid").is_file()
        else ""
    )
    same_apiserver = SERVED_BY.is_file() and SERVED_BY.read_text().strip() == apiserver
    if reuse and same_apiserver and procs.running("kueue", PID_FILE) and _healthy()[0]:
        _log("re-using running Kueue")
        return Kueue(version(), LOG_FILE)
    # A Kueue of an earlier kube-apiserver (a restart wiped its etcd) is not re-used: its
    # caches describe objects that are gone.
    stop_kueue()
    _stop_strays(binary)
    _certificates()
    KUEUE_DIR.mkdir(parents=True, exist_ok=True)
    config = KUEUE_DIR / "config.yaml"
    config.write_text(CONFIG)
    LOG_FILE.parent.mkdir(parents=True, exist_ok=True)
    PID_FILE.parent.mkdir(parents=True, exist_ok=True)
    busy = [p for p in (HEALTH_PORT, METRICS_PORT, WEBHOOK_PORT) if not procs.port_free(HOST, p)]
    if busy:
        raise TestbedError(f"ports {busy} are taken: {procs.port_owner(busy[0])}")
    log = LOG_FILE.open("ab")
    proc = subprocess.Popen(
        [
            str(binary),
            f"--config={config}",
            f"--kubeconfig={kube.kubeconfig}",
            "--feature-gates=VisibilityOnDemand=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={"PATH": SYSTEM_PATH, "HOME": str(KUEUE_DIR)},
        start_new_session=True,
    )
    log.close()
    _CHILD.append(proc)
    PID_FILE.write_text(f"{proc.pid}\n")
    SERVED_BY.write_text(f"{apiserver}\n")

    def ready() -> bool:
        if proc.poll() is not None:
            raise TestbedError(f"kueue exited {proc.returncode}\n{procs.tail(LOG_FILE, 40)}")
        return _healthy()[0]

    procs.wait("kueue readyz", ready, 60, [LOG_FILE], error=TestbedError, interval=0.5)
    _log(f"Kueue {version()} started (pid {proc.pid})")
    return Kueue(version(), LOG_FILE)


def _stop_strays(binary: Path) -> None:
    """Kueue processes of this binary whose pid file was lost (a crashed fixture)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
        except OSError:
            continue
        if exe == str(binary):
            pid = int(entry.name)
            _log(f"stopping a stray Kueue (pid {pid})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                if not procs.pid_alive(pid, "kueue"):
                    break
                procs.reap(pid)
                time.sleep(0.05)


def stop_kueue() -> None:
    procs.stop_pid("kueue", PID_FILE, log=_log, timeout=15)
    while _CHILD:
        procs.reap_child(_CHILD.pop())
