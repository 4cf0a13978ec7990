"""The wake service (controller/wakes.py) on a fake clock: one pending wake per resource, the
earliest wins; a wait becomes a wake after its delay, a failure one after the backoff (and is
counted); a deleted resource's wake is dropped; a closed service wakes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.controller.resource import RetryLater
from slurmjob_operator.controller.wakes import Wakes

A = ObjectRef("team-a", "a", "uid-a")
B = ObjectRef("team-a", "b", "uid-b")


@dataclass
class Armed:
    at: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Clock:
    """A clock and the timers on it: `advance` fires what is due, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.armed: list[Armed] = []

    def __call__(self) -> float:
        return self.now

    def timer(self, delay: float, callback: Callable[[], None]) -> Armed:
        armed = Armed(self.now + delay, callback)
        self.armed.append(armed)
        return armed

    def live(self) -> list[float]:
        return sorted(a.at for a in self.armed if not a.cancelled)

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        for armed in sorted(self.armed, key=lambda a: a.at):
            if armed.at <= self.now and not armed.cancelled:
                armed.cancelled = True  # fired once
                armed.callback()
        await asyncio.sleep(0)  # the woken reconciles run
        await asyncio.sleep(0)


class Target:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.then: list[BaseException | None] = []

    async def __call__(self, ref: ObjectRef) -> None:
        self.calls.append(ref.name)
        outcome = self.then.pop(0) if self.then else None
        if outcome is not None:
            raise outcome


def service(clock: Clock, target: Target, errors: list[int] | None = None) -> Wakes:
    counted = errors if errors is not None else []
    return Wakes(
        target,
        backoff=30.0,
        on_error=lambda: counted.append(1),
        timer=clock.timer,
        clock=clock,
    )


async def test_one_pending_wake_per_resource_and_the_earliest_wins() -> None:
    clock, target = Clock(), Target()
    wakes = service(clock, target)
    wakes.at(A, 10)
    wakes.at(A, 50)  # later: the pending one stays
    assert wakes.due_in(A.uid) == 10
    wakes.at(A, 5)  # sooner: replaces it
    assert wakes.due_in(A.uid) == 5
    assert clock.live() == [5]
    wakes.at(B, 7)
    assert len(wakes) == 2
    await clock.advance(5)
    assert target.calls == ["a"]
    assert wakes.due_in(A.uid) is None
    await clock.advance(2)
    assert target.calls == ["a", "b"]
    assert len(wakes) == 0


async def test_a_wait_wakes_after_its_delay_and_a_failure_after_the_backoff() -> None:
    clock, target, errors = Clock(), Target(), []
    wakes = service(clock, target, errors)
    target.then = [RetryLater("Kueue: waiting", 12), RuntimeError("a bug"), None]
    wakes.at(A, 0)
    await clock.advance(0)
    assert target.calls == ["a"]
    assert wakes.due_in(A.uid) == 12  # the wait's own delay
    await clock.advance(12)
    assert target.calls == ["a", "a"]
    assert errors == [1]  # counted, and looked at again: never dropped
    assert wakes.due_in(A.uid) == 30
    await clock.advance(30)
    assert target.calls == ["a", "a", "a"]
    assert len(wakes) == 0


async def test_a_handlers_reconcile_never_raises_and_leaves_a_wake() -> None:
    clock, target, errors = Clock(), Target(), []
    wakes = service(clock, target, errors)

    async def waits() -> None:
        raise RetryLater("upstream not done", 50)

    async def breaks() -> None:
        raise KeyError("unforeseen")

    await wakes.attempt(A, waits())
    await wakes.attempt(B, breaks())
    assert wakes.due_in(A.uid) == 50
    assert wakes.due_in(B.uid) == 30
    assert errors == [1]

    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):  # a stop is a stop, not a wake
        await wakes.attempt(A, cancelled())


async def test_a_deleted_resource_is_forgotten_and_a_closed_service_wakes_nothing() -> None:
    clock, target = Clock(), Target()
    wakes = service(clock, target)
    wakes.at(A, 1)
    wakes.forget(A.uid)
    await clock.advance(5)
    assert target.calls == []
    wakes.at(B, 1)
    await wakes.close()
    assert clock.live() == []
    wakes.at(A, 0)  # after close: ignored
    await clock.advance(5)
    assert target.calls == []
    assert len(wakes) == 0


async def test_an_unbound_service_keeps_nothing_running() -> None:
    clock = Clock()
    wakes = Wakes(backoff=1.0, timer=clock.timer, clock=clock)
    wakes.at(A, 0)
    await clock.advance(1)  # fired with no target: dropped, not an error
    assert len(wakes) == 0
    target = Target()
    wakes.bind(target)
    wakes.at(A, 0)
    await clock.advance(0)
    assert target.calls == ["a"]


async def test_drain_waits_for_what_is_due_now_on_the_real_loop() -> None:
    target = Target()
    wakes = Wakes(target, backoff=1.0)
    wakes.at(A, 0)
    wakes.at(B, 3600)
    await wakes.drain()
    assert target.calls == ["a"]  # B stays pending
    assert wakes.due_in(B.uid) is not None
    await wakes.close()


async def test_a_run_now_is_a_wake_and_its_done_comes_however_it_ends() -> None:
    """`run` (a parked submit granted its slot): the reconcile runs as a wake's does (its wait
    becomes a wake), `done` follows, even for a run cancelled by `close` before it started;
    once closed nothing runs and the caller is told."""
    clock, target = Clock(), Target()
    wakes = service(clock, target)
    done: list[str] = []
    target.then = [RetryLater("Kueue: waiting", 12)]
    assert wakes.run(A, target, done=lambda: done.append("a"))
    await wakes.drain()
    assert (target.calls, done, wakes.due_in(A.uid)) == (["a"], ["a"], 12)
    assert wakes.run(B, target, done=lambda: done.append("b"))
    await wakes.close()  # before the run's first step
    assert target.calls == ["a"]
    assert done == ["a", "b"]
    assert not wakes.run(A, target, done=lambda: done.append("late"))
    assert done == ["a", "b"]
