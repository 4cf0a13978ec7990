"""Preflight: syntax errors and leaked secrets stop a submission."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from slurmjob_operator.config import Settings
from slurmjob_operator.core.launch import StagedFile
from slurmjob_operator.site.catalogs import ArtifactFormat
from slurmjob_operator.site.preflight import (
    PreflightError,
    check_env_file,
    check_rendered,
    find_shellcheck,
    shellcheck_script,
)
from slurmjob_operator.site.render import RenderedAttempt, render_attempt

from .test_render_support import fixed_artifact, make_context, make_spec

SECRET = "hf_s3cr3t 'quoted' \"value\"\n"


def _rendered(secret: str = SECRET) -> tuple[RenderedAttempt, dict[str, str]]:
    settings = Settings(storage_root=Path("/srv/sj"))
    spec = make_spec("gpu")
    values = {"HF_TOKEN": secret}
    ctx = make_context(spec, settings, fixed_artifact(ArtifactFormat.SQSH), secret_values=values)
    return render_attempt(spec, ctx), values


def _body(rendered: RenderedAttempt) -> str:
    return json.dumps({"script": rendered.launch.script, "job": {"name": rendered.launch.job_name}})


def _with_script(rendered: RenderedAttempt, script: str) -> RenderedAttempt:
    launch = rendered.launch.model_copy(update={"script": script})
    files = {**rendered.files, "job.sh": StagedFile(script.encode(), 0o555)}
    return dataclasses.replace(rendered, launch=launch, files=files)


def test_clean_attempt_passes() -> None:
    rendered, values = _rendered()
    check_rendered(rendered, values, _body(rendered))
    secrets_file = rendered.files["secrets.env"]
    assert secrets_file.mode == 0o600
    for name, staged in rendered.files.items():
        if name != "secrets.env":
            assert SECRET.encode() not in staged.content
    assert SECRET not in rendered.launch.model_dump_json()
    assert json.dumps(SECRET)[1:-1] not in rendered.launch.model_dump_json()


def test_syntax_error_is_caught() -> None:
    rendered, values = _rendered()
    broken = _with_script(rendered, rendered.launch.script + "\nif then fi (\n")
    with pytest.raises(PreflightError, match="does not parse"):
        check_rendered(broken, values, _body(broken))


@pytest.mark.parametrize(
    "plant",
    [
        lambda s: f"echo {s}",
        lambda s: f"echo {shlex.quote(s)}",
    ],
)
def test_secret_in_script_is_caught(plant: object) -> None:
    rendered, values = _rendered()
    assert callable(plant)
    leaked = _with_script(rendered, rendered.launch.script + "\n" + plant(SECRET) + "\n")
    with pytest.raises(PreflightError, match="HF_TOKEN") as info:
        check_rendered(leaked, values, _body(rendered))
    assert SECRET not in str(info.value)


def test_secret_in_job_env_is_caught() -> None:
    rendered, values = _rendered()
    files = {**rendered.files, "job.env": StagedFile(f"export X={SECRET}".encode(), 0o444)}
    leaked = dataclasses.replace(rendered, files=files)
    with pytest.raises(PreflightError, match=r"HF_TOKEN.*job\.env"):
        check_rendered(leaked, values, _body(rendered))


def test_secret_in_body_is_caught_even_json_escaped() -> None:
    rendered, values = _rendered()
    body = json.dumps({"job": {"environment": {"HF_TOKEN": SECRET}}})
    assert SECRET not in body  # escaped: the raw value does not appear
    with pytest.raises(PreflightError, match="submit body"):
        check_rendered(rendered, values, body)


def test_short_secrets_are_not_searched() -> None:
    rendered, _ = _rendered(secret="ab1")
    check_rendered(rendered, {"HF_TOKEN": "e"}, _body(rendered))


@pytest.mark.skipif(find_shellcheck() is None, reason="shellcheck is not installed")
def test_shellcheck_helper() -> None:
    assert shellcheck_script('#!/bin/bash\necho "$1"\n') == []
    findings = shellcheck_script("#!/bin/bash\nrm -rf $1/*\n")
    assert (findings and "SC2115" in " ".join(findings)) or "SC2086" in " ".join(findings)


def test_env_files_are_records() -> None:
    rendered, _ = _rendered()
    assert rendered.files["job.env"].content == b"EPOCHS=3\0GREETING=it's $HOME `x`\0"
    check_env_file("job.env", rendered.files["job.env"].content)
    check_env_file("secrets.env", rendered.files["secrets.env"].content)
    check_env_file("job.env", b"")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"A=1", "does not end in NUL"),
        (b"export A=1\n\0", "record 0 does not start with NAME="),
        (b"A=1\0no-equals\0", "record 1 does not start with NAME="),
        (b"A=1\0PATH=/tenant/bin\0", "record 1 sets the reserved name PATH"),
        (b"LD_PRELOAD=/x.so\0", "record 0 sets the reserved name LD_PRELOAD"),
    ],
)
def test_malformed_env_file_is_caught(content: bytes, message: str) -> None:
    rendered, values = _rendered()
    files = {**rendered.files, "secrets.env": StagedFile(content, 0o600)}
    broken = dataclasses.replace(rendered, files=files)
    with pytest.raises(PreflightError, match=message) as info:
        check_rendered(broken, values, _body(rendered))
    assert "/tenant/bin" not in str(info.value)
    assert "/x.so" not in str(info.value)
