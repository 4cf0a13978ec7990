"""Preflight: syntax errors and leaked secrets stop a submission."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from slurmjob_operator.config import Settings
from slurmjob_operator.core.launch import StagedFile
from slurmjob_operator.site import preflight
from slurmjob_operator.site.catalogs import ArtifactFormat
from slurmjob_operator.site.preflight import (
    PreflightError,
    check_bash_syntax,
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


@pytest.mark.parametrize("memfd", [True, False], ids=["memfd", "pipe"])
def test_bash_reads_the_script_from_memory_or_a_pipe_alike(
    memfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same verdict and message whether bash reads the script from a file in memory or,
    where there is none, from a pipe; a script larger than a pipe's buffer included."""
    if not memfd:
        monkeypatch.delattr(preflight.os, "memfd_create", raising=False)
    script, _ = _rendered()
    large = script.launch.script + "\n" + "echo padding-line-of-the-script\n" * 8000
    assert len(large) > 200_000
    check_bash_syntax(large)
    # Where bash says the open quote ends: it read the whole script, not a buffer's worth.
    line = large.count("\n") + 1
    with pytest.raises(PreflightError, match=f"line {line}: unexpected EOF while looking for"):
        check_bash_syntax(large + 'echo "unclosed\n')
    with pytest.raises(PreflightError, match="unexpected token"):
        check_bash_syntax("#!/bin/bash\nif true; then\n}\n")


def test_bash_n_runs_nothing_a_tenant_wrote(tmp_path: Path) -> None:
    """The check parses and never executes: a command substitution, a redirection and a
    command in the tenant's words leave no trace, and the script cannot read the check's own
    input past itself (bash gets it from a file in memory, nothing after the script)."""
    marker = tmp_path / "ran"
    hostile = (
        "#!/bin/bash\n"
        f"touch {marker}\n"
        f"echo $(touch {marker}.subst) > {marker}.redirect\n"
        f'read -r line; echo "$line" > {marker}.stdin\n'
    )
    check_bash_syntax(hostile)
    assert list(tmp_path.iterdir()) == []


def test_bash_is_looked_up_again_when_path_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """bash is found on the operator's own PATH (never a tenant's: PATH is a reserved name in
    a spec), once per PATH value: a PATH without bash refuses, the next PATH finds it again."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no bash there
    with pytest.raises(PreflightError, match="bash is not on PATH"):
        check_bash_syntax("#!/bin/bash\necho ok\n")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    check_bash_syntax("#!/bin/bash\necho ok\n")


def test_the_script_file_in_memory_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """No descriptor is left behind per check, passed or refused."""
    closed: list[int] = []
    real_close = preflight.os.close
    made: list[int] = []
    real_memfd = preflight.os.memfd_create

    def memfd_create(name: str, flags: int = 0) -> int:
        made.append(real_memfd(name, flags))
        return made[-1]

    def close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(preflight.os, "memfd_create", memfd_create)
    monkeypatch.setattr(preflight.os, "close", close)
    check_bash_syntax("#!/bin/bash\necho ok\n")
    with pytest.raises(PreflightError):
        check_bash_syntax("#!/bin/bash\nif\n")
    assert len(made) == 2
    assert set(made) <= set(closed)


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
