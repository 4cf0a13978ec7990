"""Log patterns against the real kube-apiserver and Slurm 26.05: the CRD cannot run RE2, so a
pattern RE2 refuses is accepted by `kubectl apply` and refused by the operator (InvalidSpec,
field named); a job whose logs are built to make a backtracking engine take hours is decided
like any other."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.integration.test_operator_e2e import Operator, _operator, cpu_spec
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

# Pure bash (no coreutils needed in the container): a 40,000-character line of "ibib…" (the
# default link-down rule took Python's re hours on it) and 5,000 "a" (`(a+)+b` never
# returned), then a failure.
HOSTILE = (
    "printf -v s '%20000s' ''; echo \"${s// /ib}\"; "
    "printf -v a '%5000s' ''; printf '%s' \"${a// /a}\"; echo \"$1\"; exit 1"
)
RETRY = {
    "limit": 1,
    "backoffSeconds": 0,
    "rules": [{"action": "Retry", "onLogPattern": "(a+)+b"}],
}


@pytest.fixture(scope="module")
def op(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    # The status keeps all the reader took (64 KiB), so the tail shown is what the rules read.
    yield from _operator(
        kube, slurm_2605, tmp_path_factory.mktemp("patterns"), SLURMJOB_STATUS_TAIL_BYTES="65536"
    )


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    conditions = (obj.get("status") or {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "Ready"), {})


def test_a_pattern_re2_refuses_passes_the_crd_and_is_refused_by_the_operator(
    op: Operator,
) -> None:
    retry = {"limit": 1, "rules": [{"action": "Retry", "onLogPattern": "error(?! ignored)"}]}
    op.apply("lookahead", cpu_spec(["true"], retry=retry))  # kubectl apply accepts it
    obj = op.wait_for(
        "lookahead", lambda o: _ready(o).get("reason") == "InvalidSpec", what="InvalidSpec"
    )
    ready = _ready(obj)
    assert ready["status"] == "False"
    assert ready["message"].startswith("spec.retry.rules[0].onLogPattern: "), ready
    assert "RE2" in ready["message"]
    assert obj["status"].get("attempts", []) == []
    uid8 = obj["metadata"]["uid"][:8]
    assert op.slurm_jobs_named(f"sj-{op.namespace}-lookahead-{uid8}-a1") == []


@pytest.mark.parametrize(
    ("name", "last", "actions"),
    [
        ("hostile-nomatch", "", ["Fail"]),  # neither (a+)+b nor a default rule matches
        ("hostile-match", "b", ["Retry", "Fail"]),  # (a+)+b matches; the limit is 1
    ],
)
def test_hostile_logs_are_decided_like_any_others(
    op: Operator, name: str, last: str, actions: list[str]
) -> None:
    op.apply(name, cpu_spec(["bash", "-c", HOSTILE, "hostile", last], retry=RETRY))
    obj = op.wait_for(
        name,
        lambda o: (
            (o.get("status") or {}).get("phase") == "Failed"
            and len(o["status"].get("attempts", [])) == len(actions)
        ),
        within=120,
        what=f"Failed after {len(actions)} attempt(s)",
    )
    attempts = obj["status"]["attempts"]
    assert [a["retryAction"] for a in attempts] == actions
    stdout = ((obj["status"].get("logs") or {}).get("stdout") or {}).get("tail", "")
    assert "ibibib" in stdout, "the hostile line reached the log tail the rules read"
