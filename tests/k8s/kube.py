"""Start and stop the local Kubernetes API server used by the integration tests.

An envtest-style control plane: etcd and kube-apiserver on 127.0.0.1 (no controller-manager,
scheduler or kubelet, so Pods never run, there is no garbage collection and deleted namespaces
stay Terminating). RBAC is on; the admin is a client certificate in group ``system:masters``.

* etcd: client ``http://127.0.0.1:22379``, peer 22380, data in ``/srv/slurmjob-testbed/k8s``;
* kube-apiserver: ``https://127.0.0.1:22443`` with a CA, serving and client certificates and a
  service-account signing key made with the ``openssl`` CLI (kept across restarts);
* binaries: built once by ``tests/k8s/build.sh`` into ``/var/cache/slurmjob-testbed/k8s``.

CLI (used by ``make dev-up``)::

    python -m tests.k8s.kube up        # start (or re-use) and print KUBECONFIG=... etc.
    python -m tests.k8s.kube down
    python -m tests.k8s.kube status
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.k8s import pki
from tests.testbed import procs

HERE = Path(__file__).resolve().parent
GOMOD_DIR = HERE / "gomod"
CACHE_DIR = Path(os.environ.get("SLURMJOB_TESTBED_K8S_CACHE", "/var/cache/slurmjob-testbed/k8s"))
BASE = Path("/srv/slurmjob-testbed/k8s")
PKI_DIR = BASE / "pki"
PKI = pki.Pki(PKI_DIR)
RUN_DIR = BASE / "run"
LOG_DIR = BASE / "log"
ETCD_DATA = BASE / "etcd-data"
USERS_DIR = BASE / "users"
HOME_DIR = BASE / "home"  # kubectl discovery cache and helm's config/cache/data
KUBECONFIG = BASE / "admin.kubeconfig"
KEEP_ENV = "SLURMJOB_TESTBED_KEEP"

HOST = "127.0.0.1"
ETCD_PORT = 22379
ETCD_PEER_PORT = 22380
APISERVER_PORT = 22443
SERVER = f"https://{HOST}:{APISERVER_PORT}"
SERVICE_CIDR = "10.0.0.0/24"
ADMIN_USER = "testbed-admin"
ADMIN_GROUP = "system:masters"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Daemons do not fork; keep their Popen so they are reaped after stop (no zombies, no
# ResourceWarning while the session runs).
_CHILDREN: dict[str, subprocess.Popen[bytes]] = {}


class TestbedError(RuntimeError):
    """The Kubernetes test bed could not be built, started or stopped."""

    __test__ = False  # not a pytest test class despite the name


# --------------------------------------------------------------------------- binaries


def _require_version(wrapper: str, module: str) -> str:
    """The version ``module`` is required at in the wrapper module ``gomod/<wrapper>/go.mod``."""
    go_mod = GOMOD_DIR / wrapper / "go.mod"
    for line in go_mod.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] == module:
            return parts[1]
    raise TestbedError(f"no require line for {module} in {go_mod}")


def versions() -> dict[str, str]:
    """Component -> version, read from the wrapper go.mod files (as build.sh does)."""
    k8s = _require_version("kube", "k8s.io/kubernetes")
    return {
        "etcd": _require_version("etcd", "go.etcd.io/etcd/server/v3"),
        "kube-apiserver": k8s,
        "kubectl": k8s,
        "helm": _require_version("helm", "helm.sh/helm/v3"),
    }


def binaries() -> dict[str, Path]:
    """Component -> cached binary; raises if build.sh has not built one of them yet."""
    found = {c: CACHE_DIR / f"{c}-{v}" / c for c, v in versions().items()}
    missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if missing:
        raise TestbedError(
            "Kubernetes test-bed binaries missing: "
            + ", ".join(missing)
            + "; run `bash tests/k8s/build.sh` first (make test does; a cold build takes a while)"
        )
    return found


# --------------------------------------------------------------------------- the handle


@dataclasses.dataclass(frozen=True)
class KubeTestbed:
    """What a test needs to talk to the running API server."""

    kubeconfig: Path
    server: str
    kubectl_bin: Path
    helm_bin: Path
    ca_file: Path
    version: str
    home: Path

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm/kopf: KUBECONFIG plus caches kept out of $HOME."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "KUBECACHEDIR": str(self.home / "kube-cache"),
            "HELM_CACHE_HOME": str(self.home / "helm-cache"),
            "HELM_CONFIG_HOME": str(self.home / "helm-config"),
            "HELM_DATA_HOME": str(self.home / "helm-data"),
        }

    def _run(
        self,
        argv: Sequence[str],
        input: str | None,
        check: bool,
        timeout: float,
        kubeconfig: Path | None,
    ) -> subprocess.CompletedProcess[str]:
        env = {"PATH": SYSTEM_PATH, "HOME": str(self.home), **self.env()}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        try:
            proc = subprocess.run(
                list(argv),
                input=input,
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TestbedError(f"{' '.join(argv)} timed out after {timeout:.0f} s") from exc
        if check and proc.returncode != 0:
            raise TestbedError(
                f"{' '.join(argv)} failed (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 30,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl as the admin (or as ``kubeconfig``'s user); raises on failure if check."""
        return self._run([str(self.kubectl_bin), *args], input, check, timeout, kubeconfig)

    def helm(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against the test bed. Pods never run here: do not use --wait."""
        return self._run([str(self.helm_bin), *args], input, check, timeout, None)

    def apply(
        self,
        manifest: Path | str,
        *args: str,
        server_side: bool = True,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl apply`` a file (Path, or str without newline) or YAML text (str with one).

        Server-side apply (field manager ``slurmjob-testbed``, forcing conflicts) by default.
        """
        flags = ["--server-side", "--force-conflicts", "--field-manager=slurmjob-testbed"]
        argv = ["apply", *(flags if server_side else []), *args]
        if isinstance(manifest, str) and "\n" in manifest:
            return self.kubectl(*argv, "-f", "-", input=manifest, check=check)
        return self.kubectl(*argv, "-f", str(manifest), check=check)

    def wait_established(self, crd_name: str, timeout: float = 30) -> None:
        """Wait until a CustomResourceDefinition is Established (served). Polled: `kubectl
        wait` fails at once on a CRD made a moment ago, whose status has no conditions yet."""
        deadline = time.monotonic() + timeout
        jsonpath = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
        last = ""
        while time.monotonic() < deadline:
            proc = self.kubectl("get", "crd", crd_name, "-o", jsonpath, check=False)
            if proc.returncode == 0 and proc.stdout.strip() == "True":
                return
            last = (proc.stdout + proc.stderr).strip()
            time.sleep(0.2)
        raise TestbedError(f"crd/{crd_name} not Established within {timeout:.0f} s: {last}")

    def kubeconfig_for(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig for a non-admin ``user`` (client cert; ``groups`` as its O= fields).

        With RBAC on, such a user can do nothing until a (Cluster)RoleBinding grants it.
        """
        return _user_kubeconfig(user, tuple(groups))


# --------------------------------------------------------------------------- helpers


def _log(msg: str) -> None:
    procs.log("k8s-testbed", msg)


def _daemons() -> list[tuple[str, Path]]:
    """(command name, pid file) of every daemon, in stop order."""
    return [
        ("kube-apiserver", RUN_DIR / "kube-apiserver.pid"),
        ("etcd", RUN_DIR / "etcd.pid"),
    ]


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def _kubeconfig_text(user: str, cert: Path, key: Path) -> str:
    """A self-contained kubeconfig (data embedded), as JSON (which is YAML)."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "slurmjob-testbed",
                "cluster": {
                    "server": SERVER,
                    "certificate-authority-data": _b64(PKI_DIR / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(cert),
                    "client-key-data": _b64(key),
                },
            }
        ],
        "contexts": [
            {
                "name": f"{user}@slurmjob-testbed",
                "context": {"cluster": "slurmjob-testbed", "user": user, "namespace": "default"},
            }
        ],
        "current-context": f"{user}@slurmjob-testbed",
        "preferences": {},
    }
    return json.dumps(config, indent=2) + "\n"


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        pki.write_private(path, text)


