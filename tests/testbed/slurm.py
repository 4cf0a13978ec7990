"""Start and stop the two local Slurm test clusters used by the integration tests.

* ``22.05``: Debian 12's Slurm on the host, slurmrestd serving v0.0.38 on 127.0.0.1:6820.
* ``26.05``: Slurm from Debian testing in a debootstrap chroot (built by install.sh),
  slurmrestd serving v0.0.45 (and its ``/slurmdb/`` paths) on 127.0.0.1:26820, with
  accounting: slurmdbd on 127.0.0.1:26821 over a MariaDB of its own on 127.0.0.1:26822, and
  ``MinJobAge`` short enough that slurmctld purges an ended job within a test (it purges
  every 60 s, jobs older than ``MinJobAge``).

Both have two slurmd nodes (n1: 2 fake h100, n2: 2 fake a100), JWT auth, real Pyxis (built
here against each cluster's spank.h) beside a recording SPANK plugin (steps.jsonl), and real
Enroot and Apptainer (tests/testbed/runtimes.sh); jobs run in the images of images.sh.
Everything lives under ``/srv/slurmjob-testbed`` (bind-mounted at the same path into the
chroot), compiled plugins are cached under ``/var/cache/slurmjob-testbed``.

CLI (used by ``make dev-up``)::

    python -m tests.testbed.slurm up [22.05] [26.05]    # start (or re-use) and print env values
    python -m tests.testbed.slurm down [22.05] [26.05]
    python -m tests.testbed.slurm status
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.testbed import procs

HERE = Path(__file__).resolve().parent
TESTBED_ROOT = Path("/srv/slurmjob-testbed")
STORAGE_ROOT = TESTBED_ROOT / "storage"
BIN_DIR = TESTBED_ROOT / "bin"
RECORD_DIR = TESTBED_ROOT / "records"
CACHE_DIR = Path("/var/cache/slurmjob-testbed")
SUITE = os.environ.get("SLURMJOB_TESTBED_SUITE", "forky")
CHROOT = CACHE_DIR / f"{SUITE}-chroot"
CHROOT_MARKER = CHROOT / ".slurmjob-testbed-complete"
JOB_USER = "slurmci"
REST_USER = "slurmrest"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOB_PATH = f"{BIN_DIR}:{SYSTEM_PATH}"
KEEP_ENV = "SLURMJOB_TESTBED_KEEP"
PYXIS_ARCHIVE = "pyxis-0.24.0.tar.gz"

NODES: dict[str, dict[str, Any]] = {
    "n1": {"features": ["fast", "h100"], "gpus": 2, "gpu_type": "h100"},
    "n2": {"features": ["slow", "a100"], "gpus": 2, "gpu_type": "a100"},
}


# slurmrestd does not daemonize; keep its Popen so it is neither garbage-collected while
# running (ResourceWarning) nor left a zombie after stop_cluster().
_REST_CHILDREN: dict[str, subprocess.Popen[bytes]] = {}
_DB_CHILDREN: dict[str, subprocess.Popen[bytes]] = {}

# slurmctld purges ended jobs older than MinJobAge every 60 s. Without accounting they stay
# the default 300 s (the operator has nothing else to ask); with it, 20 s: a purge within a
# test (<= 80 s after the end), yet a test reading a job just after its end still finds it.
MIN_JOB_AGE = {False: 300, True: 20}
#: A second partition whose MaxTime (minutes) a job can exceed: the limits checked before submit.
SHORT_PARTITION = "short"
SHORT_MAX_TIME = 30
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"


class TestbedError(RuntimeError):
    """A cluster could not be started or stopped."""


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    name: str
    ctld_port: int
    slurmd_ports: dict[str, int]
    rest_port: int
    api_version: str
    chroot: Path | None
    rest_plugins: str | None
    # slurmdbd port and its MariaDB's port; None: no accounting (accounting_storage/none).
    accounting_ports: tuple[int, int] | None = None

    @property
    def accounting(self) -> bool:
        return self.accounting_ports is not None

    @property
    def cluster_name(self) -> str:
        return "tb" + self.name.replace(".", "")

    @property
    def base(self) -> Path:
        return TESTBED_ROOT / self.name

    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def key_file(self) -> Path:
        return self.base / "etc" / "jwt_hs256.key"

    @property
    def rest_pid_file(self) -> Path:
        return self.base / "run" / "slurmrestd.pid"


SPECS: dict[str, ClusterSpec] = {
    "22.05": ClusterSpec(
        name="22.05",
        ctld_port=16817,
        slurmd_ports={"n1": 16818, "n2": 16819},
        rest_port=6820,
        api_version="v0.0.38",
        chroot=None,
        rest_plugins="openapi/v0.0.36,openapi/v0.0.37,openapi/v0.0.38",
    ),
    "26.05": ClusterSpec(
        name="26.05",
        ctld_port=26817,
        slurmd_ports={"n1": 26818, "n2": 26819},
        rest_port=26820,
        api_version="v0.0.45",
        chroot=CHROOT,
        rest_plugins="openapi/slurmctld,openapi/slurmdbd",
        accounting_ports=(26821, 26822),
    ),
}


def mint_token(key: bytes, user: str, lifespan: int = 600) -> str:
    """An HS256 JWT with the claims slurmctld's auth/jwt expects (exp, iat, sun)."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")

    now = int(time.time())
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"exp": now + lifespan, "iat": now, "sun": user}
    payload = b64(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{header}.{payload}".encode("ascii")
    sig = b64(hmac.new(key, signing_input, hashlib.sha256).digest())
    return f"{header}.{payload}.{sig}"


@dataclasses.dataclass(frozen=True)
class SlurmTestbed:
    """What a test needs to talk to one running test cluster."""

    name: str
    rest_url: str
    api_version: str
    user: str
    uid: int
    gid: int
    jwt_key_file: Path
    storage_root: Path
    job_path: str
    record_dir: Path
    partition: str
    nodes: dict[str, dict[str, Any]]
    has_accounting: bool
    slurm_conf: Path
    chroot: Path | None
    bin_dir: Path
    cluster_name: str  # ClusterName= (SLURM_CLUSTER_NAME in jobs, "cluster" in records)

    def token(self, lifespan: int = 600) -> str:
        return mint_token(self.jwt_key_file.read_bytes(), self.user, lifespan)

    def headers(self, lifespan: int = 600) -> dict[str, str]:
        return {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.token(lifespan)}

    def scontrol(self, *args: str) -> str:
        return _run(SPECS[self.name], ["scontrol", *args]).stdout

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (sinfo, squeue, ...) against this cluster."""
        return _run(SPECS[self.name], list(argv), check=check)

    def env(self) -> dict[str, str]:
        """Environment values for a developer shell / the operator."""
        tag = self.name.replace(".", "")
        return {
            f"SLURMJOB_TESTBED_{tag}_REST_URL": self.rest_url,
            f"SLURMJOB_TESTBED_{tag}_API_VERSION": self.api_version,
            f"SLURMJOB_TESTBED_{tag}_USER": self.user,
            f"SLURMJOB_TESTBED_{tag}_JWT_KEY_FILE": str(self.jwt_key_file),
            f"SLURMJOB_TESTBED_{tag}_SLURM_CONF": str(self.slurm_conf),
            f"SLURMJOB_TESTBED_{tag}_CHROOT": str(self.chroot or ""),
            "SLURMJOB_TESTBED_STORAGE_ROOT": str(self.storage_root),
            "SLURMJOB_TESTBED_JOB_PATH": self.job_path,
            "SLURMJOB_TESTBED_RECORD_DIR": str(self.record_dir),
        }


# --------------------------------------------------------------------------- helpers


def _log(msg: str) -> None:
    procs.log("testbed", msg)


def _client_argv(spec: ClusterSpec, argv: Sequence[str]) -> list[str]:
    env = ["env", "-i", f"PATH={SYSTEM_PATH}", f"SLURM_CONF={spec.conf}"]
    if spec.chroot is not None:
        return ["chroot", str(spec.chroot), *env, *argv]
    return [*env, *argv]


def _run(
    spec: ClusterSpec, argv: Sequence[str], check: bool = True, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    cmd = _client_argv(spec, argv)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise TestbedError(
            f"{' '.join(argv)} failed on cluster {spec.name} (rc {proc.returncode}):\n"
            f"{proc.stdout}{proc.stderr}"
        )
    return proc


def _sh(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed (rc {proc.returncode}): {proc.stderr}")
    return proc


def _daemons(spec: ClusterSpec) -> list[tuple[str, Path]]:
    """(command name, pid file) of every daemon, in stop order."""
    run = spec.base / "run"
    return [
        ("slurmrestd", spec.rest_pid_file),
        *[("slurmd", run / f"slurmd-{n}.pid") for n in NODES],
        ("slurmctld", run / "slurmctld.pid"),
        *(
            [("slurmdbd", run / "slurmdbd.pid"), ("mariadbd", run / "mariadbd.pid")]
            if spec.accounting
            else []
        ),
        ("munged", spec.base / "munge" / "munged.pid"),
    ]


def _rest_ping(spec: ClusterSpec, timeout: float = 3) -> tuple[bool, str]:
    try:
        key = spec.key_file.read_bytes()
    except OSError as exc:
        return False, str(exc)
    req = urllib.request.Request(
        f"http://127.0.0.1:{spec.rest_port}/slurm/{spec.api_version}/ping",
        headers={"X-SLURM-USER-NAME": JOB_USER, "X-SLURM-USER-TOKEN": mint_token(key, JOB_USER)},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return False, f"HTTP {exc.code}: {exc.read()[:300]!r}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, str(exc)
    pings = body.get("pings") or []
    ok = resp.status == 200 and not body.get("errors") and bool(pings)
    return ok, json.dumps(body)[:500]


def _healthy(spec: ClusterSpec) -> bool:
    return procs.all_running(_daemons(spec)) and _rest_ping(spec)[0]


def _is_mountpoint(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode == 0


def _ensure_chroot_mounts(root: Path) -> None:
    if not CHROOT_MARKER.is_file():
        raise TestbedError(
            f"the Slurm 26.05 chroot {root} is missing or incomplete; "
            "run `bash tests/testbed/install.sh` first"
        )
    mounts: list[tuple[Path, list[str], bool]] = [
        (root / "proc", ["-t", "proc", "proc"], True),
        (root / "dev", ["--bind", "/dev"], True),
        # What the containers need below /dev: a devpts (Apptainer's --contain makes a new
        # instance, and refuses to without one there) and /dev/shm (Ray's object store).
        (root / "dev" / "pts", ["--bind", "/dev/pts"], True),
        (root / "dev" / "shm", ["--bind", "/dev/shm"], True),
        (root / "sys", ["-t", "sysfs", "sysfs"], False),
        (root / str(TESTBED_ROOT).lstrip("/"), ["--bind", str(TESTBED_ROOT)], True),
    ]
    for target, args, required in mounts:
        target.mkdir(parents=True, exist_ok=True)
        if _is_mountpoint(target):
            continue
        proc = subprocess.run(
            ["mount", *args, str(target)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            if required:
                raise TestbedError(f"mount {' '.join(args)} {target} failed: {proc.stderr}")
            _log(f"optional mount {target} failed (ignored): {proc.stderr.strip()}")
    (root / ".pivot-old").mkdir(mode=0o700, exist_ok=True)  # slurmd's pivot_root (PIVOT_INTO)
    for name in ("hosts", "resolv.conf"):
        src = Path("/etc") / name
        dst = root / "etc" / name
        if src.exists() and (not dst.exists() or dst.read_bytes() != src.read_bytes()):
            shutil.copyfile(src, dst)


def _ensure_common_dirs() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(JOB_USER)
    except KeyError:
        raise TestbedError(
            f"user {JOB_USER} does not exist; run `bash tests/testbed/install.sh` first"
        ) from None
    for d in (TESTBED_ROOT, BIN_DIR):
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
    for d in (STORAGE_ROOT, RECORD_DIR):
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chown(d, pw.pw_uid, pw.pw_gid)
        d.chmod(0o755)
    # The recording plugin's file: root's, written as root (no job can add a line).
    steps = RECORD_DIR / "steps.jsonl"
    steps.touch(exist_ok=True)
    os.chown(steps, 0, 0)
    steps.chmod(0o644)
    # The host-side stand-ins of earlier releases of the test bed (apptainer, ray, torchrun,
    # the probe): gone, so that the real runtimes on PATH are the ones that run.
    for name in ("apptainer", "ray", "torchrun", "collective-probe"):
        (BIN_DIR / name).unlink(missing_ok=True)
    for old in ("pyxis.jsonl", "apptainer.jsonl", "ray.jsonl"):
        (RECORD_DIR / old).unlink(missing_ok=True)
    return pw.pw_uid, pw.pw_gid


def _slurm_version(spec: ClusterSpec) -> str:
    argv = ["dpkg-query", "-W", "-f=${Version}", "slurmctld"]
    if spec.chroot is not None:
        argv = ["chroot", str(spec.chroot), *argv]
    return _sh(argv).stdout.strip()


def _compile_in_root(spec: ClusterSpec, src_dir: Path, argv: list[str], product: str) -> Path:
    """Run a build command in a copy of ``src_dir`` inside the cluster's root (the host, or
    the chroot its slurmd runs in, against that root's own Slurm headers); return the path of
    ``product`` on the host."""
    if spec.chroot is None:
        _sh(["bash", "-c", 'cd "$1" && shift && exec "$@"', "build", str(src_dir), *argv])
        return src_dir / product
    work = spec.chroot / "tmp" / f"slurmjob-build-{os.getpid()}-{src_dir.name}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src_dir, work)
    inner = Path("/tmp") / work.name
    _sh(["chroot", str(spec.chroot), "bash", "-c", 'cd "$1" && shift && exec "$@"', "build",
         str(inner), *argv])  # fmt: skip
    return work / product


def _cached_build(spec: ClusterSpec, name: str, key: str, build: Any) -> Path:
    """The plugin ``name`` for this cluster's Slurm version, built once per ``key``."""
    version = _slurm_version(spec)
    cached = CACHE_DIR / "spank" / f"{name}-{version}-{key}.so"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        _log(f"building SPANK plugin {name} for Slurm {version}")
        with tempfile.TemporaryDirectory() as tmp:
            built = build(Path(tmp))
            shutil.copyfile(built, str(cached) + ".tmp")
            if spec.chroot is not None:  # the copy it was built in, in the chroot's /tmp
                shutil.rmtree(built.parent, ignore_errors=True)
        Path(str(cached) + ".tmp").replace(cached)
    dst = spec.base / "lib" / f"{name}.so"
    if not dst.exists() or dst.read_bytes() != cached.read_bytes():
        shutil.copyfile(cached, dst)
        dst.chmod(0o755)
    return dst


def _recorder_plugin(spec: ClusterSpec) -> Path:
    """The recording SPANK plugin (the oracle of what reaches a step's host side)."""
    src = HERE / "spank_record.c"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]

    def build(tmp: Path) -> Path:
        shutil.copyfile(src, tmp / "record.c")
        flags = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror"]
        return _compile_in_root(spec, tmp, [*flags, "-o", "record.so", "record.c"], "record.so")

    return _cached_build(spec, "slurmjob_record", digest, build)


