"""Leader election on a Lease: the pure decisions, the elector against an in-memory Lease with
the apiserver's compare-and-swap, and a property: whatever the schedule of steps, crashes and
partitions, two replicas never act at the same moment."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmjob_operator.core.leadership import (
    LeaseRecord,
    Move,
    Sighting,
    Timing,
    next_move,
    observe,
    still_leading,
)
from slurmjob_operator.election import Elector, LeadershipLost, run_elected
from slurmjob_operator.leases import LeaseConflict

TIMING = Timing(lease_duration=15, renew_deadline=10, retry_period=2)


# -- decisions --------------------------------------------------------------------------------


def seen(holder: str | None, since: float = 0.0, **kw: object) -> Sighting:
    return Sighting(LeaseRecord(holder=holder, duration=15, **kw), since)


@pytest.mark.parametrize(
    ("sighting", "now", "move"),
    [
        (None, 0.0, Move.CREATE),
        (seen("me"), 100.0, Move.RENEW),
        (seen("other", since=0.0), 14.9, Move.WAIT),
        (seen("other", since=0.0), 15.0, Move.TAKE),
        (seen(None), 0.0, Move.TAKE),  # given up
        (seen("", since=0.0), 0.0, Move.TAKE),
    ],
)
def test_moves(sighting: Sighting | None, now: float, move: Move) -> None:
    assert next_move(sighting, "me", now, TIMING)[0] is move


def test_taking_counts_a_transition_and_renewing_does_not() -> None:
    _, taken = next_move(seen("other", transitions=4), "me", 99, TIMING)
    assert taken is not None
    assert (taken.holder, taken.transitions) == ("me", 5)
    _, renewed = next_move(seen("me", transitions=5), "me", 0, TIMING)
    assert renewed is not None
    assert renewed.transitions == 5


def test_another_holders_own_duration_governs() -> None:
    long = Sighting(LeaseRecord(holder="other", duration=60), 0.0)
    assert next_move(long, "me", 30, TIMING)[0] is Move.WAIT


def test_the_clock_restarts_only_when_the_record_changes() -> None:
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    first = observe(None, LeaseRecord(holder="a", renewed=t0, version="1"), 5.0)
    same = observe(first, LeaseRecord(holder="a", renewed=t0, version="2"), 9.0)
    assert same.since == 5.0, "a resourceVersion alone is no renewal"
    renewed = observe(same, LeaseRecord(holder="a", renewed=t0 + timedelta(seconds=2)), 11.0)
    assert renewed.since == 11.0


def test_still_leading_until_the_renew_deadline() -> None:
    assert still_leading(0.0, 9.99, TIMING)
    assert not still_leading(0.0, 10.0, TIMING)
    assert not still_leading(None, 0.0, TIMING)


@pytest.mark.parametrize(("retry", "renew", "lease"), [(2, 10, 10), (0, 5, 10), (6, 5, 10)])
def test_timing_must_leave_a_margin(retry: float, renew: float, lease: float) -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        Timing(lease_duration=lease, renew_deadline=renew, retry_period=retry)


# -- the elector against an in-memory Lease ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return datetime(2026, 12, 1, tzinfo=UTC) + timedelta(seconds=self.now)

    async def sleep(self, seconds: float) -> None:
        """Until the test has moved the clock on by `seconds`."""
        until = self.now + seconds
        while self.now < until:  # noqa: ASYNC110 (the test moves the clock between yields)
            await asyncio.sleep(0)


class LeaseServer:
    """The apiserver's side: one Lease, writes compare-and-swap on resourceVersion."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0

    def _stamp(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = replace(record, version=str(self.version))
        return self.record


class LeaseView:
    """One replica's connection to the server; `cut` makes every call fail."""

    namespace = "ns"
    name = "lease"

    def __init__(self, server: LeaseServer) -> None:
        self.server = server
        self.cut = False

    def _check(self) -> None:
        if self.cut:
            raise ConnectionError("apiserver unreachable")

    async def read(self) -> LeaseRecord | None:
        self._check()
        return self.server.record

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.server.record is not None:
            raise LeaseConflict("exists")
        return self.server._stamp(record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        current = self.server.record
        if current is None or current.version != record.version:
            raise LeaseConflict("changed")
        return self.server._stamp(record)


def elector(server: LeaseServer, clock: Clock, name: str) -> tuple[Elector, LeaseView]:
    view = LeaseView(server)
    e = Elector(
        view,
        name,
        TIMING,
        clock=clock,
        wall=clock.wall,
        sleep=clock.sleep,
    )
    return e, view


async def test_one_of_two_takes_the_lease_and_the_other_waits() -> None:
    server, clock = LeaseServer(), Clock()
    a, _ = elector(server, clock, "a")
    b, _ = elector(server, clock, "b")
    assert await a.step() is True
    assert await b.step() is False
    for _ in range(20):  # a renews every retry period; b never gets it
        clock.now += TIMING.retry_period
        assert await a.step() is True
        assert await b.step() is False
    assert server.record is not None
    assert (server.record.holder, server.record.transitions) == ("a", 0)


async def test_a_dead_leaders_lease_is_taken_after_its_duration() -> None:
    server, clock = LeaseServer(), Clock()
    a, _ = elector(server, clock, "a")
    b, _ = elector(server, clock, "b")
    await a.step()
    await b.step()  # b sees a's record at 0
    clock.now = 14.0
    assert await b.step() is False
    clock.now = 15.0
    assert await b.step() is True
    assert server.record is not None
    assert (server.record.holder, server.record.transitions) == ("b", 1)


async def test_a_cut_off_leader_stops_before_the_standby_may_take_over() -> None:
    server, clock = LeaseServer(), Clock()
    a, a_view = elector(server, clock, "a")
    b, _ = elector(server, clock, "b")
    await a.step()
    a.leading = True
    a_view.cut = True
    holding = asyncio.ensure_future(a.hold())
    stopped_at = None
    taken_at = None
    while taken_at is None:
        clock.now += 0.5
        await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)
        if holding.done() and stopped_at is None:
            stopped_at = clock.now
        if await b.step():
            taken_at = clock.now
    with pytest.raises(LeadershipLost):
        await holding
    assert stopped_at is not None
    assert stopped_at < taken_at


async def test_a_clean_end_gives_the_lease_up_for_the_standby() -> None:
    server, clock = LeaseServer(), Clock()
    a, _ = elector(server, clock, "a")
    b, _ = elector(server, clock, "b")

    async def work(stop: asyncio.Event) -> None:
        return None

    assert await run_elected(a, work, grace=1) is True
    assert server.record is not None
    assert server.record.holder is None
    assert await b.step() is True, "taken at once, not after the lease duration"


# -- the property -------------------------------------------------------------------------------

EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.sampled_from(["step", "step", "step", "cut", "heal", "crash"]),
        st.floats(min_value=0.0, max_value=6.0),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_two_replicas_never_act_at_the_same_moment(events: list[tuple[str, str, float]]) -> None:
    """A replica acts from a successful take or renew until its renew deadline passes without
    another; it learns nothing in between. Whatever the order of steps, partitions and
    crashes, the intervals in which the two act never overlap."""

    async def play() -> None:
        server, clock = LeaseServer(), Clock()
        replicas = {n: elector(server, clock, n) for n in ("a", "b")}
        acting: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
        for name, what, wait in events:
            clock.now += wait
            e, view = replicas[name]
            if what == "cut":
                view.cut = True
            elif what == "heal":
                view.cut = False
            elif what == "crash":  # a new process with a new identity
                replicas[name] = elector(server, clock, f"{name}-{clock.now}")
                replicas[name][1].cut = view.cut
            else:
                try:
                    ok = await e.step()
                except ConnectionError:
                    ok = False
                if ok:
                    assert e.last_renewed is not None
                    acting[name].append((e.last_renewed, e.last_renewed + TIMING.renew_deadline))
        for a0, a1 in acting["a"]:
            for b0, b1 in acting["b"]:
                assert a1 <= b0 or b1 <= a0, (acting, events)

    asyncio.run(play())


async def test_a_standby_is_healthy_while_it_can_read_the_lease() -> None:
    """Both replicas are Ready: a standby that never leads must pass its probes, or every
    rollout and node drain would stall on it; one that cannot reach the apiserver fails them."""
    server, clock = LeaseServer(), Clock()
    leader, _ = elector(server, clock, "a")
    standby, view = elector(server, clock, "b")
    assert standby.healthy() is False  # nothing heard yet
    assert await leader.step() is True
    assert await standby.step() is False
    assert standby.healthy() is True
    assert standby.leading is False
    view.cut = True
    clock.now += TIMING.lease_duration
    with pytest.raises(ConnectionError):
        await standby.step()
    assert standby.healthy() is True  # within two lease durations of the last answer
    clock.now += TIMING.lease_duration
    assert standby.healthy() is False