def _user_kubeconfig(user: str, groups: tuple[str, ...]) -> Path:
    if not user or any(c in user + "".join(groups) for c in "/=,+\n\\\"'"):
        raise TestbedError(f"unsupported user or group name: {user!r} {groups!r}")
    tag = "-".join([user, *groups]).replace(":", "_")
    path = USERS_DIR / f"{tag}.kubeconfig"
    if path.is_file():
        return path
    USERS_DIR.mkdir(parents=True, exist_ok=True)
    name = f"user-{tag}"
    subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
    try:
        PKI.sign(name, subject, pki.CLIENT_EXT)
    except pki.PkiError as exc:
        raise TestbedError(str(exc)) from None
    pki.write_private(path, _kubeconfig_text(user, PKI.crt(name), PKI.key(name)))
    return path


def _ssl_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(PKI_DIR / "ca.crt"))
    ctx.load_cert_chain(str(PKI_DIR / "admin.crt"), str(PKI_DIR / "admin.key"))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 3) -> tuple[int, str]:
    """(HTTP status, body) of a GET; status 0 with the error text when it did not connect."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def _etcd_ok() -> tuple[bool, str]:
    status, body = _get(f"http://{HOST}:{ETCD_PORT}/health")
    try:
        healthy = status == 200 and json.loads(body).get("health") == "true"
    except ValueError:
        healthy = False
    return healthy, f"HTTP {status}: {body[:300]}"


def _apiserver_ok(path: str = "/readyz") -> tuple[bool, str]:
    try:
        ctx = _ssl_context()
    except (OSError, ssl.SSLError) as exc:
        return False, str(exc)
    status, body = _get(SERVER + path, ctx)
    return status == 200, f"HTTP {status}: {body[:500]}"


def _healthy() -> bool:
    return procs.all_running(_daemons()) and _apiserver_ok()[0] and KUBECONFIG.is_file()


def _spawn(comm: str, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=BASE,
            env={"PATH": SYSTEM_PATH, "HOME": str(HOME_DIR)},
            start_new_session=True,
        )
    _CHILDREN[comm] = proc
    (RUN_DIR / f"{comm}.pid").write_text(f"{proc.pid}\n")
    return proc


def _alive_check(
    comm: str, proc: subprocess.Popen[bytes], log: Path, ok: Callable[[], tuple[bool, str]]
) -> tuple[Callable[[], bool], Callable[[], str]]:
    last = [""]

    def check() -> bool:
        if proc.poll() is not None:
            raise TestbedError(f"{comm} exited with rc {proc.returncode}\n{procs.tail(log, 40)}")
        good, last[0] = ok()
        return good

    return check, lambda: last[0]


def _apiserver_argv(binary: Path) -> list[str]:
    """kube-apiserver's command line; a kept apiserver started with another is restarted."""
    d = PKI_DIR
    front_proxy = pki.FRONT_PROXY_CLIENT
    return [
        str(binary),
        f"--etcd-servers=http://{HOST}:{ETCD_PORT}",
        f"--bind-address={HOST}",
        f"--advertise-address={HOST}",  # no default route here: do not guess an address
        f"--secure-port={APISERVER_PORT}",
        f"--cert-dir={d}",
        f"--tls-cert-file={d / 'apiserver.crt'}",
        f"--tls-private-key-file={d / 'apiserver.key'}",
        f"--client-ca-file={d / 'ca.crt'}",
        f"--service-account-issuer={SERVER}",
        f"--service-account-key-file={d / 'sa.pub'}",
        f"--service-account-signing-key-file={d / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=RBAC",
        "--allow-privileged=true",
        # No controller-manager creates the `default` ServiceAccount in namespaces.
        "--disable-admission-plugins=ServiceAccount",
        # The `kubernetes` Service would get a loopback endpoint, which validation rejects.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        # The aggregator (APIServices): to an EndpointSlice's address, not a ClusterIP (no
        # kube-proxy here), as the front proxy whose X-Remote-* headers name the user.
        "--enable-aggregator-routing=true",
        f"--requestheader-client-ca-file={PKI.crt(pki.FRONT_PROXY_CA)}",
        f"--requestheader-allowed-names={front_proxy}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={PKI.crt(front_proxy)}",
        f"--proxy-client-key-file={PKI.key(front_proxy)}",
    ]


