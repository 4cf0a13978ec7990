"""Rendering: golden scripts and LaunchRequests, shell checks, structure and refusals.

`UPDATE_GOLDEN=1 pytest tests/unit/test_render.py` rewrites the golden files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import jinja2
import pytest

from slurmjob_operator.api.spec import EnvVar, Mount
from slurmjob_operator.config import RuntimeProfile, Settings
from slurmjob_operator.core import naming
from slurmjob_operator.core.probe import ProbePlan
from slurmjob_operator.site.catalogs import ArtifactFormat, CollectiveProbe, GpuSeries
from slurmjob_operator.site.preflight import find_shellcheck, shellcheck_script
from slurmjob_operator.site.render import render_attempt
from slurmjob_operator.site.templating import RenderError, environment, shquote
from slurmjob_operator.storage.staging import stage_attempt

from .test_render_support import (
    MARK_HEAD_READY,
    UID,
    command_step,
    fixed_artifact,
    make_context,
    make_spec,
    pools_for,
    profile_format,
    run_attempt,
    stand_in_settings,
    user_env,
    write_artifact,
)

GOLDEN = Path(__file__).parent / "golden"
PROFILES = [RuntimeProfile.ENROOT_PYXIS, RuntimeProfile.APPTAINER]
SHAPES = ["cpu", "gpu", "het"]
CASES = [(p, s) for s in SHAPES for p in PROFILES]
# "array": the cpu job as a 20-task array (its script differs from the cpu job's only there).
# The launch shapes (spec.launch) other than the default: on the gpu job, the het job, and
# tasks on the gpu job (2 per node, pmi2) and on the cpu job (2 on its node).
LAUNCH_SHAPES: dict[str, tuple[str, dict[str, Any], int | None]] = {
    "nodes": ("gpu", {"shape": "nodes"}, None),
    "torchrun-het": ("het", {"shape": "torchrun", "masterPort": 29600}, None),
    "tasks": ("gpu", {"shape": "tasks", "mpi": "pmi2"}, 2),
    "tasks-cpu": ("cpu", {"shape": "tasks"}, 2),
}
# The collective probe (issue 26, part 2): a ladder of two rungs after the plain run, on the
# gpu job and the het job (whose series set a least bus bandwidth), and on the gpu job with a
# rung from the cache and two nodes the tenant avoids.
PROBE = CollectiveProbe(
    command=["all_reduce_perf", "-b", "8M", "-e", "128M"],
    timeout_seconds=90,
    ladder=[{"NCCL_P2P_DISABLE": "1"}, {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}],
)
PROBE_SHAPES: dict[str, tuple[str, ProbePlan | None]] = {
    "probe": ("gpu", None),
    "probe-het": ("het", None),
    "probe-cached": ("gpu", ProbePlan(cached_rung=1, exclude=("gpu-a7", "gpu-b2"))),
}
GOLDEN_CASES = [
    *CASES,
    *((p, "array") for p in PROFILES),
    *((p, s) for s in LAUNCH_SHAPES for p in PROFILES),
    *((p, s) for s in PROBE_SHAPES for p in PROFILES),
]


def golden_settings(profile: RuntimeProfile) -> Settings:
    return Settings(
        storage_root=Path("/srv/slurmjob"),
        slurm_storage_root=Path("/lustre/slurmjob"),
        slurm_runtime_profile=profile,
    )


def golden_render(profile: RuntimeProfile, shape: str) -> Any:
    settings = golden_settings(profile)
    array = shape == "array"
    artifact = fixed_artifact(profile_format(profile))
    plan: ProbePlan | None = None
    if shape in PROBE_SHAPES:
        shape, plan = PROBE_SHAPES[shape]
        artifact = artifact.model_copy(update={"probe": PROBE})
    launch: dict[str, Any] = {}
    if shape in LAUNCH_SHAPES:
        shape, launch_spec, tasks = LAUNCH_SHAPES[shape]
        pools = pools_for(shape)
        for pool in pools if tasks else ():
            pool["tasksPerNode"] = tasks
        launch = {"launch": launch_spec, "pools": pools}
    cpu = shape in ("cpu", "array")
    spec = make_spec(
        "cpu" if array else shape,
        **launch,
        account="ml",
        qos="normal",
        timeLimit="4h",
        partition="cpu" if cpu else None,
        **({"array": {"count": 20, "parallelism": 3}} if array else {}),
    )
    ctx = make_context(
        spec,
        settings,
        artifact,
        partition="cpu" if cpu else "gpu",
        exclusive={"learner": True} if shape == "het" else {},
    )
    if artifact.probe is not None:
        floors = {
            pool: series.model_copy(update={"min_bus_bandwidth": 40.0 + i})
            for i, (pool, series) in enumerate(ctx.gpu_series.items())
            if series is not None
        }
        ctx = dataclasses.replace(ctx, probe=plan, gpu_series=floors)
    return render_attempt(spec, ctx)


def golden_json(rendered: Any) -> str:
    launch = rendered.launch.model_dump(mode="json")
    launch["script"] = "<see the .sh golden file>"
    if launch["array"] is None:  # the field is younger than the golden files of plain jobs
        del launch["array"]
    if not launch["excluded_nodes"]:  # as is this one
        del launch["excluded_nodes"]
    files = {
        name: {
            "mode": oct(staged.mode),
            "content": "<redacted>" if name == "secrets.env" else staged.content.decode(),
        }
        for name, staged in sorted(rendered.files.items())
        if name != "job.sh"
    }
    return json.dumps({"launch": launch, "files": files}, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize(("profile", "shape"), GOLDEN_CASES)
def test_golden(profile: RuntimeProfile, shape: str) -> None:
    rendered = golden_render(profile, shape)
    stem = f"{shape}-{profile.value}"
    outputs = {
        GOLDEN / f"{stem}.sh": rendered.launch.script,
        GOLDEN / f"{stem}.json": golden_json(rendered),
    }
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        for path, text in outputs.items():
            path.write_text(text, encoding="utf-8")
    for path, text in outputs.items():
        assert path.exists(), f"{path} is missing: run with UPDATE_GOLDEN=1"
        assert text == path.read_text(encoding="utf-8"), f"{path} differs (UPDATE_GOLDEN=1)"


@pytest.mark.parametrize(("profile", "shape"), GOLDEN_CASES)
def test_golden_script_parses(profile: RuntimeProfile, shape: str) -> None:
    script = golden_render(profile, shape).launch.script
    result = subprocess.run(["bash", "-n"], input=script.encode(), capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


@pytest.mark.skipif(find_shellcheck() is None, reason="shellcheck is not installed")
@pytest.mark.parametrize(("profile", "shape"), GOLDEN_CASES)
def test_golden_script_shellcheck(profile: RuntimeProfile, shape: str) -> None:
    script = golden_render(profile, shape).launch.script
    assert shellcheck_script(script, severity="warning") == []


@pytest.mark.parametrize(("profile", "shape"), CASES)
def test_no_sbatch_lines_and_every_option_in_the_request(
    profile: RuntimeProfile, shape: str
) -> None:
    rendered = golden_render(profile, shape)
    launch = rendered.launch
    assert not [line for line in launch.script.splitlines() if line.startswith("#SBATCH")]
    assert launch.script.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in launch.script
    assert launch.time_limit_minutes == 240
    assert launch.account == "ml"
    assert launch.qos == "normal"
    assert launch.partition == ("cpu" if shape == "cpu" else "gpu")
    cluster_dir = "/lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1"
    assert launch.working_directory == cluster_dir
    assert launch.standard_output == f"{cluster_dir}/stdout.log"
    assert launch.standard_error == f"{cluster_dir}/stderr.log"
    assert launch.environment == {
        "PATH": Settings().slurm_job_path,
        "SLURMJOB_NAMESPACE": "team-a",
        "SLURMJOB_NAME": "resnet",
        "SLURMJOB_UID": UID,
        "SLURMJOB_ATTEMPT": "1",
        "SLURMJOB_STAGING_DIR": cluster_dir,
    }
    assert launch.job_name == naming.job_name("team-a", "resnet", UID, 1)
    assert naming.parse_comment(launch.comment) == naming.JobIdentity("team-a", "resnet", UID, 1)
    assert rendered.staging_dir == Path("/srv/slurmjob/team-a/resnet-3f2a9c1e/attempt-1")


def test_components() -> None:
    het = golden_render(RuntimeProfile.ENROOT_PYXIS, "het").launch
    assert [c.model_dump() for c in het.components] == [
        {
            "pool": "learner",
            "nodes": 2,
            "tasks_per_node": 1,
            "cpus_per_task": 64,
            "memory_mb": 512 * 1024,
            "gpus_per_node": 8,
            "constraints": "h100",
            "exclusive": True,
        },
        {
            "pool": "rollout",
            "nodes": 3,
            "tasks_per_node": 1,
            "cpus_per_task": 32,
            "memory_mb": 256 * 1024,
            "gpus_per_node": 4,
            "constraints": "a100&ib",
            "exclusive": False,
        },
    ]
    cpu = golden_render(RuntimeProfile.APPTAINER, "cpu").launch
    assert [c.model_dump() for c in cpu.components] == [
        {
            "pool": "main",
            "nodes": 1,
            "tasks_per_node": 1,
            "cpus_per_task": 4,
            "memory_mb": 8192,
            "gpus_per_node": 0,
            "constraints": None,
            "exclusive": False,
        }
    ]


def test_cpu_job_has_no_ray_and_no_gpu() -> None:
    for profile in PROFILES:
        script = golden_render(profile, "cpu").launch.script
        assert "ray" not in script
        assert "--nv" not in script
        assert "het-group" not in script
    assert (
        "apptainer --quiet exec --no-home --contain --nv"
        in golden_render(RuntimeProfile.APPTAINER, "gpu").launch.script
    )


def test_files_and_modes() -> None:
    rendered = golden_render(RuntimeProfile.ENROOT_PYXIS, "gpu")
    assert {n: f.mode for n, f in rendered.files.items()} == {
        "job.sh": 0o555,
        "job.env": 0o444,
        "secrets.env": 0o600,
    }
    assert rendered.files["job.sh"].content.decode() == rendered.launch.script
    # Data for `mapfile -d ''`, not shell: the value as it is, each record ending in NUL.
    assert rendered.files["job.env"].content == b"EPOCHS=3\0GREETING=it's $HOME `x`\0"
    assert rendered.files["secrets.env"].content == b"HF_TOKEN=secret-hf_token-value\0"
    assert "secret-hf_token-value" not in repr(rendered)


def test_no_secrets_file_without_secret_env() -> None:
    settings = golden_settings(RuntimeProfile.ENROOT_PYXIS)
    spec = make_spec("cpu", env=[{"name": "A", "value": "1"}])
    rendered = render_attempt(
        spec, make_context(spec, settings, fixed_artifact(ArtifactFormat.SQSH))
    )
    assert set(rendered.files) == {"job.sh", "job.env"}
    assert "read_env_file secrets.env" not in rendered.launch.script
    assert "secrets.env ]]" not in rendered.launch.script


def test_staging_translation_and_mounts() -> None:
    script = golden_render(RuntimeProfile.ENROOT_PYXIS, "cpu").launch.script
    staging = "/lustre/slurmjob/team-a/resnet-3f2a9c1e/attempt-1"
    assert (
        "--container-mounts=/lustre/slurmjob/datasets/imagenet:/data:ro,"
        f"/lustre/slurmjob/results/run-1:/results,{staging}:{staging}:ro"
    ) in script
    assert "--container-image=/lustre/slurmjob/runtimes/custom-test.sqsh" in script
    assert "--container-workdir=/workspace" in script
    assert "--container-env=EPOCHS,GREETING,HF_TOKEN" in script
    assert "/srv/slurmjob" not in script


def test_wrong_artifact_format_is_refused() -> None:
    settings = golden_settings(RuntimeProfile.APPTAINER)
    spec = make_spec("cpu")
    ctx = make_context(spec, settings, fixed_artifact(ArtifactFormat.SQSH))
    with pytest.raises(RenderError, match="sqsh artifact"):
        render_attempt(spec, ctx)


def test_het_job_without_constraint_is_refused() -> None:
    settings = golden_settings(RuntimeProfile.ENROOT_PYXIS)
    spec = make_spec("het")
    ctx = make_context(spec, settings, fixed_artifact(ArtifactFormat.SQSH))
    loose = GpuSeries(name="a100", slurm_constraint=None, gpus_per_node=4)
    ctx = type(ctx)(**{**ctx.__dict__, "gpu_series": {"learner": loose, "rollout": loose}})
    with pytest.raises(RenderError, match="constraint"):
        render_attempt(spec, ctx)


def test_unresolved_secret_is_refused() -> None:
    settings = golden_settings(RuntimeProfile.ENROOT_PYXIS)
    spec = make_spec("cpu")
    ctx = make_context(spec, settings, fixed_artifact(ArtifactFormat.SQSH), secret_values={})
    with pytest.raises(RenderError, match="HF_TOKEN"):
        render_attempt(spec, ctx)


def test_reserved_env_name_is_refused_even_without_validation() -> None:
    """A spec that skipped validation (model_copy does not validate) still cannot reach a
    script: render checks the rules of api.scriptwords again."""
    settings = golden_settings(RuntimeProfile.ENROOT_PYXIS)
    spec = make_spec("cpu", env=[{"name": "A", "value": "x"}])
    for name in ("SHELLOPTS", "PATH", "LD_PRELOAD"):
        bad = spec.model_copy(update={"env": [EnvVar.model_construct(name=name, value="x")]})
        with pytest.raises(RenderError, match=name):
            render_attempt(bad, make_context(bad, settings, fixed_artifact(ArtifactFormat.SQSH)))


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"command": ["--container-mounts=/:/host", "bash"]}, "starts with '-'"),
        ({"command": ["bash", ":", "x"]}, "command\\[1\\] is ':'"),
        ({"working_dir": "/w$(id)"}, "may only use"),
    ],
)
def test_unsafe_words_are_refused_even_without_validation(
    update: dict[str, Any], message: str
) -> None:
    settings = golden_settings(RuntimeProfile.ENROOT_PYXIS)
    bad = make_spec("cpu").model_copy(update=update)
    with pytest.raises(RenderError, match=message):
        render_attempt(bad, make_context(bad, settings, fixed_artifact(ArtifactFormat.SQSH)))


def test_unsafe_mount_is_refused_even_without_validation() -> None:
    settings = golden_settings(RuntimeProfile.ENROOT_PYXIS)
    spec = make_spec("cpu")
    mount = Mount.model_construct(source="data", target="/data$(id>/tmp/x)", read_only=False)
    bad = spec.model_copy(update={"mounts": [mount]})
    with pytest.raises(RenderError, match="may only use"):
        render_attempt(bad, make_context(bad, settings, fixed_artifact(ArtifactFormat.SQSH)))


def test_mount_separator_in_storage_root_is_refused() -> None:
    settings = Settings(storage_root=Path("/srv/a,b"))
    spec = make_spec("cpu")
    with pytest.raises(RenderError, match="mount path"):
        render_attempt(spec, make_context(spec, settings, fixed_artifact(ArtifactFormat.SQSH)))


def test_unquoted_interpolation_is_refused(tmp_path: Path) -> None:
    (tmp_path / "job.sh.j2").write_text("#!/bin/bash\necho {{ staging_dir }}\n")
    settings = Settings(templates_dir=tmp_path)
    spec = make_spec("cpu")
    with pytest.raises(RenderError, match="unquoted"):
        render_attempt(spec, make_context(spec, settings, fixed_artifact(ArtifactFormat.SQSH)))


def test_site_templates_override_single_parts(tmp_path: Path) -> None:
    (tmp_path / "shape").mkdir()
    (tmp_path / "shape" / "cpu.sh.j2").write_text("echo site-cpu {{ user_command | shjoin }}\n")
    settings = Settings(templates_dir=tmp_path)
    spec = make_spec("cpu", command=["echo", "a b"])
    rendered = render_attempt(
        spec, make_context(spec, settings, fixed_artifact(ArtifactFormat.SQSH))
    )
    assert "echo site-cpu echo 'a b'\n" in rendered.launch.script
    assert "set -euo pipefail" in rendered.launch.script


def test_strict_undefined() -> None:
    env = environment(Settings())
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ nope | shquote }}").render()


@pytest.mark.parametrize(
    "word",
    ["=", "A=$(touch pwned)", "X=`id`;rm -rf /", "LR=0.1 --x", "a=b\nc", "B=${HOME}", "C='q'"],
)
def test_an_assignment_like_word_a_tenant_wrote_reaches_bash_as_itself(
    word: str, tmp_path: Path
) -> None:
    """Inside the script's arrays as in a plain command: bash reads back the very word,
    expands nothing and runs nothing (no file appears)."""
    script = (
        f'cd {shquote(str(tmp_path))}\nwords=(\n  {shquote(word)}\n)\nprintf %s "${{words[0]}}"'
    )
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == word
    assert list(tmp_path.iterdir()) == []


def test_shquote() -> None:
    assert shquote("plain") == "plain"
    assert shquote(3) == "3"
    assert shquote("a b") == "'a b'"
    assert shquote("it's") == "'it'\"'\"'s'"
    # Words an array would show as a mistaken index assignment (shellcheck SC2191) are quoted;
    # an option with a value is not.
    assert shquote("=") == "'='"
    assert shquote("LR=0.1") == "'LR=0.1'"
    assert shquote("--lr=0.1") == "--lr=0.1"
    # bash's reserved words too (shellcheck's SC1010 reads a bare `then` as syntax).
    assert shquote("then") == "'then'"
    assert shquote("done") == "'done'"
    with pytest.raises(RenderError):
        shquote("nul\0")
    with pytest.raises(RenderError):
        shquote(True)
    with pytest.raises(RenderError):
        shquote(None)


# --- the script run against stand-ins -------------------------------------------------------


@pytest.mark.parametrize(("profile", "shape"), CASES)
def test_script_runs(tmp_path: Path, profile: RuntimeProfile, shape: str) -> None:
    settings = stand_in_settings(tmp_path, slurm_runtime_profile=profile)
    artifact = write_artifact(settings, profile_format(profile))
    spec = make_spec(shape, command=["python", "-c", "print('hi $USER')", ""])
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    nodes = (("n1", "n2"), ("n3", "n4", "n5")) if shape == "het" else (("n1", "n2"),)
    run = run_attempt(
        rendered, settings, tmp_path / "work", nodes=nodes, extra_env={"FAKE_COMMAND_SLEEP": "0.5"}
    )
    assert run.returncode == 0, run.stderr
    step = command_step(run, spec.command)
    container = user_env(step, profile)
    assert container["GREETING"] == "it's $HOME `x`"
    assert container["HF_TOKEN"] == "secret-hf_token-value"
    if profile is RuntimeProfile.APPTAINER:  # only under the prefix, never as themselves
        assert "GREETING" not in step.env
        assert "HF_TOKEN" not in step.env
    # The script's own variables, in the host environment as before.
    assert step.env["MASTER_ADDR"] == "n1"
    # No masterPort: a port picked on the first node at run time, in the kernel's range.
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert low <= int(step.env["MASTER_PORT"]) <= high
    assert step.env["WORLD_SIZE"] == {"cpu": "1", "gpu": "2", "het": "5"}[shape]
    assert step.env["NODE_RANK"] == "0"
    assert not (rendered.staging_dir / "secrets.env").exists()
    # Every step: srun's options, `--`, then the launcher and the command.
    for each in run.steps:
        cut = each.argv.index("--")
        assert all(a.startswith("-") for a in each.argv[:cut])
        if profile is RuntimeProfile.APPTAINER:
            assert each.argv[cut + 1 : cut + 4] == ["apptainer", "--quiet", "exec"]
    assert step.argv[step.argv.index("--") + 1 :][-len(spec.command) :] == spec.command
    if shape == "cpu":
        assert len(run.steps) == 1
        assert step.argv[:3] == ["--overlap", "--nodes=1", "--ntasks=1"]
    else:
        starts = [s.argv for s in run.steps if "start" in s.argv]
        assert len(starts) == (2 if shape == "gpu" else 3)
        head = next(a for a in starts if "--head" in a)
        assert "--nodelist=n1" in head
        assert "--num-gpus=8" in head
        [gcs] = [int(a.split("=")[1]) for a in head if a.startswith("--port=")]
        assert low <= gcs <= high
        assert str(gcs) != step.env["MASTER_PORT"]
        assert step.env["RAY_ADDRESS"] == f"n1:{gcs}"
        workers = [a for a in starts if "--head" not in a]
        assert all(f"--address=n1:{gcs}" in a for a in workers)
        assert step.env["RAY_AUTH_MODE"] == "token"
        assert re.fullmatch("[0-9a-f]{64}", step.env["RAY_AUTH_TOKEN"])
        assert (rendered.staging_dir / "ray.log").stat().st_mode & 0o077 == 0
        if shape == "het":
            assert any("--het-group=1" in a and "--num-gpus=4" in a for a in workers)
            assert all("--het-group=0" in a or "--het-group=1" in a for a in starts)


def test_script_exit_code_is_the_commands(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    artifact = write_artifact(settings, ArtifactFormat.SQSH)
    spec = make_spec("gpu")
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run = run_attempt(rendered, settings, tmp_path / "w", extra_env={"FAKE_SRUN_EXIT": "7"})
    assert run.returncode == 7


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hsqz-not-a-squashfs", "no hsqs magic"),
        (None, "sha256"),
    ],
)
def test_script_refuses_a_bad_artifact(tmp_path: Path, content: bytes | None, message: str) -> None:
    settings = stand_in_settings(tmp_path)
    artifact = write_artifact(settings, ArtifactFormat.SQSH, content)
    if content is None:  # right magic, tampered afterwards
        (settings.storage_root / artifact.path).write_bytes(b"hsqs-tampered")
    spec = make_spec("cpu")
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run = run_attempt(rendered, settings, tmp_path / "w")
    assert run.returncode == 97
    assert message in run.stderr
    assert run.steps == []
    assert not (rendered.staging_dir / "secrets.env").exists()


def test_script_refuses_a_missing_artifact(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path, slurm_runtime_profile="apptainer")
    artifact = write_artifact(settings, ArtifactFormat.SIF)
    (settings.storage_root / artifact.path).unlink()
    spec = make_spec("cpu")
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run = run_attempt(rendered, settings, tmp_path / "w")
    assert run.returncode == 97
    assert "missing" in run.stderr


def test_script_refuses_a_second_run_without_secrets(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    artifact = write_artifact(settings, ArtifactFormat.SQSH)
    spec = make_spec("cpu")
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    assert run_attempt(rendered, settings, tmp_path / "w1").returncode == 0
    again = run_attempt(rendered, settings, tmp_path / "w2", stage=False)
    assert again.returncode == 96
    assert again.steps == []


def test_script_missing_staging_dir(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    artifact = write_artifact(settings, ArtifactFormat.SQSH)
    spec = make_spec("cpu")
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run_attempt(rendered, settings, tmp_path / "w1")
    (rendered.staging_dir / "job.env").chmod(0o644)
    (rendered.staging_dir / "job.env").unlink()
    run = run_attempt(rendered, settings, tmp_path / "w2", stage=False)
    assert run.returncode == 94


def test_script_ray_head_that_dies(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    artifact = write_artifact(settings, ArtifactFormat.SQSH)
    spec = make_spec("gpu")
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run = run_attempt(
        rendered,
        settings,
        tmp_path / "w",
        extra_env={"FAKE_HEAD_DIES": "1", "FAKE_HEALTH_FAILS": "1"},
    )
    assert run.returncode == 95
    assert "Ray head" in run.stderr
    assert not any(s.argv[-len(spec.command) :] == spec.command for s in run.steps)


def test_script_exits_on_sigterm(tmp_path: Path) -> None:
    """A cancelled job (SIGTERM to the job's processes) exits 143 at once, through the trap."""
    settings = stand_in_settings(tmp_path)
    artifact = write_artifact(settings, ArtifactFormat.SQSH)
    spec = make_spec("gpu")
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    stage_attempt(settings, rendered.staging_dir, rendered.files)
    bin_dir = tmp_path / "bin"  # the first directory of the job's PATH (stand_in_settings)
    bin_dir.mkdir()
    started = tmp_path / "command-started"
    # Ray steps block (the head's marks it ready), the command blocks until the signal.
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n" + MARK_HEAD_READY + 'mark_head_ready "$@"\n'
        f"[[ ${{*: -1}} == --block ]] || touch {shlex.quote(str(started))}\n"
        "exec sleep 30\n"
    )
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho n1\necho n2\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    proc = subprocess.Popen(
        ["bash", str(rendered.staging_dir / "job.sh")],
        cwd=rendered.launch.working_directory,
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "SLURM_JOB_NODELIST": "n1,n2",
            "SLURMD_NODENAME": "n1",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists()
    begin = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 143, err
    assert time.monotonic() - begin < 10
    assert not (rendered.staging_dir / "secrets.env").exists()


def _array_attempt(tmp_path: Path, indices: tuple[int, ...] | None = None) -> Any:
    settings = stand_in_settings(tmp_path, slurm_runtime_profile=RuntimeProfile.APPTAINER)
    artifact = write_artifact(settings, profile_format(RuntimeProfile.APPTAINER))
    spec = make_spec("cpu", command=["python", "-c", "print(1)"], array={"count": 20})
    ctx = dataclasses.replace(make_context(spec, settings, artifact), array_indices=indices)
    return spec, settings, render_attempt(spec, ctx)


def test_an_array_task_gets_its_index(tmp_path: Path) -> None:
    spec, settings, rendered = _array_attempt(tmp_path)
    assert rendered.launch.array == "0-19"
    assert rendered.launch.standard_output.endswith("/stdout-%a.log")
    assert rendered.launch.standard_error.endswith("/stderr-%a.log")
    run = run_attempt(
        rendered,
        settings,
        tmp_path / "work",
        nodes=(("n1",),),
        extra_env={
            "SLURM_ARRAY_TASK_ID": "7",
            "SLURM_ARRAY_JOB_ID": "4242",
        },
    )
    assert run.returncode == 0, run.stderr
    assert command_step(run, spec.command).env["SLURMJOB_ARRAY_INDEX"] == "7"


def test_an_array_script_without_a_task_id_stops_before_the_command(tmp_path: Path) -> None:
    spec, settings, rendered = _array_attempt(tmp_path)
    run = run_attempt(rendered, settings, tmp_path / "work", nodes=(("n1",),))
    assert run.returncode != 0
    assert "SLURM_ARRAY_TASK_ID" in run.stderr
    assert not [s for s in run.steps if s.argv[-len(spec.command) :] == spec.command]


def test_a_retry_submits_its_own_indices(tmp_path: Path) -> None:
    _, _, rendered = _array_attempt(tmp_path, (5, 13))
    assert rendered.launch.array == "5,13"
    with pytest.raises(RenderError, match="some of 0 to 19"):
        _array_attempt(tmp_path, (5, 20))
    with pytest.raises(RenderError, match="some of 0 to 19"):
        _array_attempt(tmp_path, ())


def test_a_plain_job_takes_no_indices(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path, slurm_runtime_profile=RuntimeProfile.APPTAINER)
    artifact = write_artifact(settings, profile_format(RuntimeProfile.APPTAINER))
    spec = make_spec("cpu")
    ctx = dataclasses.replace(make_context(spec, settings, artifact), array_indices=(1,))
    with pytest.raises(RenderError, match="not an array"):
        render_attempt(spec, ctx)
    plain = render_attempt(spec, make_context(spec, settings, artifact))
    assert plain.launch.array is None
    assert "export SLURMJOB_ARRAY_INDEX" not in plain.launch.script
