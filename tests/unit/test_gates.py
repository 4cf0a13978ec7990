"""The chain of gates before a submit (controller/gates): the order, and what go, wait and
fail do; the retry-due gate on its own (the others are driven through the controller's tests:
test_controller, test_kueue, test_dependencies, test_limits_reads)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.api.status import SlurmJobStatus
from slurmjob_operator.controller.gates import Chain, Fail, Go, Outcome, Pending, Wait
from slurmjob_operator.controller.gates.retry import RetryDueGate
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core.reconcile import Step
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.times import rfc3339, utc_now

REF = ObjectRef(namespace="team-a", name="train", uid="u-1")


def view(**status: Any) -> ResourceView:
    body = {
        "metadata": {"namespace": REF.namespace, "name": REF.name, "uid": REF.uid},
        "spec": {},
        "status": SlurmJobStatus(**status).model_dump(by_alias=True, exclude_none=True),
    }
    return ResourceView.of(body)


class Edge:
    """What the chain asks of the ResourceEdge: apply a transition, get the new view."""

    def __init__(self) -> None:
        self.written: list[Transition] = []

    async def apply(self, seen: ResourceView, transition: Transition) -> ResourceView:
        self.written.append(transition)
        return seen


class Says:
    def __init__(self, name: str, outcome: Outcome, seen: list[str]) -> None:
        self.name, self.outcome, self.seen = name, outcome, seen

    async def check(self, pending: Pending) -> Outcome:
        self.seen.append(self.name)
        return self.outcome


def chain(edge: Edge, *gates: Says) -> Chain:
    return Chain(cast(ResourceEdge, edge), gates)


WRITE = Transition(SlurmJobStatus(message="said"))


async def test_every_gate_in_order_when_each_says_go() -> None:
    seen: list[str] = []
    edge = Edge()
    ok = await chain(edge, Says("a", Go(), seen), Says("b", Go(), seen)).run(
        Pending(view(), Step.SUBMIT)
    )
    assert ok
    assert seen == ["a", "b"]
    assert edge.written == []


async def test_a_fail_is_written_and_stops_the_chain() -> None:
    seen: list[str] = []
    edge = Edge()
    gates = (Says("a", Fail(WRITE), seen), Says("b", Go(), seen))
    assert not await chain(edge, *gates).run(Pending(view(), Step.SUBMIT))
    assert seen == ["a"]
    assert edge.written == [WRITE]
    seen.clear()
    assert not await chain(Edge(), Says("a", Fail(), seen), Says("b", Go(), seen)).run(
        Pending(view(), Step.SUBMIT)
    )
    assert seen == ["a"]


async def test_a_wait_is_written_and_looked_at_again_later() -> None:
    seen: list[str] = []
    edge = Edge()
    gates = (Says("a", Go(), seen), Says("b", Wait(WRITE, "upstream", 7.0), seen))
    with pytest.raises(RetryLater, match="upstream") as caught:
        await chain(edge, *gates, Says("c", Go(), seen)).run(Pending(view(), Step.SUBMIT))
    assert caught.value.delay == 7.0
    assert seen == ["a", "b"]
    assert edge.written == [WRITE]


async def test_a_retry_waits_for_its_due_time_and_a_first_submit_does_not() -> None:
    gate = RetryDueGate()
    later = rfc3339(utc_now() + timedelta(seconds=120))
    outcome = await gate.check(Pending(view(next_attempt_at=later), Step.RETRY))
    assert isinstance(outcome, Wait)
    assert outcome.write is None
    assert 100 < outcome.delay <= 120
    assert isinstance(await gate.check(Pending(view(next_attempt_at=later), Step.SUBMIT)), Go)
    past = rfc3339(utc_now() - timedelta(seconds=5))
    assert isinstance(await gate.check(Pending(view(next_attempt_at=past), Step.RETRY)), Go)
    assert isinstance(await gate.check(Pending(view(), Step.RETRY)), Go)
