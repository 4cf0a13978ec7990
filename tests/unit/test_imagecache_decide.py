"""The image cache's decisions (imagecache/decide.py) and records (imagecache/record.py): one
import per (scope, reference), adopted by name after a lost answer and never sent twice,
transient failures retried, permanent ones failing at once, a tag re-resolved after its reuse
time, a digest never; the result file parsed as hostile input."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmjob_operator.imagecache.decide import (
    REASON_FAILED,
    REASON_PULLING,
    REASON_READY,
    AdoptImport,
    Fail,
    ImportJob,
    ImportPolicy,
    JobState,
    Ready,
    RetryLater,
    SubmitImport,
    WaitImport,
    decide,
    image_condition,
    submitted,
)
from slurmjob_operator.imagecache.exits import EXIT_CLASSES
from slurmjob_operator.imagecache.layout import CacheLayout, import_job_name
from slurmjob_operator.imagecache.record import (
    MAX_USERS,
    FailureKind,
    ImageRecord,
    ImportResult,
    RecordState,
    ResultError,
    parse_result,
)
from slurmjob_operator.imagecache.request import ImageRefused, ImageRequest, image_request, may_use
from slurmjob_operator.site.catalogs import ArtifactFormat

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"
OTHER = "sha256:" + "f" * 64
LAYOUT = CacheLayout(PurePosixPath("/cache"))
POLICY = ImportPolicy(
    tag_reuse_seconds=600,
    max_retries=2,
    backoff_seconds=60,
    backoff_max_seconds=100,
    failure_reuse_seconds=300,
)
SQSH = ArtifactFormat.SQSH


def request(image: str = "nvcr.io/nvidia/pytorch:24.01", tenant: str | None = None) -> ImageRequest:
    return image_request(
        image,
        tenant=tenant,
        allowed_registries=["nvcr.io/nvidia"],
        with_credentials=tenant is not None,
        fmt=SQSH,
    )


TAG = request()
PINNED = request(f"nvcr.io/nvidia/pytorch@{DIGEST}")


def result(record: ImageRecord, digest: str = DIGEST, **changes: Any) -> ImportResult:
    assert record.attempt is not None
    fields: dict[str, Any] = {
        "job": record.attempt.job_name,
        "reference": record.reference,
        "format": record.format,
        "platform": "linux/amd64",
        "digest": digest,
        "sha256": "a" * 64,
        "size": 40 << 20,
        "inode": 1234,
        "ctime_ns": 1_796_652_383_889_095_757,
    }
    return ImportResult.model_validate(fields | changes)


def job(record: ImageRecord, state: JobState, exit_code: int | None = None) -> ImportJob:
    assert record.attempt is not None
    return ImportJob(record.attempt.job_name, state, record.attempt.job_id or 7, exit_code)


def running(
    req: ImageRequest = TAG, record: ImageRecord | None = None, at: datetime = NOW
) -> ImageRecord:
    action = decide(req, record, at, POLICY, LAYOUT)
    assert isinstance(action, SubmitImport)
    return submitted(action.record, 7)


def ready(req: ImageRequest = TAG, digest: str = DIGEST) -> ImageRecord:
    record = running(req)
    action = decide(
        req, record, NOW, POLICY, LAYOUT, job(record, JobState.COMPLETED, 0), result(record, digest)
    )
    assert isinstance(action, Ready)
    return action.record


def test_first_use_submits_attempt_one_written_ahead() -> None:
    action = decide(TAG, None, NOW, POLICY, LAYOUT)
    assert isinstance(action, SubmitImport)
    record = action.record
    assert action.attempt == record.attempt
    assert action.attempt.number == 1
    assert action.attempt.write_ahead
    assert action.attempt.job_id is None
    assert action.attempt.job_name == import_job_name(TAG.key, int(NOW.timestamp()), 1)
    assert record.state is RecordState.RESOLVING
    assert record.scope == "public"
    pinned = decide(PINNED, None, NOW, POLICY, LAYOUT)
    assert pinned.record.state is RecordState.IMPORTING
    assert image_condition(action).reason == REASON_PULLING


def test_a_lost_answer_is_adopted_by_name_never_sent_twice() -> None:
    written = decide(TAG, None, NOW, POLICY, LAYOUT).record  # crash after the write-ahead
    adopt = decide(TAG, written, NOW, POLICY, LAYOUT)
    assert isinstance(adopt, AdoptImport)
    assert adopt.job_name == written.attempt.job_name  # type: ignore[union-attr]
    # Found by its name: adopted, waited for.
    found = ImportJob(adopt.job_name, JobState.PENDING, job_id=42)
    wait = decide(TAG, written, NOW, POLICY, LAYOUT, found)
    assert isinstance(wait, WaitImport)
    assert wait.job_id == 42
    assert wait.record.attempt is not None
    assert not wait.record.attempt.write_ahead
    # Not found yet (no proof of absence): still adopting, nothing submitted.
    unproven = ImportJob(adopt.job_name, JobState.PENDING)
    assert isinstance(decide(TAG, written, NOW, POLICY, LAYOUT, unproven), AdoptImport)
    # Proven absent: the next attempt, under another name; not a retry.
    absent = ImportJob(adopt.job_name, JobState.ABSENT)
    again = decide(TAG, written, NOW, POLICY, LAYOUT, absent)
    assert isinstance(again, SubmitImport)
    assert again.attempt.number == 2
    assert again.attempt.job_name != adopt.job_name
    assert again.record.retries == 0


def test_two_slurmjobs_of_one_tag_share_one_import() -> None:
    record = running()
    for _ in range(2):  # every waiting SlurmJob's reconcile
        action = decide(TAG, record, NOW, POLICY, LAYOUT, job(record, JobState.RUNNING))
        assert isinstance(action, WaitImport)
        assert action.record == record
    assert isinstance(decide(TAG, record, NOW, POLICY, LAYOUT), WaitImport)


def test_a_completed_import_publishes_its_entry() -> None:
    record = running()
    action = decide(
        TAG, record, NOW, POLICY, LAYOUT, job(record, JobState.COMPLETED, 0), result(record)
    )
    assert isinstance(action, Ready)
    entry = action.entry
    assert entry.path == f"/cache/entries/public/sha256-{HEX}.sqsh"
    assert entry.ctime == "1796652383.889095757"
    assert (entry.size, entry.inode) == (40 << 20, 1234)
    done = action.record
    assert done.state is RecordState.READY
    assert done.entry == entry
    assert done.resolved is not None
    assert done.resolved.digest == DIGEST
    assert done.attempt is not None
    assert done.attempt.ended_at == NOW
    assert image_condition(action).ready
    assert image_condition(action).reason == REASON_READY
    assert ImageRecord.from_json(done.to_json()) == done


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"job": "slurmjob-import-000000000000-9"}, "job"),
        ({"reference": "nvcr.io/nvidia/pytorch:other"}, "reference"),
        ({"format": ArtifactFormat.SIF}, "format"),
        ({"platform": "linux/arm64"}, "platform"),
    ],
)
def test_a_result_that_is_not_this_attempts_fails_permanently(
    change: dict[str, Any], says: str
) -> None:
    record = running()
    action = decide(
        TAG,
        record,
        NOW,
        POLICY,
        LAYOUT,
        job(record, JobState.COMPLETED, 0),
        result(record, **change),
    )
    assert isinstance(action, Fail)
    assert says in action.message
    assert action.record.failure is not None
    assert action.record.failure.reason == "ResultInvalid"


def test_a_digest_import_must_publish_that_digest() -> None:
    record = running(PINNED)
    bad = decide(
        PINNED,
        record,
        NOW,
        POLICY,
        LAYOUT,
        job(record, JobState.COMPLETED, 0),
        result(record, OTHER),
    )
    assert isinstance(bad, Fail)
    assert "digest" in bad.message


def test_a_completed_job_without_result_is_retried() -> None:
    record = running()
    action = decide(TAG, record, NOW, POLICY, LAYOUT, job(record, JobState.COMPLETED, 0))
    assert isinstance(action, RetryLater)
    assert action.record.failure is not None
    assert action.record.failure.reason == "ResultMissing"


@pytest.mark.parametrize(
    ("exit_code", "permanent", "reason"),
    [
        (64, True, "ImportUsage"),
        (65, True, "BadImage"),
        (66, True, "ManifestUnknown"),
        (77, True, "AccessDenied"),
        (78, True, "RuntimeMisconfigured"),
        (69, False, "RegistryUnavailable"),
        (73, False, "CacheUnwritable"),
        (74, False, "CacheIOError"),
        (75, False, "TemporaryFailure"),
        (None, False, "ImportInterrupted"),  # node failure, timeout, cancel
        (1, False, "ImportFailed"),
        (137, False, "ImportFailed"),
    ],
)
def test_exit_codes(exit_code: int | None, permanent: bool, reason: str) -> None:
    record = running()
    action = decide(TAG, record, NOW, POLICY, LAYOUT, job(record, JobState.FAILED, exit_code))
    failure = action.record.failure
    assert failure is not None
    assert failure.reason == reason
    if permanent:
        assert isinstance(action, Fail)
        assert action.reason == REASON_FAILED
        assert failure.kind is FailureKind.PERMANENT
        assert action.record.state is RecordState.FAILED
        assert image_condition(action).reason == REASON_FAILED
    else:
        assert isinstance(action, RetryLater)
        assert action.at == NOW + timedelta(seconds=60)
        assert failure.kind is FailureKind.TRANSIENT
        assert action.record.retries == 1
    assert action.record.attempt is not None
    assert action.record.attempt.ended_at == NOW
    assert {c for c, k in EXIT_CLASSES.items() if k.kind is FailureKind.PERMANENT} == {
        64,
        65,
        66,
        77,
        78,
    }


def test_transient_failures_back_off_then_give_up() -> None:
    record, at = running(), NOW
    names = {record.attempt.job_name}  # type: ignore[union-attr]
    for delay in (60, 100):  # 60, then 120 capped at 100
        action = decide(TAG, record, at, POLICY, LAYOUT, job(record, JobState.FAILED, 75))
        assert isinstance(action, RetryLater)
        assert action.at == at + timedelta(seconds=delay)
        waiting = decide(TAG, action.record, at, POLICY, LAYOUT)
        assert isinstance(waiting, RetryLater)
        assert waiting.at == action.at
        at = action.at
        again = decide(TAG, action.record, at, POLICY, LAYOUT)
        assert isinstance(again, SubmitImport)
        assert again.attempt.job_name not in names
        names.add(again.attempt.job_name)
        record = submitted(again.record, 7)
    final = decide(TAG, record, at, POLICY, LAYOUT, job(record, JobState.FAILED, 69))
    assert isinstance(final, Fail)
    assert "gave up after 2 retries" in final.message


def test_a_failure_answers_for_a_while_then_a_new_import_is_tried() -> None:
    record = running()
    failed = decide(TAG, record, NOW, POLICY, LAYOUT, job(record, JobState.FAILED, 77)).record
    soon = decide(TAG, failed, NOW + timedelta(seconds=299), POLICY, LAYOUT)
    assert isinstance(soon, Fail)
    assert "AccessDenied" in soon.message
    later = decide(TAG, failed, NOW + timedelta(seconds=300), POLICY, LAYOUT)
    assert isinstance(later, SubmitImport)
    assert later.attempt.number == 2
    assert later.record.failure is None
    assert later.record.retries == 0


def test_a_tag_is_re_resolved_after_its_reuse_time_a_digest_never() -> None:
    tagged = ready()
    assert isinstance(decide(TAG, tagged, NOW + timedelta(seconds=599), POLICY, LAYOUT), Ready)
    stale = decide(TAG, tagged, NOW + timedelta(seconds=600), POLICY, LAYOUT)
    assert isinstance(stale, SubmitImport)
    assert stale.record.state is RecordState.RESOLVING
    assert stale.record.entry == tagged.entry
    pinned = ready(PINNED)
    assert isinstance(decide(PINNED, pinned, NOW + timedelta(days=400), POLICY, LAYOUT), Ready)


def test_a_moved_tag_retires_its_old_entry() -> None:
    used = ready().used_by("uid-1", NOW)
    later = NOW + timedelta(hours=1)
    record = submitted(decide(TAG, used, later, POLICY, LAYOUT).record, 8)
    moved = decide(
        TAG,
        record,
        later,
        POLICY,
        LAYOUT,
        job(record, JobState.COMPLETED, 0),
        result(record, OTHER),
    )
    assert isinstance(moved, Ready)
    assert moved.entry.digest == OTHER
    assert [e.digest for e in moved.record.retired] == [DIGEST]
    assert moved.record.retired[0].retired_at == later
    assert moved.record.pinned_digests() == {DIGEST}  # uid-1 still runs on the old one
    # Resolved again to the same digest: nothing retired.
    same = submitted(decide(TAG, used, later, POLICY, LAYOUT).record, 9)
    kept = decide(TAG, same, later, POLICY, LAYOUT, job(same, JobState.COMPLETED, 0), result(same))
    assert isinstance(kept, Ready)
    assert kept.record.retired == []


def test_a_job_gone_without_a_final_state() -> None:
    record = running()
    lost = decide(TAG, record, NOW, POLICY, LAYOUT, job(record, JobState.ABSENT))
    assert isinstance(lost, RetryLater)
    assert lost.record.failure is not None
    assert lost.record.failure.reason == "ImportLost"
    found = decide(TAG, record, NOW, POLICY, LAYOUT, job(record, JobState.ABSENT), result(record))
    assert isinstance(found, Ready)


def test_inputs_that_do_not_belong_are_refused() -> None:
    record = running()
    with pytest.raises(ValueError, match="not the record's attempt"):
        decide(TAG, record, NOW, POLICY, LAYOUT, ImportJob("slurmjob-import-x-1", JobState.RUNNING))
    with pytest.raises(ValueError, match="not the record of"):
        decide(request("nvcr.io/nvidia/other:1"), record, NOW, POLICY, LAYOUT)
    with pytest.raises(ValueError, match="timezone"):
        decide(TAG, record, NOW.replace(tzinfo=None), POLICY, LAYOUT)


def test_requests_and_who_may_use_a_record() -> None:
    with pytest.raises(ImageRefused, match="not among"):
        request("nvcr.io/other/x:1")
    with pytest.raises(ValueError, match="credentials"):
        image_request(
            "nvcr.io/nvidia/x:1",
            tenant=None,
            allowed_registries=["nvcr.io"],
            with_credentials=True,
            fmt=SQSH,
        )
    own = ready(request(tenant="team-a"))
    assert own.scope == "tenant-team-a"
    assert own.tenant == "team-a"
    assert may_use(own, "team-a", ["nvcr.io"]) == ""
    assert "another tenant's" in may_use(own, "team-b", ["nvcr.io"])
    assert "another tenant's" in may_use(own, None, ["nvcr.io"])
    shared = ready()
    assert may_use(shared, "team-b", ["nvcr.io/nvidia"]) == ""
    assert may_use(shared, None, ["nvcr.io"]) == ""
    assert "does not list" in may_use(shared, "team-b", ["ghcr.io"])


def test_users_are_bounded_and_released() -> None:
    record = ready()
    for i in range(MAX_USERS + 5):
        record = record.used_by(f"uid-{i}", NOW + timedelta(seconds=i))
    assert len(record.users) == MAX_USERS
    assert record.users[-1].uid == f"uid-{MAX_USERS + 4}"
    assert record.last_use == NOW + timedelta(seconds=MAX_USERS + 4)
    record = record.released_by(f"uid-{MAX_USERS + 4}")
    assert all(u.uid != f"uid-{MAX_USERS + 4}" for u in record.users)
    assert ImageRecord.from_json(record.to_json()) == record


def test_record_schema_versions() -> None:
    data = json.loads(ready().to_json())
    assert data["schemaVersion"] == 1
    assert "lastUse" in data
    for version, says in ((2, "newer"), (0, "not a version"), (None, "not a version")):
        with pytest.raises(ValueError, match=says):
            ImageRecord.from_json(json.dumps(data | {"schemaVersion": version}))
    with pytest.raises(ValueError, match="bytes"):
        ImageRecord.from_json(" " * (256 * 1024 + 1))
    with pytest.raises(ValueError, match="canonical"):
        ImageRecord.from_json(json.dumps(data | {"reference": "NVCR.io/nvidia/pytorch:24.01"}))
    with pytest.raises(ValueError, match="a Ready record has an entry"):
        ImageRecord.from_json(json.dumps(data | {"state": "Ready", "entry": None}))


# ---------------------------------------------------------------------------------------------
# The result file

GOOD = (
    "job=slurmjob-import-0123456789ab-1\nreference=nvcr.io/nvidia/pytorch:24.01\nformat=sqsh\n"
    f"platform=linux/amd64\ndigest={DIGEST}\nsha256={'a' * 64}\nsize=41943040\ninode=1234\n"
    "ctime=1796652383.889095757\n"
)


def test_result_round_trip() -> None:
    parsed = parse_result(GOOD.encode())
    assert parsed.ctime_ns == 1_796_652_383_889_095_757
    assert parsed.size == 41943040
    assert parsed.render() == GOOD
    assert (
        parse_result(GOOD.replace("ctime=1796652383.889095757", "ctime=5").encode()).ctime_ns
        == 5 * 10**9
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (GOOD + "size=1\n", "twice"),
        (GOOD + "path=/etc/passwd\n", "not one of"),
        (GOOD.replace("size=41943040", "size=+1"), "size"),
        (GOOD.replace("size=41943040", "size=1_0"), "size"),
        (GOOD.replace("size=41943040", "size=0"), "size"),
        (GOOD.replace("size=41943040", "size=" + "9" * 21), "size"),
        (GOOD.replace("inode=1234", "inode= 12"), "inode"),
        (GOOD.replace("ctime=1796652383.889095757", "ctime=1.1234567891"), "ctime"),
        (GOOD.replace("ctime=1796652383.889095757", "ctime=1."), "ctime"),
        (GOOD.replace("a" * 64, "A" * 64), "sha256"),
        (GOOD.replace(DIGEST, "sha256:xyz"), "digest"),
        (GOOD.replace("format=sqsh", "format=tar"), "format"),
        (GOOD.replace("job=slurmjob", "job=-slurmjob"), "job"),
        (GOOD.replace("reference=nvcr.io", "reference=NVCR.io"), "canonical"),
        (GOOD.replace("platform=linux/amd64", "platform=linux amd64"), "platform"),
        (GOOD.replace("inode=1234\n", ""), "missing inode"),
        (GOOD.replace("\n", "\r\n"), "unexpected value"),
        (GOOD + "x" * 5000, "bytes"),
    ],
)
def test_hostile_results_are_refused(text: str, says: str) -> None:
    with pytest.raises(ResultError, match=says):
        parse_result(text.encode())


def test_non_ascii_results_are_refused() -> None:
    with pytest.raises(ResultError, match="ASCII"):
        parse_result(GOOD.replace("size=41943040", "size=٤٢").encode())


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=600))
def test_any_bytes_parse_or_are_refused(data: bytes) -> None:
    with contextlib.suppress(ResultError):
        parse_result(data)


# ---------------------------------------------------------------------------------------------
# Whatever Slurm and the storage say, one record never sends a job name twice

_observations = st.lists(
    st.tuples(
        st.sampled_from(["answer", "lose", "pending", "done", "fail", "absent", "nothing"]),
        st.sampled_from([0, 65, 75, None]),
        st.integers(0, 900),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(steps=_observations, pinned=st.booleans())
def test_names_are_never_reused_and_one_attempt_is_in_flight(
    steps: list[tuple[str, int | None, int]], pinned: bool
) -> None:
    req = PINNED if pinned else TAG
    record: ImageRecord | None = None
    at, sent, next_id = NOW, set[str](), 100
    for kind, code, delay in steps:
        at += timedelta(seconds=delay)
        observed: ImportJob | None = None
        found: ImportResult | None = None
        if record is not None and record.in_flight and kind != "nothing":
            attempt = record.attempt
            assert attempt is not None
            state = {
                "done": JobState.COMPLETED,
                "fail": JobState.FAILED,
                "absent": JobState.ABSENT,
            }.get(kind, JobState.PENDING)
            found_id = attempt.job_id if kind != "answer" or attempt.job_id else next_id
            observed = ImportJob(attempt.job_name, state, found_id, code)
            found = result(record) if kind == "done" else None
        action = decide(req, record, at, POLICY, LAYOUT, observed, found)
        record = action.record
        if isinstance(action, SubmitImport):
            assert action.attempt.job_name not in sent
            sent.add(action.attempt.job_name)
            if kind != "lose":
                record = submitted(record, next_id)
                next_id += 1
            assert record.in_flight
        if isinstance(action, WaitImport | AdoptImport):
            assert record.in_flight
        if isinstance(action, Ready):
            assert record.state is RecordState.READY
            assert record.entry == action.entry
            assert not record.in_flight
        if isinstance(action, Fail):
            assert record.state is RecordState.FAILED
            assert not record.in_flight
        assert record.retries <= POLICY.max_retries
        assert ImageRecord.from_json(record.to_json()) == record
