"""The log archive (issue 25, "Logs outlive the resource"): a deleted SlurmJob's attempts are
copied, redacted and without following a link, to the admin's archive root before its staging
goes; the archive keeps to its retention and size cap; the log API serves an entry only to the
SlurmJob name and namespace (by uid) it was taken from. The controller against the in-memory
store and Slurm, real files."""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.logs import LogQuery, LogStream, QueryError
from slurmjob_operator.controller.logaccess import ClusterFiles, LogAccess, LogFailure
from slurmjob_operator.core import naming
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.redact import Redactor
from slurmjob_operator.doctor.archive import check_archive
from slurmjob_operator.doctor.report import Outcome, Report
from slurmjob_operator.storage.archive import (
    ArchiveRecord,
    AttemptSource,
    read_record,
    write_entry,
)
from slurmjob_operator.storage.archivesweep import sweep

from .controller_fakes import Bed, make_bed
from .test_controller_storage import SECRET_ENV, _restarted, submit

MARKER = "OPERATOR-ONLY-MARKER-archive-5c1e"
DAY = 86400.0


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    archive = tmp_path / "archive"
    archive.mkdir(mode=0o700)
    return make_bed(tmp_path, archive_root=archive)


def staging(bed: Bed, ref: Any, attempt: int = 1) -> Path:
    return naming.staging_dir(bed.settings.storage_root, ref.namespace, ref.name, ref.uid, attempt)


def entry(bed: Bed, ref: Any) -> Path:
    root = bed.settings.archive_root
    assert root is not None
    return Path(root, ref.namespace, ref.uid)


def reasons(bed: Bed) -> list[str]:
    return [reason for _, reason, _ in bed.store.events]


def access(bed: Bed) -> LogAccess:
    files = {"default": ClusterFiles(bed.settings, lambda namespace: None)}
    return LogAccess(
        bed.store,
        files,
        Clusters(("default",)),
        archive_root=bed.settings.archive_root,
    )


async def deleted(bed: Bed, ref: Any) -> None:
    body = bed.store.body(ref)
    await bed.controller.finalize(body)
    del bed.store.objects[(ref.namespace, ref.name)]


