"""Launch shapes (issue 26, part 1): the steps each shape starts, the job description it asks
for, and what each node's or task's wrapper gives the program, run for real with the fake srun
(its recorded argv's container part is run on this machine with Slurm's per-task variables)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.config import RuntimeProfile
from slurmjob_operator.site.render import render_attempt

from .test_render_support import (
    Run,
    Step,
    make_context,
    make_spec,
    pools_for,
    profile_format,
    run_attempt,
    stand_in_settings,
    write_artifact,
)
from .test_site import refusal, resolve
from .test_spec import changed, gpu_spec

COMMAND = ("env",)


def _run(
    tmp: Path,
    shape: str,
    launch: dict[str, Any],
    tasks: int | None = None,
    extra_env: dict[str, str] | None = None,
    nodes: tuple[tuple[str, ...], ...] = (("n1", "n2"),),
) -> tuple[Any, Run]:
    settings = stand_in_settings(tmp, slurm_runtime_profile=RuntimeProfile.APPTAINER)
    artifact = write_artifact(settings, profile_format(settings.slurm_runtime_profile))
    pools = pools_for(shape)
    for pool in pools if tasks else ():
        pool["tasksPerNode"] = tasks
    spec = make_spec(shape, command=COMMAND, env=[], pools=pools, launch=launch)
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    return rendered, run_attempt(rendered, settings, tmp, nodes=nodes, extra_env=extra_env)


def _launched(run: Run) -> list[Step]:
    """The steps that run the command, in the order of their pools (they start at once)."""
    steps = [s for s in run.steps if s.argv[-len(COMMAND) :] == list(COMMAND)]
    return sorted(steps, key=lambda s: [a for a in s.argv if a.startswith("--het-group=")])


def _inside(step: Step, bin_dir: Path | None = None, **slurm: str) -> dict[str, str]:
    """Run the step's container part (from `sh -c` on) here, as the task Slurm would start,
    and read the environment the command got."""
    start = step.argv.index("-c") - 1
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin" if bin_dir else "/usr/bin:/bin", **slurm}
    out = subprocess.run(step.argv[start:], env=env, capture_output=True, check=True, text=True)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def test_nodes_runs_the_command_on_every_node_with_its_rank(tmp_path: Path) -> None:
    rendered, run = _run(tmp_path, "gpu", {"shape": "nodes", "masterPort": 29611})
    assert run.returncode == 0, run.stderr
    [step] = _launched(run)
    assert "--nodes=2" in step.argv
    assert "--ntasks=2" in step.argv
    assert "--ntasks-per-node=1" in step.argv
    assert [c.tasks_per_node for c in rendered.launch.components] == [1]
    for node in (0, 1):
        env = _inside(step, SLURM_NODEID=str(node))
        assert env["NODE_RANK"] == env["SLURMJOB_NODE_RANK"] == str(node)
        assert env["WORLD_SIZE"] == env["SLURMJOB_NODE_COUNT"] == "2"
        assert env["NUM_GPU_PER_NODE"] == env["SLURMJOB_GPUS_PER_NODE"] == "8"
        assert env["MASTER_ADDR"] == "n1"
        assert env["MASTER_PORT"] == "29611"


def test_torchrun_on_a_heterogeneous_job_counts_every_components_nodes(tmp_path: Path) -> None:
    bin_dir = tmp_path / "fake-torchrun"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\nfor a in "$@"; do echo "ARG=$a"; done\n')
    (bin_dir / "torchrun").chmod(0o755)
    _, run = _run(
        tmp_path,
        "het",
        {"shape": "torchrun", "masterPort": 29500},
        nodes=(("h1", "h2"), ("r1", "r2", "r3")),
    )
    assert run.returncode == 0, run.stderr
    learner, rollout = _launched(run)
    assert "--het-group=0" in learner.argv
    assert "--het-group=1" in rollout.argv
    start = rollout.argv.index("-c") - 1
    out = subprocess.run(
        rollout.argv[start:],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_NODEID": "2"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [
        "ARG=--nnodes=5",
        "ARG=--nproc-per-node=4",
        "ARG=--node-rank=4",  # the rollout's third node after the learner's two
        "ARG=--master-addr=h1",
        "ARG=--master-port=29500",
        "ARG=env",
    ]


def test_tasks_share_out_cpus_and_gpus_and_give_each_task_its_global_rank(
    tmp_path: Path,
) -> None:
    rendered, run = _run(tmp_path, "gpu", {"shape": "tasks", "mpi": "pmi2"}, tasks=2)
    assert run.returncode == 0, run.stderr
    [component] = rendered.launch.components
    assert (component.tasks_per_node, component.cpus_per_task) == (2, 32)
    [step] = _launched(run)
    for flag in ("--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=32"):
        assert flag in step.argv
    assert "--gpus-per-task=4" in step.argv
    assert "--mpi=pmi2" in step.argv
    env = _inside(step, SLURM_PROCID="3")
    assert env["SLURMJOB_TASK_RANK"] == "3"
    assert env["SLURMJOB_TASK_COUNT"] == "4"
    assert env["SLURMJOB_NODELIST"] == "n1,n2"


def test_tasks_on_a_heterogeneous_job_number_the_tasks_across_components(
    tmp_path: Path,
) -> None:
    _, run = _run(
        tmp_path, "het", {"shape": "tasks"}, tasks=2, nodes=(("h1", "h2"), ("r1", "r2", "r3"))
    )
    assert run.returncode == 0, run.stderr
    _, rollout = _launched(run)
    assert "--gpus-per-task=2" in rollout.argv
    env = _inside(rollout, SLURM_PROCID="0")
    assert env["SLURMJOB_TASK_RANK"] == "4"  # after the learner's 2 nodes x 2 tasks
    assert env["SLURMJOB_TASK_COUNT"] == "10"
    assert env["SLURMJOB_NODELIST"] == "h1,h2,r1,r2,r3"


def test_a_cpu_job_takes_tasks_on_its_node_without_gpus(tmp_path: Path) -> None:
    rendered, run = _run(tmp_path, "cpu", {"shape": "tasks"}, tasks=2)
    assert run.returncode == 0, run.stderr
    [step] = _launched(run)
    assert "--ntasks=2" in step.argv
    assert "--cpus-per-task=2" in step.argv
    assert not [a for a in step.argv if a.startswith("--gpus")]
    assert rendered.launch.components[0].cpus_per_task == 2


FAIL_ONE = r"""#!/bin/bash
for arg in "$@"; do
  if [[ $arg == --het-group=1 ]]; then
    exit 7
  fi
