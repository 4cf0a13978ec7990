"""SlurmClient against an in-process fake slurmrestd: error taxonomy, discovery, operations."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from typing import Any

import pytest

from slurmjob_operator.core.jobview import BaseState, JobSource
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.discovery import discover_version, pick_version
from slurmjob_operator.slurm.errors import (
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmNotFound,
    SlurmRejected,
    SlurmTransient,
    SlurmUnsupported,
)
from slurmjob_operator.slurm.http import HttpTransport

from .handles import handle
from .raw_http import GET_404_2605, SUBMIT_422_2605, raw_server
from .slurm_fakes import (
    S2205,
    S2605,
    FakeSlurm,
    StaticToken,
    capture,
    cpu_request,
    envelope,
    sample,
)

Calls = list[tuple[str, str, str, float]]


@pytest.fixture(autouse=True)
def _in_a_step(step: Any) -> None:
    """Handles live as long as their step: one per test."""


def client(
    fake: FakeSlurm, session: HttpTransport, version: str = "v0.0.45", **kw: Any
) -> SlurmClient:
    return SlurmClient(
        session, fake.base_url, version, token=StaticToken(), user="alice", timeout=0.5, **kw
    )


V45 = "/slurm/v0.0.45"
V38 = "/slurm/v0.0.38"


# -- submit ---------------------------------------------------------------------------------


async def test_submit_success_sends_headers_and_body(fake: FakeSlurm, session: Any) -> None:
    fake.json("POST", f"{V45}/job/submit", sample("slurm-26.05/resp_submit.json"))
    calls: Calls = []
    c = client(fake, session, on_request=lambda *a: calls.append(a))
    receipt = await c.submit(cpu_request())
    assert (receipt.job_id, receipt.step_id) == (2, "batch")
    seen = fake.seen[-1]
    assert seen.headers["X-SLURM-USER-TOKEN"] == "tok"
    assert seen.headers["X-SLURM-USER-NAME"] == "alice"
    assert seen.body == c.dialect.submit_body(cpu_request())
    assert calls[0][:3] == (f"{V45}/job/submit", "POST", "2xx")


async def test_submit_200_with_errors_is_rejected_and_carries_job_id(
    fake: FakeSlurm, session: Any
) -> None:
    payload = {
        "errors": [
            {"error_code": 2015, "error": "Requested partition configuration not available now"}
        ],
        "job_id": 41,
        "step_id": "BATCH",
    }
    fake.json("POST", f"{V38}/job/submit", payload)
    with pytest.raises(SlurmRejected) as info:
        await client(fake, session, "v0.0.38").submit(cpu_request())
    assert info.value.job_id == 41
    assert info.value.error_numbers == (2015,)
    assert "partition configuration" in str(info.value)


@pytest.mark.parametrize(
    ("status", "payload", "expected"),
    [
        (
            511,
            envelope(errors=[{"error_number": 1007, "error": "Protocol authentication error"}]),
            SlurmAuthError,
        ),
        (
            500,
            envelope(errors=[{"error_number": 2000, "error": "Invalid partition name specified"}]),
            SlurmRejected,
        ),
        (422, envelope(errors=[{"error_number": 2063, "error": "no cwd"}]), SlurmRejected),
        (
            502,
            envelope(
                errors=[{"error_number": 1001, "error": "Unable to contact slurm controller"}]
            ),
            SlurmTransient,
        ),
        (
            500,
            envelope(
                errors=[{"error_number": 1802, "error": "Slurm backup controller in standby mode"}]
            ),
            SlurmAmbiguous,
        ),
        (504, None, SlurmAmbiguous),
        (502, None, SlurmAmbiguous),
        (503, None, SlurmAmbiguous),
    ],
)
async def test_submit_failure_classes(
    fake: FakeSlurm, session: Any, status: int, payload: Any, expected: type[Exception]
) -> None:
    if payload is None:
        fake.text("POST", f"{V45}/job/submit", "Bad Gateway", status)
    else:
        fake.json("POST", f"{V45}/job/submit", payload, status)
    with pytest.raises(expected):
        await client(fake, session).submit(cpu_request())


ZERO_BYTES_22 = {
    "errors": [{"error_code": 5005, "error": "Zero Bytes were transmitted or received"}]
}


async def test_submit_5005_with_a_refused_ping_is_auth(fake: FakeSlurm, session: Any) -> None:
    # 22.05 answers a bad token with 5005 on submit; its ping then fails the same way.
    fake.json("POST", f"{V38}/job/submit", ZERO_BYTES_22, 500)
    refused = {"errors": [{"error": "slurmctld config is unable to load", "error_number": -1}]}
    fake.json("GET", f"{V38}/ping", refused, 500)
    with pytest.raises(SlurmAuthError):
        await client(fake, session, "v0.0.38").submit(cpu_request())


async def test_submit_5005_with_a_good_ping_is_ambiguous(fake: FakeSlurm, session: Any) -> None:
    # The token works: slurmctld closed the connection after reading the submit.
    fake.json("POST", f"{V45}/job/submit", ZERO_BYTES_22, 500)
    fake.json("GET", f"{V45}/ping", sample("slurm-26.05/resp_ping.json"))
    with pytest.raises(SlurmAmbiguous):
        await client(fake, session).submit(cpu_request())


async def test_submit_plain_text_400_is_rejected(fake: FakeSlurm, session: Any) -> None:
    fake.text("POST", f"{V38}/job/submit", "Unable to parse query.", 400)
    with pytest.raises(SlurmRejected, match="Unable to parse query"):
        await client(fake, session, "v0.0.38").submit(cpu_request())


async def test_submit_plain_500_is_ambiguous(fake: FakeSlurm, session: Any) -> None:
    fake.text("POST", f"{V45}/job/submit", "", 500)
    with pytest.raises(SlurmAmbiguous):
        await client(fake, session).submit(cpu_request())


async def test_submit_dropped_connection_is_ambiguous(fake: FakeSlurm, session: Any) -> None:
    fake.drop("POST", f"{V45}/job/submit")
    with pytest.raises(SlurmAmbiguous):
        await client(fake, session).submit(cpu_request())
    assert fake.seen[-1].body is not None  # the request was read before the drop


async def test_submit_timeout_is_ambiguous(fake: FakeSlurm, session: Any) -> None:
    fake.hang("POST", f"{V45}/job/submit")
    calls: Calls = []
    with pytest.raises(SlurmAmbiguous):
        await client(fake, session, on_request=lambda *a: calls.append(a)).submit(cpu_request())
    assert calls[0][2] == "timeout"


async def test_submit_connection_refused_is_transient(session: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = SlurmClient(
        session, f"http://127.0.0.1:{port}", "v0.0.45", token=StaticToken(), timeout=0.5
    )
    with pytest.raises(SlurmTransient):
        await c.submit(cpu_request())


async def test_submit_2605_double_422_is_rejected_with_slurms_text(session: Any) -> None:
    # 26.05 writes two responses for one error; the first (JSON) one is the answer.
    async with raw_server(SUBMIT_422_2605) as srv:
        c = SlurmClient(session, srv.url, "v0.0.45", token=StaticToken(), timeout=2)
        with pytest.raises(SlurmRejected, match="Invalid partition name specified") as info:
            await c.submit(cpu_request())
    assert "[2000]" in str(info.value)  # from the JSON errors[], not the text/plain echo
    assert srv.requests[0].startswith(b"POST /slurm/v0.0.45/job/submit HTTP/1.1\r\n")


# -- GETs -----------------------------------------------------------------------------------


async def test_get_dropped_and_hung_are_transient(fake: FakeSlurm, session: Any) -> None:
    fake.drop("GET", f"{V45}/job/5")
    fake.hang("GET", f"{V45}/job/6")
    with pytest.raises(SlurmTransient):
        await client(fake, session).get_job(5)
    with pytest.raises(SlurmTransient):
        await client(fake, session).get_job(6)


@pytest.mark.parametrize(
    ("status", "payload", "expected"),
    [
        (
            500,
            {
                "errors": [
                    {
                        "description": "Unable to find JobId=9",
                        "error_number": 2017,
                        "error": "Invalid job id specified",
                        "source": "slurm_load_job",
                    }
                ],
                "jobs": [],
            },
            SlurmNotFound,
        ),
        (
            500,
            {"errors": [{"error": "_handle_job_get: unknown job 9", "errno": 0}], "jobs": []},
            SlurmNotFound,
        ),
        (
            404,
            envelope(errors=[{"error_number": 2017, "error": "Invalid job id specified"}], jobs=[]),
            SlurmNotFound,
        ),
        (200, envelope(jobs=[]), SlurmNotFound),
        (401, None, SlurmAuthError),
        (
            500,
            {
                "errors": [
                    {
                        "description": "slurmctld config is unable to load",
                        "error_number": -1,
                        "error": "Unspecified error",
                        "source": "slurm_load_ctl_conf",
                    }
                ]
            },
            SlurmAuthError,
        ),
        (502, None, SlurmTransient),
        (500, None, SlurmTransient),
    ],
)
async def test_get_job_failure_classes(
    fake: FakeSlurm, session: Any, status: int, payload: Any, expected: type[Exception]
) -> None:
    if payload is None:
        fake.text("GET", f"{V38}/job/9", "Authentication failure" if status == 401 else "", status)
    else:
        fake.json("GET", f"{V38}/job/9", payload, status)
    with pytest.raises(expected):
        await client(fake, session, "v0.0.38").get_job(9)


async def test_get_job_2605_double_404_is_not_found(session: Any) -> None:
    async with raw_server(GET_404_2605) as srv:
        c = SlurmClient(session, srv.url, "v0.0.45", token=StaticToken(), timeout=2)
        with pytest.raises(SlurmNotFound):
            await c.get_job(999999)


async def test_unserved_path_is_unsupported_not_missing(fake: FakeSlurm, session: Any) -> None:
    with pytest.raises(SlurmUnsupported):
        await client(fake, session).get_job(1)


async def test_get_job_het_and_sluid(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", f"{V45}/job/6", sample("slurm-26.05/resp_get_job_het.json"))
    fake.json("GET", f"{V45}/job/s2FSM8MPC68800", sample("slurm-26.05/resp_get_job_by_sluid.json"))
    c = client(fake, session)
    assert [j.job_id for j in await c.get_job(6)] == [6, 7]
    (job,) = await c.get_job("s2FSM8MPC68800")
    assert job.sluid == "s2FSM8MPC68800"


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.44"])
async def test_sluid_refused_before_v045(fake: FakeSlurm, session: Any, version: str) -> None:
    with pytest.raises(SlurmUnsupported):
        await client(fake, session, version).get_job("s2FSM8MPC68800")
    assert fake.seen == []


async def test_bad_refs_refused(fake: FakeSlurm, session: Any) -> None:
    c = client(fake, session)
    for ref in ("1,2", "../x", "sSHORT", "123_[1-3]"):
        with pytest.raises(ValueError, match="invalid"):
            await c.get_job(ref)
    with pytest.raises(ValueError, match="invalid job id"):
        await c.get_job(0)
    assert fake.seen == []


# -- list, state, cancel --------------------------------------------------------------------


async def test_list_jobs_304_on_v38(fake: FakeSlurm, session: Any) -> None:
    async def handler(_: Any) -> Any:
        from aiohttp import web

        return web.Response(status=304)

    fake.routes[("GET", f"{V38}/jobs")] = handler
    result = await client(fake, session, "v0.0.38").list_jobs(datetime(2026, 1, 1, tzinfo=UTC))
    assert result.not_modified
    assert result.jobs == ()
    assert fake.seen[-1].query == [("update_time", "1767225600")]


async def test_list_jobs_no_change_warning_on_v045(fake: FakeSlurm, session: Any) -> None:
    warning = {
        "description": "No job changes since update_time=1767225600",
        "source": "slurm_load_jobs",
    }
    fake.json("GET", f"{V45}/jobs", envelope(jobs=[], warnings=[warning]))
    result = await client(fake, session).list_jobs(datetime(2026, 1, 1, tzinfo=UTC))
    assert result.not_modified
    assert result.warnings[0].description == warning["description"]


async def test_list_jobs_full(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", f"{V45}/jobs", sample("slurm-26.05/resp_list_jobs.json"))
    result = await client(fake, session).list_jobs()
    assert not result.not_modified
    assert len(result.jobs) == 6
    assert fake.seen[-1].query == []


async def test_jobs_state_batches_repeated_parameters(fake: FakeSlurm, session: Any) -> None:
    async def handler(request: Any) -> Any:
        from aiohttp import web

        ids = request.query.getall("job_id")
        jobs = [{"job_id": i, "state": ["RUNNING"]} for i in ids if i != "13"]
        if "12" in ids:
            jobs.append({"job_id": "12+1", "state": ["PENDING"]})
        return web.json_response(envelope(jobs=jobs))

    fake.routes[("GET", f"{V45}/jobs/state")] = handler
    result = await client(fake, session).jobs_state([14, 12, 13, 12, 11], batch=2)
    assert [s.query for s in fake.seen] == [
        [("job_id", "11"), ("job_id", "12")],
        [("job_id", "13"), ("job_id", "14")],
    ]
    by_component = {e.component_job_id: e for e in result}
    assert sorted(by_component) == [11, 12, 13, 14]
    assert len(result) == 4
    assert by_component[13].raw_job_id == "12+1"
    assert by_component[13].het_job_offset == 1
    assert by_component[12].base_state is BaseState.RUNNING


async def test_jobs_state_keeps_every_task_of_an_array(fake: FakeSlurm, session: Any) -> None:
    """The captured answer for an array's id: one entry per task, pending ones under the
    array's id, each started one under its own job id (Slurm 26.05.5)."""
    captured = capture("resp_state_array_running.json")

    async def handler(request: Any) -> Any:
        from aiohttp import web

        assert request.query.getall("job_id") == ["1"]
        return web.json_response(captured)

    fake.routes[("GET", f"{V45}/jobs/state")] = handler
    result = await client(fake, session).jobs_state([1])
    assert sorted((e.job_id, e.array_task) for e in result) == [
        (1, "2"),
        (1, "3"),
        (1, "4"),
        (1, "5"),
        (2, "0"),
        (3, "1"),
    ]
    assert {e.array_task: e.base_state for e in result}["0"] is BaseState.RUNNING


