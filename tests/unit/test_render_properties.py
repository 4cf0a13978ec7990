"""Property tests: no input can break the script's quoting, inject shell or srun options.

Arbitrary text (quotes, `$()`, backticks, newlines, unicode, words starting with `-`, words
holding `:`; no NUL) in the command, env values, secret values, names, and paths of the safe
alphabet in mounts and workingDir, is rendered, staged and run with bash against stand-ins:
the script is shellcheck-clean, every user word is one quoted word of `user_command`, each srun
gets the script's options, `--`, the launcher and the command (byte for byte), and the env
values arrive byte for byte in the step's environment (under APPTAINERENV_ for apptainer).
With validation switched off, a first word starting with `-` still lands after `--`.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmjob_operator.api.scriptwords import PATH_CHARS, command_problem
from slurmjob_operator.api.spec import DNS_LABEL_RE
from slurmjob_operator.config import RuntimeProfile
from slurmjob_operator.site import render
from slurmjob_operator.site.preflight import find_shellcheck, shellcheck_script
from slurmjob_operator.site.render import render_attempt
from slurmjob_operator.site.templating import shquote

from .test_render_support import (
    Step,
    command_step,
    make_context,
    make_spec,
    profile_format,
    run_attempt,
    stand_in_settings,
    user_env,
    write_artifact,
)

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=0, max_size=24)
NASTY = st.sampled_from(
    [
        "$(touch pwned)",
        "`touch pwned`",
        "'",
        '"',
        "\\",
        "\n",
        "$HOME",
        "*",
        "--jobid=4242",
        "--container-mounts=/:/host",
        "-",
        "--",
        "::",
        "a:b",
        " : ",
        "é\u202e",
    ]
)
VALUE = st.one_of(TEXT, NASTY, st.lists(NASTY, max_size=4).map("".join))
WORD = VALUE.filter(lambda w: w != ":")  # a lone ':' is refused (test_spec)
FIRST = WORD.filter(lambda w: bool(w) and not w.startswith("-"))
LABEL = st.from_regex(DNS_LABEL_RE, fullmatch=True).filter(lambda s: len(s) <= 30)
SEGMENT = st.from_regex(f"[{PATH_CHARS}]{{1,12}}", fullmatch=True).filter(
    lambda s: s not in {".", ".."}
)
PATH = st.lists(SEGMENT, min_size=1, max_size=3).map("/".join)
ENV_NAME = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).map(lambda s: "U_" + s)
HAS_SHELLCHECK = find_shellcheck() is not None


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    command = [draw(FIRST), *draw(st.lists(WORD, max_size=5))]
    names = draw(st.lists(ENV_NAME, min_size=1, max_size=4, unique=True))
    values = [draw(VALUE) for _ in names]
    secret = draw(VALUE)
    mounts = draw(st.lists(st.tuples(PATH, PATH, st.booleans()), max_size=3))
    targets = {f"/{t}" for _, t, _ in mounts}
    return {
        "command": command,
        "env": dict(zip(names, values, strict=True)),
        "secret": secret,
        "mounts": [{"source": s, "target": f"/{t}", "readOnly": ro} for s, t, ro in mounts]
        if len(targets) == len(mounts)
        else [],
        "working_dir": "/" + draw(PATH),
        "namespace": draw(LABEL),
        "name": draw(LABEL),
        "pools": draw(st.lists(LABEL, min_size=2, max_size=2, unique=True)),
        "profile": draw(st.sampled_from(list(RuntimeProfile))),
    }


def _layout(step: Step, launcher: list[str], command: list[str]) -> list[str]:
    """The step's srun options; asserts the rest is `--`, the launcher and the command."""
    cut = step.argv.index("--")
    assert step.argv[cut + 1 :] == [*launcher, *command]
    return step.argv[:cut]


#: The Ray session directory's word in a step's argv: Pyxis' mount option, or the path pair.
RAY_DIR_WORD = re.compile(r"(?:--container-mounts=)?(/tmp/slurmjob-ray\.[A-Za-z0-9]{8}):\1")