async def test_every_file_of_every_attempt_is_archived_before_the_staging_goes(bed: Bed) -> None:
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    base = staging(bed, ref)
    (base / "stdout.log").write_text("".join(f"line {i}\n" for i in range(5000)))
    (base / "stderr.log").write_text("warning: x\n")
    (base / "stdout-0.log").write_text("task 0\n")
    (base / "stdout-12.log").write_text("task 12\n")
    (base / "notes.txt").write_text("not a log\n")
    await deleted(bed, ref)
    assert not base.exists(), "the staging is removed after the archive"
    where = entry(bed, ref)
    files = sorted(p.name for p in (where / "attempt-1").iterdir())
    assert files == ["job.sh", "stderr.log", "stdout-0.log", "stdout-12.log", "stdout.log"]
    assert (where / "attempt-1" / "stdout.log").read_text().count("\n") == 5000, "not a tail"
    assert "#!/" in (where / "attempt-1" / "job.sh").read_text()
    status = json.loads((where / "status.json").read_text())
    assert status["attempts"][0]["number"] == 1
    record = read_record(where.parent.parent, ref.namespace, ref.uid)
    assert record is not None
    assert record.name == ref.name
    assert record.namespace_uid == await bed.store.namespace_uid(ref.namespace)
    assert record.attempts[0].files[-1] == "job.sh"
    for path in [where, where / "attempt-1"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    for path in (where / "attempt-1").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.stat().st_uid == os.geteuid()
    assert "LogsArchived" in reasons(bed)
    [text] = [m for _, r, m in bed.store.events if r == "LogsArchived"]
    assert f"--uid {ref.uid}" in text


async def test_only_names_an_attempt_can_have_are_archived(bed: Bed) -> None:
    """A job that fills its directory with log-like names gets no more than an attempt can
    have archived (task indices below 10,000), and the log API answers 404 beyond them."""
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    base = staging(bed, ref)
    for index in (9999, 10000, 99999, 1234567):
        (base / f"stdout-{index}.log").write_text(f"task {index}\n")
    for index in range(2000):
        (base / f"junk-{index}.log").write_text("x\n")
    await deleted(bed, ref)
    files = sorted(p.name for p in (entry(bed, ref) / "attempt-1").iterdir())
    assert files == ["job.sh", "stdout-9999.log"]
    with pytest.raises(LogFailure) as beyond:
        await access(bed).read(ref.namespace, ref.name, LogQuery(uid=ref.uid, index=50000))
    assert beyond.value.code == 404


async def test_secret_values_are_hidden_in_the_archive(bed: Bed) -> None:
    bed.store.secrets[("team-a", "hf")] = {"token": "archived-value-9876"}
    ref = await submit(bed, env=SECRET_ENV)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").write_text("token=archived-value-9876\n")
    del bed.store.secrets[("team-a", "hf")]  # deleted with the SlurmJob: the given value stays
    await deleted(bed, ref)
    text = (entry(bed, ref) / "attempt-1" / "stdout.log").read_text()
    assert "archived-value-9876" not in text
    assert text.startswith("token=")


async def test_without_the_values_nothing_is_archived_and_an_event_says_so(bed: Bed) -> None:
    bed.store.secrets[("team-a", "hf")] = {"token": "lost-value-12345"}
    ref = await submit(bed, env=SECRET_ENV)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").write_text("token=lost-value-12345\n")
    del bed.store.secrets[("team-a", "hf")]
    restarted = _restarted(bed)  # as the job user: no copy of the values is kept
    await restarted.finalize(bed.store.body(ref))
    assert not entry(bed, ref).exists()
    assert not staging(bed, ref).exists()
    [message] = [m for _, r, m in bed.store.events if r == "LogsNotArchived"]
    assert "secret values" in message


async def test_a_planted_link_is_left_out_not_followed(bed: Bed, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(MARKER + "\n")
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").symlink_to(secret)
    (staging(bed, ref) / "stderr.log").write_text("kept\n")
    await deleted(bed, ref)
    where = entry(bed, ref)
    everything = "".join(p.read_text() for p in where.rglob("*") if p.is_file())
    assert MARKER not in everything
    record = read_record(where.parent.parent, ref.namespace, ref.uid)
    assert record is not None
    assert record.attempts[0].skipped == ["stdout.log"]
    assert (where / "attempt-1" / "stderr.log").read_text() == "kept\n"


async def test_the_caps_keep_each_files_end_and_bound_the_entry(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    archive.mkdir(mode=0o700)
    bed = make_bed(
        tmp_path,
        archive_root=archive,
        archive_file_max_bytes=65536,
        archive_max_bytes=1024**2,
        archive_entry_max_bytes=512 * 1024,
    )
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    base = staging(bed, ref)
    (base / "stdout.log").write_text("".join(f"line {i:06d}\n" for i in range(20000)))
    for index in range(40):
        (base / f"stdout-{index}.log").write_bytes(b"x" * 40000 + b"\n")
    await deleted(bed, ref)
    record = read_record(archive, ref.namespace, ref.uid)
    assert record is not None
    [attempt] = record.attempts
    kept = (entry(bed, ref) / "attempt-1" / "stdout.log").read_text()
    assert len(kept) <= 65536
    assert kept.endswith("line 019999\n")
    assert kept.startswith("line ")
    assert "stdout.log" in attempt.truncated
    # The entry cap is shared: every task's file keeps its end, none is left out.
    assert not attempt.skipped
    assert record.entry_cap == 512 * 1024
    for index in range(40):
        assert (entry(bed, ref) / "attempt-1" / f"stdout-{index}.log").read_bytes().endswith(b"x\n")
    total = sum(p.stat().st_size for p in entry(bed, ref).rglob("*") if p.is_file())
    assert total <= 512 * 1024 + 65536


async def test_the_log_api_serves_an_archive_only_to_its_name_and_namespace(bed: Bed) -> None:
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").write_text("hello from the archive\n")
    logs = access(bed)
    live = await logs.read(ref.namespace, ref.name, LogQuery(uid=ref.uid))
    assert live.text == "hello from the archive\n"
    assert not live.ended
    await deleted(bed, ref)
    logs = access(bed)
    answer = await logs.read(ref.namespace, ref.name, LogQuery(uid=ref.uid))
    assert answer.text == "hello from the archive\n"
    assert answer.ended
    assert answer.found
    status = json.loads((entry(bed, ref) / "status.json").read_text())
    assert answer.phase is not None
    assert answer.phase == status["phase"]
    whole = await logs.read(ref.namespace, ref.name, LogQuery(uid=ref.uid, offset=6))
    assert whole.text == "from the archive\n"
    with pytest.raises(LogFailure) as gone:
        await logs.read(ref.namespace, ref.name, LogQuery())
    assert gone.value.code == 404, "without the uid a deleted SlurmJob is not found"
    with pytest.raises(LogFailure) as other:
        await logs.read(ref.namespace, "another-name", LogQuery(uid=ref.uid))
    assert other.value.code == 404
    with pytest.raises(LogFailure) as unknown:
        await logs.read(ref.namespace, ref.name, LogQuery(uid=str(uuid.uuid4())))
    assert unknown.value.code == 404
    with pytest.raises(LogFailure) as attempt:
        await logs.read(ref.namespace, ref.name, LogQuery(uid=ref.uid, attempt=2))
    assert (attempt.value.code, attempt.value.reason) == (404, "NoAttempt")
    bed.store.namespace_uids[ref.namespace] = str(uuid.uuid4())  # deleted and made again
    with pytest.raises(LogFailure) as reused:
        await access(bed).read(ref.namespace, ref.name, LogQuery(uid=ref.uid))
    assert reused.value.code == 404


async def test_a_new_slurmjob_of_the_same_name_is_read_live(bed: Bed) -> None:
    old = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, old) / "stdout.log").write_text("old\n")
    await deleted(bed, old)
    new = await submit(bed)
    (staging(bed, new) / "stdout.log").write_text("new\n")
    logs = access(bed)
    assert (await logs.read(new.namespace, new.name, LogQuery())).text == "new\n"
    assert (await logs.read(new.namespace, new.name, LogQuery(uid=new.uid))).text == "new\n"
    assert (await logs.read(old.namespace, old.name, LogQuery(uid=old.uid))).text == "old\n"


async def test_without_an_archive_root_nothing_is_archived_or_served(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").write_text("gone\n")
    await deleted(bed, ref)
    assert "LogsArchived" not in reasons(bed)
    assert "LogsNotArchived" not in reasons(bed)
    with pytest.raises(LogFailure) as gone:
        await access(bed).read(ref.namespace, ref.name, LogQuery(uid=ref.uid))
    assert gone.value.code == 404


def _record(namespace: str = "team-a", when: float = 0.0) -> ArchiveRecord:
    return ArchiveRecord(
        namespace=namespace,
        namespace_uid="ns-uid",
        name="train",
        uid=str(uuid.uuid4()),
        archived_at=when,
    )


def _write(root: Path, record: ArchiveRecord, source: Path, size: int) -> None:
    (source / "attempt-1").mkdir(parents=True, exist_ok=True)
    (source / "attempt-1" / "stdout.log").write_bytes(b"y" * (size - 1) + b"\n")
    (source / "attempt-1" / "job.sh").write_text("#!/bin/bash\n")
    attempt = AttemptSource(
        1, source, source / "attempt-1", os.geteuid(), os.geteuid(), Redactor(())
    )
    write_entry(root, record, [attempt], {}, file_cap=1024**2, entry_cap=10 * 1024**2)


def test_a_retried_archive_replaces_the_entry(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    root.mkdir(mode=0o700)
    record = _record(when=time.time())
    _write(root, record, tmp_path / "s1", 100)
    _write(root, record, tmp_path / "s2", 200)
    path = root / "team-a" / record.uid / "attempt-1" / "stdout.log"
    assert path.stat().st_size == 200
    assert [p.name for p in (root / "team-a").iterdir()] == [record.uid], "no temporary left"


def test_the_sweep_keeps_retention_then_size_oldest_first(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    root.mkdir(mode=0o700)
    now = time.time()
    old = _record(when=now - 40 * DAY)
    middle = _record(when=now - 3 * DAY)
    recent = _record(namespace="team-b", when=now - 1 * DAY)
    for i, record in enumerate([old, middle, recent]):
        _write(root, record, tmp_path / f"s{i}", 300_000)
    crashed = root / "team-a" / f".{uuid.uuid4()}.0123456789ab.tmp"
    crashed.mkdir()
    os.utime(crashed, (now - 7200, now - 7200))
    swept = sweep(root, now, 30 * DAY, 10**9)
    assert swept.removed == 1
    assert not (root / "team-a" / old.uid).exists()
    assert not crashed.exists()
    swept = sweep(root, now, 30 * DAY, 400_000)
    assert swept.removed == 1
    assert not (root / "team-a" / middle.uid).exists()
    assert (root / "team-b" / recent.uid).exists()
    assert swept.kept == 1


def test_the_sweep_never_follows_or_removes_what_is_not_the_operators(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    root.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep\n")
    (root / "team-a").symlink_to(outside)
    swept = sweep(root, time.time(), 0.0, 0)
    assert swept.removed == 0
    assert (outside / "keep").exists()


def test_a_record_of_another_entry_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    root.mkdir(mode=0o700)
    record = _record(when=time.time())
    _write(root, record, tmp_path / "s", 10)
    other = str(uuid.uuid4())
    (root / "team-a" / record.uid).rename(root / "team-a" / other)
    with pytest.raises(ValueError, match="names team-a/"):
        read_record(root, "team-a", other)
    assert read_record(root, "team-a", "not-a-uid") is None


def test_the_query_takes_a_uid_and_nothing_like_a_path() -> None:
    uid = str(uuid.uuid4())
    assert LogQuery.parse([("uid", uid)]).uid == uid
    assert ("uid", uid) in LogQuery(stream=LogStream.STDOUT, uid=uid).items()
    for bad in ["../x", uid.upper(), uid + "/", "", uid[:-1]]:
        with pytest.raises(QueryError):
            LogQuery.parse([("uid", bad)])


def _doctor(tmp_path: Path, **settings: Any) -> dict[str, Any]:
    report = Report()
    bed = make_bed(tmp_path, **settings)
    check_archive(bed.settings, [bed.settings.storage_root], report)
    [check] = report.checks
    return {"outcome": check.outcome, "detail": check.detail}


def test_doctor_says_what_is_wrong_with_the_archive_root(tmp_path: Path) -> None:
    assert _doctor(tmp_path)["outcome"] is Outcome.SKIP
    open_root = tmp_path / "open"
    open_root.mkdir(mode=0o755)
    open_root.chmod(0o755)
    found = _doctor(tmp_path, archive_root=open_root)
    assert found["outcome"] is Outcome.FAIL
    assert "chmod 0700" in found["detail"]
    inside = tmp_path / "storage" / "archive"
    inside.mkdir(mode=0o700)
    found = _doctor(tmp_path, archive_root=inside)
    assert found["outcome"] is Outcome.FAIL
    assert "inside the storage root" in found["detail"]
    good = tmp_path / "good"
    good.mkdir(mode=0o700)
    found = _doctor(tmp_path, archive_root=good)
    # The tests run as the job user: the archive is only safe where no compute node mounts it.
    assert found["outcome"] is Outcome.WARN
    assert "no compute node mounts" in found["detail"]
    found = _doctor(tmp_path, archive_root=good, staging_owner="4242:4242")
    assert found["outcome"] is Outcome.OK
    assert "SLURMJOB_ARCHIVE_ROOT" in _doctor(tmp_path, archive_root=tmp_path / "none")["detail"]
