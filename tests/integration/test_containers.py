"""What a job's container is, proven on both Slurm releases with both real runtimes (Enroot +
Pyxis, and Apptainer): every job is rendered by the real pipeline, staged and submitted through
slurmrestd, and its command runs in the test bed's image (tests/testbed/images.sh).

- the command runs in the image (its marker and Debian release), as the job's user, never
  root; a file on the node's own filesystem is invisible; the declared mounts are at their
  targets with their modes (EROFS on the read-only one, the files written in the read-write
  one belong to the job's uid on the host); the attempt directory is read-only; no home;
- the environment inside is the rules' and nothing else: a variable planted in the batch
  environment alone never reaches the container;
- a cancel ends the container's processes and leaves no mount on the node.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import cpu_spec, wait_for_job
from tests.integration.sitefiles import site_env
from tests.testbed.handles import cancel_own
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.api.errors import parse_spec
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.pipeline import (
    PreparedAttempt,
    Site,
    prepare_attempt,
    stage,
    verify_runtime,
)
from slurmjob_operator.core.containerenv import STEP_EXPORT_NAMES
from slurmjob_operator.core.jobview import BaseState
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport

pytestmark = pytest.mark.integration

#: Planted in the batch step's environment only (the job description's), never in spec.env.
HOST_ONLY = "TESTBED_BATCH_ONLY"


@dataclass(frozen=True)
class Bed:
    testbed: SlurmTestbed
    settings: Settings
    site: Site
    namespace: str


@pytest.fixture(params=["apptainer", "enroot-pyxis"])
def profile(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def bed(slurm: SlurmTestbed, profile: str, tmp_path: Path) -> Bed:
    settings = Settings.from_env(site_env(slurm, profile, tmp_path))
    return Bed(slurm, settings, Site.load(settings), f"ct-{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def client(bed: Bed) -> AsyncIterator[SlurmClient]:
    async with open_transport(bed.settings) as session:
        yield await connect(bed.settings, session)


def _folder(bed: Bed, name: str) -> tuple[str, Path]:
    """A folder of the job user's under the storage root: (mount source, host path)."""
    source = f"{bed.namespace}/{name}"
    path = bed.testbed.storage_root / source
    path.mkdir(parents=True)
    os.chown(path.parent, bed.testbed.uid, bed.testbed.gid)
    os.chown(path, bed.testbed.uid, bed.testbed.gid)
    return source, path


def _prepare(bed: Bed, spec: dict[str, Any], client: SlurmClient) -> PreparedAttempt:
    prepared = prepare_attempt(
        parse_spec(spec),
        bed.site,
        namespace=bed.namespace,
        name="ct",
        uid=str(uuid.uuid4()),
        attempt=1,
        api_version=client.version,
        secret_values={"TOKEN": "s3cret"},
    )
    prepared.rendered.launch.environment[HOST_ONLY] = "planted"
    verify_runtime(prepared, bed.settings)
    stage(prepared, bed.settings)
    return prepared


#: What the command reports of its container, one `key=value` line each, then its environment
#: (NUL-separated) in the read-write mount.
LOOK = r"""
. /etc/os-release
echo "marker=$(cat /etc/slurmjob-testbed-image)"
echo "codename=$VERSION_CODENAME"
echo "ids=$(id -u):$(id -g)"
echo "pwd=$(pwd)"
echo written > /rw/by-the-job
touch /ro/x 2>/tmp/ro.err; echo "ro-write=$? $(cat /tmp/ro.err)"
touch "$SLURMJOB_STAGING_DIR/x" 2>/tmp/st.err; echo "staging-write=$? $(cat /tmp/st.err)"
echo "staging-job-sh=$(test -r "$SLURMJOB_STAGING_DIR/job.sh" && echo readable)"
echo "node-file=$(test -e "$1" && echo visible || echo invisible)"
echo "records=$(test -e /srv/slurmjob-testbed/records && echo visible || echo invisible)"
echo "home=${HOME:-unset} $(ls -A "${HOME:-/nonexistent}" 2>/dev/null | head -3 | tr '\n' ' ')"
env -0 > /rw/env.bin
"""


def _lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