def _pyxis_plugin(spec: ClusterSpec) -> Path:
    """Pyxis, built from its pinned upstream archive (verified and kept in the cache by
    tests/testbed/runtimes.sh) against this cluster's own spank.h."""
    archive = CACHE_DIR / "vendor" / PYXIS_ARCHIVE
    if not archive.is_file():
        raise TestbedError(f"{archive} is missing: run `bash tests/testbed/runtimes.sh` first")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]

    def build(tmp: Path) -> Path:
        _sh(["tar", "-xzf", str(archive), "-C", str(tmp)])
        src = tmp / PYXIS_ARCHIVE.removesuffix(".tar.gz")
        return _compile_in_root(spec, src, ["make", "-s"], "spank_pyxis.so")

    return _cached_build(spec, "spank_pyxis", digest, build)


def _user_ids(spec: ClusterSpec, user: str) -> tuple[int, int]:
    if spec.chroot is None:
        pw = pwd.getpwnam(user)
        return pw.pw_uid, pw.pw_gid
    for line in (spec.chroot / "etc" / "passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == user:
            return int(parts[2]), int(parts[3])
    raise TestbedError(f"user {user} missing in {spec.chroot}; run tests/testbed/install.sh")


def _hardware() -> str:
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=False).stdout
    fields = dict(
        item.split("=", 1) for item in out.split() if "=" in item and not item.startswith("Node")
    )
    keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    if not all(k in fields for k in keep):
        return "CPUs=2 RealMemory=1000"
    return " ".join(f"{k}={fields[k]}" for k in keep)


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """True when the file was written (it was missing or said something else)."""
    changed = not path.exists() or path.read_text() != text
    if changed:
        path.write_text(text)
    path.chmod(mode)
    return changed


