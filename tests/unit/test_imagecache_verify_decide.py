"""The verification of registry artifacts, decided (imagecache/verifydecide.py): one job per
(runtime, sha256, path), adopted by name after a lost answer and never sent twice; the result
checked against the registry and the site's owner rule; a verified file that the operator no
longer sees as it was verified is verified again, never passed; failures told apart by the
script's exit codes."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.imagecache.decide import ImportJob, JobState
from slurmjob_operator.imagecache.record import FailureKind
from slurmjob_operator.imagecache.verifydecide import (
    VERIFY_EXIT_CLASSES,
    AdoptVerify,
    FileSeen,
    SubmitVerify,
    Verified,
    VerifyFailed,
    VerifyLater,
    VerifyPolicy,
    VerifyRequest,
    WaitVerify,
    changes,
    classify_verify_exit,
    decide_verify,
    unsafe,
)
from slurmjob_operator.imagecache.verifyrecord import (
    ArtifactRecord,
    VerifyResult,
    VerifyState,
    verify_job_name,
)
from slurmjob_operator.site.catalogs import ArtifactFormat

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SHA = "ab" * 32
CACHE_UID = 990
REQUEST = VerifyRequest("pytorch", SHA, "/shared/runtimes/pytorch.sqsh", ArtifactFormat.SQSH)
POLICY = VerifyPolicy(
    cache_uid=CACHE_UID,
    max_retries=2,
    backoff_seconds=60,
    backoff_max_seconds=100,
    failure_reuse_seconds=300,
)
SEEN = FileSeen(regular=True, uid=0, mode=0o444, size=4096, inode=77, ctime_ns=1_796_000_000)
TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "image" / "verify.sh.j2"


def _result(name: str, **update: object) -> VerifyResult:
    values: dict[str, object] = {
        "job": name,
        "format": ArtifactFormat.SQSH,
        "sha256": SHA,
        "size": SEEN.size,
        "inode": SEEN.inode,
        "ctime_ns": SEEN.ctime_ns,
        "uid": SEEN.uid,
        "mode": SEEN.mode,
        **update,
    }
    return VerifyResult.model_validate(values)


def _submitted(now: datetime = NOW) -> tuple[ArtifactRecord, str]:
    """A record whose first job was submitted and answered with id 41."""
    action = decide_verify(REQUEST, None, now, POLICY, SEEN)
    assert isinstance(action, SubmitVerify)
    name = action.attempt.job_name
    waited = decide_verify(
        REQUEST, action.record, now, POLICY, SEEN, ImportJob(name, JobState.PENDING, 41)
    )
    assert isinstance(waited, WaitVerify)
    return waited.record, name


def _verified() -> ArtifactRecord:
    record, name = _submitted()
    done = ImportJob(name, JobState.COMPLETED, 41, 0)
    action = decide_verify(REQUEST, record, NOW, POLICY, SEEN, done, _result(name))
    assert isinstance(action, Verified)
    return action.record


def test_a_first_use_submits_one_named_write_ahead_job() -> None:
    action = decide_verify(REQUEST, None, NOW, POLICY, None)
    assert isinstance(action, SubmitVerify)
    record = action.record
    assert record.state is VerifyState.VERIFYING
    assert record.attempt == action.attempt
    assert action.attempt.write_ahead
    assert action.attempt.job_id is None
    assert action.attempt.job_name == verify_job_name(record.key, int(NOW.timestamp()), 1)
    assert action.why == ""


def test_a_lost_answer_is_adopted_by_name_never_sent_again() -> None:
    submit = decide_verify(REQUEST, None, NOW, POLICY, SEEN)
    assert isinstance(submit, SubmitVerify)
    name = submit.attempt.job_name
    adopt = decide_verify(REQUEST, submit.record, NOW, POLICY, SEEN)
    assert adopt == AdoptVerify(name, submit.record)
    still = ImportJob(name, JobState.PENDING)  # not found, the fencing window not over
    assert isinstance(decide_verify(REQUEST, submit.record, NOW, POLICY, SEEN, still), AdoptVerify)
    found = decide_verify(
        REQUEST, submit.record, NOW, POLICY, SEEN, ImportJob(name, JobState.RUNNING, 52)
    )
    assert isinstance(found, WaitVerify)
    assert found.job_id == 52
    assert found.record.attempt is not None
    assert (found.record.attempt.job_id, found.record.attempt.write_ahead) == (52, False)


def test_a_submit_proven_absent_gets_a_new_name() -> None:
    submit = decide_verify(REQUEST, None, NOW, POLICY, SEEN)
    assert isinstance(submit, SubmitVerify)
    gone = ImportJob(submit.attempt.job_name, JobState.ABSENT)
    again = decide_verify(REQUEST, submit.record, NOW, POLICY, SEEN, gone)
    assert isinstance(again, SubmitVerify)
    assert again.attempt.number == 2
    assert again.attempt.job_name != submit.attempt.job_name


def test_a_passed_job_verifies_the_file_the_operator_sees() -> None:
    record = _verified()
    assert record.state is VerifyState.VERIFIED
    assert record.verified is not None
    assert (record.verified.size, record.verified.inode) == (SEEN.size, SEEN.inode)
    assert record.attempt is not None
    assert record.attempt.ended_at == NOW
    assert record.failure is None
    ArtifactRecord.from_json(record.to_json())  # it holds together


def test_a_verified_file_unchanged_passes_with_no_job_and_no_write() -> None:
    record = _verified()
    later = NOW + timedelta(days=30)
    action = decide_verify(REQUEST, record, later, POLICY, SEEN)
    assert action == Verified(record.verified, record)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seen", "named"),
    [
        (replace(SEEN, inode=78), "inode 77 is now 78"),
        (replace(SEEN, ctime_ns=SEEN.ctime_ns + 1), "ctime"),
        (replace(SEEN, size=4097), "size 4096 is now 4097"),
        (replace(SEEN, mode=0o644), "mode 444 is now 644"),
        (replace(SEEN, uid=CACHE_UID), "owner 0 is now 990"),
        (replace(SEEN, regular=False), "no longer a regular file"),
        (None, "gone or unreadable"),
    ],
)
def test_a_verified_file_that_changed_is_verified_again(seen: FileSeen | None, named: str) -> None:
    record = _verified()
    action = decide_verify(REQUEST, record, NOW + timedelta(hours=1), POLICY, seen)
    assert isinstance(action, SubmitVerify)
    assert named in action.why
    assert action.record.verified is None
    assert action.record.state is VerifyState.VERIFYING
    assert action.attempt.number == 2


_FIELDS = st.sampled_from(["regular", "uid", "mode", "size", "inode", "ctime_ns", "gone"])


@given(st.lists(_FIELDS, unique=True, max_size=3))
def test_a_pass_is_given_only_for_the_very_file_verified(changed: list[str]) -> None:
    """Whatever differs, and however much: Verified exactly when nothing does."""
    record = _verified()
    seen: FileSeen | None = SEEN
    for name in changed:
        if seen is None:
            break
        if name == "gone":
            seen = None
        elif name == "regular":
            seen = replace(seen, regular=False)
        else:
            seen = replace(seen, **{name: getattr(seen, name) + 8})
    action = decide_verify(REQUEST, record, NOW, POLICY, seen)
    assert isinstance(action, Verified) == (not changed)
    assert isinstance(action, Verified | SubmitVerify)


def _ended(code: int | None, state: JobState = JobState.FAILED) -> tuple[ArtifactRecord, object]:
    record, name = _submitted()
    job = ImportJob(name, state, 41, code)
    return record, decide_verify(REQUEST, record, NOW, POLICY, SEEN, job)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (65, "ArtifactMismatch"),
        (66, "ArtifactMissing"),
        (77, "ArtifactUnsafe"),
        (64, "VerifyUsage"),
    ],
)
def test_a_permanent_exit_fails_the_waiting_slurmjobs_at_once(code: int, reason: str) -> None:
    _, action = _ended(code)
    assert isinstance(action, VerifyFailed)
    assert action.message.startswith(f"runtime pytorch: {reason}: verification job 41")
    assert f"(exit code {code})" in action.message
    assert action.record.state is VerifyState.FAILED


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (73, "VerifyUnwritable"),
        (74, "VerifyIOError"),
        (75, "ArtifactChanging"),
        (None, "VerifyInterrupted"),
        (137, "VerifyFailed"),
    ],
)
def test_a_transient_exit_is_tried_again_later(code: int | None, reason: str) -> None:
    _, action = _ended(code)
    assert isinstance(action, VerifyLater)
    assert action.at == NOW + timedelta(seconds=60)
    failure = action.record.failure
    assert failure is not None
    assert (failure.kind, failure.reason) == (FailureKind.TRANSIENT, reason)
    assert action.record.retries == 1


def test_transient_failures_past_the_retries_fail_for_good() -> None:
    record, name = _submitted()
    moment = NOW
    for _ in range(POLICY.max_retries + 1):
        job = ImportJob(name, JobState.FAILED, 41, 75)
        action = decide_verify(REQUEST, record, moment, POLICY, SEEN, job)
        if isinstance(action, VerifyFailed):
            break
        assert isinstance(action, VerifyLater)
        moment = action.at
        again = decide_verify(REQUEST, action.record, moment, POLICY, SEEN)
        assert isinstance(again, SubmitVerify)
        name = again.attempt.job_name
        record = decide_verify(
            REQUEST, again.record, moment, POLICY, SEEN, ImportJob(name, JobState.PENDING, 42)
        ).record
    assert isinstance(action, VerifyFailed)
    assert "gave up after 2 retries" in action.message


def test_a_failure_fails_new_slurmjobs_for_a_while_then_is_verified_afresh() -> None:
    _, action = _ended(77)
    assert isinstance(action, VerifyFailed)
    record = action.record
    soon = decide_verify(REQUEST, record, NOW + timedelta(seconds=299), POLICY, SEEN)
    assert isinstance(soon, VerifyFailed)
    assert soon.message == action.message
    later = decide_verify(REQUEST, record, NOW + timedelta(seconds=300), POLICY, SEEN)
    assert isinstance(later, SubmitVerify)
    assert (later.record.failure, later.record.retries) == (None, 0)


def test_a_retry_waits_for_its_time() -> None:
    _, action = _ended(74)
    assert isinstance(action, VerifyLater)
    early = decide_verify(REQUEST, action.record, action.at - timedelta(seconds=1), POLICY, SEEN)
    assert early == VerifyLater(action.at, action.record)
    due = decide_verify(REQUEST, action.record, action.at, POLICY, SEEN)
    assert isinstance(due, SubmitVerify)


@pytest.mark.parametrize(
    ("update", "why", "kind"),
    [
        ({"sha256": "cd" * 32}, "says sha256", FailureKind.PERMANENT),
        ({"job": "slurmjob-verify-ffffffffffff-1"}, "says job", FailureKind.PERMANENT),
        ({"format": ArtifactFormat.SIF}, "says format sif", FailureKind.PERMANENT),
        ({"uid": 1000}, "neither root nor the cache user", FailureKind.PERMANENT),
        ({"mode": 0o664}, "lets its group or others write", FailureKind.PERMANENT),
        ({"mode": 0o446}, "lets its group or others write", FailureKind.PERMANENT),
        ({"inode": 78}, "does not see the file", FailureKind.TRANSIENT),
        ({"ctime_ns": 5}, "does not see the file", FailureKind.TRANSIENT),
    ],
)
def test_a_result_the_operator_cannot_trust_is_no_pass(
    update: dict[str, object], why: str, kind: FailureKind
) -> None:
    record, name = _submitted()
    done = ImportJob(name, JobState.COMPLETED, 41, 0)
    action = decide_verify(REQUEST, record, NOW, POLICY, SEEN, done, _result(name, **update))
    assert isinstance(action, VerifyFailed | VerifyLater)
    failure = action.record.failure
    assert failure is not None
    assert why in failure.message
    assert failure.kind is kind
    assert action.record.verified is None


def test_a_job_ended_without_a_result_or_gone_is_transient() -> None:
    record, name = _submitted()
    done = ImportJob(name, JobState.COMPLETED, 41, 0)
    missing = decide_verify(REQUEST, record, NOW, POLICY, SEEN, done)
    assert isinstance(missing, VerifyLater)
    assert missing.record.failure is not None
    assert missing.record.failure.reason == "ResultMissing"
    gone = ImportJob(name, JobState.ABSENT, 41)
    lost = decide_verify(REQUEST, record, NOW, POLICY, SEEN, gone)
    assert isinstance(lost, VerifyLater)
    assert lost.record.failure is not None
    assert lost.record.failure.reason == "VerifyLost"
    # Gone from Slurm's records, but its result says it passed: that is what counts.
    found = decide_verify(REQUEST, record, NOW, POLICY, SEEN, gone, _result(name))
    assert isinstance(found, Verified)


def test_another_records_request_or_a_naive_clock_is_a_bug() -> None:
    record = _verified()
    with pytest.raises(ValueError, match="is not the record of"):
        decide_verify(replace(REQUEST, sha256="cd" * 32), record, NOW, POLICY, SEEN)
    with pytest.raises(ValueError, match="timezone-aware"):
        decide_verify(REQUEST, record, NOW.replace(tzinfo=None), POLICY, SEEN)
    submitted, _ = _submitted()
    with pytest.raises(ValueError, match="is not the record's attempt"):
        decide_verify(
            REQUEST, submitted, NOW, POLICY, SEEN, ImportJob("other", JobState.RUNNING, 1)
        )


@pytest.mark.parametrize(
    ("uid", "mode", "why"),
    [
        (0, 0o444, ""),
        (0, 0o644, ""),
        (0, 0o755, ""),
        (CACHE_UID, 0o444, ""),
        (CACHE_UID, 0o600, ""),
        (1000, 0o444, "owner uid 1000"),
        (0, 0o664, "mode 664"),
        (0, 0o646, "mode 646"),
        (0, 0o1777, "mode 1777"),  # sticky or not: others may create and rename
        (CACHE_UID, 0o2775, "mode 2775"),
    ],
)
def test_only_root_and_the_owner_may_change_a_verified_file(uid: int, mode: int, why: str) -> None:
    found = unsafe(uid, mode, POLICY)
    assert (found == "") == (why == "")
    assert why in found


def test_changes_name_each_difference() -> None:
    record = _verified()
    assert record.verified is not None
    assert changes(record.verified, SEEN) == ""
    both = changes(record.verified, replace(SEEN, size=1, inode=2))
    assert both == "size 4096 is now 1, inode 77 is now 2"


def test_the_scripts_exit_codes_are_the_table() -> None:
    """The codes templates/image/verify.sh.j2 documents, and whether each is permanent, are
    exactly VERIFY_EXIT_CLASSES."""
    documented = {
        int(code): kind
        for code, kind in re.findall(
            r"^#\s+(\d+)\s+.*\((permanent|transient)\)$", TEMPLATE.read_text(), re.M
        )
    }
    assert set(documented) == set(VERIFY_EXIT_CLASSES) - {64}
    for code, kind in documented.items():
        assert classify_verify_exit(code).kind is FailureKind(kind), code
    used = {int(code) for code in re.findall(r"\bfail (\d+)\b", TEMPLATE.read_text())}
    assert used == set(documented)
