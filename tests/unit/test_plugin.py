"""`kubectl slurmjob` (issue 13, part 4) without a cluster: argument parsing, the tables of
`get` and `describe`, `logs` and `logs -f` against a scripted cluster (the operator's answers,
its refusals, the apiserver's, a cluster without the log API), `cancel` and what the
apiserver's answers for the aggregated log API mean (issue 21, section 3)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.logs import LogAnswer, LogError, LogQuery, LogStream
from slurmjob_operator.plugin import kubeclient
from slurmjob_operator.plugin.args import build_parser
from slurmjob_operator.plugin.kubeclient import (
    ApiserverRefused,
    LogsApiAbsent,
    OperatorRefused,
    OperatorUnavailable,
    PluginError,
    Unauthorized,
)
from slurmjob_operator.plugin.main import main, run
from slurmjob_operator.plugin.render import (
    Job,
    array_counts,
    describe,
    get_table,
    printable,
    suspend_effect,
)
from slurmjob_operator.plugin.subcommand import EXIT_ERROR, EXIT_OK

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def slurmjob(
    name: str = "train",
    *,
    phase: str | None = "Running",
    attempts: list[dict[str, Any]] | None = None,
    array: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    logs: dict[str, Any] | None = None,
    suspend: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "attempts": attempts
        if attempts is not None
        else [
            {
                "number": 1,
                "jobName": "sj-a1",
                "jobId": 4242,
                "sluid": "sluid-abc",
                "cluster": "hpc",
                "nativeState": "RUNNING",
                "submittedAt": "2026-03-01T11:50:00Z",
                "startedAt": "2026-03-01T11:51:00Z",
            }
        ],
        "conditions": conditions
        if conditions is not None
        else [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Running",
                "message": "Slurm job is RUNNING",
                "lastTransitionTime": "2026-03-01T11:51:00Z",
            }
        ],
    }
    if phase is not None:
        status["phase"] = phase
    if array is not None:
        status["array"] = array
    if logs is not None:
        status["logs"] = logs
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": "u-1",
            "creationTimestamp": "2026-03-01T11:45:00Z",
        },
        "spec": {"suspend": suspend},
        "status": status,
    }


def answer(text: str, **extra: Any) -> LogAnswer:
    values = {
        "namespace": "team-a",
        "name": "train",
        "attempt": 1,
        "latestAttempt": 1,
        "stream": "stdout",
        "found": True,
        "text": text,
        "nextOffset": len(text.encode()),
        "size": len(text.encode()),
        "ended": False,
    }
    values.update(extra)
    return LogAnswer.model_validate(values)


class FakeCluster:
    def __init__(self, objects: dict[str, dict[str, Any]], exec_plugin: bool = True) -> None:
        self.namespace = "team-a"
        self.objects = objects
        self.exec_plugin = exec_plugin
        self.script: list[LogAnswer | Exception] = []
        self.queries: list[LogQuery] = []
        self.calls: list[tuple[str, Any]] = []
        self.refreshed = 0
        self.closed = False
        self.gone_after = 0

    async def refresh_credentials(self) -> bool:
        self.refreshed += 1
        return self.exec_plugin

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        if name not in self.objects:
            raise PluginError(f"slurmjob {name} in namespace {namespace} not found")
        return self.objects[name]

    async def exists(self, namespace: str, name: str) -> bool:
        self.gone_after -= 1
        return self.gone_after >= 0

    async def list(self, namespace: str | None) -> list[dict[str, Any]]:
        self.calls.append(("list", namespace))
        return list(self.objects.values())

    async def delete(self, namespace: str, name: str) -> None:
        self.calls.append(("delete", (namespace, name)))

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", patch))
        return self.objects[name]

    async def read_log(self, namespace: str, name: str, query: LogQuery) -> LogAnswer:
        self.queries.append(query)
        self.calls.append(("read", (namespace, name)))
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    async def close(self) -> None:
        self.closed = True


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


async def run_plugin(
    cluster: FakeCluster, *argv: str, out: io.StringIO | None = None
) -> tuple[int, str, str]:
    stdout, stderr = out or io.StringIO(), io.StringIO()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def connect(context: str | None) -> FakeCluster:
        return cluster

    args = build_parser({}).parse_args(list(argv))
    code = await run(args, stdout, stderr, connect=connect, sleep=sleep, now=lambda: NOW)
    assert cluster.closed
    return code, stdout.getvalue(), stderr.getvalue()


# -- arguments ------------------------------------------------------------------------------


def test_logs_arguments_and_their_defaults() -> None:
    args = build_parser({}).parse_args(["logs", "train", "-f", "--stderr", "--attempt", "2"])
    assert (args.name, args.follow, args.stderr, args.attempt, args.index) == (
        "train",
        True,
        True,
        2,
        None,
    )
    args = build_parser({}).parse_args(["logs", "train", "--index", "3", "-n", "team-b"])
    assert (args.index, args.namespace, args.ignored) == (3, "team-b", None)


async def test_logs_names_no_operator_namespace_or_service() -> None:
    """The log is asked of the apiserver: no Service name or namespace is guessed, and the
    old flags pointing at one are taken and ignored (with a note) for one release."""
    cluster = FakeCluster({"train": slurmjob()})
    cluster.script = [answer("ok\n")]
    argv = ["logs", "train", "--operator-namespace", "ops", "--operator-service", "sj-logs"]
    code, out, err = await run_plugin(cluster, *argv)
    assert (code, out) == (EXIT_OK, "ok\n")
    assert cluster.calls == [("read", ("team-a", "train"))]
    assert err.count("\n") == 1
    assert "are ignored: logs come through the apiserver" in err
    env = {"KUBECTL_SLURMJOB_OPERATOR_SERVICE": "sj-logs"}
    assert "operator_service" not in vars(build_parser(env).parse_args(["logs", "train"]))


@pytest.mark.parametrize(
    "argv",
    [
        ["logs"],
        ["logs", "../x"],
        ["logs", "Train"],
        ["logs", "train", "--index", "../1"],
        ["logs", "train", "--index", "-1"],
        ["logs", "train", "--index", "1000000"],
        ["logs", "train", "--attempt", "0"],
        ["logs", "train", "-n", "a/b"],
        ["cancel"],
        ["frobnicate"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


# -- get and describe -----------------------------------------------------------------------


def test_the_get_table() -> None:
    jobs = [
        Job.of(slurmjob("train")),
        Job.of(slurmjob("sweep", array={"total": 8, "running": 3, "succeeded": 5})),
        Job.of(slurmjob("new", phase=None, attempts=[], conditions=[])),
    ]
    text = get_table(jobs, NOW)
    lines = text.splitlines()
    assert lines[0].split() == [
        "NAME",
        "PHASE",
        "ATTEMPT",
        "JOBID",
        "SLUID",
        "CLUSTER",
        "ARRAY",
        "REASON",
        "AGE",
    ]
    row = ["train", "Running", "1", "4242", "sluid-abc", "hpc", "-", "Running", "15m"]
    assert lines[1].split() == row
    assert "total=8 running=3 succeeded=5" in lines[2]
    assert lines[3].split() == ["new", "-", "-", "-", "-", "-", "-", "-", "15m"]
    # No job has an array: no ARRAY column.
    assert "ARRAY" not in get_table(jobs[:1], NOW)
    assert get_table(jobs[:1], NOW, namespaces=True).startswith("NAMESPACE")


def test_the_reason_shown_is_a_suspension_first() -> None:
    conditions = [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Queued",
            "message": "",
            "lastTransitionTime": "2026-03-01T11:51:00Z",
        },
        {
            "type": "Suspended",
            "status": "True",
            "reason": "Held",
            "message": "Slurm job 4242 held",
            "lastTransitionTime": "2026-03-01T11:52:00Z",
        },
    ]
    assert "Held" in get_table([Job.of(slurmjob(conditions=conditions))], NOW)


@pytest.mark.parametrize(
    ("array", "shown"),
    [
        (None, None),
        ({}, None),
        ({"total": 4, "failed": 1, "zeta": 2, "running": 3}, "total=4 running=3 failed=1 zeta=2"),
        ({"counts": {"pending": 2, "running": 1}, "total": 3}, "total=3 pending=2 running=1"),
        ({"total": 2, "done": True, "name": "x"}, "total=2"),
    ],
)
def test_array_counts(array: dict[str, Any] | None, shown: str | None) -> None:
    assert array_counts(array) == shown


def test_describe_shows_attempts_conditions_and_tails() -> None:
    attempts = [
        {
            "number": 1,
            "jobName": "sj-a1",
            "jobId": 100,
            "cluster": "hpc",
            "nativeState": "FAILED",
            "reason": "NonZeroExitCode",
            "exitCode": 1,
            "finishedAt": "2026-03-01T11:55:00Z",
            "retryAction": "Retry",
        },
        {"number": 2, "jobName": "sj-a2", "jobId": 101, "sluid": "s-2", "cluster": "hpc"},
    ]
    logs = {"stdout": {"tail": "a\nb\n\x1b]0;pwned\x07c\n", "bytes": 9000, "lines": 3}}
    text = describe(Job.of(slurmjob(attempts=attempts, logs=logs)), NOW, tail_lines=2)
    assert "Slurm job:     101, SLUID s-2, cluster hpc (attempt 2 of 2)" in text
    assert "FAILED" in text
    assert "Retry" in text
    assert "NonZeroExitCode" in text
    assert "Ready   True     Running" in text
    assert "stdout: 9000 bytes, last 2 lines (earlier lines left out):" in text
    assert "\x1b" not in text  # a job's escape sequence never reaches the terminal
    assert "\\x1b]0;pwned\\x07c" in text
    assert "stderr: (none)" in text


def test_describe_shows_each_walltime_segment_and_how_it_ended() -> None:
    segment = {"index": 0, "limitMinutes": 240, "ended": "Timeout", "progress": True}
    attempts = [
        {
            "number": 1,
            "jobName": "sj-a1",
            "jobId": 100,
            "retryAction": "Segment",
            "segment": segment,
        },
        {
            "number": 2,
            "jobName": "sj-a2",
            "jobId": 101,
            "segment": {"index": 1, "limitMinutes": 240, "previousJobId": 100},
        },
    ]
    text = describe(Job.of(slurmjob(attempts=attempts)), NOW)
    assert "SEGMENT" in text
    assert "0 (Timeout)" in text
    plain = describe(Job.of(slurmjob(attempts=[{"number": 1, "jobName": "a", "jobId": 9}])), NOW)
    assert "SEGMENT" not in plain


def test_printable() -> None:
    assert printable("ok\ttab\nline") == "ok\ttab\nline"
    assert printable("\x1b[31mred\x7f\x9b") == "\\x1b[31mred\\x7f\\x9b"
    assert printable("naïve \u2013 ✓") == "naïve \u2013 ✓"


# -- logs -----------------------------------------------------------------------------------


async def test_logs_prints_the_operators_tail() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    cluster.script = [answer("line 1\nline 2\n", truncated=True)]
    code, out, err = await run_plugin(cluster, "logs", "train")
    assert (code, out) == (EXIT_OK, "line 1\nline 2\n")
    assert "last 64 KiB / 2,000 lines" in err
    assert cluster.queries == [LogQuery()]


async def test_logs_all_reads_a_whole_archived_file_from_its_start_by_uid() -> None:
    """`--all --uid`: a SlurmJob deleted since, read from the archive in 64 KiB reads from
    offset 0 until the size the first read saw (nothing of the live object is asked)."""
    uid = "0b6d2c5e-7a31-4c2e-9d1f-3a4b5c6d7e8f"
    cluster = FakeCluster({})
    cluster.script = [
        answer("one\n", offset=0, nextOffset=4, size=12, ended=True),
        answer("two\n", offset=4, nextOffset=8, size=12, ended=True),
        answer("six\n", offset=8, nextOffset=12, size=12, ended=True),
    ]
    code, out, err = await run_plugin(cluster, "logs", "train", "--all", "--uid", uid)
    assert (code, out, err) == (EXIT_OK, "one\ntwo\nsix\n", "")
    assert [q.offset for q in cluster.queries] == [0, 4, 8]
    assert {q.uid for q in cluster.queries} == {uid}
    assert cluster.script == []


async def test_logs_all_stops_when_a_read_gets_no_further() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    cluster.script = [
        answer("one\n", offset=0, nextOffset=4, size=9),
        answer("", offset=4, nextOffset=4, size=9),  # a last line without its newline yet
    ]
    code, out, _ = await run_plugin(cluster, "logs", "train", "--all")
    assert (code, out) == (EXIT_OK, "one\n")
    assert [q.offset for q in cluster.queries] == [0, 4]


def test_a_uid_that_is_not_one_is_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["logs", "train", "--uid", "../../etc"])


async def test_logs_follow_reads_on_until_the_attempt_ended_and_the_file_is_drained() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    cluster.script = [
        answer("one\n", nextOffset=4, size=4),
        answer("", offset=4, nextOffset=4, size=6),  # a line being written: held back
        answer("two\n", offset=4, nextOffset=8, size=8),
        answer("three\n", offset=8, nextOffset=14, size=20, ended=True),
        answer("four\n", offset=14, nextOffset=20, size=20, ended=True),
    ]
    code, out, _ = await run_plugin(cluster, "logs", "train", "-f", "--stderr", "--index", "2")
    assert (code, out) == (EXIT_OK, "one\ntwo\nthree\nfour\n")
    assert cluster.script == []
    assert [q.offset for q in cluster.queries] == [None, 4, 4, 8, 14]
    # Pinned to the attempt the first read found, whatever starts meanwhile.
    assert [q.attempt for q in cluster.queries] == [None, 1, 1, 1, 1]
    assert {q.stream for q in cluster.queries} == {LogStream.STDERR}
    assert {q.index for q in cluster.queries} == {2}


async def test_follow_of_an_ended_attempt_stops_at_once_and_names_a_newer_one() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    cluster.script = [answer("done\n", ended=True, latestAttempt=2)]
    code, out, err = await run_plugin(cluster, "logs", "train", "-f")
    assert (code, out) == (EXIT_OK, "done\n")
    assert "attempt 2 has started: kubectl slurmjob logs train --attempt 2 -f" in err


async def test_follow_waits_out_an_operator_restart_and_sees_a_replaced_file() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    cluster.script = [
        answer("a\n"),
        OperatorUnavailable("HTTP 503 from the apiserver: service unavailable"),
        answer("fresh\n", offset=0, nextOffset=6, size=6, ended=True),
    ]
    code, out, err = await run_plugin(cluster, "logs", "train", "-f")
    assert (code, out) == (EXIT_OK, "a\nfresh\n")
    assert "the operator does not answer (HTTP 503" in err
    assert "was replaced or cut short" in err


async def test_follow_ends_when_the_slurmjob_is_deleted() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    gone = LogError(code=404, reason="NotFound", message="SlurmJob team-a/train not found")
    cluster.script = [answer("a\n"), OperatorRefused(gone)]
    code, _, err = await run_plugin(cluster, "logs", "train", "-f")
    assert code == EXIT_OK
    assert "was deleted" in err


async def test_follow_waits_for_the_first_attempt() -> None:
    cluster = FakeCluster({"train": slurmjob(phase="Pending", attempts=[])})
    none = LogError(code=404, reason="NoAttempt", message="SlurmJob team-a/train has no attempt")
    cluster.script = [OperatorRefused(none), OperatorRefused(none), answer("hi\n", ended=True)]
    code, out, err = await run_plugin(cluster, "logs", "train", "-f")
    assert (code, out) == (EXIT_OK, "hi\n")
    assert err.count("has no attempt yet; waiting") == 1
    # Without -f it is an error at once; and so is a job that ended without an attempt.
    cluster.script = [OperatorRefused(none)]
    with pytest.raises(PluginError, match="has no attempt"):
        await run_plugin(cluster, "logs", "train")
    failed = FakeCluster({"train": slurmjob(phase="Failed", attempts=[])})
    failed.script = [OperatorRefused(none)]
    with pytest.raises(PluginError, match="is Failed without any attempt"):
        await run_plugin(failed, "logs", "train", "-f")


@pytest.mark.parametrize(
    "refusal",
    [
        OperatorRefused(LogError(code=403, reason="Forbidden", message='user "bob" may not get')),
        ApiserverRefused('HTTP 403 from the apiserver: User "bob" may not get slurmjobs/log'),
    ],
)
async def test_a_refusal_is_an_error_and_no_fallback(refusal: Exception) -> None:
    cluster = FakeCluster({"train": slurmjob(logs={"stdout": {"tail": "secret tail\n"}})})
    cluster.script = [refusal]
    with pytest.raises(PluginError, match='"bob" may not get') as raised:
        await run_plugin(cluster, "logs", "train")
    assert "secret tail" not in str(raised.value)


async def test_a_cluster_without_the_log_api_gets_the_status_tail_with_a_one_line_note() -> None:
    logs = {"stdout": {"tail": "kept\n", "truncated": True}, "stderr": {"tail": "oops\n"}}
    cluster = FakeCluster({"train": slurmjob(logs=logs)})
    absent = LogsApiAbsent("the apiserver serves no logs.slurmjob.io/v1alpha1: 404 page not found")
    cluster.script = [absent]
    code, out, err = await run_plugin(cluster, "logs", "train", "-f")
    assert (code, out) == (EXIT_OK, "kept\n")
    assert err.count("\n") == 1
    assert "no log API here (the apiserver serves no logs.slurmjob.io/v1alpha1" in err
    assert "earlier lines left out" in err
    assert "not following" in err
    cluster.script = [absent]
    code, out, _ = await run_plugin(cluster, "logs", "train", "--stderr")
    assert out == "oops\n"


async def test_an_operator_that_does_not_answer_falls_back_with_a_one_line_note() -> None:
    cluster = FakeCluster({"train": slurmjob(logs={"stdout": {"tail": "kept\n"}})})
    cluster.script = [OperatorUnavailable("HTTP 503 from the apiserver: service unavailable")]
    code, out, err = await run_plugin(cluster, "logs", "train")
    assert (code, out) == (EXIT_OK, "kept\n")
    assert err.count("\n") == 1
    assert "the operator's log API does not answer (HTTP 503 from the apiserver" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--index", "1"], "no log per array task"),
        (["--attempt", "1"], "newest attempt's tail only"),
    ],
)
async def test_the_fallback_cannot_show_what_the_status_does_not_keep(
    argv: list[str], message: str
) -> None:
    attempts = [{"number": 1, "jobName": "a1"}, {"number": 2, "jobName": "a2"}]
    cluster = FakeCluster({"train": slurmjob(attempts=attempts)})
    cluster.script = [LogsApiAbsent("404")]
    with pytest.raises(PluginError, match=message):
        await run_plugin(cluster, "logs", "train", *argv)


async def test_credentials_the_apiserver_refuses_are_fetched_again_once() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    cluster.script = [Unauthorized("expired"), answer("ok\n")]
    code, out, _ = await run_plugin(cluster, "logs", "train")
    assert (code, out, cluster.refreshed) == (EXIT_OK, "ok\n", 1)
    assert len(cluster.queries) == 2
    # Refused again, or nothing to fetch again with: an error, no fallback.
    cluster.script = [Unauthorized("expired"), Unauthorized("still")]
    with pytest.raises(Unauthorized, match="still"):
        await run_plugin(cluster, "logs", "train")
    plain = FakeCluster({"train": slurmjob()}, exec_plugin=False)
    plain.script = [Unauthorized("no")]
    with pytest.raises(Unauthorized, match="no"):
        await run_plugin(plain, "logs", "train")
    assert len(plain.queries) == 1


async def test_control_characters_reach_a_terminal_escaped_and_a_pipe_raw() -> None:
    text = "\x1b[2Jcleared\r\n"
    cluster = FakeCluster({"train": slurmjob()})
    cluster.script = [answer(text)]
    _, out, _ = await run_plugin(cluster, "logs", "train", out=Tty())
    assert out == "\\x1b[2Jcleared\r\n"
    cluster.script = [answer(text)]
    _, out, _ = await run_plugin(cluster, "logs", "train")
    assert out == text


# -- cancel ---------------------------------------------------------------------------------


async def test_cancel_deletes_and_says_the_slurm_job_is_cancelled_first() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    code, out, _ = await run_plugin(cluster, "cancel", "train")
    assert code == EXIT_OK
    assert ("delete", ("team-a", "train")) in cluster.calls
    assert "cancels Slurm job 4242 first" in out
    cluster.gone_after = 2
    code, out, _ = await run_plugin(cluster, "cancel", "train", "--wait")
    assert "is gone" in out


async def test_cancel_wait_gives_up_after_the_timeout() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    cluster.gone_after = 10**9
    with pytest.raises(PluginError, match="still there after 1 s"):
        await run_plugin(cluster, "cancel", "train", "--wait", "--timeout", "1")


async def test_cancel_suspend_patches_spec_suspend() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    code, out, _ = await run_plugin(cluster, "cancel", "train", "--suspend")
    assert code == EXIT_OK
    assert ("patch", {"spec": {"suspend": True}}) in cluster.calls
    assert not any(c[0] == "delete" for c in cluster.calls)
    assert "Slurm holds only pending jobs, so it runs on" in out


@pytest.mark.parametrize(
    ("body", "effect"),
    [
        (slurmjob(phase="Queued"), "the queued Slurm job 4242 is held in Slurm"),
        (
            slurmjob(phase="Running"),
            "runs on to its end (condition Suspended=False, reason NotHeld)",
        ),
        (slurmjob(phase="Pending", attempts=[]), "nothing is submitted while spec.suspend"),
        (slurmjob(phase="Succeeded"), "the job has ended"),
    ],
)
def test_what_suspend_does(body: dict[str, Any], effect: str) -> None:
    assert effect in suspend_effect(Job.of(body))


# -- what the apiserver's answers mean ------------------------------------------------------


def _raises(status: int, body: object) -> Callable[[], object]:
    raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
    return lambda: kubeclient._answer(status, raw)


def test_the_apiservers_answers() -> None:
    ok = answer("x\n").model_dump(mode="json", by_alias=True)
    assert kubeclient._answer(200, json.dumps({**ok, "newerField": 1}).encode()).text == "x\n"
    refusal = {"kind": "SlurmJobLogError", "code": 403, "reason": "Forbidden", "message": "no"}
    gone = {**refusal, "code": 404, "reason": "NotFound", "message": "SlurmJob a/b not found"}
    forbidden = {
        "kind": "Status",
        "code": 403,
        "reason": "Forbidden",
        "message": 'slurmjobs.logs.slurmjob.io "b" is forbidden: User "bob" cannot get '
        'resource "slurmjobs/log"',
    }
    for status, body, kind in [
        (403, refusal, OperatorRefused),
        (404, gone, OperatorRefused),  # the operator's: the SlurmJob, not the API, is gone
        # A release that serves the API for other namespaces: this one's has it off.
        (404, {**gone, "reason": "NotWatched", "message": "not watched here"}, LogsApiAbsent),
        (401, {"kind": "Status", "message": "Unauthorized"}, Unauthorized),
        (403, forbidden, ApiserverRefused),
        # No APIService: the apiserver's own 404, a Status or plain text.
        (
            404,
            {"kind": "Status", "reason": "NotFound", "message": "the server could not find"},
            LogsApiAbsent,
        ),
        (404, b"404 page not found\n", LogsApiAbsent),
        (503, {"kind": "Status", "message": "service unavailable"}, OperatorUnavailable),
        (429, {"kind": "Status", "message": "too many requests"}, OperatorUnavailable),
        (503, {**refusal, "code": 503, "reason": "SecretsUnknown"}, OperatorUnavailable),
        (200, b"<html>not json</html>", OperatorUnavailable),
    ]:
        with pytest.raises(kind) as raised:
            _raises(status, body)()
        assert type(raised.value) is kind, (status, body)
    # Neither refusal falls back: they are errors, not an absent API.
    assert not issubclass(ApiserverRefused, OperatorUnavailable)
    assert not issubclass(OperatorRefused, OperatorUnavailable)


def test_the_log_path() -> None:
    assert kubeclient.log_path("team-a", "train") == (
        "/apis/logs.slurmjob.io/v1alpha1/namespaces/team-a/slurmjobs/train/log"
    )


async def test_get_lists_the_namespace_or_all() -> None:
    cluster = FakeCluster({"train": slurmjob()})
    code, out, _ = await run_plugin(cluster, "get")
    assert (code, cluster.calls[-1]) == (EXIT_OK, ("list", "team-a"))
    assert out.startswith("NAME")
    await run_plugin(cluster, "get", "-A")
    assert cluster.calls[-1] == ("list", None)
    empty = FakeCluster({})
    code, out, err = await run_plugin(empty, "get")
    assert (code, out, err) == (EXIT_OK, "", "No SlurmJobs found in namespace team-a.\n")
    with pytest.raises(PluginError, match="not found"):
        await run_plugin(empty, "describe", "nope")


@pytest.mark.parametrize(
    ("argv", "namespace", "context", "kubeconfig"),
    [
        (["get"], None, None, None),
        (["-n", "a", "--context", "c", "--kubeconfig", "/k", "get"], "a", "c", "/k"),
        (["get", "-n", "a", "--context", "c", "--kubeconfig", "/k"], "a", "c", "/k"),
        (["-n", "a", "--kubeconfig", "/k", "logs", "train", "-n", "b"], "b", None, "/k"),
        (["--context", "c", "leader"], None, "c", None),
    ],
)
def test_kubectls_flags_go_before_or_after_the_subcommand(
    argv: list[str], namespace: str | None, context: str | None, kubeconfig: str | None
) -> None:
    args = build_parser({}).parse_args(argv)
    assert (args.namespace, args.context, args.kubeconfig) == (namespace, context, kubeconfig)


def test_without_a_kubeconfig_one_line_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["get"]) == EXIT_ERROR
    out, err = capfd.readouterr()
    assert out == ""
    assert err == (
        "error: no kubeconfig (~/.kube/config absent) and not inside a pod: "
        "set KUBECONFIG or pass --kubeconfig\n"
    )


def test_main_reports_errors_with_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def refuse(context: str | None, **_: object) -> FakeCluster:
        raise PluginError("no usable kubeconfig")

    monkeypatch.setattr(kubeclient.Session, "open", refuse)
    assert main(["get"]) == EXIT_ERROR
    assert capsys.readouterr().err == "error: no usable kubeconfig\n"
