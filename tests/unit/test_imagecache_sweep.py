"""The image cache's sweep: the pure plan (imagecache/evict.py `plan_sweep`), the
housekeeping job's report and state (imagecache/housekeeping.py) and its script
(templates/image/sweep.sh.j2) run by bash on a cache directory of files. The real cache user
runs it as a Slurm job in tests/integration/test_image_cache_e2e.py."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path, PurePosixPath

import pytest
from tests.unit.test_imagecache_evict import LAYOUT, NOW, digest, ready
from tests.unit.test_imagecache_script import _settings

from slurmjob_operator.imagecache.decide import new_record
from slurmjob_operator.imagecache.evict import FAILURE_KEPT, cached_files, plan_sweep
from slurmjob_operator.imagecache.housekeeping import (
    MAX_MISSING,
    ReportError,
    SweepState,
    check_due,
    parse_report,
)
from slurmjob_operator.imagecache.layout import CacheLayout
from slurmjob_operator.imagecache.record import (
    Failure,
    FailureKind,
    ImageRecord,
    ImageUser,
    RecordState,
)
from slurmjob_operator.imagecache.request import image_request
from slurmjob_operator.imagecache.script import render_sweep
from slurmjob_operator.site.catalogs import ArtifactFormat

GIB = 1024**3


def used(record: ImageRecord, uid: str, minutes: int) -> ImageRecord:
    return record.used_by(uid, NOW + timedelta(minutes=minutes))


# ---------------------------------------------------------------------------------------------
# The plan


def test_a_final_slurmjob_releases_its_entry_and_an_unused_one_goes_first() -> None:
    old = used(ready("r.io/a/old:1", 1, size=GIB), "job-old", 1)
    new = used(ready("r.io/a/new:1", 2, size=GIB), "job-new", 2)
    plan = plan_sweep([old, new], live={"job-old"}, capacity=GIB, floor=0)
    # job-new is final: its entry, though used last, goes; job-old's is kept.
    assert new.entry is not None
    assert old.entry is not None
    assert plan.paths == (new.entry.path,)
    assert plan.delete == (new.key,)
    assert plan.write == ()  # job-old's record is as it was


def test_released_users_are_written_even_when_nothing_is_evicted() -> None:
    record = used(ready("r.io/a/x:1", 1), "gone", 1)
    plan = plan_sweep([record], live=set(), capacity=10 * GIB, floor=0)
    assert plan.paths == ()
    assert plan.delete == ()
    (written,) = plan.write
    assert written.users == []


def test_an_entry_in_use_is_kept_within_its_scope_share() -> None:
    pinned = used(ready("r.io/a/p:1", 1, size=GIB), "live", 1)
    spare = ready("r.io/a/s:1", 2, size=GIB)
    plan = plan_sweep([pinned, spare], live={"live"}, capacity=GIB + GIB // 2, floor=0)
    assert spare.entry is not None
    assert plan.paths == (spare.entry.path,)


def test_a_tenant_cannot_pin_the_cache_past_its_share() -> None:
    mine = [used(ready(f"r.io/a/t{i}:1", i, size=GIB, tenant="a"), f"a{i}", i) for i in range(4)]
    theirs = used(ready("r.io/b/x:1", 9, size=GIB, tenant="b"), "b9", 9)
    live = {u.uid for r in [*mine, theirs] for u in r.users}
    plan = plan_sweep([*mine, theirs], live=live, capacity=3 * GIB, floor=0)
    assert theirs.entry is not None
    assert theirs.entry.path not in plan.paths
    assert len(plan.paths) == 2  # a's oldest two, though all of a's are in use


def test_an_import_in_flight_keeps_its_scopes_files_this_pass() -> None:
    done = ready("r.io/a/done:1", 1, size=GIB)
    importing = ready("r.io/a/busy:1", 2, size=GIB)
    assert importing.attempt is not None
    busy = importing.model_copy(
        update={"attempt": importing.attempt.model_copy(update={"ended_at": None})}
    )
    assert busy.in_flight
    plan = plan_sweep([done, busy], live=set(), capacity=GIB // 2, floor=0)
    assert plan.paths == ()


def test_a_missing_entry_is_forgotten() -> None:
    record = ready("r.io/a/x:1", 1)
    assert record.entry is not None
    plan = plan_sweep([record], live=set(), capacity=10 * GIB, floor=0, missing=[record.entry.path])
    assert plan.delete == (record.key,)
    assert plan.paths == ()  # nothing to delete: it is not there


def test_two_records_of_one_file_count_it_once_and_lose_it_together() -> None:
    tag = ready("r.io/a/x:1", 1, size=GIB)
    pinned = ready("r.io/a/x@" + digest(1), 1, size=GIB)
    assert tag.entry is not None
    assert pinned.entry is not None
    assert tag.entry.path == pinned.entry.path
    assert len(cached_files([tag, pinned])) == 1
    other = used(ready("r.io/a/y:1", 2, size=GIB), "live", 5)
    plan = plan_sweep([tag, pinned, other], live={"live"}, capacity=GIB, floor=0)
    assert plan.paths == (tag.entry.path,)
    assert set(plan.delete) == {tag.key, pinned.key}


# ---------------------------------------------------------------------------------------------
# The report and the state

JOB = "slurmjob-image-sweep-1-1"
ENTRY = "/cache/entries/public/sha256-" + "a" * 64 + ".sqsh"
GOOD = f"job={JOB}\nbytes=10\nfiles=1\ndeleted=0\norphans=0\nleftovers=0\nmissing={ENTRY}\n"


def test_a_report_is_parsed() -> None:
    report = parse_report(GOOD.encode(), LAYOUT, JOB)
    assert (report.bytes, report.files, report.missing) == (10, 1, [ENTRY])


@pytest.mark.parametrize(
    "text",
    [
        GOOD.replace(JOB, "other-job"),  # another job's report
        GOOD.replace("bytes=10", "bytes=+10"),
        GOOD.replace("bytes=10", "bytes=1_0"),
        GOOD.replace("files=1\n", ""),
        GOOD + "bytes=3\n",
        GOOD + "extra=1\n",
        GOOD + "missing=/etc/passwd\n",
        GOOD + "missing=/cache/entries/public/../../etc/x.sqsh\n",
        GOOD + "no equals sign\n",
        GOOD.replace("job=", "jób="),
    ],
)
def test_a_hostile_report_is_refused(text: str) -> None:
    with pytest.raises(ReportError):
        parse_report(text.encode(), LAYOUT, JOB)


def test_a_report_names_at_most_so_many_missing_entries() -> None:
    lines = "".join(
        f"missing=/cache/entries/public/sha256-{n:064x}.sqsh\n" for n in range(MAX_MISSING + 5)
    )
    report = parse_report((GOOD + lines).encode(), LAYOUT, JOB)
    assert len(report.missing) == MAX_MISSING


def test_the_state_names_each_job_once_and_a_check_is_due_after_its_interval() -> None:
    state = SweepState()
    assert check_due(state, NOW, 60)
    started = SweepState(since=NOW)
    assert not check_due(started, NOW + timedelta(seconds=59), 60)
    first = state.submitting(NOW)
    second = first.ended(NOW, None, "no report").submitting(NOW)
    assert first.job_name != second.job_name
    ended = second.ended(NOW, None, None)
    assert not ended.in_flight
    assert not check_due(ended, NOW + timedelta(seconds=59), 60)
    assert check_due(ended, NOW + timedelta(seconds=60), 60)
    assert SweepState.model_validate_json(ended.model_dump_json(by_alias=True)) == ended


# ---------------------------------------------------------------------------------------------
# The script


def _entry(root: Path, scope: str, n: int, age: float = 0.0) -> Path:
    path = root / "entries" / scope / f"sha256-{n:064x}.sqsh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"hsqs" + b"x" * n)
    path.chmod(0o444)
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path


def _sweep(
    tmp_path: Path, delete: list[Path], keep: list[Path], decided_at: float
) -> tuple[subprocess.CompletedProcess[str], str]:
    settings = _settings(tmp_path)
    name = "slurmjob-image-sweep-1-1"
    (tmp_path / "delete").write_text("".join(f"{p}\n" for p in delete))
    (tmp_path / "keep").write_text("".join(f"{p}\n" for p in keep))
    launch = render_sweep(
        settings,
        name,
        PurePosixPath(tmp_path / "delete"),
        PurePosixPath(tmp_path / "keep"),
        int(decided_at),
    )
    script = tmp_path / "sweep.sh"
    script.write_text(launch.script)
    proc = subprocess.run(
        ["bash", str(script)],
        env={"PATH": settings.slurm_job_path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    result = tmp_path / "cache" / "results" / f"{name}.result"
    return proc, result.read_text() if result.exists() else ""


def test_the_script_deletes_what_was_evicted_and_reports_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    gone = _entry(root, "public", 1)
    kept = _entry(root, "tenant-a", 2)
    orphan = _entry(root, "public", 3)
    missing = root / "entries" / "public" / f"sha256-{4:064x}.sqsh"
    proc, text = _sweep(tmp_path, [gone], [kept, missing], time.time() + 5)
    assert proc.returncode == 0, proc.stderr
    assert not gone.exists()
    assert kept.exists()
    assert orphan.exists()
    report = parse_report(
        text.encode(), CacheLayout(PurePosixPath(root)), "slurmjob-image-sweep-1-1"
    )
    assert (report.deleted, report.files, report.orphans) == (1, 2, 1)
    assert report.bytes == kept.stat().st_size + orphan.stat().st_size
    assert report.missing == [str(missing)]


def test_an_entry_published_after_the_decision_is_kept(tmp_path: Path) -> None:
    fresh = _entry(tmp_path / "cache", "public", 1)
    proc, text = _sweep(tmp_path, [fresh], [], time.time() - 60)
    assert proc.returncode == 0, proc.stderr
    assert fresh.exists()
    assert "deleted=0" in text


def test_a_path_outside_the_entries_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x")
    proc, text = _sweep(tmp_path, [victim], [], time.time() + 5)
    assert proc.returncode == 65
    assert victim.exists()
    assert text == ""


def test_a_link_in_the_entries_is_removed_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("x")
    link = tmp_path / "cache" / "entries" / "public" / f"sha256-{1:064x}.sqsh"
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    proc, _ = _sweep(tmp_path, [link], [], time.time() + 5)
    assert proc.returncode == 0, proc.stderr
    assert not link.is_symlink()
    assert target.exists()


def test_a_running_imports_directory_stays(tmp_path: Path) -> None:
    # A directory goes only once its ctime is older than an import may run (find -cmin); a
    # ctime cannot be set back here, so the dead case is left to the script's reading.
    running = tmp_path / "cache" / "tmp" / "slurmjob-import-alive-1"
    running.mkdir(parents=True)
    (running / "image.sqsh").write_text("partial")
    proc, text = _sweep(tmp_path, [], [], time.time() + 5)
    assert proc.returncode == 0, proc.stderr
    assert (running / "image.sqsh").exists()
    assert "leftovers=0" in text


def test_one_tenants_anonymous_pulls_cannot_flush_anothers() -> None:
    """Shared entries count in the share of the tenant whose SlurmJob made them: team-a
    pulling many public images evicts its own, never team-b's older idle one."""

    def shared(image: str, n: int, tenant: str) -> ImageRecord:
        return ready(image, n, size=GIB).model_copy(update={"charged": f"tenant-{tenant}"})

    theirs = shared("r.io/b/old:1", 1, "b")
    mine = [shared(f"r.io/a/x{i}:1", 10 + i, "a") for i in range(3)]
    for record in mine:
        assert record.entry is not None
    plan = plan_sweep([theirs, *mine], live=set(), capacity=2 * GIB, floor=0)
    assert theirs.entry is not None
    assert theirs.entry.path not in plan.paths
    assert len(plan.paths) == 2
    # Without the charge the shared entries are one owner: the oldest (team-b's) went first.
    plain = [r.model_copy(update={"charged": None}) for r in (theirs, *mine)]
    assert theirs.entry.path in plan_sweep(plain, live=set(), capacity=2 * GIB, floor=0).paths