def _write_config(spec: ClusterSpec) -> bool:
    """Write the cluster's configuration; True when a daemon's config file changed (a
    running cluster started from the old one must be restarted to see it)."""
    b = spec.base
    for sub in ("etc", "state/ctld", "run", "log", "munge", "dev", "lib"):
        (b / sub).mkdir(parents=True, exist_ok=True)
    for node in NODES:
        (b / "state" / f"slurmd-{node}").mkdir(exist_ok=True)
    # keys
    if not spec.key_file.exists():
        spec.key_file.write_bytes(os.urandom(32))
    spec.key_file.chmod(0o600)
    munge_uid, munge_gid = _user_ids(spec, "munge")
    munge_dir = b / "munge"
    os.chown(munge_dir, munge_uid, munge_gid)
    munge_dir.chmod(0o755)
    munge_key = munge_dir / "munge.key"
    if not munge_key.exists():
        munge_key.write_bytes(os.urandom(1024))
    os.chown(munge_key, munge_uid, munge_gid)
    munge_key.chmod(0o400)
    # fake GPUs: character devices with /dev/null's numbers
    for i in range(4):
        dev = b / "dev" / f"gpu{i}"
        if not dev.is_char_device():
            with contextlib.suppress(FileNotFoundError):
                dev.unlink()
            os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    hw = _hardware()
    modern = spec.chroot is not None
    lines = [
        f"ClusterName={spec.cluster_name}",
        "SlurmctldHost=localhost",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={spec.ctld_port}",
        f"SlurmdPort={spec.slurmd_ports['n1']}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={munge_dir}/munge.socket",
        "CredType=cred/munge",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={spec.key_file}",
        f"StateSaveLocation={b}/state/ctld",
        f"SlurmdSpoolDir={b}/state/slurmd-%n",
        f"SlurmctldPidFile={b}/run/slurmctld.pid",
        f"SlurmdPidFile={b}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={b}/log/slurmctld.log",
        f"SlurmdLogFile={b}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "MailProg=/bin/true",
        "CommunicationParameters=NoInAddrAny",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        *([] if modern else ["TaskPlugin=task/none"]),
        "JobAcctGatherType=jobacct_gather/none",
        *_accounting_lines(spec),
        *([] if modern else ["JobCompType=jobcomp/none"]),
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0,bf_interval=1",
        "ReturnToService=2",
        "JobRequeue=0",
        f"MinJobAge={MIN_JOB_AGE[spec.accounting]}",
        # The scale bench (bench/scale) queues 10,000 jobs per run, and its runs follow each
        # other faster than MinJobAge purges the ended ones: room for several runs' worth.
        "MaxJobCount=60000",
        "GresTypes=gpu",
        f"PlugStackConfig={b}/etc/plugstack.conf",
    ]
    gres = ["AutoDetect=off"]
    for i, (node, info) in enumerate(NODES.items()):
        lines.append(
            f"NodeName={node} NodeAddr=127.0.0.1 Port={spec.slurmd_ports[node]} {hw} "
            f"Gres=gpu:{info['gpu_type']}:{info['gpus']} "
            f"Features={','.join(info['features'])} State=UNKNOWN"
        )
        first = i * info["gpus"]
        gres.append(
            f"NodeName={node} Name=gpu Type={info['gpu_type']} "
            f"File={b}/dev/gpu[{first}-{first + info['gpus'] - 1}]"
        )
    lines.append(
        f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP"
    )
    # A partition with a MaxTime, for the limits checked before submit (core/limits.py).
    lines.append(
        f"PartitionName={SHORT_PARTITION} Nodes={','.join(NODES)} MaxTime={SHORT_MAX_TIME} State=UP"
    )
    changed = _write_if_changed(spec.conf, "\n".join(lines) + "\n")
    changed |= _write_if_changed(b / "etc" / "gres.conf", "\n".join(gres) + "\n")
    cgroup_conf = b / "etc" / "cgroup.conf"
    if modern:  # 26.05 has no task/none; 22.05 does not know CgroupPlugin=disabled
        changed |= _write_if_changed(cgroup_conf, "CgroupPlugin=disabled\n")
    else:
        cgroup_conf.unlink(missing_ok=True)
    # The recorder first: it sees the step before Pyxis enters the container. Pyxis keeps its
    # runtime files under the cluster's own directory (both clusters' nodes are this one
    # machine). 22.05 starts squashfs images directly (use_squashfuse=1: a fifth of a second
    # per step; docs/benchmarks.md); 26.05, where the walltime chains run, unpacks them
    # (`enroot create`): a signal Slurm sends a step (the walltime warning, scancel --signal)
    # is followed by SIGCONT, which ends Pyxis' stopped placeholder in the container, and with
    # it the Enroot fuse shim and squashfuse that serve the image (docs/development.md).
    squashfuse = 0 if spec.chroot is not None else 1
    recorder = _recorder_plugin(spec)
    pyxis = _pyxis_plugin(spec)
    (b / "run" / "pyxis").mkdir(parents=True, exist_ok=True)
    changed |= _write_if_changed(
        b / "etc" / "plugstack.conf",
        f"required {recorder} record_dir={RECORD_DIR}\n"
        f"required {pyxis} runtime_path={b}/run/pyxis use_squashfuse={squashfuse}\n",
    )
    if spec.accounting_ports is not None:
        changed |= _write_dbd_config(spec, spec.accounting_ports)
    return changed


