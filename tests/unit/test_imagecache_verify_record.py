"""The verified artifacts' records and result files (imagecache/verifyrecord.py): a record key
and job names that are DNS labels and safe words whatever the runtime id, a record that
refuses what does not hold together, and the result file a verification job writes parsed as
hostile input (strict keys, bounded, plain digits, no path)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.imagecache.layout import is_dns_label, is_safe_word
from slurmjob_operator.imagecache.verifyrecord import (
    MAX_RESULT_BYTES,
    ArtifactRecord,
    VerifiedFile,
    VerifyResult,
    VerifyResultError,
    VerifyState,
    artifact_key,
    parse_verify_result,
    verify_job_name,
    verify_result_path,
)
from slurmjob_operator.site.catalogs import ArtifactFormat

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SHA = "ab" * 32
PATH = "/shared/runtimes/pytorch-24.01.sqsh"
JOB = "slurmjob-verify-0123456789ab-1"
GOOD = (
    f"job={JOB}\nformat=sqsh\nsha256={SHA}\nsize=4096\ninode=77\n"
    "ctime=1796000000.123456789\nuid=0\nmode=444\n"
)


@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=200))
def test_keys_and_job_names_are_labels_and_safe_words(runtime_id: str, path: str) -> None:
    key = artifact_key(runtime_id, SHA, path)
    assert is_dns_label(key)
    assert key.startswith("artifact-")
    name = verify_job_name(key, 1_796_000_000, 3)
    assert is_safe_word(name)
    assert name.startswith("slurmjob-verify-")
    assert name.endswith("-3")


def test_a_key_changes_with_the_runtime_its_sha256_or_its_path() -> None:
    base = artifact_key("pytorch", SHA, PATH)
    assert artifact_key("pytorch", SHA, PATH) == base
    assert artifact_key("pytorch2", SHA, PATH) != base
    assert artifact_key("pytorch", "cd" * 32, PATH) != base
    assert artifact_key("pytorch", SHA, PATH + ".new") != base


def test_job_names_differ_by_epoch_and_attempt() -> None:
    key = artifact_key("pytorch", SHA, PATH)
    names = {verify_job_name(key, epoch, n) for epoch in (1, 2) for n in (1, 2)}
    assert len(names) == 4
    for bad_key, epoch, attempt in (("image-x-0", 1, 1), (key, -1, 1), (key, 1, 0)):
        with pytest.raises(ValueError, match=r"artifact record key|attempts count from 1"):
            verify_job_name(bad_key, epoch, attempt)


def test_the_result_path_is_under_the_caches_verify_directory() -> None:
    root = PurePosixPath("/cache")
    assert verify_result_path(root, JOB) == PurePosixPath(f"/cache/verify/{JOB}.result")
    for bad in ("../x", ".hidden", "a/b", ""):
        with pytest.raises(ValueError, match="not a safe path word"):
            verify_result_path(root, bad)


def _record(**update: object) -> ArtifactRecord:
    values: dict[str, object] = {
        "key": artifact_key("pytorch", SHA, PATH),
        "epoch": 1_796_000_000,
        "runtimeId": "pytorch",
        "sha256": SHA,
        "path": PATH,
        "format": "sqsh",
        "state": "Verifying",
        **update,
    }
    return ArtifactRecord.model_validate(values)


def _verified(**update: object) -> dict[str, object]:
    return {
        "jobName": JOB,
        "sha256": SHA,
        "size": 4096,
        "inode": 77,
        "ctimeNs": 1_796_000_000_123_456_789,
        "ownerUid": 0,
        "mode": 0o444,
        "verifiedAt": NOW.isoformat(),
        **update,
    }


def test_a_record_round_trips_through_its_json() -> None:
    record = _record(state="Verified", verified=_verified())
    again = ArtifactRecord.from_json(record.to_json())
    assert again == record
    assert isinstance(again.verified, VerifiedFile)
    assert again.state is VerifyState.VERIFIED


@pytest.mark.parametrize(
    ("update", "why"),
    [
        ({"key": "artifact-other-0123456789abcdef"}, "not the key of its artifact"),
        ({"state": "Verified"}, "exactly when it has a verified file"),
        ({"verified": _verified()}, "exactly when it has a verified file"),
        ({"state": "Verified", "verified": _verified(sha256="cd" * 32)}, "registry's sha256"),
        ({"state": "Failed"}, "a Failed record has a failure"),
        ({"path": "relative/x.sqsh"}, "plain absolute path"),
        ({"path": "/a/../etc/shadow"}, "plain absolute path"),
        ({"path": "/a//b"}, "plain absolute path"),
        ({"path": "/a/b\nc"}, "plain absolute path"),
        ({"runtimeId": "a\x1bb"}, "printable"),
        ({"schemaVersion": 2}, "schema version"),
        ({"state": "Verified", "verified": _verified(mode=0o10000)}, "less than or equal"),
        ({"state": "Verified", "verified": _verified(ownerUid=-1)}, "greater than or equal"),
    ],
)
def test_a_record_that_does_not_hold_together_is_refused(
    update: dict[str, object], why: str
) -> None:
    if "runtimeId" in update or "path" in update:
        runtime_id = str(update.get("runtimeId", "pytorch"))
        path = str(update.get("path", PATH))
        update = {**update, "key": artifact_key(runtime_id, SHA, path)}
    with pytest.raises(ValueError, match=why):
        _record(**update)


@pytest.mark.parametrize(
    "text",
    ["[]", '{"schemaVersion": true}', '{"schemaVersion": 0}', '{"schemaVersion": 9}'],
)
def test_a_stored_record_of_no_known_version_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a JSON object|schemaVersion"):
        ArtifactRecord.from_json(text)


def test_a_huge_stored_record_is_refused_unread() -> None:
    with pytest.raises(ValueError, match="more than"):
        ArtifactRecord.from_json("{" + " " * 70_000 + "}")


def test_a_good_result_parses_to_what_stat_printed() -> None:
    result = parse_verify_result(GOOD.encode())
    assert result == VerifyResult(
        job=JOB,
        format=ArtifactFormat.SQSH,
        sha256=SHA,
        size=4096,
        inode=77,
        ctime_ns=1_796_000_000_123_456_789,
        uid=0,
        mode=0o444,
    )
    assert result.render() == GOOD


@given(
    size=st.integers(1, 2**63 - 1),
    inode=st.integers(1, 2**64 - 1),
    ctime_ns=st.integers(0, 2**63 - 1),
    uid=st.integers(0, 2**32 - 2),
    mode=st.integers(0, 0o7777),
)
def test_what_a_result_renders_parses_back(
    size: int, inode: int, ctime_ns: int, uid: int, mode: int
) -> None:
    result = VerifyResult(
        job=JOB,
        format=ArtifactFormat.SIF,
        sha256=SHA,
        size=size,
        inode=inode,
        ctime_ns=ctime_ns,
        uid=uid,
        mode=mode,
    )
    assert parse_verify_result(result.render().encode()) == result


def _with(line: str, value: str) -> bytes:
    key = line.split("=", 1)[0]
    return "".join(
        f"{key}={value}\n" if row.startswith(f"{key}=") else f"{row}\n" for row in GOOD.splitlines()
    ).encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (GOOD.encode() + b"x" * MAX_RESULT_BYTES, "more than"),
        (GOOD.replace("size=4096", "size=4096\xe9").encode("latin-1"), "not ASCII"),
        (GOOD.encode() + b"path=/etc/shadow\n", "not one of"),
        (GOOD.encode() + b"size=1\n", "given twice"),
        (GOOD.replace("uid=0\n", "").encode(), "missing uid"),
        (b"", "missing job"),
        (GOOD.replace("=", " = ", 1).encode(), "not one of"),
        (_with("job", "../../etc/passwd"), "empty or odd value"),
        (_with("job", "a b"), "empty or odd value"),
        (_with("job", "-rf"), "safe word"),
        (_with("job", ""), "empty or odd value"),
        (_with("format", "tar"), "format"),
        (_with("sha256", "AB" * 32), "sha256"),
        (_with("sha256", "ab" * 31), "sha256"),
        (_with("size", "+4096"), "empty or odd value"),
        (_with("size", "4_096"), "not a number"),
        (_with("size", "0"), "size"),
        (_with("size", "1" * 21), "not a number"),
        (_with("size", "0x10"), "not a number"),
        (_with("inode", str(2**64)), "inode"),
        (_with("ctime", "1796000000"), "seconds.nanoseconds"),
        (_with("ctime", "1796000000."), "seconds.nanoseconds"),
        (_with("ctime", "1796000000.1234567890"), "seconds.nanoseconds"),
        (_with("ctime", "-1.0"), "not a number"),
        (_with("uid", "4294967295"), "uid"),
        (_with("mode", "8"), "not a number"),
        (_with("mode", "17777"), "mode"),
        ("\n".join(GOOD.splitlines()).replace("\n", "\r\n").encode(), "odd value"),
    ],
)
def test_a_hostile_result_is_refused_with_the_reason(data: bytes, why: str) -> None:
    with pytest.raises(VerifyResultError, match=why):
        parse_verify_result(data)


def test_a_result_names_no_path() -> None:
    """Nothing in the file is ever used as a path: the keys are fixed, and none names one."""
    assert json.dumps(parse_verify_result(GOOD.encode()).model_dump(mode="json")).count("/") == 0