async def test_jobs_state_isolates_unknown_ids(fake: FakeSlurm, session: Any) -> None:
    async def handler(request: Any) -> Any:
        from aiohttp import web

        ids = request.query.getall("job_id")
        if "3" in ids:
            return web.json_response(
                envelope(errors=[{"error_number": 2017, "error": "Invalid job id specified"}]),
                status=404,
            )
        return web.json_response(
            envelope(jobs=[{"job_id": i, "state": ["COMPLETED"]} for i in ids])
        )

    fake.routes[("GET", f"{V45}/jobs/state")] = handler
    result = await client(fake, session).jobs_state([1, 2, 3, 4])
    assert sorted(e.job_id for e in result) == [1, 2, 4]
    assert all(e.is_final for e in result)


async def test_jobs_state_unsupported_on_v38(fake: FakeSlurm, session: Any) -> None:
    with pytest.raises(SlurmUnsupported):
        await client(fake, session, "v0.0.38").jobs_state([1])


async def test_cancel_completed_job_v38_is_success(fake: FakeSlurm, session: Any) -> None:
    fake.json("DELETE", f"{V38}/job/5", {"meta": {}, "errors": []})
    result = await client(fake, session, "v0.0.38").cancel(handle(5, "alice"))
    assert result.job_ref == "5"


