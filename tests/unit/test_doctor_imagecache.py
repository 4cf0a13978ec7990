"""`doctor`'s image cache check (doctor/imagecache.py): the cache root as the operator's
read-only mount shows it and the last housekeeping job's report."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.unit.test_imagecache_script import _settings

from slurmjob_operator.doctor.imagecache import check_image_cache
from slurmjob_operator.doctor.report import Outcome, Report

JOB = "slurmjob-image-sweep-1-1"


def _check(tmp_path: Path, text: str | None, age: float = 0.0, **changes: object) -> Report:
    # The test's own uid is the cache user's here (the files are the test's).
    settings = _settings(tmp_path).model_copy(update={"image_cache_uid": os.getuid(), **changes})
    assert settings.image_cache_root is not None
    if text is not None:
        results = settings.image_cache_root / "results"
        results.mkdir(exist_ok=True)
        path = results / f"{JOB}.result"
        path.write_text(text)
        then = time.time() - age
        os.utime(path, (then, then))
    report = Report()
    check_image_cache(settings, report)
    return report


def _report(cache: Path, **values: object) -> str:
    fields = {"bytes": 10, "files": 1, "deleted": 0, "orphans": 0, "leftovers": 0, **values}
    lines = [f"job={JOB}", *(f"{k}={v}" for k, v in fields.items() if k != "missing")]
    lines += [f"missing={p}" for p in values.get("missing", [])]  # type: ignore[attr-defined]
    return "\n".join(lines) + "\n"


def test_a_site_without_images_has_no_check(tmp_path: Path) -> None:
    assert _check(tmp_path, None, images_enabled=False).checks == []


def test_a_fresh_cache_says_no_job_reported_yet(tmp_path: Path) -> None:
    (check,) = _check(tmp_path, None).checks
    assert check.outcome is Outcome.OK
    assert "no housekeeping job" in check.detail


def test_a_good_report_shows_bytes_against_the_cap(tmp_path: Path) -> None:
    (check,) = _check(tmp_path, _report(tmp_path / "cache", bytes=123)).checks
    assert check.outcome is Outcome.OK, check.detail
    assert "123 bytes in 1 files" in check.detail


def test_missing_entries_over_the_cap_and_a_stale_check_warn(tmp_path: Path) -> None:
    entry = f"{tmp_path}/cache/entries/public/sha256-{1:064x}.sqsh"
    text = _report(tmp_path / "cache", bytes=2 * 1024**2, missing=[entry])
    (check,) = _check(
        tmp_path, text, age=3 * 86400, image_cache_max_bytes=1024**2, image_cache_check_seconds=60
    ).checks
    assert check.outcome is Outcome.WARN
    for words in ("1 recorded entries missing", "over the cap", "older than two check"):
        assert words in check.detail


def test_a_report_that_does_not_parse_warns(tmp_path: Path) -> None:
    (check,) = _check(tmp_path, "job=other\n").checks
    assert check.outcome is Outcome.WARN
    assert "not the report of" in check.detail


def test_a_cache_root_of_another_user_fails(tmp_path: Path) -> None:
    (check,) = _check(tmp_path, None, image_cache_uid=os.getuid() + 1).checks
    assert check.outcome is Outcome.FAIL
    assert "SLURMJOB_IMAGE_CACHE_UID" in check.detail