def _accounting_lines(spec: ClusterSpec) -> list[str]:
    if spec.accounting_ports is None:
        # 26.05 has no accounting_storage/none line: it is its default.
        return [] if spec.chroot is not None else ["AccountingStorageType=accounting_storage/none"]
    dbd_port, _ = spec.accounting_ports
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={dbd_port}",
        # The munge socket for slurmdbd connections (else /run/munge's, which is not ours).
        f"AccountingStoragePass={spec.base}/munge/munge.socket",
        # The operator's attempt identity is in the comment; slurmdbd keeps it only with this.
        "AccountingStoreFlags=job_comment",
    ]


def _db_password(spec: ClusterSpec) -> str:
    path = spec.base / "etc" / "db.pass"
    if not path.exists():
        path.write_text(base64.b32encode(os.urandom(20)).decode().rstrip("="))
    path.chmod(0o600)
    return path.read_text().strip()


def _write_dbd_config(spec: ClusterSpec, ports: tuple[int, int]) -> bool:
    b = spec.base
    dbd_port, db_port = ports
    lines = [
        "AuthType=auth/munge",
        f"AuthInfo=socket={b}/munge/munge.socket",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={spec.key_file}",
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={dbd_port}",
        "SlurmUser=root",
        f"PidFile={b}/run/slurmdbd.pid",
        f"LogFile={b}/log/slurmdbd.log",
        "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={db_port}",
        f"StorageUser={DB_USER}",
        f"StoragePass={_db_password(spec)}",
        f"StorageLoc={DB_NAME}",
    ]
    # slurmdbd refuses a config readable by others (it holds the database password).
    return _write_if_changed(b / "etc" / "slurmdbd.conf", "\n".join(lines) + "\n", mode=0o600)


