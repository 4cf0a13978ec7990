"""Hostile and malformed slurmrestd answers, through the real client and dialects against the
in-process fake slurmrestd: every one ends as one of the client's own errors, or as a record
left out of a sweep, never as a TypeError, OverflowError, ValueError or ValidationError.

Bodies are written as JSON text, so that what `json.dumps` cannot write (a 5,000-digit number,
`Infinity`) reaches the client exactly as a server could send it.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

from slurmjob_operator.core.jobview import JOB_ID_MAX, JobSource, SlurmJobView
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.dialects import SubmitReceipt, dialect_for, parse_envelope
from slurmjob_operator.slurm.errors import (
    InvalidJobRef,
    SlurmAmbiguous,
    SlurmError,
    SlurmMalformed,
    SlurmNotFound,
    SlurmRejected,
)
from slurmjob_operator.slurm.exchange import decode_json
from slurmjob_operator.slurm.http import HttpTransport

from .handles import handle
from .slurm_fakes import FakeSlurm, StaticToken, cpu_request, envelope, sample, sample_json_22

V45 = "/slurm/v0.0.45"
V38 = "/slurm/v0.0.38"
DB45 = "/slurmdb/v0.0.45"
HUGE = "9" * 5000  # beyond what Python's int() reads from text (4300 digits)
LONG = str(10**30)  # readable, but no Slurm number is that long


@pytest.fixture(autouse=True)
def _in_a_step(step: object) -> None:
    """Handles live as long as their step: one per test."""


@pytest.fixture
async def client(fake: FakeSlurm) -> AsyncIterator[SlurmClient]:
    async with HttpTransport() as transport:
        yield SlurmClient(
            transport, fake.base_url, "v0.0.45", token=StaticToken(), user="alice", timeout=2
        )


@pytest.fixture
async def client38(fake: FakeSlurm) -> AsyncIterator[SlurmClient]:
    async with HttpTransport() as transport:
        yield SlurmClient(
            transport, fake.base_url, "v0.0.38", token=StaticToken(), user="alice", timeout=2
        )


def answer(fake: FakeSlurm, method: str, path: str, body: Any, **raw: str) -> None:
    """Serve `body` as JSON text; each `"@name@"` string in it is replaced by `raw[name]`."""
    text = json.dumps(body)
    for name, fragment in raw.items():
        text = text.replace(f'"@{name}@"', fragment)

    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(status=200, text=text, content_type="application/json")

    fake.routes[(method, path)] = handler


def job45(**fields: Any) -> dict[str, Any]:
    """The captured v0.0.45 running job, with `fields` replaced."""
    record = copy.deepcopy(sample("slurm-26.05/resp_get_job.json")["jobs"][0])
    record.update(fields)
    return record


def job38(**fields: Any) -> dict[str, Any]:
    record = copy.deepcopy(sample_json_22("job2_running.json")["jobs"][0])
    record.update(fields)
    return record


def number(value: Any) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": value}


# -- one job: an unreadable record is SlurmMalformed, never "gone" ------------------------

# (case id, the job record, raw JSON fragments)
UNREADABLE_JOBS: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("number-is-a-list", job45(time_limit=number([1])), {}),
    ("time-number-is-a-list", job45(submit_time=number([1])), {}),
    ("time-is-an-object-of-garbage", job45(end_time=number({"x": 1})), {}),
    ("job-id-zero", job45(job_id=0), {}),
    ("job-id-negative", job45(job_id=-7), {}),
    ("job-id-beyond-uint32", job45(job_id=2**32), {}),
    ("job-id-no-val", job45(job_id=0xFFFFFFFE), {}),
    ("job-id-5000-digits", job45(job_id="@huge@"), {"huge": HUGE}),
    ("job-id-30-digits", job45(job_id="@long@"), {"long": LONG}),
    ("job-id-true", job45(job_id=True), {}),
    ("job-id-string", job45(job_id="2"), {}),
    ("job-id-float", job45(job_id=2.5), {}),
    ("het-offset-huge", job45(het_job_offset=number("@huge@")), {"huge": HUGE}),
    ("node-count-negative", job45(node_count=number(-1)), {}),
    ("exit-status-not-a-list", job45(exit_code={"status": 5}), {}),
    ("state-is-a-number", job45(job_state=7), {}),
    ("name-is-a-list", job45(name=["x"]), {}),
]


@pytest.mark.parametrize(
    ("record", "raw"),
    [(r, w) for _, r, w in UNREADABLE_JOBS],
    ids=[c for c, _, _ in UNREADABLE_JOBS],
)
async def test_an_unreadable_job_record_is_malformed(
    fake: FakeSlurm, client: SlurmClient, record: dict[str, Any], raw: dict[str, str]
) -> None:
    answer(fake, "GET", f"{V45}/job/2", envelope(jobs=[record]), **raw)
    with pytest.raises(SlurmMalformed) as caught:
        await client.get_job(2)
    assert not isinstance(caught.value, SlurmNotFound), "an unreadable job is not a gone job"
    assert caught.value.endpoint == f"{V45}/job/{{job_id}}"
    assert len(str(caught.value)) < 600, "no long hostile value is echoed"


@pytest.mark.parametrize(
    "body",
    [
        '{"jobs": 7}',
        '{"jobs": "x"}',
        '{"jobs": {"job_id": 2}}',
        '{"jobs": [7]}',
        '{"jobs": [["x"]]}',
    ],
)
async def test_a_job_answer_of_the_wrong_shape_is_malformed(
    fake: FakeSlurm, client: SlurmClient, body: str
) -> None:
    answer(fake, "GET", f"{V45}/job/2", "@whole@", whole=body)
    with pytest.raises(SlurmMalformed):
        await client.get_job(2)


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [
        ("1e20", None),  # OverflowError from datetime before
        ("-1e20", None),
        ("Infinity", None),  # Python's json reads it
        ("NaN", "malformed"),
        (HUGE, None),
        ("253402300800", None),  # one second after the last a datetime holds
        ("253402300799", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
        ('"1795990886"', datetime.fromtimestamp(1795990886, tz=UTC)),
        ('"soon"', "malformed"),
        ("true", "malformed"),
    ],
)
async def test_times_out_of_range_are_unknown_not_an_error(
    fake: FakeSlurm, client: SlurmClient, client38: SlurmClient, fragment: str, expected: Any
) -> None:
    answer(
        fake, "GET", f"{V45}/job/2", envelope(jobs=[job45(submit_time=number("@t@"))]), t=fragment
    )
    answer(fake, "GET", f"{V38}/job/2", {"jobs": [job38(job_id=2, submit_time="@t@")]}, t=fragment)
    for c in (client, client38):
        if expected == "malformed":
            with pytest.raises(SlurmMalformed):
                await c.get_job(2)
        else:
            (job,) = await c.get_job(2)
            assert job.submit_time == expected


async def test_a_missing_component_fails_the_whole_job(
    fake: FakeSlurm, client: SlurmClient
) -> None:
    het = sample("slurm-26.05/resp_get_job_het.json")
    het["jobs"][1]["node_count"] = number([2])
    answer(fake, "GET", f"{V45}/job/6", het)
    with pytest.raises(SlurmMalformed, match=r"jobs\[1\] \(job_id 7\)"):
        await client.get_job(6)


async def test_unreadable_accounting_records_of_one_job_are_malformed(
    fake: FakeSlurm, client: SlurmClient
) -> None:
    body = sample("slurm-26.05/resp_slurmdb_job.json")
    body["jobs"].append({**body["jobs"][0], "time": {"submission": number([1])}})
    answer(fake, "GET", f"{DB45}/job/9", body)
    with pytest.raises(SlurmMalformed):
        await client.get_job_accounting(9)


# -- sweeps: the bad record is left out, the others go on ---------------------------------


async def test_a_jobs_state_sweep_leaves_out_unreadable_entries(
    fake: FakeSlurm, client: SlurmClient, caplog: pytest.LogCaptureFixture
) -> None:
    entries = [
        {"job_id": "1", "state": ["RUNNING"]},
        {"job_id": "@huge@", "state": ["COMPLETED"]},
        {"job_id": HUGE[:50], "state": ["COMPLETED"]},
        {"job_id": [3], "state": ["COMPLETED"]},
        {"job_id": True, "state": ["COMPLETED"]},
        {"job_id": "\u0663", "state": ["COMPLETED"]},  # ARABIC-INDIC DIGIT THREE: int() reads 3
        {"job_id": "4+99999999999", "state": ["COMPLETED"]},
        "x",
        {"job_id": 2, "state": ["PENDING"]},
    ]
    answer(fake, "GET", f"{V45}/jobs/state", envelope(jobs=entries), huge=HUGE)
    with caplog.at_level(logging.WARNING):
        result = await client.jobs_state(None)
    assert sorted(e.job_id for e in result) == [1, 2]
    assert "7 unreadable record(s) left out" in caplog.text


async def test_a_listing_leaves_out_unreadable_jobs(
    fake: FakeSlurm, client: SlurmClient, client38: SlurmClient, caplog: pytest.LogCaptureFixture
) -> None:
    listing = sample("slurm-26.05/resp_list_jobs.json")
    good = len(listing["jobs"])
    listing["jobs"].insert(1, job45(job_id="@huge@"))
    listing["jobs"].append(job45(job_id=0))
    answer(fake, "GET", f"{V45}/jobs", listing, huge=HUGE)
    answer(
        fake,
        "GET",
        f"{V38}/jobs",
        {"jobs": [job38(job_id=5), job38(job_id=6, submit_time=[1]), job38(job_id=-7)]},
    )
    with caplog.at_level(logging.WARNING):
        assert len((await client.list_jobs()).jobs) == good
        assert [j.job_id for j in (await client38.list_jobs()).jobs] == [5]
    assert "unreadable record(s) left out" in caplog.text


async def test_a_listing_that_is_not_a_list_is_malformed(
    fake: FakeSlurm, client: SlurmClient
) -> None:
    answer(fake, "GET", f"{V45}/jobs", envelope(jobs=7))
    answer(fake, "GET", f"{V45}/jobs/state", envelope(jobs={"1": "RUNNING"}))
    with pytest.raises(SlurmMalformed):
        await client.list_jobs()
    with pytest.raises(SlurmMalformed):
        await client.jobs_state([1])


async def test_find_by_name_leaves_out_unreadable_accounting_records(
    fake: FakeSlurm, client: SlurmClient
) -> None:
    accounted = sample("slurm-26.05/resp_slurmdb_jobs.json")
    [failed] = [j for j in accounted["jobs"] if j["name"] == "rest-fail"]
    accounted["jobs"].insert(0, {**failed, "job_id": -7})
    accounted["jobs"].append({**failed, "job_id": 12, "time": {"submission": number([1])}})
    answer(fake, "GET", f"{V45}/jobs", envelope(jobs=[]))
    answer(fake, "GET", f"{DB45}/jobs", accounted)
    found = await client.find_by_name("rest-fail")
    assert [(j.job_id, j.source) for j in found] == [(10, JobSource.ACCOUNTING)]


# -- ids the operator would send are checked first ----------------------------------------


@pytest.mark.parametrize(
    "ref", [0, -7, JOB_ID_MAX + 1, 2**40, str(2**40), "0", "-7", "s" + "x" * 40]
)
async def test_ids_no_job_can_have_are_not_sent(
    fake: FakeSlurm, client: SlurmClient, ref: int | str
) -> None:
    for call in (client.get_job, client.get_job_accounting):
        with pytest.raises(InvalidJobRef):
            await call(ref)
    # No handle can carry such an id (a view's id is checked where Slurm's answer is read);
    # a SLUID is checked where a change would send it.
    if isinstance(ref, str) and ref.startswith("s"):
        with pytest.raises(InvalidJobRef):
            await client.cancel_many([handle(ref, "alice")])
    else:
        with pytest.raises(ValueError, match="job_id"):
            handle(int(ref), "alice")
    assert fake.seen == []


async def test_a_state_sweep_does_not_send_impossible_ids(
    fake: FakeSlurm, client: SlurmClient
) -> None:
    answer(fake, "GET", f"{V45}/jobs/state", envelope(jobs=[{"job_id": 5, "state": ["RUNNING"]}]))
    result = await client.jobs_state([5, 0, -7, 2**40])
    assert [e.job_id for e in result] == [5]
    assert [s.query for s in fake.seen] == [[("job_id", "5")]]


# -- submit: an unreadable receipt means a job may exist ----------------------------------


@pytest.mark.parametrize(
    "fragment", ["0", "-7", HUGE, LONG, str(2**32), "true", '"12"', "12.0", "null", "[12]"]
)
async def test_a_receipt_without_a_usable_job_id_is_ambiguous(
    fake: FakeSlurm, client: SlurmClient, fragment: str
) -> None:
    answer(fake, "POST", f"{V45}/job/submit", envelope(job_id="@id@", step_id="batch"), id=fragment)
    with pytest.raises(SlurmAmbiguous, match="submit answer unreadable"):
        await client.submit(cpu_request())


@pytest.mark.parametrize("fragment", ["true", "0", "-7", HUGE, str(2**32)])
async def test_a_refusal_names_only_a_job_id_slurm_could_have_made(
    fake: FakeSlurm, client38: SlurmClient, fragment: str
) -> None:
    body = {"errors": [{"error_code": 2015, "error": "not available now"}], "job_id": "@id@"}
    answer(fake, "POST", f"{V38}/job/submit", body, id=fragment)
    with pytest.raises(SlurmRejected) as caught:
        await client38.submit(cpu_request())
    assert caught.value.job_id is None, "a bool or an impossible id must not be cancelled"


# -- cancel, ping, nodes, envelopes ---------------------------------------------------------


@pytest.mark.parametrize(
    "status", ['["x"]', "[7]", '[{"error": {"code": "x"}}]', '"done"', '{"error": 1}']
)
async def test_an_unreadable_cancel_answer_is_malformed(
    fake: FakeSlurm, client: SlurmClient, status: str
) -> None:
    answer(fake, "DELETE", f"{V45}/job/5", envelope(status="@s@"), s=status)
    with pytest.raises(SlurmMalformed) as caught:
        await client.cancel(handle(5, "alice"))
    assert caught.value.method == "DELETE"


@pytest.mark.parametrize("pings", ["7", '["x"]', '[{"responding": "perhaps"}]'])
async def test_an_unreadable_ping_is_malformed(
    fake: FakeSlurm, client: SlurmClient, pings: str
) -> None:
    answer(fake, "GET", f"{V45}/ping", envelope(pings="@p@"), p=pings)
    with pytest.raises(SlurmMalformed):
        await client.ping()


async def test_unreadable_nodes_and_partitions_are_malformed(
    fake: FakeSlurm, client: SlurmClient
) -> None:
    answer(fake, "GET", f"{V45}/nodes", envelope(nodes=7))
    answer(fake, "GET", f"{V45}/partitions", envelope(partitions=7))
    with pytest.raises(SlurmMalformed):
        await client.list_nodes()
    with pytest.raises(SlurmMalformed):
        await client.list_partitions()


@pytest.mark.parametrize(
    "errors",
    [
        '[{"error_number": "x", "error": "boom"}]',
        '[{"error": 5}]',
        '[{"error_number": [1]}]',
        "[7]",
        f'[{{"error_number": {HUGE}}}]',
    ],
)
async def test_an_unreadable_error_entry_is_still_an_error(
    fake: FakeSlurm, client: SlurmClient, errors: str
) -> None:
    answer(fake, "GET", f"{V45}/job/2", envelope(jobs=[job45()], errors="@e@"), e=errors)
    with pytest.raises(SlurmError) as caught:
        await client.get_job(2)
    assert type(caught.value) is SlurmRejected


def test_an_envelope_of_the_wrong_types_is_read_as_far_as_it_goes() -> None:
    env = parse_envelope(
        {"meta": {"slurm": {"release": 5, "cluster": ["x"]}, "plugin": {"data_parser": {}}}}
    )
    assert (env.release, env.cluster, env.data_parser) == (None, None, None)
    env = parse_envelope({"errors": [{"error": 5}], "warnings": [{"description": ["x"]}]})
    assert len(env.errors) == 1
    assert len(env.warnings) == 1


async def test_a_deeply_nested_answer_is_no_json_body(fake: FakeSlurm, client: SlurmClient) -> None:
    answer(fake, "GET", f"{V45}/job/2", "@deep@", deep="[" * 100_000 + "]" * 100_000)
    with pytest.raises(SlurmError, match="without a JSON body"):
        await client.get_job(2)


def test_long_integers_read_as_infinite_only_where_python_refuses_them() -> None:
    assert decode_json(f'{{"a": [1, {LONG}]}}') == {"a": [1, 10**30]}
    assert decode_json(f'{{"a": [1, {HUGE}, -{HUGE}]}}') == {"a": [1, float("inf"), float("-inf")]}
    assert decode_json("[" * 100_000) is None
    assert decode_json("not json") is None


# -- the dialects directly: the same errors, whoever calls them -----------------------------


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.44", "v0.0.45"])
@pytest.mark.parametrize(
    "payload",
    [
        {"jobs": 7},
        {"jobs": [{"job_id": 0}]},
        {"pings": 7},
        {"job_id": 0},
        {"job_id": 2**40},
    ],
)
def test_every_parse_function_fails_only_as_a_slurm_error(
    version: str, payload: dict[str, Any]
) -> None:
    dialect = dialect_for(version)
    parsers = [
        dialect.parse_jobs,
        dialect.parse_ping,
        dialect.parse_submit,
        lambda p: dialect.parse_cancel(p, "5"),
    ]
    if dialect.supports_accounting:
        parsers += [dialect.parse_accounting_jobs, dialect.parse_jobs_state]
    for parse in parsers:
        try:
            result = parse(payload)
        except SlurmError:
            continue
        # What was read must be within range; a list answer may leave records out.
        if isinstance(result, SubmitReceipt):
            assert 1 <= result.job_id <= JOB_ID_MAX
        for item in result if isinstance(result, list) else []:
            assert not isinstance(item, SlurmJobView) or 1 <= item.job_id <= JOB_ID_MAX
