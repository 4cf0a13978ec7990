"""The error taxonomy as a pure function of (status, errors[], body)."""

from __future__ import annotations

import pytest

from slurmjob_operator.slurm.dialects import parse_envelope
from slurmjob_operator.slurm.errors import (
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmError,
    SlurmMessage,
    SlurmNotFound,
    SlurmRejected,
    SlurmTransient,
    SlurmUnsupported,
    classify,
)


def msg(number: int | None = None, text: str = "", description: str = "") -> SlurmMessage:
    return SlurmMessage(error_number=number, error=text or None, description=description or None)


@pytest.mark.parametrize(
    ("status", "errors", "json_body", "text", "submit", "expected"),
    [
        (200, (), True, "", False, None),
        (200, (), True, "", True, None),
        (304, (), False, "", False, None),
        (401, (), False, "Authentication failure", False, SlurmAuthError),
        (511, (), True, "", True, SlurmAuthError),
        (500, (msg(1007),), True, "", False, SlurmAuthError),
        (500, (msg(6000),), True, "", True, SlurmAuthError),
        (
            500,
            (msg(-1, "Unspecified error", "slurmctld config is unable to load"),),
            True,
            "",
            False,
            SlurmAuthError,
        ),
        (500, (msg(2017),), True, "", False, SlurmNotFound),
        (404, (msg(2017),), True, "", False, SlurmNotFound),
        (500, (msg(0, "_handle_job_get: unknown job 9"),), True, "", False, SlurmNotFound),
        (404, (), False, "Unable to find requested URL endpoint.", False, SlurmUnsupported),
        (200, (msg(2015),), True, "", True, SlurmRejected),
        (400, (msg(9001),), True, "", True, SlurmRejected),
        (422, (msg(2000),), True, "", True, SlurmRejected),
        (400, (), False, "Unable to parse query.", True, SlurmRejected),
        (500, (msg(2014),), True, "", True, SlurmRejected),
        (502, (msg(1001),), True, "", True, SlurmTransient),
        (500, (msg(1003),), True, "", True, SlurmAmbiguous),
        (500, (msg(1003),), True, "", False, SlurmTransient),
        (502, (), False, "", True, SlurmAmbiguous),
        (504, (), False, "", True, SlurmAmbiguous),
        (502, (), False, "", False, SlurmTransient),
        (503, (), False, "", True, SlurmAmbiguous),
        (503, (), False, "", False, SlurmTransient),
        (500, (), False, "", True, SlurmAmbiguous),
        (500, (), False, "", False, SlurmTransient),
        (500, (), False, "Authentication failure", True, SlurmTransient),
    ],
)
def test_classify_table(
    status: int,
    errors: tuple[SlurmMessage, ...],
    json_body: bool,
    text: str,
    submit: bool,
    expected: type[SlurmError] | None,
) -> None:
    got = classify(status, errors, json_body=json_body, text=text, submit=submit)
    if expected is None:
        assert got is None
    else:
        assert type(got) is expected


def test_error_message_keeps_slurm_texts() -> None:
    error = classify(
        500,
        (msg(2000, "Invalid partition name specified", "Batch job submission failed"),),
        json_body=True,
        submit=True,
        endpoint="/slurm/v0.0.45/job/submit",
        method="POST",
        job_id=7,
    )
    assert isinstance(error, SlurmRejected)
    assert "Invalid partition name specified" in str(error)
    assert "[2000]" in str(error)
    assert "HTTP 500" in str(error)
    assert error.job_id == 7
    assert error.endpoint == "/slurm/v0.0.45/job/submit"


@pytest.mark.parametrize(
    ("item", "number", "text"),
    [
        ({"error": "x", "error_number": 2017}, 2017, "x"),  # v0.0.38 spec
        ({"error": "environment must be set", "error_code": 2127}, 2127, "environment must be set"),
        (
            {"error": "_op_handler_ping: ...", "errno": 5005},
            5005,
            "_op_handler_ping: ...",
        ),  # v0.0.36
        ({"description": "d", "error_number": 1007, "error": "e", "source": "s"}, 1007, "d"),
    ],
)
def test_envelope_error_shapes(item: dict[str, object], number: int, text: str) -> None:
    (error,) = parse_envelope({"errors": [item]}).errors
    assert error.error_number == number
    assert text in error.text


def test_envelope_meta_both_spellings() -> None:
    old = parse_envelope({"meta": {"Slurm": {"release": "22.05.8"}}})
    new = parse_envelope(
        {
            "meta": {
                "slurm": {"release": "26.05.3", "cluster": "c"},
                "plugin": {"data_parser": "data_parser/v0.0.45"},
            }
        }
    )
    assert old.release == "22.05.8"
    assert (new.release, new.cluster, new.data_parser) == ("26.05.3", "c", "data_parser/v0.0.45")
    assert parse_envelope("garbage").errors == ()
    warnings = parse_envelope({"warnings": [{"description": "w", "source": "s"}]}).warnings
    assert warnings[0].description == "w"