@pytest.mark.parametrize(
    ("code", "outcome"),
    [(2021, "done"), (2017, SlurmNotFound), (2002, SlurmRejected), (0, "ok")],
)
async def test_cancel_status_entries_v045(
    fake: FakeSlurm, session: Any, code: int, outcome: Any
) -> None:
    status = [
        {
            "error": {"string": "x", "code": code, "message": "m"},
            "step_id": "5",
            "job_id": {"set": True, "infinite": False, "number": 5},
            "federation": {"sibling": ""},
        }
    ]
    fake.json("DELETE", f"{V45}/job/5", envelope(status=status))
    c = client(fake, session)
    if isinstance(outcome, type):
        with pytest.raises(outcome):
            await c.cancel(handle(5, "alice"), signal="TERM")
    else:
        result = await c.cancel(handle(5, "alice"), signal="TERM")
        assert result.already_done is (outcome == "done")
    assert fake.seen[-1].query == [("signal", "TERM")]


async def test_cancel_unknown_job_v38(fake: FakeSlurm, session: Any) -> None:
    fake.json(
        "DELETE",
        f"{V38}/job/9",
        {
            "errors": [
                {
                    "description": "unable to kill JobId=9 with signal 9: Invalid job id specified",
                    "error_number": 2017,
                }
            ]
        },
        500,
    )
    with pytest.raises(SlurmNotFound):
        await client(fake, session, "v0.0.38").cancel(handle(9, "alice"))


