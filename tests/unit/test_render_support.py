"""Builders and stand-ins shared by the render, preflight and staging tests (no tests here).

`run_attempt` stages a rendered attempt and runs its batch script with bash, with fake `srun`
and `scontrol` in the first directory of the job's PATH (the script sets the PATH rendered from
`Settings.slurm_job_path` itself; `stand_in_settings` makes one whose first directory is the
test's own). The fake srun writes its argv (NUL-separated) and environment (`env -0`) to a log
directory and exits (a leading `--export=` is applied when the record is read, as srun applies
it to the step's environment); a step ending in `--block` (a Ray node) sleeps until the script
stops it; the Ray head's step marks its head ready as the real wrapper does once `ray
health-check` answers (not with `FAKE_HEALTH_FAILS`).
The fake scontrol, a host tool the script runs after it has read the env files, records its
environment too (`Run.host_envs`). Artifacts are real small files with the right magic, so the
script's verification (dd, tr, sha256sum) runs for real.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.config import RuntimeProfile, Settings
from slurmjob_operator.site.artifacts import CachedImage
from slurmjob_operator.site.catalogs import ArtifactFormat, GpuSeries, RuntimeArtifact
from slurmjob_operator.site.render import RenderContext, RenderedAttempt
from slurmjob_operator.storage.staging import stage_attempt

UID = "3f2a9c1e-7b4d-4e8a-9c21-5d6e7f809a1b"
SERIES = {
    "h100": GpuSeries(name="h100", slurm_constraint="h100", gpus_per_node=8),
    "a100": GpuSeries(name="a100", slurm_constraint="a100&ib", gpus_per_node=4),
}

#: Bash: what the Ray head's wrapper (`sh -c WRAPPER sh READY_FILE ADDRESS ...`) does once its
#: head answers, for a fake srun given the step's argv: it creates READY_FILE.
MARK_HEAD_READY = r"""
mark_head_ready() {
  local -a args=("$@")
  local i
  for ((i = 0; i + 3 < ${#args[@]}; i++)); do
    [[ ${args[i]} == -c && ${args[i + 1]} == *health-check* ]] && : >"${args[i + 3]}"
  done
  return 0
}
"""

FAKE_SRUN = (
    r"""#!/bin/bash
"""
    + MARK_HEAD_READY
    + r"""log=$(mktemp "$FAKE_LOG_DIR/srun.XXXXXX")
# Renamed into place once complete: the script may stop a background step at any moment, and a
# half-written record must never be read as the step's argv.
env -0 >"$log.env.part" && mv "$log.env.part" "$log.env"
printf '%s\0' "$@" >"$log.argv.part" && mv "$log.argv.part" "$log.argv"
last=${*: -1}
if [[ $last == --block ]]; then
  if [[ -n ${FAKE_HEAD_DIES:-} ]]; then
    exit 1
  fi
  [[ -n ${FAKE_HEALTH_FAILS:-} ]] || mark_head_ready "$@"
  exec sleep 60
fi
sleep "${FAKE_COMMAND_SLEEP:-0}"  # lets background steps record themselves first
exit "${FAKE_SRUN_EXIT:-0}"
"""
)

FAKE_SCONTROL = r"""#!/bin/bash
env -0 >"$(mktemp "$FAKE_LOG_DIR/scontrol.XXXXXX")"
[[ $1 == show && $2 == hostnames ]] || exit 2
[[ -n ${3:-} ]] || exit 1
tr ',' '\n' <<<"$3"
if [[ -n ${FAKE_SCONTROL_LINGER:-} ]]; then
  exec >&-  # its output is complete; the process itself ends later (as a slow one may)
  sleep "$FAKE_SCONTROL_LINGER"
fi
"""


SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def stand_in_settings(tmp: Path, **overrides: Any) -> Settings:
    """Settings for running scripts: storage root `tmp/root`, job PATH `tmp/bin` first."""
    root = tmp / "root"
    root.mkdir(parents=True, exist_ok=True)
    values: dict[str, Any] = {
        "storage_root": root,
        "slurm_job_path": f"{tmp / 'bin'}:{SYSTEM_PATH}",
        **overrides,
    }
    return Settings(**values)


def stand_in_dir(settings: Settings) -> Path:
    """Where the fakes go: the first directory of the job's PATH, a test's own directory."""
    first = Path(settings.slurm_job_path.split(":")[0])
    if not first.is_relative_to(settings.storage_root.parent):
        raise ValueError(f"{first} is not a test directory: use stand_in_settings")
    return first


def apptainer_reads(handed: str) -> str:
    """What a program in an Apptainer container sees for a value handed to Apptainer as
    ``handed`` (APPTAINERENV_<NAME>), for the values core.containerenv produces: the model of
    what the test bed's real Apptainer 1.5.3 did (tests/integration/test_containers.py runs
    values through it): a double-quoted shell string's escapes of backslash, dollar and
    backquote, and one carriage return dropped before each line feed. An unescaped $ or
    backquote would be expanded: the model refuses it."""
    handed = handed.replace("\r\n", "\n")
    out: list[str] = []
    i = 0
    while i < len(handed):
        c = handed[i]
        if c == "\\" and i + 1 < len(handed) and handed[i + 1] in "\\$`":
            out.append(handed[i + 1])
            i += 2
            continue
        assert c not in "$`", f"unescaped {c!r} would be expanded in {handed!r}"
        out.append(c)
        i += 1
    return "".join(out)


def user_env(step: Step, profile: RuntimeProfile) -> dict[str, str]:
    """The variables a step hands to the container, as the program inside sees them: for
    apptainer, APPTAINERENV_<NAME> as Apptainer reads it."""
    if profile is RuntimeProfile.APPTAINER:
        prefix = "APPTAINERENV_"
        return {
            k[len(prefix) :]: apptainer_reads(v)
            for k, v in step.env.items()
            if k.startswith(prefix)
        }
    return step.env


def profile_format(profile: RuntimeProfile) -> ArtifactFormat:
    return ArtifactFormat.SQSH if profile is RuntimeProfile.ENROOT_PYXIS else ArtifactFormat.SIF


def artifact_bytes(fmt: ArtifactFormat, payload: bytes = b"payload") -> bytes:
    if fmt is ArtifactFormat.SQSH:
        return b"hsqs" + payload
    return b"#!/usr/bin/env run-singularity\n\0" + b"SIF_MAGIC\0" + payload


def write_artifact(
    settings: Settings, fmt: ArtifactFormat, content: bytes | None = None
) -> RuntimeArtifact:
    data = artifact_bytes(fmt) if content is None else content
    path = f"runtimes/custom-test.{fmt.value}"
    target = settings.storage_root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return RuntimeArtifact(
        id="custom-test", format=fmt, path=path, sha256=hashlib.sha256(data).hexdigest()
    )


def fixed_artifact(fmt: ArtifactFormat) -> RuntimeArtifact:
    return RuntimeArtifact(
        id="custom-test",
        format=fmt,
        path=f"runtimes/custom-test.{fmt.value}",
        sha256=hashlib.sha256(artifact_bytes(fmt)).hexdigest(),
    )


def pools_for(shape: str) -> list[dict[str, Any]]:
    if shape == "cpu":
        return [{"name": "main", "cpus": 4, "memoryGb": 8}]
    if shape == "gpu":
        return [
            {
                "name": "train",
                "nodes": 2,
                "gpusPerNode": 8,
                "gpuSeries": "h100",
                "cpus": 64,
                "memoryGb": 512,
            }
        ]
    if shape == "het":
        return [
            {
                "name": "learner",
                "nodes": 2,
                "gpusPerNode": 8,
                "gpuSeries": "h100",
                "cpus": 64,
                "memoryGb": 512,
            },
            {
                "name": "rollout",
                "nodes": 3,
                "gpusPerNode": 4,
                "gpuSeries": "a100",
                "cpus": 32,
                "memoryGb": 256,
            },
        ]
    raise ValueError(shape)


def make_spec(
    shape: str,
    command: Sequence[str] = ("python", "train.py", "--epochs", "3"),
    env: Sequence[Mapping[str, Any]] | None = None,
    mounts: Sequence[Mapping[str, Any]] | None = None,
    working_dir: str | None = "/workspace",
    pools: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> SlurmJobSpec:
    if env is None:
        env = [
            {"name": "EPOCHS", "value": "3"},
            {"name": "GREETING", "value": "it's $HOME `x`"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        ]
    if mounts is None:
        mounts = [
            {"source": "datasets/imagenet", "target": "/data", "readOnly": True},
            {"source": "results/run-1", "target": "/results"},
        ]
    body: dict[str, Any] = {
        "framework": {"kind": "custom", "name": "custom", "runtimeId": "custom-test"},
        "command": list(command),
        "env": list(env),
        "mounts": list(mounts),
        "pools": pools if pools is not None else pools_for(shape),
        **extra,
    }
    if working_dir is not None:
        body["workingDir"] = working_dir
    return SlurmJobSpec.model_validate(body)


def make_context(
    spec: SlurmJobSpec,
    settings: Settings,
    artifact: RuntimeArtifact | CachedImage,
    secret_values: Mapping[str, str] | None = None,
    namespace: str = "team-a",
    name: str = "resnet",
    uid: str = UID,
    attempt: int = 1,
    partition: str | None = "gpu",
    exclusive: Mapping[str, bool] | None = None,
) -> RenderContext:
    if secret_values is None:
        secret_values = {e.name: f"secret-{e.name.lower()}-value" for e in spec.secret_env}
    return RenderContext(
        namespace=namespace,
        name=name,
        uid=uid,
        attempt=attempt,
        artifact=artifact,
        gpu_series={p.name: SERIES.get(p.gpu_series or "") for p in spec.pools},
        exclusive=exclusive if exclusive is not None else {},
        partition=partition,
        settings=settings,
        secret_values=secret_values,
    )


@dataclass
class Step:
    argv: list[str]
    env: dict[str, str]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    steps: list[Step]
    host_envs: list[dict[str, str]]
    """The environments of the fake scontrol runs (host tools the script runs itself)."""


def _read_env(raw: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            key, _, value = item.partition(b"=")
            env[key.decode()] = value.decode("utf-8", "surrogateescape")
    return env


def _read_steps(log_dir: Path) -> list[Step]:
    steps = []
    for argv_file in sorted(log_dir.glob("srun.*.argv"), key=lambda p: p.stat().st_mtime_ns):
        raw_argv = argv_file.read_bytes()
        argv = [a.decode("utf-8", "surrogateescape") for a in raw_argv.split(b"\0")[:-1]]
        env_file = argv_file.with_suffix(".env")
        # A background step stopped early may have no env file yet.
        env = _read_env(env_file.read_bytes()) if env_file.exists() else {}
        steps.append(_exported(argv, env))
    return steps


def _exported(argv: list[str], env: dict[str, str]) -> Step:
    """What the step gets, as srun gives it: with a leading `--export=NAMES`, only those names
    and Slurm's own SLURM_* (and SLURMD_NODENAME, which slurmstepd sets) of srun's
    environment; the option itself is srun's, not the step's."""
    if not argv or not argv[0].startswith("--export="):
        return Step(argv, env)
    names = set(argv[0].removeprefix("--export=").split(","))
    kept = {
        k: v
        for k, v in env.items()
        if k in names or k.startswith("SLURM_") or k == "SLURMD_NODENAME"
    }
    return Step(argv[1:], kept)


def run_attempt(
    rendered: RenderedAttempt,
    settings: Settings,
    work: Path,
    nodes: Sequence[Sequence[str]] = (("n1", "n2"),),
    extra_env: Mapping[str, str] | None = None,
    stage: bool = True,
) -> Run:
    """Stage the attempt below settings.storage_root and run its script like slurmd would."""
    if stage:
        stage_attempt(settings, rendered.staging_dir, rendered.files)
    bin_dir = stand_in_dir(settings)
    log_dir = work / "log"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(rendered.launch.environment)
    env.update(
        {
            "FAKE_LOG_DIR": str(log_dir),
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": rendered.launch.job_name,
            "SLURM_JOB_NODELIST": ",".join(nodes[0]),
            "SLURM_NNODES": str(len(nodes[0])),
            "SLURM_SUBMIT_DIR": rendered.launch.working_directory,
            "SLURMD_NODENAME": nodes[0][0],
        }
    )
    if len(nodes) > 1:
        env["SLURM_HET_SIZE"] = str(len(nodes))
        for i, group in enumerate(nodes):
            env[f"SLURM_JOB_NODELIST_HET_GROUP_{i}"] = ",".join(group)
            env[f"SLURM_JOB_ID_HET_GROUP_{i}"] = str(4242 + i)
    env.update(extra_env or {})
    result = subprocess.run(
        ["bash", str(rendered.staging_dir / "job.sh")],
        cwd=rendered.launch.working_directory,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    return Run(
        returncode=result.returncode,
        stdout=result.stdout.decode("utf-8", "replace"),
        stderr=result.stderr.decode("utf-8", "replace"),
        steps=_read_steps(log_dir),
        host_envs=[_read_env(p.read_bytes()) for p in sorted(log_dir.glob("scontrol.*"))],
    )


def command_step(run: Run, command: Sequence[str]) -> Step:
    """The srun invocation that ran the user command (its argv ends with the command)."""
    matches = [s for s in run.steps if s.argv[len(s.argv) - len(command) :] == list(command)]
    assert matches, f"no srun step ran the command; steps: {[s.argv for s in run.steps]}"
    return matches[-1]