#: How slurmd enters the chroot: in a mount namespace of its own whose root IS the chroot
#: (pivot_root), not by chroot(2). The kernel refuses a user namespace to a chrooted process
#: (user_namespaces(7)), and Enroot and Apptainer each make one for every container.
PIVOT_INTO = (
    'root=$1; shift; mount --rbind "$root" "$root" && cd "$root" && '
    'pivot_root . .pivot-old && umount -l /.pivot-old && exec chroot . "$@"'
)


def _daemon_argv(
    spec: ClusterSpec, argv: Sequence[str], user: str | None = None, *, pivot: bool = False
) -> list[str]:
    env = ["env", "-i", f"PATH={SYSTEM_PATH}", f"SLURM_CONF={spec.conf}"]
    if spec.chroot is not None and pivot:
        assert user is None, "a pivoted daemon runs as root"
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                PIVOT_INTO, "pivot", str(spec.chroot), *env, *argv]  # fmt: skip
    if spec.chroot is not None:
        userspec = [f"--userspec={user}:{user}"] if user else []
        return ["chroot", *userspec, str(spec.chroot), *env, *argv]
    if user:
        return ["runuser", "-u", user, "--", *env, *argv]
    return [*env, *argv]


def _start_daemons(spec: ClusterSpec) -> None:
    b = spec.base
    log = b / "log"
    md = b / "munge"
    t0 = time.monotonic()
    munged = [
        "munged",
        f"--socket={md}/munge.socket",
        f"--key-file={md}/munge.key",
        f"--pid-file={md}/munged.pid",
        f"--log-file={md}/munged.log",
        f"--seed-file={md}/munged.seed",
    ]
    with contextlib.suppress(FileNotFoundError):
        (md / "munge.socket").unlink()
    proc = subprocess.run(
        _daemon_argv(spec, munged, user="munge"), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise TestbedError(
            f"munged failed to start (rc {proc.returncode}): {proc.stderr}\n"
            + procs.tail(md / "munged.log")
        )
    procs.wait(
        "munge socket", (md / "munge.socket").exists, 10, [md / "munged.log"], error=TestbedError
    )
    if spec.accounting_ports is not None:
        _start_accounting(spec, spec.accounting_ports)
    _start_ctld(spec)
    for node in NODES:
        proc = subprocess.run(
            _daemon_argv(spec, ["slurmd", "-N", node], pivot=True),
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise TestbedError(
                f"slurmd {node} failed (rc {proc.returncode}): {proc.stderr}\n"
                + procs.tail(log / f"slurmd-{node}.log")
            )

    def nodes_idle() -> bool:
        out = _run(spec, ["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        bad = {n: s for n, s in states.items() if s.rstrip("*~#$@").startswith(("inval", "fail"))}
        if bad:
            raise TestbedError(
                f"nodes of {spec.name} are not usable: {bad}\n" + procs.tail(log / "slurmctld.log")
            )
        return sorted(states) == sorted(NODES) and set(states.values()) == {"idle"}

    procs.wait(
        f"nodes of {spec.name} to be idle",
        nodes_idle,
        30,
        [log / "slurmctld.log", *(log / f"slurmd-{n}.log" for n in NODES)],
        error=TestbedError,
        interval=0.2,
    )
    _start_rest(spec)
    _log(f"cluster {spec.name} up in {time.monotonic() - t0:.2f} s")


def _start_ctld(spec: ClusterSpec) -> None:
    """slurmctld, on the state it saved (a fresh cluster's state directory is empty)."""
    log = spec.base / "log"
    proc = subprocess.run(
        _daemon_argv(spec, ["slurmctld", "-i"]), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise TestbedError(
            f"slurmctld failed (rc {proc.returncode}): {proc.stderr}\n"
            + procs.tail(log / "slurmctld.log")
        )
    procs.wait(
        f"slurmctld of {spec.name} to answer scontrol ping",
        lambda: _run(spec, ["scontrol", "ping"], check=False).returncode == 0,
        30,
        [log / "slurmctld.log"],
        error=TestbedError,
        interval=0.2,
    )


def _start_rest(spec: ClusterSpec) -> None:
    b = spec.base
    log = b / "log"
    rest_log = log / "slurmrestd.log"
    rest = ["slurmrestd", "-u", REST_USER, "-g", REST_USER, "-a", "rest_auth/jwt"]
    if spec.rest_plugins:
        rest += ["-s", spec.rest_plugins]
    rest.append(f"127.0.0.1:{spec.rest_port}")
    env_args = ["env", "-i", f"PATH={SYSTEM_PATH}", f"SLURM_CONF={spec.conf}", "SLURM_JWT=daemon"]
    if spec.chroot is not None:
        script = f"cd {b} && exec {' '.join([*env_args, *rest])}"
        argv = ["chroot", str(spec.chroot), "/bin/sh", "-c", script]
    else:
        argv = [*env_args, *rest]
    with rest_log.open("ab") as out:
        rp = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=b, start_new_session=True
        )
    _REST_CHILDREN[spec.name] = rp
    spec.rest_pid_file.write_text(f"{rp.pid}\n")
    last: list[str] = [""]

    def rest_ok() -> bool:
        if rp.poll() is not None:
            raise TestbedError(
                f"slurmrestd of {spec.name} exited with rc {rp.returncode}\n" + procs.tail(rest_log)
            )
        ok, detail = _rest_ping(spec)
        last[0] = detail
        return ok

    try:
        procs.wait(
            f"authenticated REST ping on {spec.name}", rest_ok, 20, [rest_log], error=TestbedError
        )
    except TestbedError as exc:
        raise TestbedError(f"{exc}\nlast ping answer: {last[0]}") from None


def _start_accounting(spec: ClusterSpec, ports: tuple[int, int]) -> None:
    """MariaDB (a fresh data directory under state/, like slurmctld's state), then slurmdbd,
    then the cluster registered, so slurmctld finds its association on its first start."""
    b = spec.base
    log = b / "log"
    datadir = b / "state" / "mysql"
    sock = b / "run" / "mysqld.sock"
    _, db_port = ports
    if not (datadir / "mysql").is_dir():
        datadir.mkdir(parents=True, exist_ok=True)
        _sh(
            _daemon_argv(
                spec,
                [
                    "mariadb-install-db", "--user=root", f"--datadir={datadir}",
                    "--auth-root-authentication-method=socket", "--skip-test-db",
                ],
            )
        )  # fmt: skip
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    mariadbd = [
        "mariadbd", "--no-defaults", "--user=root", f"--datadir={datadir}",
        f"--socket={sock}", f"--port={db_port}", "--bind-address=127.0.0.1",
        f"--pid-file={b}/run/mariadbd.pid", f"--log-error={log}/mariadb.log",
        "--skip-name-resolve", "--innodb-buffer-pool-size=128M",
        # What slurmdbd checks for (a write conflict would make it exit otherwise).
        "--innodb-lock-wait-timeout=900", "--innodb-snapshot-isolation=OFF",
    ]  # fmt: skip
    with (log / "mariadb.log").open("ab") as out:
        db = subprocess.Popen(
            _daemon_argv(spec, mariadbd),
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=b, start_new_session=True,
        )  # fmt: skip
    _DB_CHILDREN[spec.name] = db

    def sql(statement: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            _daemon_argv(spec, ["mariadb", f"--socket={sock}", "-u", "root", "-e", statement]),
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip

    def db_up() -> bool:
        if db.poll() is not None:
            raise TestbedError(
                f"mariadbd exited with rc {db.returncode}\n" + procs.tail(log / "mariadb.log")
            )
        return sql("SELECT 1").returncode == 0

    procs.wait("MariaDB", db_up, 30, [log / "mariadb.log"], error=TestbedError, interval=0.2)
    password = _db_password(spec)
    for host in ("127.0.0.1", "localhost"):
        grant = sql(
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{host}' IDENTIFIED BY '{password}';"
            f"ALTER USER '{DB_USER}'@'{host}' IDENTIFIED BY '{password}';"
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{host}';"
        )
        if grant.returncode != 0:
            raise TestbedError(f"granting slurmdbd its database failed: {grant.stderr}")
    # With Debian 12's MariaDB client library (see install.sh for why).
    slurmdbd = ["env", "LD_LIBRARY_PATH=/opt/slurmjob-libmariadb", "slurmdbd"]
    proc = subprocess.run(_daemon_argv(spec, slurmdbd), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TestbedError(
            f"slurmdbd failed (rc {proc.returncode}): {proc.stderr}\n"
            + procs.tail(log / "slurmdbd.log")
        )

    def registered() -> bool:
        out = _run(spec, ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], check=False)
        if out.returncode != 0:
            return False
        if spec.cluster_name in out.stdout.split():
            return True
        _run(spec, ["sacctmgr", "-i", "add", "cluster", spec.cluster_name], check=False)
        return False

    procs.wait(
        f"slurmdbd of {spec.name} with cluster {spec.cluster_name}",
        registered, 60, [log / "slurmdbd.log"], error=TestbedError, interval=0.3,
    )  # fmt: skip


def _testbed(spec: ClusterSpec) -> SlurmTestbed:
    pw = pwd.getpwnam(JOB_USER)
    return SlurmTestbed(
        name=spec.name,
        rest_url=f"http://127.0.0.1:{spec.rest_port}",
        api_version=spec.api_version,
        user=JOB_USER,
        uid=pw.pw_uid,
        gid=pw.pw_gid,
        jwt_key_file=spec.key_file,
        storage_root=STORAGE_ROOT,
        job_path=JOB_PATH,
        record_dir=RECORD_DIR,
        partition="debug",
        nodes={n: dict(v, features=list(v["features"])) for n, v in NODES.items()},
        has_accounting=spec.accounting,
        slurm_conf=spec.conf,
        chroot=spec.chroot,
        bin_dir=BIN_DIR,
        cluster_name=spec.cluster_name,
    )


# --------------------------------------------------------------------------- public API


def keep_requested() -> bool:
    return os.environ.get(KEEP_ENV, "") not in ("", "0", "false", "no")


def prepare_host() -> None:
    """The users, shared directories and chroot mounts every cluster needs: done once before
    clusters start at once (tests/lanes.py), since two first-time creations would race."""
    _ensure_common_dirs()
    for spec in SPECS.values():
        if spec.chroot is not None:
            _ensure_chroot_mounts(spec.chroot)


def start_cluster(name: str, reuse: bool | None = None) -> SlurmTestbed:
    """Start cluster ``name`` ("22.05" or "26.05") from clean state and wait until usable.

    With ``reuse`` (default: $SLURMJOB_TESTBED_KEEP is set) an already running, healthy
    cluster (live pids in its pid files and an authenticated REST ping) is used as is.
    Stale daemons from earlier runs are stopped through their pid files first.
    """
    if name not in SPECS:
        raise TestbedError(f"unknown cluster {name!r}; known: {', '.join(SPECS)}")
    if os.geteuid() != 0:
        raise TestbedError("the Slurm test bed must be started as root")
    spec = SPECS[name]
    if reuse is None:
        reuse = keep_requested()
    uid, gid = _ensure_common_dirs()
    if (uid, gid) != (2001, 2001):
        _log(f"note: {JOB_USER} has uid:gid {uid}:{gid}")
    if spec.chroot is not None:
        _ensure_chroot_mounts(spec.chroot)
        if _user_ids(spec, JOB_USER) != (uid, gid):
            raise TestbedError(f"{JOB_USER} has different ids on the host and in {spec.chroot}")
    if procs.shared_requested():
        procs.attach(f"Slurm {name} cluster", lambda: _healthy(spec), error=TestbedError)
        return _testbed(spec)
    if reuse and _healthy(spec):
        if not _write_config(spec):
            _log(f"re-using running cluster {name}")
            return _testbed(spec)
        _log(f"cluster {name} runs an older configuration: restarting it")
    stop_cluster(name)
    for sub in ("state", "log"):
        shutil.rmtree(spec.base / sub, ignore_errors=True)
    _write_config(spec)
    try:
        _start_daemons(spec)
    except BaseException:
        stop_cluster(name)
        raise
    return _testbed(spec)


def stop_cluster(name: str) -> None:
    """Stop every daemon of cluster ``name`` recorded in its pid files (mounts are kept), and
    whatever its nodes still ran: a job's slurmstepd outlives its slurmd, and with it the
    job's containers (a Ray head keeps a dozen processes)."""
    spec = SPECS[name]
    for comm, pid_file in _daemons(spec):
        procs.stop_pid(comm, pid_file, log=_log, timeout=10)
    procs.reap_child(_REST_CHILDREN.pop(name, None))
    procs.reap_child(_DB_CHILDREN.pop(name, None))
    _end_strays(spec)


def _end_strays(spec: ClusterSpec) -> None:
    """SIGKILL this cluster's slurmstepds (their environment names its slurm.conf, as its
    slurmd's did) and every process below them."""
    mark = f"SLURM_CONF={spec.conf}".encode()
    parents: dict[int, int] = {}
    roots: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_text = (entry / "stat").read_text()
            ppid = int(stat_text.rsplit(")", 1)[1].split()[1])
            parents[int(entry.name)] = ppid
            if (entry / "comm").read_text().strip() == "slurmstepd" and mark in (
                entry / "environ"
            ).read_bytes().split(b"\0"):
                roots.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    doomed = set(roots)
    grew = True
    while grew:
        below = {pid for pid, ppid in parents.items() if ppid in doomed} - doomed
        doomed |= below
        grew = bool(below)
    if doomed:
        _log(f"ending {len(doomed)} processes {spec.name}'s nodes left behind")
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_control(name: str) -> None:
    """Stop slurmrestd and slurmctld of cluster `name` (the nodes, their running jobs and
    accounting go on): the cluster is down for its clients."""
    spec = SPECS[name]
    for comm, pid_file in _daemons(spec):
        if comm in ("slurmrestd", "slurmctld"):
            procs.stop_pid(comm, pid_file, log=_log, timeout=10)
    procs.reap_child(_REST_CHILDREN.pop(name, None))


def start_control(name: str) -> SlurmTestbed:
    """Start slurmctld again on the state it saved, and slurmrestd: the jobs it knew are
    recovered, the nodes register again."""
    spec = SPECS[name]
    _start_ctld(spec)
    _start_rest(spec)
    return _testbed(spec)


def cluster_status(name: str) -> str:
    spec = SPECS[name]
    parts = procs.states(_daemons(spec))
    ok, _ = _rest_ping(spec)
    parts.append(f"rest={'ok' if ok else 'down'}")
    return " ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("up", "down", "status"):
        print("usage: python -m tests.testbed.slurm up|down|status [22.05] [26.05]")
        return 2
    cmd, names = args[0], args[1:] or list(SPECS)
    try:
        for name in names:
            if cmd == "up":
                tb = start_cluster(name, reuse=True)
                for k, v in tb.env().items():
                    print(f"{k}={v}")
            elif cmd == "down":
                stop_cluster(name)
            else:
                print(f"{name}: {cluster_status(name)}")
    except TestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