done
exec sleep 60
"""


def test_the_first_step_that_fails_ends_the_others_and_gives_its_code(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path, slurm_runtime_profile=RuntimeProfile.APPTAINER)
    artifact = write_artifact(settings, profile_format(settings.slurm_runtime_profile))
    spec = make_spec("het", command=COMMAND, env=[], launch={"shape": "nodes"})
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run_attempt(rendered, settings, tmp_path, nodes=(("h1", "h2"), ("r1", "r2", "r3")))
    srun = tmp_path / "bin" / "srun"
    srun.write_text(FAIL_ONE)
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(rendered.staging_dir / "job.sh")],
        cwd=rendered.launch.working_directory,
        env={
            **rendered.launch.environment,
            "FAKE_LOG_DIR": str(tmp_path / "log"),
            "SLURM_JOB_NODELIST": "h1,h2",
            "SLURMD_NODENAME": "h1",
            "SLURM_JOB_NODELIST_HET_GROUP_0": "h1,h2",
            "SLURM_JOB_NODELIST_HET_GROUP_1": "r1,r2,r3",
        },
        capture_output=True,
        timeout=50,  # the learner's step sleeps 60 s unless it is ended
        check=False,
    )
    assert result.returncode == 7, result.stderr
    assert time.monotonic() - started < 50


LATE_ONE = r"""#!/bin/bash
for arg in "$@"; do
  if [[ $arg == --het-group=1 ]]; then
    sleep 2
    touch "$FAKE_LOG_DIR/late-step-done"
    exit 0
  fi