def _running_argv() -> list[str] | None:
    """The running kube-apiserver's command line, None when it does not run."""
    pid = procs.read_pid(RUN_DIR / "kube-apiserver.pid")
    if pid is None or not procs.pid_alive(pid, "kube-apiserver"):
        return None
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _requestheader_published() -> tuple[bool, str]:
    """The apiserver publishes its front-proxy CA and names for aggregated API servers in
    kube-system/extension-apiserver-authentication (once kube-system exists)."""
    try:
        ctx = _ssl_context()
    except (OSError, ssl.SSLError) as exc:
        return False, str(exc)
    path = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
    status, body = _get(SERVER + path, ctx)
    data: dict[str, Any] = {}
    if status == 200:
        with contextlib.suppress(ValueError, AttributeError):
            data = json.loads(body).get("data") or {}
    ca = PKI.crt(pki.FRONT_PROXY_CA).read_text().strip()
    published = ca in str(data.get("requestheader-client-ca-file", ""))
    names = data.get("requestheader-allowed-names", "")
    return published and pki.FRONT_PROXY_CLIENT in names, f"HTTP {status}: {body[:300]}"


def _start_daemons(bins: dict[str, Path]) -> None:
    t0 = time.monotonic()
    etcd_log = LOG_DIR / "etcd.log"
    etcd = _spawn(
        "etcd",
        [
            str(bins["etcd"]),
            "--name=testbed",
            f"--data-dir={ETCD_DATA}",
            f"--listen-client-urls=http://{HOST}:{ETCD_PORT}",
            f"--advertise-client-urls=http://{HOST}:{ETCD_PORT}",
            f"--listen-peer-urls=http://{HOST}:{ETCD_PEER_PORT}",
            f"--initial-advertise-peer-urls=http://{HOST}:{ETCD_PEER_PORT}",
            f"--initial-cluster=testbed=http://{HOST}:{ETCD_PEER_PORT}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ],
        etcd_log,
    )
    check, detail = _alive_check("etcd", etcd, etcd_log, _etcd_ok)
    procs.wait("etcd /health", check, 20, [etcd_log], error=TestbedError, detail=detail)
    t_etcd = time.monotonic() - t0

    api_log = LOG_DIR / "kube-apiserver.log"
    api = _spawn("kube-apiserver", _apiserver_argv(bins["kube-apiserver"]), api_log)
    check, detail = _alive_check("kube-apiserver", api, api_log, _apiserver_ok)
    procs.wait(
        "kube-apiserver /readyz",
        check,
        60,
        [api_log, etcd_log],
        error=TestbedError,
        interval=0.2,
        detail=detail,
    )
    check, detail = _alive_check(
        "kube-apiserver", api, api_log, lambda: _apiserver_ok("/api/v1/namespaces/default")
    )
    procs.wait("namespace default", check, 15, [api_log], error=TestbedError, detail=detail)
    check, detail = _alive_check("kube-apiserver", api, api_log, _requestheader_published)
    procs.wait(
        "kube-system/extension-apiserver-authentication",
        check,
        15,
        [api_log],
        error=TestbedError,
        interval=0.2,
        detail=detail,
    )
    total = time.monotonic() - t0
    _log(f"etcd + kube-apiserver up in {total:.2f} s (etcd {t_etcd:.2f} s)")


def _testbed() -> KubeTestbed:
    bins = binaries()
    return KubeTestbed(
        kubeconfig=KUBECONFIG,
        server=SERVER,
        kubectl_bin=bins["kubectl"],
        helm_bin=bins["helm"],
        ca_file=PKI_DIR / "ca.crt",
        version=versions()["kube-apiserver"],
        home=HOME_DIR,
    )


# --------------------------------------------------------------------------- public API


def keep_requested() -> bool:
    return os.environ.get(KEEP_ENV, "") not in ("", "0", "false", "no")


def start_testbed(reuse: bool | None = None) -> KubeTestbed:
    """Start etcd + kube-apiserver from an empty etcd and wait until the API is ready.

    With ``reuse`` (default: $SLURMJOB_TESTBED_KEEP is set) an already running, ready API
    server (live pids in the pid files and /readyz answering the admin) is used as is.
    Stale daemons from earlier runs are stopped through their pid files first.
    """
    if os.geteuid() != 0:
        raise TestbedError("the Kubernetes test bed must be started as root")
    if shutil.which("openssl") is None:
        raise TestbedError("openssl is missing (apt-get install openssl)")
    bins = binaries()
    if procs.shared_requested():
        procs.attach("kube-apiserver", _healthy, error=TestbedError)
        return _testbed()
    if reuse is None:
        reuse = keep_requested()
    for d in (BASE, RUN_DIR, LOG_DIR, HOME_DIR):
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
    service_ip = "10.0.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
    sans = [f"IP:{HOST}", f"IP:{service_ip}", "DNS:localhost", "DNS:kubernetes"]
    sans += [f"DNS:kubernetes.default{tail}" for tail in ("", ".svc", ".svc.cluster.local")]
    try:
        made = PKI.ensure(sans, f"/O={ADMIN_GROUP}/CN={ADMIN_USER}")
    except pki.PkiError as exc:
        raise TestbedError(str(exc)) from None
    _write_if_changed(KUBECONFIG, _kubeconfig_text(ADMIN_USER, PKI.crt("admin"), PKI.key("admin")))
    if reuse and _healthy():
        if made or _running_argv() != _apiserver_argv(bins["kube-apiserver"]):
            _log("the running kube-apiserver has other flags or certificates: restarting it")
        else:
            _log("re-using the running kube-apiserver")
            return _testbed()
    stop_testbed()
    busy = [p for p in (ETCD_PORT, ETCD_PEER_PORT, APISERVER_PORT) if not procs.port_free(HOST, p)]
    if busy:
        owners = "\n".join(f"port {p}: {procs.port_owner(p)}" for p in busy)
        raise TestbedError(
            f"ports of the Kubernetes test bed are taken by something else:\n{owners}"
        )
    shutil.rmtree(ETCD_DATA, ignore_errors=True)
    shutil.rmtree(LOG_DIR, ignore_errors=True)
    LOG_DIR.mkdir(mode=0o755)
    try:
        _start_daemons(bins)
    except BaseException:
        stop_testbed()
        raise
    return _testbed()


def stop_testbed() -> None:
    """Stop kube-apiserver and etcd through their pid files (data and certificates are kept)."""
    for comm, pid_file in _daemons():
        procs.stop_pid(comm, pid_file, log=_log, timeout=15)
        procs.reap_child(_CHILDREN.pop(comm, None))


def testbed_status() -> str:
    parts = procs.states(_daemons())
    parts.append(f"readyz={'ok' if _apiserver_ok()[0] else 'down'}")
    return " ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in ("up", "down", "status"):
        print("usage: python -m tests.k8s.kube up|down|status")
        return 2
    try:
        if args[0] == "up":
            tb = start_testbed(reuse=True)
            print(f"KUBECONFIG={tb.kubeconfig}")
            print(f"SLURMJOB_TESTBED_K8S_SERVER={tb.server}")
            print(f"SLURMJOB_TESTBED_KUBECTL={tb.kubectl_bin}")
            print(f"SLURMJOB_TESTBED_HELM={tb.helm_bin}")
        elif args[0] == "down":
            stop_testbed()
        else:
            print(f"kubernetes: {testbed_status()}")
            print(f"KUBECONFIG={KUBECONFIG}")
    except TestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
