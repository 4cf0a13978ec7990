"""Names that tie a Slurm job and its staging directory to one attempt of one SlurmJob.

Everything here is a pure function of (namespace, name, uid, attempt), so a restarted
operator finds the same job name, comment and directories again.

- `job_name`: the Slurm job name, unique per resource and attempt, at most 200 characters of
  `[A-Za-z0-9._-]`. It carries the first 8 characters of the uid and the attempt number; the
  namespace and name are shortened first when the whole would be too long.
- `comment`: the Slurm comment, carrying all four values in full so that a job found by name
  can be matched exactly (`parse_comment`).
- `staging_dir`: `<root>/<namespace>/<name>-<uid8>/attempt-<n>`; `resource_dir` is its parent.
- `log_file`: the name of a log in the attempt's directory: `stdout.log` / `stderr.log`, and
  `stdout-<i>.log` / `stderr-<i>.log` for task `i` of a job array.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Array task indexes a log name may carry: 0 to 999,999 (an index is also part of a file name
# here, so it is kept short and plain).
from slurmjob_operator.api.logs import MAX_ARRAY_INDEX, LogStream

#: The files of an attempt's staging directory.
SCRIPT_FILE = "job.sh"
ENV_FILE = "job.env"
SECRETS_FILE = "secrets.env"
STDOUT_FILE = "stdout.log"
STDERR_FILE = "stderr.log"
#: Written by the batch script: what the collective probe found (`core.probe`).
PROBE_RECORD_FILE = "probe.record"
#: A job array's tasks each write their own pair, named by `array_log_file`; Slurm expands `%a`
#: in the paths of the submit to the task's index.
ARRAY_STDOUT_PATTERN = "stdout-%a.log"
ARRAY_STDERR_PATTERN = "stderr-%a.log"

#: The two log streams of an attempt, as `log_file` names them.
LOG_STREAMS = tuple(s.value for s in LogStream)

JOB_NAME_MAX = 200
COMMENT_TAG = "slurmjob.io"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_COMMENT_RE = re.compile(
    r"^slurmjob\.io ns=(?P<ns>\S+) name=(?P<name>\S+) uid=(?P<uid>\S+) attempt=(?P<attempt>\d+)$"
)
_NS_MAX = 63


@dataclass(frozen=True)
class JobIdentity:
    """The SlurmJob attempt a Slurm job belongs to, as read back from its comment."""

    namespace: str
    name: str
    uid: str
    attempt: int


def _check(namespace: str, name: str, uid: str, attempt: int) -> None:
    for label, value in (("namespace", namespace), ("name", name), ("uid", uid)):
        if not value or value in {".", ".."} or any(c in value for c in "/\0 \t\n"):
            raise ValueError(f"{label} {value!r} cannot be used in a job name or a path")
    if attempt < 1:
        raise ValueError(f"attempt {attempt} must be at least 1")


def uid8(uid: str) -> str:
    """The first 8 characters of the uid, made safe for names and paths."""
    return _UNSAFE.sub("-", uid[:8])


def job_name(namespace: str, name: str, uid: str, attempt: int) -> str:
    """`sj-<ns>-<name>-<uid8>-a<n>`: deterministic, at most 200 chars of `[A-Za-z0-9._-]`."""
    _check(namespace, name, uid, attempt)
    tail = f"-{uid8(uid)}-a{attempt}"
    budget = JOB_NAME_MAX - len("sj-") - len("-") - len(tail)
    ns = _UNSAFE.sub("-", namespace)[:_NS_MAX]
    safe_name = _UNSAFE.sub("-", name)[: max(budget - len(ns), 1)]
    return f"sj-{ns}-{safe_name}{tail}"[:JOB_NAME_MAX]


def comment(namespace: str, name: str, uid: str, attempt: int) -> str:
    """`slurmjob.io ns=<ns> name=<name> uid=<uid> attempt=<n>` (parsed by `parse_comment`)."""
    _check(namespace, name, uid, attempt)
    return f"{COMMENT_TAG} ns={namespace} name={name} uid={uid} attempt={attempt}"


def parse_comment(text: str | None) -> JobIdentity | None:
    """The identity in a comment written by `comment`, or None for any other comment."""
    if not text:
        return None
    match = _COMMENT_RE.fullmatch(text.strip())
    if match is None:
        return None
    attempt = int(match["attempt"])
    if attempt < 1:
        return None
    return JobIdentity(match["ns"], match["name"], match["uid"], attempt)


def array_log_file(stream: str, index: int) -> str:
    """`stdout-<index>.log` / `stderr-<index>.log`: the log file of one task of an array, in
    its attempt's staging directory (what Slurm makes of `ARRAY_*_PATTERN`)."""
    return log_file(stream, index)


def log_files(index: int | None) -> tuple[str, str]:
    """The (stdout, stderr) file names of a plain job (None) or of one task of an array."""
    return log_file("stdout", index), log_file("stderr", index)


def resource_dir(storage_root: Path, namespace: str, name: str, uid: str) -> Path:
    """`<root>/<namespace>/<name>-<uid8>`: every attempt of one resource lives below it."""
    _check(namespace, name, uid, 1)
    return storage_root / namespace / f"{name}-{uid8(uid)}"


#: The name of a walltime chain's checkpoint directory beside its attempt directories.
CHECKPOINT_DIR = "checkpoint"


def checkpoint_dir(storage_root: Path, namespace: str, name: str, uid: str) -> Path:
    """`<root>/<namespace>/<name>-<uid8>/checkpoint`: a walltime chain's directory that every
    segment reads and writes, outside every attempt directory (never archived)."""
    return resource_dir(storage_root, namespace, name, uid) / CHECKPOINT_DIR


def staging_dir(storage_root: Path, namespace: str, name: str, uid: str, attempt: int) -> Path:
    """`<root>/<namespace>/<name>-<uid8>/attempt-<n>`: one attempt's script, env and logs."""
    _check(namespace, name, uid, attempt)
    return resource_dir(storage_root, namespace, name, uid) / f"attempt-{attempt}"


def log_file(stream: str, index: int | None = None) -> str:
    """The file name of `stream` ("stdout" or "stderr") in an attempt's directory:
    `stdout.log`, or `stdout-<index>.log` for task `index` of a job array. The index is an
    int from 0 to `MAX_ARRAY_INDEX`, never text, so a name can hold no path."""
    if stream not in LOG_STREAMS:
        raise ValueError(f"log stream {stream!r} is not one of {', '.join(LOG_STREAMS)}")
    if index is None:
        return f"{stream}.log"
    if type(index) is not int or not 0 <= index <= MAX_ARRAY_INDEX:
        raise ValueError(f"array index {index!r} is not an integer from 0 to {MAX_ARRAY_INDEX}")
    return f"{stream}-{index}.log"
