"""What a manifest could make the batch script do on the host, run against stand-ins.

Validation refuses these manifests (`test_spec`, `test_crd`); here the refusals are switched
off (the spec is built with `model_copy`/`model_construct` and render's own check is patched
out), to prove that the script itself keeps the manifest out of its host part: a PATH,
LD_PRELOAD or BASH_ENV from spec.env never reaches the batch shell or the tools it runs (dd,
tr, sha256sum, scontrol, srun itself), the artifact check runs with the site's tools, env files
are read as data, and the command's words come after srun's `--`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.spec import EnvVar, SlurmJobSpec
from slurmjob_operator.config import RuntimeProfile, Settings
from slurmjob_operator.site import render
from slurmjob_operator.site.render import RenderedAttempt, render_attempt
from slurmjob_operator.storage.staging import stage_attempt

from .test_render_support import (
    Run,
    command_step,
    make_context,
    make_spec,
    profile_format,
    run_attempt,
    stand_in_settings,
    user_env,
    write_artifact,
)

PROFILES = [RuntimeProfile.ENROOT_PYXIS, RuntimeProfile.APPTAINER]


def _tenant_bin(root: Path, expected_sha256: str) -> Path:
    """A tenant's folder with the two tools of the attack: a sha256sum that answers whatever
    hash the script expects, and an srun that succeeds; each leaves a mark."""
    tenant = root / "team-b" / "bin"
    tenant.mkdir(parents=True)
    marks = root / "team-b" / "marks"
    for tool in ("sha256sum", "srun"):
        answer = f"echo {expected_sha256}  -\n" if tool == "sha256sum" else "exit 0\n"
        (tenant / tool).write_text(f'#!/bin/bash\necho {tool} >>"{marks}"\n{answer}')
        (tenant / tool).chmod(0o755)
    return tenant


def _unchecked(spec: SlurmJobSpec, **update: Any) -> SlurmJobSpec:
    """The spec with fields set as a manifest would, validation skipped."""
    return spec.model_copy(update=update)


def _env(**values: str) -> list[EnvVar]:
    return [EnvVar.model_construct(name=k, value=v, value_from=None) for k, v in values.items()]


@pytest.fixture
def no_render_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch render's own re-check of api.scriptwords off (the script is what is tested)."""
    monkeypatch.setattr(render, "reserved_env_name", lambda name: False)
    monkeypatch.setattr(render, "command_problem", lambda words: None)


def _attack(
    tmp_path: Path, profile: RuntimeProfile, *, tamper: bool
) -> tuple[Settings, RenderedAttempt, Run, Path]:
    settings = stand_in_settings(tmp_path, slurm_runtime_profile=profile)
    artifact = write_artifact(settings, profile_format(profile))
    if tamper:  # the right magic, other bytes: only the sha256 can tell
        good = (settings.storage_root / artifact.path).read_bytes()
        (settings.storage_root / artifact.path).write_bytes(good[:-3] + b"bad")
    tenant = _tenant_bin(settings.storage_root, artifact.sha256)
    bash_env = settings.storage_root / "team-b" / "bash_env"
    bash_env.write_text(f'echo "$0" >>"{settings.storage_root / "team-b" / "sourced"}"\n')
    spec = _unchecked(
        make_spec("cpu", command=["python", "train.py"]),
        env=_env(
            PATH=f"{tenant}:{settings.slurm_job_path}",
            LD_PRELOAD="/nonexistent/evil.so",
            BASH_ENV=str(bash_env),
            GREETING="hello",
        ),
    )
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run = run_attempt(rendered, settings, tmp_path / "work", nodes=(("n1",),))
    return settings, rendered, run, settings.storage_root / "team-b"


@pytest.mark.parametrize("profile", PROFILES)
def test_user_path_cannot_pass_a_tampered_artifact(
    tmp_path: Path, profile: RuntimeProfile, no_render_checks: None
) -> None:
    """The finding: PATH=<tenant dir>:... in job.env, sourced before the artifact check,
    replaced sha256sum (and srun), and a tampered image ran with exit 0."""
    _, rendered, run, tenant = _attack(tmp_path, profile, tamper=True)
    assert run.returncode == 97, run.stderr
    assert "sha256" in run.stderr
    assert run.steps == []
    assert not (tenant / "marks").exists(), (tenant / "marks").read_text()
    assert not (tenant / "sourced").exists()
    assert "LD_PRELOAD" not in run.stderr  # no host tool started with it
    assert not (rendered.staging_dir / "secrets.env").exists()


