"""`kubectl slurmjob describe` of a SlurmJob that names `spec.framework.image` (issue 44,
section 3): the reference, the digest it runs and the import's state, as the status says them
(the `ImageReady` condition); a job without an image shows none of it."""

from __future__ import annotations

from typing import Any

import pytest

from slurmjob_operator.plugin.render import Job, describe, image_digest

from .test_plugin import NOW, slurmjob

IMAGE = "127.0.0.1:5000/slurmjob/base:1"
DIGEST = "sha256:" + "cd" * 32


def _image_ready(status: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": "ImageReady",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-03-01T11:50:00Z",
    }


def _with_image(conditions: list[dict[str, Any]], image: str = IMAGE, **kw: Any) -> Job:
    body = slurmjob(conditions=conditions, **kw)
    body["spec"]["framework"] = {"kind": "pytorch", "name": "pytorch", "image": image}
    return Job.of(body)


def _lines(text: str) -> dict[str, str]:
    return {
        k.strip(): v.strip()
        for k, _, v in (line.partition(":") for line in text.splitlines())
        if k.startswith("Image")
    }


def test_a_job_being_imported_shows_the_import_and_no_digest() -> None:
    pulling = _image_ready("False", "ImagePulling", f"{IMAGE} is being imported by job 123")
    job = _with_image([pulling], phase="Pending", attempts=[])
    assert _lines(describe(job, NOW)) == {
        "Image": IMAGE,
        "Image digest": "-",
        "Image import": f"ImagePulling (ImageReady=False): {IMAGE} is being imported by job 123",
    }


def test_a_job_running_its_image_shows_the_digest() -> None:
    cached = _image_ready("True", "ImageCached", f"runs {IMAGE}@{DIGEST}")
    lines = _lines(describe(_with_image([cached]), NOW))
    assert lines["Image"] == IMAGE
    assert lines["Image digest"] == DIGEST
    assert lines["Image import"] == f"ImageCached (ImageReady=True): runs {IMAGE}@{DIGEST}"


def test_a_failed_import_shows_why() -> None:
    failed = _image_ready("False", "ImagePullFailed", f"{IMAGE}: AccessDenied: import job 7: 401")
    lines = _lines(describe(_with_image([failed], phase="Failed"), NOW))
    assert lines["Image digest"] == "-"
    assert lines["Image import"].startswith("ImagePullFailed (ImageReady=False): ")


def test_an_image_not_looked_at_yet() -> None:
    lines = _lines(describe(_with_image([], phase=None, attempts=[]), NOW))
    assert lines == {
        "Image": IMAGE,
        "Image digest": "-",
        "Image import": "not looked at yet",
    }


def test_a_job_without_an_image_shows_no_image_lines() -> None:
    text = describe(Job.of(slurmjob()), NOW)
    assert "Image" not in text
    body = slurmjob()
    body["spec"]["framework"] = {"kind": "pytorch", "runtimeId": "pytorch-24.01"}
    assert Job.of(body).image is None
    assert "Image" not in describe(Job.of(body), NOW)


def test_what_a_status_says_is_shown_printable_never_trusted() -> None:
    hostile = _image_ready("True", "ImageCached", "runs x@sha256:\x1b]0;pwned\x07")
    text = describe(_with_image([hostile], image="r.io/a:1\x1b[2J"), NOW)
    assert "\x1b" not in text
    assert "r.io/a:1\\x1b[2J" in text


@pytest.mark.parametrize(
    ("condition", "digest"),
    [
        (_image_ready("True", "ImageCached", f"runs {IMAGE}@{DIGEST}"), DIGEST),
        (_image_ready("True", "ImageCached", f"runs r.io/a@{DIGEST}@{DIGEST}"), DIGEST),
        (_image_ready("True", "ImageCached", "runs r.io/a:1"), None),  # no digest named
        (_image_ready("True", "ImageCached", "runs r.io/a:1@latest"), None),
        (_image_ready("True", "ImageCached", f"@{DIGEST}"), None),  # no reference
        (_image_ready("False", "ImagePulling", f"runs {IMAGE}@{DIGEST}"), None),
        (_image_ready("True", "Other", f"runs {IMAGE}@{DIGEST}"), None),
        (None, None),
    ],
)
def test_image_digest(condition: dict[str, Any] | None, digest: str | None) -> None:
    job = Job.of(slurmjob(conditions=[condition] if condition else []))
    assert image_digest(job.status) == digest
