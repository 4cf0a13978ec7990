"""The image cache as the operator's read-only mount shows it: the cache root (the cache
user's, not writable by the operator), and the last housekeeping job's report
(`results/slurmjob-image-sweep-*.result`, `imagecache.housekeeping`): bytes against the cap,
recorded entries missing, files no record names, and how old the last check is."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from slurmjob_operator.config import Settings
from slurmjob_operator.doctor.report import Outcome, Report
from slurmjob_operator.imagecache.housekeeping import (
    MAX_MISSING,
    MAX_REPORT_BYTES,
    SWEEP_JOB_PREFIX,
    ReportError,
    SweepReport,
    parse_report,
)
from slurmjob_operator.imagecache.layout import RESULT_SUFFIX, RESULTS_DIR
from slurmjob_operator.imagecache.script import layout_for
from slurmjob_operator.storage.logs import read_tail
from slurmjob_operator.storage.nofollow import UnsafePath

NAME = "image cache"


def check_image_cache(settings: Settings, report: Report) -> None:
    if not settings.images_enabled:
        return
    root, uid = settings.image_cache_root, settings.image_cache_uid
    assert root is not None
    assert uid is not None
    try:
        info = root.lstat()
    except OSError as exc:
        report.add(NAME, Outcome.FAIL, f"{root}: {exc.strerror} (SLURMJOB_IMAGE_CACHE_ROOT)")
        return
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
        report.add(
            NAME,
            Outcome.FAIL,
            f"{root} is not a directory of the cache user (uid {uid}, "
            "SLURMJOB_IMAGE_CACHE_UID): import jobs cannot publish there",
        )
        return
    if os.access(root, os.W_OK) and os.geteuid() != uid:
        report.add(
            NAME,
            Outcome.WARN,
            f"{root} is writable by the operator: mount it read-only (only the cache user may "
            "write the cache, which the node's cheap check relies on)",
        )
    found = _last_report(settings, root / RESULTS_DIR, uid)
    if found is None:
        report.add(NAME, Outcome.OK, f"{root}: no housekeeping job has reported yet")
        return
    age, last = found
    if isinstance(last, str):
        report.add(NAME, Outcome.WARN, last)
        return
    _report(settings, report, age, last)


def _report(settings: Settings, report: Report, age: float, last: SweepReport) -> None:
    cap = settings.image_cache_max_bytes
    detail = (
        f"{last.bytes} bytes in {last.files} files (cap {cap}), checked {age / 60:.0f} min ago "
        f"by {last.job}: {last.deleted} evicted, {last.orphans} recorded by no record of this "
        f"operator, {last.leftovers} dead imports' directories removed"
    )
    problems = []
    if last.missing:
        shown = ", ".join(last.missing[:3])
        problems.append(f"{len(last.missing)} recorded entries missing ({shown}): imported again")
    if last.bytes > cap:
        problems.append("over the cap: entries in use within their owners' shares are kept")
    if age > 2 * settings.image_cache_check_seconds + settings.image_cache_sweep_seconds:
        problems.append(
            "the last check is older than two check intervals: is the operator's sweep "
            "running (its log), and can the cache user's jobs start on the import partition?"
        )
    outcome = Outcome.WARN if problems else Outcome.OK
    report.add(NAME, outcome, "; ".join([detail, *problems]))


def _last_report(
    settings: Settings, results: Path, uid: int
) -> tuple[float, SweepReport | str] | None:
    """The newest housekeeping report (its age in seconds, then it or why it is unusable)."""
    try:
        names = [
            entry.name
            for entry in os.scandir(results)
            if entry.name.startswith(SWEEP_JOB_PREFIX) and entry.name.endswith(RESULT_SUFFIX)
        ]
    except OSError:
        return None
    newest: tuple[float, str] | None = None
    for name in names:
        try:
            mtime = (results / name).lstat().st_mtime
        except OSError:
            continue
        if newest is None or mtime > newest[0]:
            newest = (mtime, name)
    if newest is None:
        return None
    mtime, name = newest
    age = max(0.0, time.time() - mtime)
    assert settings.image_cache_root is not None
    try:
        tail = read_tail(
            results / name,
            root=settings.image_cache_root,
            owner=uid,
            max_bytes=MAX_REPORT_BYTES + 1,
            max_lines=MAX_MISSING + 16,
        )
    except (UnsafePath, OSError) as exc:
        return age, f"{results / name}: cannot be read ({exc})"
    if tail is None or tail.truncated:
        return age, f"{results / name}: missing or over {MAX_REPORT_BYTES} bytes"
    job = name.removesuffix(RESULT_SUFFIX)
    try:
        return age, parse_report(tail.tail.encode(), layout_for(settings), job)
    except ReportError as exc:
        return age, f"{results / name}: {exc}"
