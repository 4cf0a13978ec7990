"""Job names, comments and staging paths."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.core import naming

UID = "3f2a9c1e-7b4d-4e8a-9c21-5d6e7f809a1b"
LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
SUBDOMAIN = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", fullmatch=True)


def test_examples() -> None:
    assert naming.job_name("team-a", "resnet", UID, 3) == "sj-team-a-resnet-3f2a9c1e-a3"
    assert naming.comment("team-a", "resnet", UID, 3) == (
        f"slurmjob.io ns=team-a name=resnet uid={UID} attempt=3"
    )
    root = Path("/srv/sj")
    assert naming.staging_dir(root, "team-a", "resnet", UID, 3) == Path(
        "/srv/sj/team-a/resnet-3f2a9c1e/attempt-3"
    )
    assert naming.resource_dir(root, "team-a", "resnet", UID) == Path(
        "/srv/sj/team-a/resnet-3f2a9c1e"
    )


@given(LABEL, SUBDOMAIN, st.uuids().map(str), st.integers(1, 10_000))
def test_round_trip_and_limits(ns: str, name: str, uid: str, attempt: int) -> None:
    job = naming.job_name(ns, name, uid, attempt)
    assert len(job) <= naming.JOB_NAME_MAX
    assert re.fullmatch(r"[A-Za-z0-9._-]+", job)
    assert job.endswith(f"-{uid[:8]}-a{attempt}")
    assert job == naming.job_name(ns, name, uid, attempt)
    assert naming.job_name(ns, name, uid, attempt + 1) != job
    parsed = naming.parse_comment(naming.comment(ns, name, uid, attempt))
    assert parsed == naming.JobIdentity(ns, name, uid, attempt)


@pytest.mark.parametrize(
    "text",
    [None, "", "hello", "slurmjob.io ns=a name=b uid=c", "slurmjob.io ns=a name=b uid=c attempt=0"],
)
def test_foreign_comments(text: str | None) -> None:
    assert naming.parse_comment(text) is None


@pytest.mark.parametrize(("ns", "name"), [("..", "x"), ("a/b", "x"), ("a", ""), ("a", "x y")])
def test_unsafe_parts_are_refused(ns: str, name: str) -> None:
    with pytest.raises(ValueError, match="cannot be used"):
        naming.staging_dir(Path("/srv"), ns, name, UID, 1)
    with pytest.raises(ValueError, match="at least 1"):
        naming.job_name("a", "b", UID, 0)
