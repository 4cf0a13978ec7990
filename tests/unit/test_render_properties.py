"""Property tests: no input can break the script's quoting or inject shell.

Arbitrary text (quotes, `$()`, backticks, newlines, unicode; no NUL) in the command, env
values, secret values, names and mount paths is rendered, staged and run with bash against
stand-ins; the command's argv and the env values must arrive byte for byte.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmjob_operator.api.spec import DNS_LABEL_RE
from slurmjob_operator.config import RuntimeProfile, Settings
from slurmjob_operator.site.render import render_attempt

from .test_render_support import (
    command_step,
    make_context,
    make_spec,
    profile_format,
    run_attempt,
    write_artifact,
)

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=0, max_size=24)
NASTY = st.sampled_from(["$(touch pwned)", "`touch pwned`", "'", '"', "\\", "\n", "$HOME", "*"])
VALUE = st.one_of(TEXT, NASTY, st.lists(NASTY, max_size=4).map("".join))
LABEL = st.from_regex(DNS_LABEL_RE, fullmatch=True).filter(lambda s: len(s) <= 30)
SEGMENT = st.text(
    st.characters(codec="utf-8", exclude_characters="\0\n,:/"),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in {".", ".."})
PATH = st.lists(SEGMENT, min_size=1, max_size=3).map("/".join)
ENV_NAME = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).map(lambda s: "U_" + s)


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    command = draw(st.lists(VALUE, min_size=1, max_size=5))
    if not command[0]:
        command[0] = "x"
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


def _check(job: dict[str, Any], shape: str) -> None:
    profile: RuntimeProfile = job["profile"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        settings_ = Settings(storage_root=root, slurm_runtime_profile=profile)
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
        nodes = (("n1",),) if shape == "cpu" else (("n1", "n2"), ("n3",))
        run = run_attempt(rendered, settings_, Path(tmp) / "work", nodes=nodes)
        assert run.returncode == 0, run.stderr
        step = command_step(run, job["command"])
        staging = str(rendered.cluster_staging_dir)
        mounts = [
            f"{root}/{m['source']}:{m['target']}" + (":ro" if m["readOnly"] else "")
            for m in job["mounts"]
        ] + [f"{staging}:{staging}:ro"]
        prefix = step.argv[: len(step.argv) - len(job["command"])]
        if profile is RuntimeProfile.ENROOT_PYXIS:
            assert f"--container-mounts={','.join(mounts)}" in prefix
            assert f"--container-image={root}/{artifact.path}" in prefix
            assert f"--container-workdir={job['working_dir']}" in prefix
        else:
            binds = [prefix[i + 1] for i, a in enumerate(prefix) if a == "--bind"]
            assert binds == mounts
            assert prefix[-1] == f"{root}/{artifact.path}"
            assert prefix[prefix.index("--pwd") + 1] == job["working_dir"]
        for key, value in job["env"].items():
            assert step.env[key] == value
        assert step.env["S_SECRET"] == job["secret"]
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