@pytest.mark.parametrize("profile", PROFILES)
def test_user_variables_reach_the_containerised_step_only(
    tmp_path: Path, profile: RuntimeProfile, no_render_checks: None
) -> None:
    settings, _, run, tenant = _attack(tmp_path, profile, tamper=False)
    assert run.returncode == 0, run.stderr
    assert not (tenant / "marks").exists(), (tenant / "marks").read_text()
    # scontrol runs on the host after the env files were read: the site's PATH, nothing else.
    assert run.host_envs, "the fake scontrol did not run"
    for host in run.host_envs:
        assert host["PATH"] == settings.slurm_job_path
        assert not {"LD_PRELOAD", "BASH_ENV", "GREETING"} & set(host)
    # The step got them for the container...
    step = command_step(run, ["python", "train.py"])
    container = user_env(step, profile)
    assert container["PATH"].startswith(str(tenant / "bin"))
    assert container["LD_PRELOAD"] == "/nonexistent/evil.so"
    assert container["GREETING"] == "hello"
    sourced = (tenant / "sourced").read_text().split() if (tenant / "sourced").exists() else []
    if profile is RuntimeProfile.APPTAINER:
        # ...and under apptainer, srun and apptainer never see them as themselves.
        assert step.env["PATH"] == settings.slurm_job_path
        assert not {"LD_PRELOAD", "BASH_ENV", "GREETING"} & set(step.env)
        assert sourced == []
    else:
        # Pyxis takes --container-env values from the step's environment: only the (fake)
        # srun, a bash script here, read BASH_ENV; the batch shell and scontrol did not.
        assert all(Path(p).name == "srun" for p in sourced), sourced


@pytest.mark.parametrize("profile", PROFILES)
def test_command_words_come_after_srun_double_dash(
    tmp_path: Path, profile: RuntimeProfile, no_render_checks: None
) -> None:
    settings = stand_in_settings(tmp_path, slurm_runtime_profile=profile)
    artifact = write_artifact(settings, profile_format(profile))
    command = ["--container-mounts=/:/host", "--jobid=4242", "bash", "-c", "ls /host"]
    spec = _unchecked(make_spec("cpu"), command=command)
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    run = run_attempt(rendered, settings, tmp_path / "work", nodes=(("n1",),))
    assert run.returncode == 0, run.stderr
    [step] = run.steps
    cut = step.argv.index("--")
    options = step.argv[:cut]
    assert "--jobid=4242" not in options
    assert not any("/host" in option for option in options)
    assert step.argv[-len(command) :] == command
    launcher = step.argv[cut + 1 : len(step.argv) - len(command)]
    if profile is RuntimeProfile.APPTAINER:
        assert launcher[:3] == ["apptainer", "--quiet", "exec"]
        assert launcher[-1] == str(settings.storage_root / artifact.path)
    else:
        assert launcher == []


def _staged_good_run(tmp_path: Path) -> tuple[Settings, RenderedAttempt]:
    settings = stand_in_settings(tmp_path)
    artifact = write_artifact(settings, profile_format(RuntimeProfile.ENROOT_PYXIS))
    spec = make_spec("cpu")
    return settings, render_attempt(spec, make_context(spec, settings, artifact))


def _rewrite(path: Path, content: bytes) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(content)


def test_env_files_are_data(tmp_path: Path) -> None:
    """A value that would be shell code in a sourced file arrives as text, runs nothing."""
    settings, rendered = _staged_good_run(tmp_path)
    stage_attempt(settings, rendered.staging_dir, rendered.files)
    pwned = tmp_path / "pwned"
    code = f"$(touch {pwned})`touch {pwned}`"
    _rewrite(rendered.staging_dir / "job.env", f"EPOCHS={code}\0GREETING=x\n'\0".encode())
    run = run_attempt(rendered, settings, tmp_path / "work", stage=False)
    assert run.returncode == 0, run.stderr
    step = command_step(run, ["python", "train.py", "--epochs", "3"])
    assert step.env["EPOCHS"] == code
    assert step.env["GREETING"] == "x\n'"
    assert not pwned.exists()


@pytest.mark.parametrize(
    "content",
    [
        b"EPOCHS=3\0GREETING=x\0PATH=/tmp/tenant\0",  # a variable added
        b"PATH=/tmp/tenant\0GREETING=x\0",  # a variable renamed
        b"EPOCHS=3\0",  # one missing
        b"export EPOCHS=3\nexport GREETING=x\n",  # the old, sourced format
    ],
)
def test_changed_env_file_stops_the_job(tmp_path: Path, content: bytes) -> None:
    settings, rendered = _staged_good_run(tmp_path)
    stage_attempt(settings, rendered.staging_dir, rendered.files)
    _rewrite(rendered.staging_dir / "job.env", content)
    run = run_attempt(rendered, settings, tmp_path / "work", stage=False)
    assert run.returncode == 94, run.stderr
    assert "job.env does not hold the variables" in run.stderr
    assert run.steps == []
    assert not (rendered.staging_dir / "secrets.env").exists()


def test_env_file_replaced_by_a_link_stops_the_job(tmp_path: Path) -> None:
    """A link (here to an endless stream of empty records) is not read at all."""
    settings, rendered = _staged_good_run(tmp_path)
    stage_attempt(settings, rendered.staging_dir, rendered.files)
    env_file = rendered.staging_dir / "job.env"
    os.chmod(env_file, 0o644)
    env_file.unlink()
    env_file.symlink_to("/dev/zero")
    run = run_attempt(rendered, settings, tmp_path / "work", stage=False)
    assert run.returncode == 94, run.stderr
    assert run.steps == []