done
exit 0
"""


def test_the_script_waits_for_the_last_step_not_only_the_first(tmp_path: Path) -> None:
    """One step ends at once, the other 2 s later: the script ends after both. (CI on 26.05 lost
    the second node's output: bash 5.3's `wait -n <ids>` answers an id already waited for again
    at once; this machine's bash 5.2 does not, so the real-job test on 26.05 is what catches
    that, and this one the plain semantics.)"""
    settings = stand_in_settings(tmp_path, slurm_runtime_profile=RuntimeProfile.APPTAINER)
    artifact = write_artifact(settings, profile_format(settings.slurm_runtime_profile))
    spec = make_spec("het", command=COMMAND, env=[], launch={"shape": "nodes"})
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run_attempt(rendered, settings, tmp_path, nodes=(("h1", "h2"), ("r1", "r2", "r3")))
    (tmp_path / "bin" / "srun").write_text(LATE_ONE)
    log = tmp_path / "log"
    result = subprocess.run(
        ["bash", str(rendered.staging_dir / "job.sh")],
        cwd=rendered.launch.working_directory,
        env={
            **rendered.launch.environment,
            "FAKE_LOG_DIR": str(log),
            "SLURM_JOB_NODELIST": "h1,h2",
            "SLURMD_NODENAME": "h1",
            "SLURM_JOB_NODELIST_HET_GROUP_0": "h1,h2",
            "SLURM_JOB_NODELIST_HET_GROUP_1": "r1,r2,r3",
        },
        capture_output=True,
        timeout=50,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (log / "late-step-done").exists(), "the script ended before its last step"


def test_the_mpi_plugin_must_be_one_the_site_allows() -> None:
    spec = changed(gpu_spec(), launch={"shape": "tasks", "mpi": "pmix"})
    assert "none (SLURMJOB_MPI_PLUGINS)" in str(refusal(spec))
    assert "allows: pmi2" in str(refusal(spec, mpi_plugins="pmi2"))
    assert resolve(spec, mpi_plugins="pmi2,pmix").runtime.id == "custom-trainer"


@pytest.mark.parametrize("shape", ["nodes", "torchrun", "tasks"])
def test_no_user_word_reaches_the_wrapper_as_code(tmp_path: Path, shape: str) -> None:
    """The command's words follow the wrapper's own positional words: `$(...)`, `;` and
    quotes arrive as the program's argv, never run by the wrapper's shell."""
    bin_dir = tmp_path / "fake-torchrun"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\nshift 5\nexec "$@"\n')
    (bin_dir / "torchrun").chmod(0o755)
    settings = stand_in_settings(tmp_path, slurm_runtime_profile=RuntimeProfile.APPTAINER)
    artifact = write_artifact(settings, profile_format(settings.slurm_runtime_profile))
    words = ("printf", "%s|", "$(touch pwned)", "; touch pwned2", "'\"", "`id`")
    spec = make_spec("gpu", command=words, env=[], launch={"shape": shape})
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run = run_attempt(rendered, settings, tmp_path)
    [step] = [s for s in run.steps if s.argv[-len(words) :] == list(words)]
    start = step.argv.index("-c") - 1
    out = subprocess.run(
        step.argv[start:],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "$(touch pwned)|; touch pwned2|'\"|`id`|"
    assert not (tmp_path / "pwned").exists()
    assert not (tmp_path / "pwned2").exists()


def test_every_step_is_waited_for_though_another_child_of_the_script_ends_first(
    tmp_path: Path,
) -> None:
    """A host tool read through a process substitution (scontrol) that ends after its output
    is another child of the script: the steps' wait must not take its end for a step's (the
    script would exit 0, and Slurm end the job, before the command even started). bash 5.3's
    `wait -n` did exactly that on 26.05's nodes (CI, test_probe_e2e); a host bash 5.2 does not,
    so there this passes either way and the 26.05 end-to-end tests carry the proof."""
    slow = {"FAKE_SCONTROL_LINGER": "1", "FAKE_COMMAND_SLEEP": "2", "FAKE_SRUN_EXIT": "5"}
    for shape, launch, tasks in (("gpu", {"shape": "nodes"}, None), ("gpu", {"shape": "tasks"}, 2)):
        _, run = _run(tmp_path / launch["shape"], shape, launch, tasks, extra_env=slow)
        assert run.returncode == 5, (launch, run.stderr)
