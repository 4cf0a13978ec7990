"""The log archive's check: jobs must not be able to read what is archived of every job."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Sequence

from slurmjob_operator.config import Settings
from slurmjob_operator.doctor.report import Outcome, Report
from slurmjob_operator.storage.nofollow import job_owner

NAME = "archive"
SETTING = "SLURMJOB_ARCHIVE_ROOT"


def check_archive(
    settings: Settings, storage_roots: Sequence[os.PathLike[str]], report: Report
) -> None:
    """`storage_roots`: every cluster's storage root (jobs read them all)."""
    root = settings.archive_root
    if root is None:
        report.add(NAME, Outcome.SKIP, f"off: a deleted SlurmJob's logs go with it ({SETTING})")
        return
    try:
        st = os.stat(root)
    except OSError as exc:
        report.add(NAME, Outcome.FAIL, f"{root}: {exc.strerror} ({SETTING})")
        return
    me = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    resolved = os.path.realpath(root)
    inside = [
        str(r)
        for r in storage_roots
        if os.path.commonpath([resolved, os.path.realpath(r)]) == os.path.realpath(r)
    ]
    problems = []
    if not stat.S_ISDIR(st.st_mode):
        problems.append("is not a directory")
    if st.st_uid != me:
        problems.append(f"is owned by uid {st.st_uid}, not by the operator's uid {me} (chown it)")
    if mode & 0o077:
        problems.append(f"has mode {mode:04o}: others may read it (chmod 0700)")
    if inside:
        problems.append(f"lies inside the storage root {inside[0]}, which jobs mount")
    if problems:
        report.add(NAME, Outcome.FAIL, f"{root} " + "; ".join(problems) + f" ({SETTING})")
        return
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".slurmjob-doctor-"):
            pass
    except OSError as exc:
        report.add(NAME, Outcome.FAIL, f"{root} is not writable: {exc.strerror} ({SETTING})")
        return
    days = settings.archive_retention_days
    detail = (
        f"{root}: the operator's, mode 0700; kept {days} day(s), at most "
        f"{settings.archive_max_bytes} bytes shared by its owners, "
        f"{settings.archive_entry_cap} per SlurmJob"
    )
    if job_owner(settings) == me:
        report.add(
            NAME,
            Outcome.WARN,
            f"{detail}; jobs run as uid {me}, the operator's own: keep the archive on a volume "
            "no compute node mounts, or they can read it",
        )
        return
    report.add(NAME, Outcome.OK, detail)
