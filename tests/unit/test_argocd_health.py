"""docs/argocd/health.lua in a real Lua 5.4 interpreter (Debian's lua5.4), against a status
sample of every phase, as Argo CD runs it: the script's chunk with a global `obj`, returning
a table {status, message}."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "argocd" / "health.lua"
LUA = shutil.which("lua5.4")

pytestmark = pytest.mark.skipif(
    LUA is None, reason="lua5.4 is not installed (apt-get install -y lua5.4)"
)

# Loads the script as a chunk with `obj` as a global, prints status and message on two lines.
HARNESS = """
local chunk = assert(loadfile(arg[1], "t", setmetatable({obj = OBJ}, {__index = _G})))
local hs = chunk()
io.write(tostring(hs.status), "\\n", tostring(hs.message), "\\n")
"""


def lua_literal(value: Any) -> str:
    """A Lua table constructor for JSON-like data (as Argo CD hands `obj` to the script)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid Lua escapes for this data
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"[{json.dumps(k)}] = {lua_literal(v)}" for k, v in value.items()) + "}"
        )
    raise TypeError(value)


def health(obj: dict[str, Any]) -> tuple[str, str]:
    assert LUA is not None
    program = f"local OBJ = {lua_literal(obj)}\n{HARNESS}"
    proc = subprocess.run(
        [LUA, "-", str(SCRIPT)],
        input=program,
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    )
    assert proc.returncode == 0, proc.stderr
    status, message = proc.stdout.split("\n")[:2]
    return status, message


def job(status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": {"name": "j", "namespace": "default"},
        "spec": {"command": ["true"]},
    }
    if status is not None:
        obj["status"] = status
    return obj


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-02T03:04:05Z",
    }


@pytest.mark.parametrize(
    ("status", "want"),
    [
        pytest.param(None, ("Progressing", "Waiting for the operator"), id="fresh"),
        pytest.param({}, ("Progressing", "Waiting for the operator"), id="empty-status"),
        pytest.param(
            {"phase": "Pending", "message": "waiting for Secret hf"},
            ("Progressing", "waiting for Secret hf"),
            id="pending",
        ),
        pytest.param(
            {
                "phase": "Submitting",
                "message": "submission unconfirmed: timeout",
                "conditions": [cond("Submitted", "Unknown", "SubmissionUnconfirmed")],
            },
            ("Progressing", "submission unconfirmed: timeout"),
            id="submitting",
        ),
        pytest.param(
            {"phase": "Queued", "message": "Resources", "slurmJobId": 12},
            ("Progressing", "Resources"),
            id="queued",
        ),
        pytest.param(
            {"phase": "Running", "message": "running on n1"},
            ("Progressing", "running on n1"),
            id="running",
        ),
        pytest.param({"phase": "Running"}, ("Progressing", "Running"), id="running-no-message"),
        pytest.param(
            {"phase": "Succeeded", "message": "completed"}, ("Healthy", "completed"), id="succeeded"
        ),
        pytest.param(
            {"phase": "Failed", "message": "exit code 3"}, ("Degraded", "exit code 3"), id="failed"
        ),
        pytest.param(
            {"phase": "Cancelled", "message": "scancel"}, ("Degraded", "scancel"), id="cancelled"
        ),
        pytest.param(
            {"phase": "Unknown", "message": "state WIBBLE"},
            ("Degraded", "state WIBBLE"),
            id="unknown",
        ),
        pytest.param(
            {
                "phase": "Pending",
                "message": "spec.pools[0].gpuSeries: unknown series",
                "conditions": [
                    cond("Ready", "False", "InvalidSpec", "spec.pools[0].gpuSeries: unknown")
                ],
            },
            ("Degraded", "spec.pools[0].gpuSeries: unknown"),
            id="invalid-spec-not-yet-failed",
        ),
        pytest.param(
            {
                "phase": "Succeeded",
                "message": "done",
                "conditions": [cond("Finished", "True", "Succeeded")],
            },
            ("Healthy", "done"),
            id="finished-succeeded",
        ),
        pytest.param(
            {
                "phase": "Cancelled",
                "message": "scancel",
                "conditions": [cond("Finished", "True", "Cancelled")],
            },
            ("Degraded", "scancel"),
            id="finished-cancelled",
        ),
        pytest.param(
            {
                "phase": "Unknown",
                "message": "lost",
                "conditions": [cond("Finished", "True", "Unknown")],
            },
            ("Degraded", "lost"),
            id="finished-lost",
        ),
        pytest.param(
            {
                "phase": "Failed",
                "message": "timeLimit over MaxTime",
                "conditions": [
                    cond("Failed", "True", "LimitExceeded", "timeLimit 48:00:00 over 24:00:00"),
                    cond("Finished", "False", "LimitExceeded", "timeLimit 48:00:00 over 24:00:00"),
                ],
            },
            ("Degraded", "timeLimit 48:00:00 over 24:00:00"),
            id="refused-until-edited",
        ),
        pytest.param(
            {
                "phase": "Pending",
                "message": "retry in 30 s",
                "conditions": [cond("Finished", "False", "NotFinished")],
            },
            ("Progressing", "retry in 30 s"),
            id="not-finished-any-more",
        ),
        pytest.param(
            {
                "phase": "Pending",
                "message": "spec.suspend is true: nothing is submitted",
                "conditions": [cond("Suspended", "True", "Suspended")],
            },
            ("Suspended", "spec.suspend is true: nothing is submitted"),
            id="suspended-before-submit",
        ),
        pytest.param(
            {
                "phase": "Queued",
                "message": "Slurm job 7 held",
                "conditions": [cond("Ready", "True", "Queued"), cond("Suspended", "True", "Held")],
            },
            ("Suspended", "Slurm job 7 held"),
            id="suspended-held",
        ),
        pytest.param(
            {
                "phase": "Queued",
                "message": "released",
                "conditions": [cond("Suspended", "False", "Released")],
            },
            ("Progressing", "released"),
            id="released",
        ),
    ],
)
def test_health(status: dict[str, Any] | None, want: tuple[str, str]) -> None:
    assert health(job(status)) == want


def test_every_phase_is_covered() -> None:
    from slurmjob_operator.api.status import Phase

    phases = {"Succeeded": "Healthy", "Failed": "Degraded", "Cancelled": "Degraded"}
    for phase in Phase:
        got, _ = health(job({"phase": phase.value}))
        assert got == phases.get(
            phase.value, "Degraded" if phase is Phase.UNKNOWN else "Progressing"
        )