# -- ping, accounting, discovery ------------------------------------------------------------


async def test_ping(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", f"{V45}/ping", sample("slurm-26.05/resp_ping.json"))
    assert (await client(fake, session).ping()).release == "26.05.3"
    fake.json("GET", f"{V45}/ping", sample("slurm-26.05/resp_ping_bad_token.json"))
    with pytest.raises(SlurmAuthError):
        await client(fake, session).ping()


async def test_find_by_name_merges_controller_and_accounting(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", f"{V45}/jobs", sample("slurm-26.05/resp_list_jobs.json"))
    fake.json("GET", "/slurmdb/v0.0.45/jobs", sample("slurm-26.05/resp_slurmdb_jobs.json"))
    found = await client(fake, session).find_by_name("rest-quick")
    assert [(j.job_id, j.source) for j in found] == [
        (9, JobSource.CONTROLLER),
        (11, JobSource.CONTROLLER),
    ]
    query = dict(fake.seen[-1].query)
    assert query["job_name"] == "rest-quick"
    assert abs(int(query["start_time"]) - (datetime.now(tz=UTC).timestamp() - 7 * 86400)) < 60


async def test_find_by_name_uses_accounting_for_purged_jobs(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", f"{V45}/jobs", envelope(jobs=[]))
    fake.json("GET", "/slurmdb/v0.0.45/jobs", sample("slurm-26.05/resp_slurmdb_jobs.json"))
    found = await client(fake, session).find_by_name("rest-fail")
    assert [(j.job_id, j.source, j.exit.return_code) for j in found] == [
        (10, JobSource.ACCOUNTING, 3)
    ]


async def test_find_by_name_remembers_missing_accounting(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", f"{V45}/jobs", envelope(jobs=[]))
    c = client(fake, session)
    assert await c.find_by_name("x") == []
    assert await c.find_by_name("x") == []
    assert [s.path for s in fake.seen].count("/slurmdb/v0.0.45/jobs") == 1
    assert not await c.has_accounting()
    with pytest.raises(SlurmUnsupported):
        await c.get_job_accounting(1)


async def test_get_job_accounting(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", "/slurmdb/v0.0.45/job/9", sample("slurm-26.05/resp_slurmdb_job.json"))
    (job,) = await client(fake, session).get_job_accounting(9)
    assert job.sluid == "s2FSM8MPSV2T00"


def test_pick_version_from_documents() -> None:
    import json

    doc_22 = json.loads((S2205 / "openapi.json").read_text())
    doc_26 = json.loads((S2605 / "openapi_v3.json").read_text())
    assert pick_version(doc_22) == "v0.0.38"
    assert pick_version(doc_26) == "v0.0.45"
    assert pick_version(doc_26, ["v0.0.38", "v0.0.42"]) == "v0.0.42"
    assert pick_version({"paths": {}}) is None


async def test_discover_from_openapi_v3(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", "/openapi/v3", sample("slurm-26.05/openapi_v3.json"))
    assert await discover_version(session, fake.base_url, token=StaticToken()) == "v0.0.45"
    assert fake.seen[-1].headers["X-SLURM-USER-TOKEN"] == "tok"


async def test_discover_falls_back_to_openapi_json(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", "/openapi.json", sample("slurm-22.05/openapi.json"))
    assert (
        await discover_version(session, fake.base_url, token=StaticToken(), user="u") == "v0.0.38"
    )
    assert [s.path for s in fake.seen] == ["/openapi/v3", "/openapi.json"]


async def test_discover_by_ping_probe(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", "/slurm/v0.0.42/ping", envelope(pings=[]))
    assert await discover_version(session, fake.base_url) == "v0.0.42"
    probed = [s.path for s in fake.seen if s.path.endswith("/ping")]
    assert probed == [
        "/slurm/v0.0.45/ping",
        "/slurm/v0.0.44/ping",
        "/slurm/v0.0.43/ping",
        "/slurm/v0.0.42/ping",
    ]


async def test_discover_nothing_supported(fake: FakeSlurm, session: Any) -> None:
    fake.json("GET", "/openapi/v3", {"paths": {"/slurm/v0.0.39/ping": {}}})
    with pytest.raises(SlurmUnsupported, match=r"v0\.0\.39"):
        await discover_version(session, fake.base_url)


async def test_discover_auth_refused(fake: FakeSlurm, session: Any) -> None:
    fake.text("GET", "/openapi/v3", "Authentication failure", 401)
    with pytest.raises(SlurmAuthError):
        await discover_version(session, fake.base_url)


async def test_on_request_errors_do_not_break_calls(fake: FakeSlurm, session: Any) -> None:
    fake.json("DELETE", f"{V45}/job/5", envelope(status=[]))

    def broken(*_: Any) -> None:
        raise RuntimeError("metrics down")

    assert (
        await client(fake, session, on_request=broken).cancel(handle(5, "alice"))
    ).already_done is False
