"""Every captured slurmrestd answer, parsed through the dialect of its version."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurmjob_operator.core.jobview import BaseState, JobExit, JobSource
from slurmjob_operator.slurm.dialects import dialect_for, parse_envelope
from slurmjob_operator.slurm.errors import (
    SlurmAuthError,
    SlurmNotFound,
    SlurmRejected,
    classify,
    is_auth_failure,
)

from .slurm_fakes import S2205, S2605, SAMPLES, sample, sample_json_22

V45 = dialect_for("v0.0.45")


def ts(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


# Every sample file must be claimed by one test below; this keeps new captures from being ignored.
COVERED = {
    "slurm-22.05/job2_running.json",
    "slurm-22.05/sample_job_v38.json",
    "slurm-22.05/sample_job_v36.json",
    "slurm-22.05/openapi.json",
    "slurm-26.05/openapi_v3.json",
    "slurm-26.05/bogus_version.txt",
    "slurm-26.05/resp_no_auth.txt",
    "slurm-26.05/req_release_job.json",
    "slurm-26.05/req_update_job.json",
    "slurm-26.05/resp_get_job.json",
    "slurm-26.05/resp_get_job_by_sluid.json",
    "slurm-26.05/resp_get_job_cancelled.json",
    "slurm-26.05/resp_get_job_failed.json",
    "slurm-26.05/resp_get_job_failed_v0.0.42.json",
    "slurm-26.05/resp_get_job_failed_v0.0.43.json",
    "slurm-26.05/resp_get_job_failed_v0.0.44.json",
    "slurm-26.05/resp_get_job_het.json",
    "slurm-26.05/resp_get_job_bad_sluid.json",
    "slurm-26.05/resp_list_jobs.json",
    "slurm-26.05/resp_jobs_state.json",
    "slurm-26.05/resp_jobs_state_by_sluid.json",
    "slurm-26.05/resp_jobs_bad_token.json",
    "slurm-26.05/resp_ping.json",
    "slurm-26.05/resp_ping_bad_token.json",
    "slurm-26.05/resp_submit.json",
    "slurm-26.05/resp_submit_failing.json",
    "slurm-26.05/resp_submit_het.json",
    "slurm-26.05/resp_submit_rejected.json",
    "slurm-26.05/resp_submit_het_missing_cwd.json",
    "slurm-26.05/resp_cancel_job.json",
    "slurm-26.05/resp_cancel_het.json",
    "slurm-26.05/resp_cancel_job_by_sluid.json",
    "slurm-26.05/resp_update_job.json",
    "slurm-26.05/resp_update_job_by_sluid.json",
    "slurm-26.05/resp_release_job.json",
    "slurm-26.05/resp_slurmdb_job.json",
    "slurm-26.05/resp_slurmdb_job_by_sluid.json",
    "slurm-26.05/resp_slurmdb_jobs_step_sluid.json",
    "slurm-26.05/resp_slurmdb_jobs.json",
    "slurm-26.05/resp_conf.json",
    "slurm-26.05/resp_diag.json",
    "slurm-26.05/resp_licenses.json",
    "slurm-26.05/resp_nodes.json",
    "slurm-26.05/resp_partitions.json",
    "slurm-26.05/resp_reservations.json",
    "slurm-26.05/resp_shares.json",
}
# Covered by test_slurm_bodies.py (requests compared with what the dialect builds).
REQUESTS = {
    "slurm-26.05/req_submit.json",
    "slurm-26.05/req_submit_failing.json",
    "slurm-26.05/req_submit_held.json",
    "slurm-26.05/req_submit_het.json",
    "slurm-26.05/req_submit_het_missing_cwd.json",
    "slurm-26.05/req_submit_quick.json",
    "slurm-26.05/req_submit_rejected.json",
}


def test_every_sample_is_claimed() -> None:
    found = {str(p.relative_to(SAMPLES)) for p in SAMPLES.rglob("*") if p.is_file()}
    found.discard("README.md")
    assert found - COVERED - REQUESTS == set()


# -- 22.05, v0.0.38 -------------------------------------------------------------------------


def test_v38_running_job() -> None:
    (job,) = dialect_for("v0.0.38").parse_jobs(sample_json_22("job2_running.json"))
    assert job.job_id == 2
    assert job.name == "rest-min"
    assert job.base_state is BaseState.RUNNING
    assert job.flags == frozenset()
    assert not job.is_final
    assert job.exit == JobExit()  # running: a raw 0 means nothing yet
    assert job.reason is None
    assert job.user == "slurmci"
    assert job.partition == "debug"
    assert job.cluster == "citest"
    assert job.nodes == "localhost"
    assert job.node_count == 1
    assert job.submit_time == ts(1795990527)
    assert job.start_time == ts(1795990527)
    assert job.end_time == ts(1827526527)  # an expectation a year ahead (no time limit)
    assert job.het_job_id is None
    assert job.het_job_offset is None
    assert job.array_job_id is None
    assert job.sluid is None
    assert job.standard_output is None
    assert job.standard_error is None
    assert job.working_directory == "/tmp/slurmtest/home/slurmci"
    assert job.constraints is None
    assert job.raw_state == ("RUNNING",)


def test_v38_failed_job_exit_split() -> None:
    (job,) = dialect_for("v0.0.38").parse_jobs(sample_json_22("sample_job_v38.json"))
    assert job.job_id == 1
    assert job.base_state is BaseState.FAILED
    assert job.is_final
    assert job.exit == JobExit(return_code=3, signal=None)  # raw 768
    assert job.reason == "NonZeroExitCode"
    assert job.standard_output == "/tmp/slurmtest/home/slurmci/sample-%j.out"
    # No stderr path given: Slurm writes stderr into the stdout file.
    assert job.standard_error == job.standard_output
    assert job.nodes == "n1"


def test_v36_shape_parses_with_v38_dialect() -> None:
    (job,) = dialect_for("v0.0.38").parse_jobs(sample_json_22("sample_job_v36.json"))
    assert job.job_id == 1
    assert job.base_state is BaseState.FAILED
    assert job.exit.return_code == 3


def test_v38_envelope_meta() -> None:
    env = parse_envelope(sample_json_22("job2_running.json"))
    assert env.release == "22.05.8"
    assert env.errors == ()
    assert env.warnings == ()


# -- 26.05, v0.0.42 - v0.0.45 job info ------------------------------------------------------


def test_v45_running_job() -> None:
    (job,) = V45.parse_jobs(sample("slurm-26.05/resp_get_job.json"))
    assert job.job_id == 2
    assert job.sluid == "s2FSM8MPC68800"
    assert job.name == "rest-sleep"
    assert job.base_state is BaseState.RUNNING
    assert not job.is_final
    assert job.exit == JobExit()  # "SUCCESS, 0" while running is ignored
    assert job.user == "slurmnewuser"
    assert job.cluster == "slurmnew"
    assert job.nodes == "vm"
    assert job.node_count == 1
    assert job.submit_time == ts(1795990886)
    assert job.end_time == ts(1795991486)  # start + 10 min limit: expected, not a fact
    assert job.standard_output == "/var/tmp/slurm-new/home/slurmnewuser/job-2.out"
    assert job.standard_error == job.standard_output
    assert job.het_job_id is None
    assert job.het_job_offset is None
    assert job.array_job_id is None
    assert job.array_task_id is None
    assert job.reason is None


def test_v45_by_sluid_is_same_job() -> None:
    a = V45.parse_jobs(sample("slurm-26.05/resp_get_job.json"))
    b = V45.parse_jobs(sample("slurm-26.05/resp_get_job_by_sluid.json"))
    assert a == b


def test_v45_cancelled_job() -> None:
    (job,) = V45.parse_jobs(sample("slurm-26.05/resp_get_job_cancelled.json"))
    assert job.base_state is BaseState.CANCELLED
    assert job.is_final
    assert job.exit == JobExit(return_code=None, signal=15)
    assert job.end_time == ts(1795990913)


@pytest.mark.parametrize(
    ("file", "version", "sluid"),
    [
        ("resp_get_job_failed.json", "v0.0.45", "s2FSM8MPD6XC00"),
        ("resp_get_job_failed_v0.0.44.json", "v0.0.44", "s2FSM8MPD6XC00"),
        ("resp_get_job_failed_v0.0.43.json", "v0.0.43", None),
        ("resp_get_job_failed_v0.0.42.json", "v0.0.42", None),
    ],
)
def test_failed_job_every_version(file: str, version: str, sluid: str | None) -> None:
    payload = sample(f"slurm-26.05/{file}")
    assert parse_envelope(payload).data_parser == f"data_parser/{version}"
    (job,) = dialect_for(version).parse_jobs(payload)
    assert job.job_id == 4
    assert job.name == "rest-fail"
    assert job.base_state is BaseState.FAILED
    assert job.is_final
    assert job.exit == JobExit(return_code=3, signal=None)
    assert job.reason == "NonZeroExitCode"
    assert job.sluid == sluid
    # v0.0.42 expands standard_output itself; v0.0.43+ keep it raw next to stdout_expanded.
    assert job.standard_output == "/var/tmp/slurm-new/home/slurmnewuser/job-4.out"
    assert (job.start_time, job.end_time) == (ts(1795990920), ts(1795990921))


def test_het_job_components() -> None:
    leader, member = V45.parse_jobs(sample("slurm-26.05/resp_get_job_het.json"))
    assert (leader.job_id, leader.het_job_id, leader.het_job_offset) == (6, 6, 0)
    assert (member.job_id, member.het_job_id, member.het_job_offset) == (7, 6, 1)
    assert leader.sluid == "s2FSM8MPDKTA00"
    assert member.sluid == "s2FSM8MPDKTB00"
    assert leader.base_state is member.base_state is BaseState.PENDING
    assert leader.reason == member.reason == "Resources"
    assert leader.nodes is None
    assert leader.name == "rest-het"
    assert member.name == ""
    assert member.standard_output == "/var/tmp/slurm-new/home/slurmnewuser/slurm-7.out"
    assert leader.exit == JobExit()


def test_list_jobs() -> None:
    jobs = V45.parse_jobs(sample("slurm-26.05/resp_list_jobs.json"))
    assert [j.job_id for j in jobs] == [6, 7, 8, 9, 10, 11]
    by_id = {j.job_id: j for j in jobs}
    assert by_id[8].name == "rest-held-renamed"
    assert by_id[8].comment == "updated via REST"
    assert by_id[8].exit == JobExit(signal=15)
    assert by_id[9].base_state is BaseState.COMPLETED
    assert by_id[9].exit == JobExit(return_code=0)
    assert by_id[10].exit == JobExit(return_code=3)
    assert all(j.is_final for j in jobs)
    assert by_id[7].het_job_offset == 1


# -- /jobs/state ----------------------------------------------------------------------------


def test_jobs_state() -> None:
    (entry,) = V45.parse_jobs_state(sample("slurm-26.05/resp_jobs_state.json"))
    assert (entry.raw_job_id, entry.job_id, entry.base_state) == ("2", 2, BaseState.RUNNING)
    assert entry.het_job_offset is None
    assert entry.array_task is None


def test_jobs_state_by_sluid_shows_filter_ignored() -> None:
    entries = V45.parse_jobs_state(sample("slurm-26.05/resp_jobs_state_by_sluid.json"))
    assert [(e.job_id, e.base_state, e.is_final) for e in entries] == [
        (1, BaseState.COMPLETED, True),
        (2, BaseState.RUNNING, False),
    ]


@pytest.mark.parametrize(
    ("raw", "job_id", "offset", "task"),
    [
        ("123", 123, None, None),
        ("123+1", 123, 1, None),
        ("123_[1-3]", 123, None, "[1-3]"),
        ("123_4", 123, None, "4"),
    ],
)
def test_jobs_state_id_forms(raw: str, job_id: int, offset: int | None, task: str | None) -> None:
    (entry,) = V45.parse_jobs_state({"jobs": [{"job_id": raw, "state": ["PENDING"]}]})
    assert (entry.job_id, entry.het_job_offset, entry.array_task) == (job_id, offset, task)


def test_jobs_state_unsupported_on_v38() -> None:
    from slurmjob_operator.slurm.errors import SlurmUnsupported

    with pytest.raises(SlurmUnsupported):
        dialect_for("v0.0.38").parse_jobs_state({"jobs": []})


# -- accounting -----------------------------------------------------------------------------


def test_slurmdb_job() -> None:
    (job,) = V45.parse_accounting_jobs(sample("slurm-26.05/resp_slurmdb_job.json"))
    assert job.source is JobSource.ACCOUNTING
    assert job.job_id == 9
    assert job.sluid == "s2FSM8MPSV2T00"
    assert job.name == "rest-quick"
    assert job.base_state is BaseState.COMPLETED
    assert job.exit == JobExit(return_code=0)
    assert (job.submit_time, job.start_time, job.end_time) == (
        ts(1795991333),
        ts(1795991333),
        ts(1795991336),
    )
    assert job.standard_output == "/var/tmp/slurm-new/home/slurmnewuser/job-9.out"
    assert job.working_directory == "/var/tmp/slurm-new/home/slurmnewuser"
    assert job.het_job_id is None
    assert job.comment is None
    assert job.user == "slurmnewuser"
    for other in ("resp_slurmdb_job_by_sluid.json", "resp_slurmdb_jobs_step_sluid.json"):
        assert V45.parse_accounting_jobs(sample(f"slurm-26.05/{other}")) == [job]


def test_slurmdb_jobs() -> None:
    jobs = V45.parse_accounting_jobs(sample("slurm-26.05/resp_slurmdb_jobs.json"))
    by_id = {j.job_id: j for j in jobs}
    assert sorted(by_id) == [6, 7, 8, 9, 10, 11]
    assert (by_id[6].het_job_id, by_id[6].het_job_offset) == (6, 0)
    assert (by_id[7].het_job_id, by_id[7].het_job_offset, by_id[7].name) == (6, 1, "allocation")
    assert by_id[6].nodes is None  # "None assigned"
    assert by_id[8].exit == JobExit(signal=15)
    assert by_id[10].exit == JobExit(return_code=3)
    assert by_id[10].base_state is BaseState.FAILED
    assert by_id[11].sluid == "s2FSM8MPVYSH00"


def test_accounting_unsupported_on_v38() -> None:
    from slurmjob_operator.slurm.errors import SlurmUnsupported

    with pytest.raises(SlurmUnsupported):
        dialect_for("v0.0.38").parse_accounting_jobs({"jobs": []})


# -- submit, cancel, update, ping, envelopes ------------------------------------------------


@pytest.mark.parametrize(
    ("file", "job_id"),
    [("resp_submit.json", 2), ("resp_submit_failing.json", 4), ("resp_submit_het.json", 6)],
)
def test_submit_receipts(file: str, job_id: int) -> None:
    payload = sample(f"slurm-26.05/{file}")
    assert parse_envelope(payload).errors == ()
    receipt = V45.parse_submit(payload)
    assert (receipt.job_id, receipt.step_id, receipt.warnings) == (job_id, "batch", ())
    assert receipt.user_message is None


@pytest.mark.parametrize(
    ("file", "number", "text"),
    [
        ("resp_submit_rejected.json", 2000, "Invalid partition name specified"),
        ("resp_submit_het_missing_cwd.json", 2063, "current working directory"),
    ],
)
def test_submit_refusals(file: str, number: int, text: str) -> None:
    env = parse_envelope(sample(f"slurm-26.05/{file}"))
    error = classify(500, env.errors, json_body=True, submit=True)
    assert isinstance(error, SlurmRejected)
    assert error.error_numbers == (number,)
    assert text in str(error)
    error = classify(422, env.errors, json_body=True, submit=True)
    assert isinstance(error, SlurmRejected)


@pytest.mark.parametrize(
    "file", ["resp_cancel_job.json", "resp_cancel_het.json", "resp_cancel_job_by_sluid.json"]
)
def test_cancel_answers(file: str) -> None:
    result = V45.parse_cancel(sample(f"slurm-26.05/{file}"), "2")
    assert result.already_done is False
    assert result.job_ref == "2"


def test_update_answers() -> None:
    for file in ("resp_update_job.json", "resp_release_job.json"):
        assert parse_envelope(sample(f"slurm-26.05/{file}")).errors == ()
    env = parse_envelope(sample("slurm-26.05/resp_update_job_by_sluid.json"))
    assert isinstance(classify(200, env.errors, json_body=True), SlurmNotFound)
    # The update bodies are plain job descriptions; they are not built by this layer.
    assert sample("slurm-26.05/req_release_job.json") == {"hold": False}
    assert "name" in sample("slurm-26.05/req_update_job.json")


def test_bad_sluid_is_not_found() -> None:
    payload = sample("slurm-26.05/resp_get_job_bad_sluid.json")
    assert V45.parse_jobs(payload) == []
    assert isinstance(classify(404, parse_envelope(payload).errors, json_body=True), SlurmNotFound)
    assert isinstance(classify(500, parse_envelope(payload).errors, json_body=True), SlurmNotFound)


def test_bad_token_answers() -> None:
    env = parse_envelope(sample("slurm-26.05/resp_jobs_bad_token.json"))
    assert is_auth_failure(env.errors)
    for status in (200, 500, 511):
        assert isinstance(classify(status, env.errors, json_body=True), SlurmAuthError)
    ping = V45.parse_ping(sample("slurm-26.05/resp_ping_bad_token.json"))
    assert not ping.responding
    assert ping.controllers[0].status == "Protocol authentication error"


def test_ping() -> None:
    ping = V45.parse_ping(sample("slurm-26.05/resp_ping.json"))
    assert ping.responding
    assert ping.release == "26.05.3"
    assert ping.cluster == "slurmnew"
    assert ping.controllers[0].hostname == "vm"


def test_plain_text_answers() -> None:
    no_auth = (S2605 / "resp_no_auth.txt").read_text()
    assert isinstance(classify(401, (), json_body=False, text=no_auth), SlurmAuthError)
    bogus = (S2605 / "bogus_version.txt").read_text()
    from slurmjob_operator.slurm.errors import SlurmUnsupported

    assert isinstance(classify(404, (), json_body=False, text=bogus), SlurmUnsupported)


@pytest.mark.parametrize(
    "file",
    [
        "resp_conf.json",
        "resp_diag.json",
        "resp_licenses.json",
        "resp_nodes.json",
        "resp_partitions.json",
        "resp_reservations.json",
        "resp_shares.json",
    ],
)
def test_other_answers_have_clean_envelopes(file: str) -> None:
    env = parse_envelope(sample(f"slurm-26.05/{file}"))
    assert env.errors == ()
    assert env.release == "26.05.3"
    assert env.cluster == "slurmnew"


def test_openapi_documents_exist() -> None:
    assert Path(S2205 / "openapi.json").is_file()
    assert Path(S2605 / "openapi_v3.json").is_file()
