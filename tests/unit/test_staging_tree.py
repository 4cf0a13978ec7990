"""A staging tree the operator cannot use (issue 25, "Diagnostics that mislead"): found before
the attempt is recorded, named with the real uids, retried less and less often, and held as
one condition; and the uid Slurm ran a job as is the one named when its output could not be
opened."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.status import Phase, get_condition
from slurmjob_operator.core.decisions import GROWING_RETRY_CAP, growing_delay
from slurmjob_operator.core.jobview import SlurmJobView
from slurmjob_operator.slurm.dialects.v0038 import _JobInfo38, job_view_38
from slurmjob_operator.slurm.dialects.v004x import _JobInfo, job_view
from slurmjob_operator.storage import stagingtree
from slurmjob_operator.storage.stagingtree import StagingNotWritable, check_tree

from .controller_fakes import Bed, cpu_spec, make_bed
from .controller_fakes import reconcile_once as reconcile
from .test_acl import _as_uid as as_uid

OTHER = 54321  # a uid that is neither the operator's nor a staging owner


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


def _ready(bed: Bed, ref: Any) -> tuple[str, str, str]:
    cond = get_condition(bed.store.status(ref).conditions, "Ready")
    assert cond is not None
    return cond.status, cond.reason, cond.message


def _attempt_dir(root: Path) -> Path:
    return root / "team-a" / "train-0123abcd" / "attempt-1"


def test_a_tree_still_to_be_made_passes(tmp_path: Path) -> None:
    settings = make_bed(tmp_path).settings
    check_tree(settings, _attempt_dir(settings.storage_root))
    assert not (settings.storage_root / "team-a").exists(), "the check makes nothing"


def test_a_namespace_folder_of_another_uid_is_named_with_both_uids(tmp_path: Path) -> None:
    settings = make_bed(tmp_path).settings
    folder = settings.storage_root / "team-a"
    folder.mkdir(mode=0o750)
    os.chown(folder, OTHER, OTHER)
    with pytest.raises(StagingNotWritable) as caught:
        check_tree(settings, _attempt_dir(settings.storage_root))
    message = str(caught.value)
    euid = os.geteuid()
    assert f"staging directory {folder} is owned by {OTHER}:{OTHER} with mode 0750" in message
    assert f"the operator runs as uid {euid} and the job as uid {euid}" in message
    assert "SLURMJOB_STAGING_OWNER" in message


def test_a_link_where_a_folder_should_be_is_refused_not_followed(tmp_path: Path) -> None:
    settings = make_bed(tmp_path).settings
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (settings.storage_root / "team-a").symlink_to(elsewhere)
    with pytest.raises(StagingNotWritable, match="is a symbolic link"):
        check_tree(settings, _attempt_dir(settings.storage_root))
    assert list(elsewhere.iterdir()) == []


def test_a_folder_the_kernel_says_is_closed_is_named_with_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root the kernel lets every write through (and NFS root squash refuses it only at
    mkdir), so the refusal of `access` is stood in for here."""
    settings = make_bed(tmp_path).settings
    folder = settings.storage_root / "team-a"
    folder.mkdir(mode=0o555)
    asked: list[Any] = []

    def closed(path: Any, mode: int, **kwargs: Any) -> bool:
        asked.append((path, mode, kwargs.get("effective_ids")))
        return False

    monkeypatch.setattr(stagingtree.os, "access", closed)
    with pytest.raises(StagingNotWritable, match=re.escape(f"{folder} is owned by")):
        check_tree(settings, _attempt_dir(settings.storage_root))
    assert asked == [(".", os.W_OK | os.X_OK, True)]


def test_a_root_the_operators_uid_cannot_reach_is_named(tmp_path: Path) -> None:
    """For real, as an operator with no capabilities whose uid may not enter the root."""
    settings = make_bed(tmp_path).settings
    settings.storage_root.chmod(0o700)

    def check() -> None:
        with pytest.raises(StagingNotWritable) as caught:
            check_tree(settings, _attempt_dir(settings.storage_root))
        message = str(caught.value)
        assert f"{settings.storage_root} cannot be opened (Permission denied)" in message
        assert f"the operator runs as uid {OTHER}" in message

    as_uid(OTHER, check)


def test_the_wait_doubles_up_to_its_cap() -> None:
    waits = [growing_delay(n, 10.0) for n in range(8)]
    assert waits == [10.0, 20.0, 40.0, 80.0, 160.0, GROWING_RETRY_CAP, 300.0, 300.0]
    assert growing_delay(10_000, 10.0) == GROWING_RETRY_CAP


async def test_an_unusable_tree_holds_one_condition_and_waits_longer_each_time(bed: Bed) -> None:
    folder = bed.settings.storage_root / "team-a"
    folder.mkdir(mode=0o755)
    os.chown(folder, OTHER, OTHER)
    ref = bed.store.create("train", cpu_spec())
    delays = []
    for _ in range(4):
        retry = await reconcile(bed, ref)
        assert retry is not None
        delays.append(retry.delay)
        status = bed.store.status(ref)
        assert status.phase is Phase.PENDING, "never Submitting: nothing is recorded"
        assert status.attempts == []
    base = delays[0]
    assert delays == [base, 2 * base, 4 * base, 8 * base]
    state, reason, message = _ready(bed, ref)
    assert (state, reason) == ("False", "StagingNotWritable")
    assert f"owned by {OTHER}:{OTHER}" in message
    assert bed.store.reasons().count("StagingNotWritable") == 1, "one Event, not one a try"
    assert bed.slurm.calls == []
    # The admin fixes it: the next try submits.
    os.chown(folder, os.geteuid(), os.getegid())
    assert await reconcile(bed, ref) is None
    assert bed.store.status(ref).phase is Phase.QUEUED
    assert bed.slurm.calls.count("submit") == 1


async def test_a_tree_that_breaks_after_the_check_fails_the_stage_the_same_way(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tree changes between the check and the stage: the attempt is forgotten (nothing
    was sent), with the same reason and the same growing wait."""
    monkeypatch.setattr("slurmjob_operator.controller.checks.check_tree", lambda *a, **k: None)
    folder = bed.settings.storage_root / "team-a"
    folder.mkdir(mode=0o755)
    os.chown(folder, OTHER, OTHER)
    ref = bed.store.create("train", cpu_spec())
    first, second = await reconcile(bed, ref), await reconcile(bed, ref)
    assert first is not None
    assert second is not None
    assert second.delay == 2 * first.delay
    assert _ready(bed, ref)[:2] == ("False", "StagingNotWritable")
    assert bed.store.status(ref).attempts == []
    assert bed.slurm.calls == []


@pytest.mark.parametrize(
    ("raw", "uid"),
    [
        ({"user_name": "jobuser", "user_id": 1000}, 1000),
        ({"user_id": "1000"}, 1000),
        ({"user_id": 0}, 0),
        ({"user_id": -1}, None),
        ({"user_id": 4294967295}, None),
        ({"user_id": "9" * 5000}, None),
        ({"user_id": [1]}, None),
        ({"user_id": True}, None),
        ({}, None),
    ],
)
def test_the_uid_slurm_reports_is_read_or_left_unknown(
    raw: dict[str, Any], uid: int | None
) -> None:
    """Read for a message only: a value that is no uid is unknown, never a refused record."""
    views: list[SlurmJobView] = [
        job_view(_JobInfo.model_validate({"job_id": 1, **raw})),
        job_view_38(_JobInfo38.model_validate({"job_id": 1, **raw})),
    ]
    assert [v.user_id for v in views] == [uid, uid]