def test_a_tenants_request_charges_its_share_and_a_private_one_its_scope() -> None:
    shared_request = image_request(
        "r.io/a/x:1",
        tenant="a",
        allowed_registries=["r.io"],
        with_credentials=False,
        fmt=ArtifactFormat.SQSH,
    )
    private_request = image_request(
        "r.io/a/x:1",
        tenant="a",
        allowed_registries=["r.io"],
        with_credentials=True,
        fmt=ArtifactFormat.SQSH,
    )
    assert (shared_request.scope, new_record(shared_request, NOW).charged) == (
        "public",
        "tenant-a",
    )
    assert (private_request.scope, new_record(private_request, NOW).charged) == (
        "tenant-a",
        None,
    )


def _failed(image: str) -> ImageRecord:
    record = ready(image, 7)
    failure = Failure(kind=FailureKind.PERMANENT, reason="BadImage", message="bad", at=NOW)
    return record.model_copy(
        update={"state": RecordState.FAILED, "entry": None, "failure": failure}
    )


def test_a_failure_nobody_waits_on_is_forgotten_after_it_has_answered_for_a_while() -> None:
    """A tenant naming images that do not exist makes one record (a ConfigMap) each: they go
    FAILURE_KEPT after their failure, so they cannot pile up in the apiserver."""
    failed = _failed("r.io/a/missing:1")
    early = plan_sweep([failed], set(), 10 * GIB, 0, now=NOW + timedelta(minutes=30))
    assert early.delete == ()
    late = plan_sweep([failed], set(), 10 * GIB, 0, now=NOW + FAILURE_KEPT + timedelta(seconds=1))
    assert late.delete == (failed.key,)
    assert late.paths == ()
    waited = failed.model_copy(update={"users": [ImageUser(uid="u1", digest=digest(7))]})
    kept = plan_sweep([waited], {"u1"}, 10 * GIB, 0, now=NOW + 2 * FAILURE_KEPT)
    assert kept.delete == ()
