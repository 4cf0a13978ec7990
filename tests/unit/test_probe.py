"""The collective probe (issue 26, part 2): which jobs probe, the batch script's record read as
hostile text, the status it makes, the decision after a probe that failed everywhere, and the
cache and avoid lists the operator keeps in its ConfigMap."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from slurmjob_operator.api.probestatus import AttemptProbe
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus
from slurmjob_operator.core.afterattempt import AttemptEnd, after_attempt
from slurmjob_operator.core.probe import (
    MAX_RECORD_BYTES,
    PROBE_RETRY_ACTION,
    ProbeRecord,
    avoid_key,
    cache_key,
    parse_record,
    probe_keys,
    probe_owner,
    wants_probe,
    with_probe,
)
from slurmjob_operator.core.retries import decide
from slurmjob_operator.core.states import Observation
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.site.catalogs import CollectiveProbe

from .controller_fakes import cpu_spec

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
KEY = cache_key("tenant:a", "c1", "gpu", "sha/ladder", "h100")
AVOID = avoid_key("tenant:a", "c1")


def gpu(nodes: int, gpus: int, **extra: Any) -> SlurmJobSpec:
    pools = [
        {
            "name": "main",
            "nodes": nodes,
            "gpusPerNode": gpus,
            "gpuSeries": "h100",
            "cpus": 4,
            "memoryGb": 8,
        }
    ]
    return SlurmJobSpec.model_validate(cpu_spec(pools=pools, **extra))


@pytest.mark.parametrize(
    ("spec", "probes"),
    [
        (SlurmJobSpec.model_validate(cpu_spec()), False),
        (gpu(1, 1), False),
        (gpu(1, 2), True),
        (gpu(2, 1), True),
        (gpu(1, 2, array={"count": 4}), False),
    ],
)
def test_which_jobs_probe(spec: SlurmJobSpec, probes: bool) -> None:
    assert wants_probe(spec) is probes


@pytest.mark.parametrize(
    ("text", "record"),
    [
        (
            "nodes n1 n2\nrung 0 hung\nrung 1 passed 41.5\nresult passed 1 41.5\n",
            ProbeRecord("Passed", 1, 41.5, ("0:hung", "1:passed")),
        ),
        (
            "nodes n1\nrung 0 passed -\nresult passed 0 -\n",
            ProbeRecord("Passed", 0, None, ("0:passed",)),
        ),
        ("result skipped 2\n", ProbeRecord("Skipped", 2)),
        (
            "nodes n1 n2\nrung 0 failed n2\nrung 1 slow 3.5\nrung 2 failed n2 n1\nresult failed\n",
            ProbeRecord("Failed", None, None, ("0:failed", "1:slow", "2:failed"), ("n2", "n1")),
        ),
        (
            "nodes n1\nrung 0 hung\nrung 1 hung\nrung 2 hung\nresult failed\n",
            ProbeRecord("Failed", None, None, ("0:hung", "1:hung", "2:hung")),
        ),
    ],
)
def test_a_record_the_script_wrote(text: str, record: ProbeRecord) -> None:
    assert parse_record(text.encode(), rungs=3) == record


@pytest.mark.parametrize(
    "text",
    [
        "nodes n1\nrung 0 hung\n",  # no result yet
        "nodes n1\nrung 0 failed n9\nresult failed\n",  # blames a node the job did not get
        "nodes n1\nrung 3 passed 1\nresult passed 3 1\n",  # a rung the ladder lacks
        "nodes n1\nresult passed 0 -\nrung 0 hung\n",  # a line after the result
        "nodes n1\nrung 0 passed 1e9\nresult passed 0 1e9\n",
        "nodes n1;rm -rf /\nresult failed\n",
        "nodes ../../x\nresult failed\n",
        "NCCL_P2P_DISABLE=1\nresult passed 0 -\n",
        "nodes n\u00e91\nresult failed\n",
        "nodes n1\n" + "rung 0 hung\n" * 60 + "result failed\n",
        "nodes " + " ".join(f"n{i}" for i in range(65)) + "\nresult failed\n",
        "x" * (MAX_RECORD_BYTES + 1),
    ],
)
def test_a_record_that_is_not_the_scripts_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="probe record"):
        parse_record(text.encode("utf-8"), rungs=3)


def status_with(probe: AttemptProbe | None, *earlier: str | None) -> SlurmJobStatus:
    attempts = [
        Attempt(number=i + 1, job_name=f"a{i + 1}", job_id=10 + i, retry_action=action)
        for i, action in enumerate(earlier)
    ]
    n = len(attempts) + 1
    attempts.append(Attempt(number=n, job_name=f"a{n}", job_id=10 + n, probe=probe))
    return SlurmJobStatus(phase=Phase.FAILED, attempts=attempts)


PLANNED = AttemptProbe(key=KEY, avoid=AVOID, ladder=3)


def test_a_passing_record_sets_probe_passed_with_the_bandwidth_once() -> None:
    record = ProbeRecord("Passed", 1, 41.5, ("0:hung", "1:passed"))
    first = with_probe(status_with(PLANNED), record, 2, NOW)
    cond = next(c for c in first.status.conditions if c.type == "ProbePassed")
    assert (cond.status, cond.reason) == ("True", "ProbePassed")
    assert "rung 1" in cond.message
    assert "41.5 GB/s" in cond.message
    assert "0:hung" in cond.message
    probe = first.status.attempts[-1].probe
    assert probe is not None
    assert probe.outcome == "Passed"
    assert probe.bus_bandwidth == 41.5
    assert [e.reason for e in first.events] == ["ProbePassed"]
    again = with_probe(first.status, record, 2, NOW)
    assert again.events == ()
    assert again.status == first.status


def test_a_record_of_an_attempt_that_planned_no_probe_changes_nothing() -> None:
    status = status_with(None)
    assert with_probe(status, ProbeRecord("Failed", blamed=("n1",)), 1, NOW).status == status


def end_of(
    status: SlurmJobStatus, record: ProbeRecord, most: int, retry: dict[str, Any]
) -> AttemptEnd:
    probed = with_probe(status, record, 1, NOW)
    obs = Observation(
        phase=Phase.FAILED,
        reason="Failed",
        message="exit 1",
        native_state="FAILED",
        native_flags=[],
        exit_code=1,
        final=True,
    )
    spec = gpu(1, 2, retry=retry)
    return AttemptEnd(Transition(probed.status), spec, obs, "NCCL WARN timeout", 1, NOW, most)


FAILED_N1 = ProbeRecord("Failed", None, None, ("0:failed", "1:failed"), ("n1",))


def test_a_probe_that_blamed_nodes_gets_a_new_attempt_now_apart_from_spec_retry() -> None:
    written = after_attempt(end_of(status_with(PLANNED), FAILED_N1, 2, {"limit": 0}))
    new = written.status
    assert new.phase is Phase.PENDING
    assert new.next_attempt_at is not None
    assert new.attempts[-1].retry_action == PROBE_RETRY_ACTION
    assert "excludes n1" in (new.message or "")
    # The retry rules' own budget is untouched: the probe's attempts do not count there.
    node_fail = Observation(
        phase=Phase.FAILED,
        reason="NodeFail",
        message="node failed",
        native_state="NODE_FAIL",
        native_flags=[],
        exit_code=None,
        final=True,
    )
    spec = gpu(1, 2, retry={"limit": 1})
    assert decide(spec.retry, node_fail, "", new.attempts).retries
    spent = [a.model_copy(update={"retry_action": "Retry"}) for a in new.attempts]
    assert not decide(spec.retry, node_fail, "", spent).retries


def test_probe_attempts_are_counted_on_their_own_and_end_in_probe_failed() -> None:
    status = status_with(PLANNED, PROBE_RETRY_ACTION, PROBE_RETRY_ACTION)
    written = after_attempt(end_of(status, FAILED_N1, 2, {"limit": 5}))
    new = written.status
    assert new.phase is Phase.FAILED
    failed = next(c for c in new.conditions if c.type == "Failed")
    assert (failed.status, failed.reason) == ("True", "ProbeFailed")
    assert "2 probe attempt(s) of 2" in failed.message
    assert new.attempts[-1].retry_action == "Fail"
    assert "ProbeFailed" in [e.reason for e in written.events]


def test_a_probe_that_blamed_no_node_fails_at_once_even_where_the_retry_rules_would_retry() -> None:
    hung = ProbeRecord("Failed", None, None, ("0:hung", "1:hung"))
    # The log tail matches the default NCCL-timeout rule: the probe's decision comes first.
    written = after_attempt(end_of(status_with(PLANNED), hung, 2, {"limit": 3}))
    failed = next(c for c in written.status.conditions if c.type == "Failed")
    assert failed.reason == "ProbeFailed"
    assert "no node was blamed" in failed.message


def test_where_nodes_cannot_be_excluded_a_failed_probe_ends_the_job() -> None:
    written = after_attempt(end_of(status_with(PLANNED), FAILED_N1, 0, {"limit": 3}))
    assert written.status.phase is Phase.FAILED


def test_a_passed_probe_leaves_the_end_to_the_retry_rules() -> None:
    passed = ProbeRecord("Passed", 0, None, ("0:passed",))
    written = after_attempt(end_of(status_with(PLANNED), passed, 2, {"limit": 3}))
    assert written.status.attempts[-1].retry_action == "Retry"  # the NCCL line in the tail


def test_whose_results_a_key_holds() -> None:
    assert probe_owner("ns", "team", own_user=True) == "tenant:team"
    assert probe_owner("ns", "team", own_user=False) == "namespace:ns"
    assert probe_owner("ns", None, own_user=False) == "namespace:ns"
    assert cache_key("tenant:a", "c1", "gpu", "r", "h100") != cache_key(
        "tenant:a", "c2", "gpu", "r", "h100"
    )
    assert avoid_key("tenant:a", "c1") != avoid_key("tenant:b", "c1")


def test_keys_are_made_from_the_namespace_tenant_and_cluster_the_share_is_the_tenants() -> None:
    """Tenants sharing a Unix user get keys per namespace, yet one share of the ConfigMap."""
    shared = probe_keys("ns", "team", False, ("c1", "gpu"), "r", "h100", 3)
    assert shared.avoid == avoid_key("namespace:ns", "c1")
    assert shared.cache == cache_key("namespace:ns", "c1", "gpu", "r", "h100")
    assert (shared.owner, shared.ladder) == ("tenant:team", 3)
    own = probe_keys("ns", "team", True, ("c1", None), "r", "h100", 3)
    assert own.avoid == avoid_key("tenant:team", "c1")
    assert probe_keys("ns", None, False, ("c1", None), "r", "", 2).owner == "namespace:ns"


@pytest.mark.parametrize(
    "rung",
    [
        {"LD_PRELOAD": "/tmp/x.so"},
        {"PATH": "/tmp"},
        {"SLURM_NTASKS": "1"},
        {"BASH_ENV": "/tmp/x"},
        {"A;B": "1"},
        {"NCCL_DEBUG": "IN\0FO"},
        {},
    ],
)
def test_a_ladder_sets_only_variables_the_container_may_have(rung: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="ladder"):
        CollectiveProbe(command=["probe"], ladder=[rung])
    probe = CollectiveProbe(command=["probe"], ladder=[{"NCCL_P2P_DISABLE": "1"}])
    assert probe.rung_env(1) == [("NCCL_P2P_DISABLE", "1")]
    assert probe.rung_env(0) == []