async def test_what_the_container_sees(bed: Bed, client: SlurmClient) -> None:
    ro_source, ro_path = _folder(bed, "ro")
    rw_source, rw_path = _folder(bed, "rw")
    (ro_path / "given.txt").write_text("given\n")
    node_file = bed.testbed.storage_root / bed.namespace / "node-only.txt"
    node_file.write_text("on the node's filesystem, not mounted\n")
    spec = cpu_spec(
        ["bash", "-c", LOOK, "look", str(node_file)],
        bed.settings.slurm_runtime_profile,
        mounts=[
            {"source": ro_source, "target": "/ro", "readOnly": True},
            {"source": rw_source, "target": "/rw"},
        ],
        workingDir="/ro",
        env=[
            {"name": "GREETING", "value": "hello"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
    )
    prepared = _prepare(bed, spec, client)
    receipt = await client.submit(prepared.rendered.launch)
    [job] = await wait_for_job(client, receipt.job_id, final=True, within=90)
    staging = prepared.rendered.staging_dir
    out = (staging / "stdout.log").read_text()
    assert job.base_state is BaseState.COMPLETED, (out, (staging / "stderr.log").read_text())
    seen = _lines(out)
    assert seen["marker"].startswith("slurmjob-testbed-image name=base "), out
    assert seen["codename"] == "trixie", out  # neither the host's bookworm nor forky
    tb = bed.testbed
    assert seen["ids"] == f"{tb.uid}:{tb.gid}", out
    assert tb.uid != 0
    assert seen["pwd"] == "/ro", out
    assert seen["ro-write"].startswith("1 "), out
    assert "Read-only file system" in seen["ro-write"], out
    assert seen["staging-write"].startswith("1 "), out
    assert "Read-only file system" in seen["staging-write"], out
    assert seen["staging-job-sh"] == "readable", out
    assert seen["node-file"] == "invisible", out
    assert seen["records"] == "invisible", out
    written = rw_path / "by-the-job"
    assert written.read_text() == "written\n"
    assert (written.stat().st_uid, written.stat().st_gid) == (tb.uid, tb.gid)
    # No home: the job user's home here is the storage root itself, and none of it shows.
    home = seen["home"]
    # (What shows there is the skeleton of the attempt directory's mount point.)
    assert "runtimes" not in home, out
    assert not (staging / "secrets.env").exists()
    _check_environment(bed, (rw_path / "env.bin").read_bytes(), spec)


#: What the test bed's runtimes add to a container's environment (docs/security.md, "What a
#: container sees"): names, and prefixes. On Slurm 22.05 Pyxis' own options show as
#: _SLURM_SPANK_OPTION_pyxis_* (26.05 keeps them out of the task's environment).
RUNTIME_ADDS = {
    "enroot-pyxis": {"HOME", "LOGNAME", "PWD", "SHELL", "SHLVL", "TERM", "USER", "_"},
    "apptainer": {"HOME", "PROMPT_COMMAND", "PWD", "SHLVL", "USER_PATH", "_"},
}
RUNTIME_PREFIXES = {
    "enroot-pyxis": ("_SLURM_SPANK_OPTION_pyxis_",),
    "apptainer": ("APPTAINER_", "SINGULARITY_"),
}
#: The image's own environment (Debian's minbase sets none but PATH).
IMAGE_SETS = {"PATH"}
#: Slurm's own: SLURM_*, SLURMD_* and the job's TMPDIR (slurmstepd's).
SLURM_SETS = {"TMPDIR"}
SLURM_PREFIXES = ("SLURM_", "SLURMD_")
#: The operator's documented variables (core.containerenv.STEP_EXPORT_NAMES, SLURMJOB_*).
OPERATOR_PREFIXES = ("SLURMJOB_",)
GPU_VISIBILITY = {"CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES"}


def _check_environment(bed: Bed, env_bytes: bytes, spec: dict[str, Any]) -> None:
    env = dict(item.split("=", 1) for item in env_bytes.decode().split("\0") if "=" in item)
    profile = bed.settings.slurm_runtime_profile
    assert env["GREETING"] == "hello"
    assert env["TOKEN"] == "s3cret"
    assert HOST_ONLY not in env, sorted(env)
    allowed = (
        {e["name"] for e in spec["env"]}
        | RUNTIME_ADDS[profile]
        | IMAGE_SETS
        | SLURM_SETS
        | set(STEP_EXPORT_NAMES)
        | GPU_VISIBILITY
    )
    prefixes = RUNTIME_PREFIXES[profile] + SLURM_PREFIXES + OPERATOR_PREFIXES
    unexplained = sorted(
        name for name in env if name not in allowed and not name.startswith(prefixes)
    )
    assert unexplained == [], {name: env[name] for name in unexplained}


def _job_processes(cluster: str, job_id: int) -> list[int]:
    """Processes on this machine whose environment names the job (its steps' tasks and
    whatever runs in their containers)."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_CLUSTER_NAME={cluster}".encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= environ:
            found.append(int(entry.name))
    return found


def _commands(pids: list[int]) -> list[bytes]:
    found = []
    for pid in pids:
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            continue
    return found


def _runtime_mounts() -> list[str]:
    """The host's mounts of a runtime (Enroot's per-user directories, Apptainer's session
    directory, a squashfuse of an image): none is left once a job's containers are gone."""
    marks = ("fuse", "slurmjob-enroot", "apptainer")
    lines = Path("/proc/mounts").read_text().splitlines()
    return [line for line in lines if any(mark in line for mark in marks)]


async def test_a_cancel_leaves_nothing_on_the_node(bed: Bed, client: SlurmClient) -> None:
    tb = bed.testbed
    mounts_before = _runtime_mounts()
    spec = cpu_spec(
        ["bash", "-c", "echo started; exec sleep 300"], bed.settings.slurm_runtime_profile
    )
    prepared = _prepare(bed, spec, client)
    receipt = await client.submit(prepared.rendered.launch)
    stdout = prepared.rendered.staging_dir / "stdout.log"
    for _ in range(300):
        if stdout.exists() and "started" in stdout.read_text():
            break
        await asyncio.sleep(0.1)
    assert "started" in stdout.read_text()
    assert _job_processes(tb.cluster_name, receipt.job_id), "the container's processes"
    await cancel_own(client, receipt.job_id)
    [job] = await wait_for_job(client, receipt.job_id, final=True, within=60)
    assert job.base_state is BaseState.CANCELLED
    left: list[int] = []
    for _ in range(100):
        left = _job_processes(tb.cluster_name, receipt.job_id)
        if not left:
            break
        await asyncio.sleep(0.1)
    assert left == [], _commands(left)
    assert _runtime_mounts() == mounts_before
    root = tb.chroot or Path("/")
    enroot_run = root / "var/lib/slurmjob-enroot" / str(tb.uid) / "run"
    assert not enroot_run.exists() or list(enroot_run.iterdir()) == []
