"""`DELETE /jobs` (bulk cancel): the body sent and the answers Slurm 26.05.5 gave, as captured
in tests/data/slurm-captures, and `SlurmClient.cancel_many` over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.slurm.dialects import BulkCancelResult, dialect_for
from slurmjob_operator.slurm.dialects.kill import kill_jobs_body, parse_kill_jobs
from slurmjob_operator.slurm.errors import (
    InvalidJobRef,
    SlurmAuthError,
    SlurmMalformed,
    SlurmUnsupported,
)
from slurmjob_operator.slurm.http import HttpTransport

from .handles import handle
from .slurm_fakes import FakeSlurm, envelope
from .test_slurm_client import client

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "slurm-captures" / "slurm-26.05.5"


@pytest.fixture(autouse=True)
def _in_a_step(step: object) -> None:
    """Handles live as long as their step: one per test."""


def capture(name: str) -> Any:
    return json.loads((CAPTURES / name).read_text(encoding="utf-8"))


def failure(step_id: str, code: int, number: int | None = None) -> dict[str, Any]:
    return {
        "error": {"string": "x", "code": code, "message": "m"},
        "step_id": step_id,
        "job_id": {"set": number is not None, "infinite": False, "number": number or 0},
        "federation": {"sibling": ""},
    }


def summary(result: BulkCancelResult) -> dict[str, Any]:
    return {
        "missing": set(result.missing),
        "done": set(result.already_done),
        "refused": [ref for ref, _ in result.refused],
        "unmatched": len(result.unmatched),
    }


NOTHING: dict[str, Any] = {"missing": set(), "done": set(), "refused": [], "unmatched": 0}


def test_the_body_is_the_one_slurm_took() -> None:
    sent = capture("req_kill_jobs.json")
    assert kill_jobs_body(sent["jobs"]) == sent


def test_everything_cancelled_answers_no_failure() -> None:
    result = parse_kill_jobs(capture("resp_kill_jobs.json"), ["21", "23"])
    assert summary(result) == NOTHING


def test_an_id_slurm_never_had_is_missing_and_the_others_are_cancelled() -> None:
    result = parse_kill_jobs(capture("resp_kill_jobs_unknown.json"), ["12", "13", "14", "99999990"])
    assert summary(result) == {**NOTHING, "missing": {"99999990"}}


def test_a_job_already_ended_is_done() -> None:
    result = parse_kill_jobs(capture("resp_kill_jobs_done.json"), ["15"])
    assert summary(result) == {**NOTHING, "done": {"15"}}


def test_sluids_are_matched_as_sent() -> None:
    result = parse_kill_jobs(
        capture("resp_kill_jobs_sluid.json"), ["s599M9X1B1S200", "s999999999999Z"]
    )
    assert result.missing == {"s999999999999Z"}


def test_a_refusal_is_kept_for_its_own_id_only() -> None:
    payload = envelope(status=[failure("7", 1, 7), failure("8", 2017)])
    result = parse_kill_jobs(payload, ["7", "8", "9"])
    assert summary(result) == {**NOTHING, "missing": {"8"}, "refused": ["7"]}
    message = result.refusal("7")
    assert message is not None
    assert message.error_number == 1
    assert result.refusal("9") is None


def test_a_failure_naming_no_id_sent_is_unmatched() -> None:
    # Matched by the number when step_id is not what was sent (a SLUID sent, the id back).
    by_number = parse_kill_jobs(envelope(status=[failure("12+0", 1, 12)]), ["12"])
    assert by_number.refusal("12") is not None
    stray = parse_kill_jobs(envelope(status=[failure("40", 1, 40)]), ["12"])
    assert summary(stray) == {**NOTHING, "unmatched": 1}


def test_an_unreadable_failure_record_fails_the_read() -> None:
    with pytest.raises(SlurmMalformed):
        dialect_for("v0.0.45").parse_kill_jobs(envelope(status=[{"error": "nope"}]), ["1"])


def test_v38_has_no_bulk_cancel() -> None:
    dialect = dialect_for("v0.0.38")
    assert not dialect.supports_bulk_cancel
    with pytest.raises(SlurmUnsupported):
        dialect.kill_jobs_body(["1"])
    assert all(dialect_for(f"v0.0.4{i}").supports_bulk_cancel for i in range(6))


# -- over HTTP ------------------------------------------------------------------------------


async def test_cancel_many_sends_one_delete_with_every_id(
    fake: FakeSlurm, session: HttpTransport
) -> None:
    fake.json("DELETE", "/slurm/v0.0.45/jobs", capture("resp_kill_jobs_unknown.json"))
    jobs = [handle(1, "alice"), handle(2, "alice"), handle(3, "alice"), handle(99999990, "alice")]
    result = await client(fake, session).cancel_many(jobs)
    assert result.missing == {"99999990"}
    (seen,) = fake.seen
    assert seen.body == {"jobs": ["1", "2", "3", "99999990"], "flags": ["FULL_JOB"]}
    assert seen.headers["X-SLURM-USER-NAME"] == "alice"


async def test_an_id_no_job_can_have_sends_nothing(fake: FakeSlurm, session: HttpTransport) -> None:
    with pytest.raises(InvalidJobRef):
        await client(fake, session).cancel_many(
            [handle(1, "alice"), handle("s" + "x" * 40, "alice")]
        )
    assert not fake.seen


async def test_a_release_without_the_route_is_unsupported(
    fake: FakeSlurm, session: HttpTransport
) -> None:
    with pytest.raises(SlurmUnsupported):
        await client(fake, session, "v0.0.40").cancel_many([handle(1, "alice")])
    with pytest.raises(SlurmUnsupported):
        await client(fake, session, "v0.0.38").cancel_many([handle(1, "alice")])
    assert len(fake.seen) == 1, "v0.0.38 is not even asked"


async def test_a_refused_token_is_an_auth_error(fake: FakeSlurm, session: HttpTransport) -> None:
    fake.json(
        "DELETE",
        "/slurm/v0.0.45/jobs",
        envelope(errors=[{"error_number": 1007, "error": "Protocol authentication error"}]),
        status=401,
    )
    with pytest.raises(SlurmAuthError):
        await client(fake, session).cancel_many([handle(1, "alice")])