def _check(job: dict[str, Any], shape: str) -> None:
    profile: RuntimeProfile = job["profile"]
    with tempfile.TemporaryDirectory() as tmp:
        settings_ = stand_in_settings(Path(tmp), slurm_runtime_profile=profile)
        root = settings_.storage_root
        artifact = write_artifact(settings_, profile_format(profile))
        env = [{"name": k, "value": v} for k, v in job["env"].items()]
        env.append({"name": "S_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})
        if shape == "cpu":
            pools = [{"name": job["pools"][0], "cpus": 2, "memoryGb": 1}]
        else:
            pools = [
                {
                    "name": job["pools"][0],
                    "nodes": 2,
                    "gpusPerNode": 8,
                    "gpuSeries": "h100",
                    "cpus": 8,
                    "memoryGb": 16,
                },
                {
                    "name": job["pools"][1],
                    "nodes": 1,
                    "gpusPerNode": 4,
                    "gpuSeries": "a100",
                    "cpus": 8,
                    "memoryGb": 16,
                },
            ]
        spec = make_spec(
            shape,
            command=job["command"],
            env=env,
            mounts=job["mounts"],
            working_dir=job["working_dir"],
            pools=pools,
        )
        ctx = make_context(
            spec,
            settings_,
            artifact,
            secret_values={"S_SECRET": job["secret"]},
            namespace=job["namespace"],
            name=job["name"],
        )
        rendered = render_attempt(spec, ctx)
        script = rendered.launch.script
        quoted = "".join(f"  {shquote(word)}\n" for word in job["command"])
        assert f"user_command=(\n{quoted})\n" in script
        if HAS_SHELLCHECK:
            assert shellcheck_script(script, severity="warning") == []
        nodes = (("n1",),) if shape == "cpu" else (("n1", "n2"), ("n3",))
        run = run_attempt(rendered, settings_, Path(tmp) / "work", nodes=nodes)
        assert run.returncode == 0, run.stderr
        step = command_step(run, job["command"])
        staging = str(rendered.cluster_staging_dir)
        mounts = [
            f"{root}/{m['source']}:{m['target']}" + (":ro" if m["readOnly"] else "")
            for m in job["mounts"]
        ] + [f"{staging}:{staging}:ro"]
        image = f"{root}/{artifact.path}"
        names = ",".join([*job["env"], "S_SECRET"])
        if profile is RuntimeProfile.ENROOT_PYXIS:
            launcher: list[str] = []
            container = [
                f"--container-image={image}",
                "--no-container-mount-home",
                f"--container-mounts={','.join(mounts)}",
                f"--container-env={names}",
                f"--container-workdir={job['working_dir']}",
            ]
        else:
            binds = [w for m in mounts for w in ("--bind", m)]
            gpu = ["--nv"] if shape != "cpu" else []
            launcher = ["apptainer", "--quiet", "exec", "--no-home", "--contain", *gpu, *binds,
                        "--pwd", job["working_dir"], image]  # fmt: skip
            container = []
        head = ["--het-group=0"] if shape != "cpu" else []
        place = ["--nodelist=n1"] if shape != "cpu" else []
        # A Ray job's command (and head) step also mounts the session directory the script
        # made on the first node, read-write at its own path.
        shared_launcher, shared_container = launcher, container
        if shape != "cpu":
            [ray_dir] = {m[1] for a in step.argv if (m := RAY_DIR_WORD.fullmatch(a))}
            pair = f"{ray_dir}:{ray_dir}"
            if profile is RuntimeProfile.ENROOT_PYXIS:
                shared_container = [*container, f"--container-mounts={pair}"]
            else:
                shared_launcher = [*launcher[:-1], "--bind", pair, image]
        expected = ["--overlap", *head, "--nodes=1", "--ntasks=1", *place, *shared_container]
        assert _layout(step, shared_launcher, job["command"]) == expected
        for other in run.steps:  # the Ray steps: the same launcher after `--`
            cut = other.argv.index("--")
            after = other.argv[cut + 1 :]
            assert after[: len(launcher)] == launcher or after[: len(shared_launcher)] == (
                shared_launcher
            )
            assert other.argv[cut - len(container) : cut] == container or (
                other.argv[cut - len(shared_container) : cut] == shared_container
            )
        values = user_env(step, profile)
        for key, value in job["env"].items():
            assert values[key] == value
        assert values["S_SECRET"] == job["secret"]
        assert step.env["SLURMJOB_STAGING_DIR"] == staging
        assert not (rendered.staging_dir / "secrets.env").exists()
        # Nothing was executed by the shell that the stand-ins did not record.
        assert not list(Path(tmp).rglob("pwned"))
        assert not (Path(rendered.launch.working_directory) / "pwned").exists()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_cpu_job_quoting(job: dict[str, Any]) -> None:
    _check(job, "cpu")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_het_gpu_job_quoting(job: dict[str, Any]) -> None:
    _check(job, "het")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(VALUE, min_size=1, max_size=5).filter(lambda c: command_problem(c) is None),
    st.sampled_from(list(RuntimeProfile)),
)
def test_accepted_command_lands_after_double_dash(
    command: list[str], profile: RuntimeProfile
) -> None:
    """Whatever command validation accepts arrives whole after srun's `--`."""
    _run_command(command, profile)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12).map(
        lambda w: "-" + w
    ),
    st.lists(WORD, max_size=4),
    st.sampled_from(list(RuntimeProfile)),
)
def test_leading_dash_lands_after_double_dash_without_validation(
    first: str, rest: list[str], profile: RuntimeProfile
) -> None:
    """Defence in depth: a first word starting with `-`, which validation refuses, still
    reaches srun after its `--` (never among its options) when every check is off."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(render, "command_problem", lambda words: None)
        _run_command([first, *rest], profile)


def _run_command(command: list[str], profile: RuntimeProfile) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings_ = stand_in_settings(Path(tmp), slurm_runtime_profile=profile)
        artifact = write_artifact(settings_, profile_format(profile))
        spec = make_spec("cpu", mounts=[], env=[]).model_copy(update={"command": command})
        rendered = render_attempt(spec, make_context(spec, settings_, artifact))
        run = run_attempt(rendered, settings_, Path(tmp) / "work", nodes=(("n1",),))
        assert run.returncode == 0, run.stderr
        [step] = run.steps
        image = str(settings_.storage_root / artifact.path)
        staging = str(rendered.cluster_staging_dir)
        if profile is RuntimeProfile.APPTAINER:
            bind = f"{staging}:{staging}:ro"
            launcher = ["apptainer", "--quiet", "exec", "--no-home", "--contain", "--bind", bind,
                        "--pwd", "/workspace", image]  # fmt: skip
            options = _layout(step, launcher, command)
            assert options == ["--overlap", "--nodes=1", "--ntasks=1"]
        else:
            options = _layout(step, [], command)
            assert options[:3] == ["--overlap", "--nodes=1", "--ntasks=1"]
            assert all(o.startswith(("--container-", "--no-container-")) for o in options[3:])
        assert not list(Path(tmp).rglob("pwned"))
