"""The fair limiter: never more than `limit` holders, slots handed round-robin across keys,
nothing left behind by a cancelled waiter or holder."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmjob_operator.controller.fairness import FairLimiter, Held, Start

#: A slot that leaked shows as waiters that never finish: fail in seconds, not hang.
LEAK = 2.0


async def settle(rounds: int = 5) -> None:
    """Let every runnable task run until it blocks."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def assert_empty(limiter: FairLimiter[str]) -> None:
    assert limiter.held == 0
    assert limiter.waiting == 0
    # Memory only for current waiters: no queue and no key kept once nobody waits.
    assert limiter._queues == {}
    assert not limiter._ring


async def granted_in_order(
    limiter: FairLimiter[str],
    keys: list[str],
    labels: list[str] | None = None,
    parked: list[bool] | None = None,
) -> list[str]:
    """Fill every slot, queue one waiter per entry of `keys` (in that order; `parked[i]`: that
    one parked, no task), free the slots; the waiters' labels (default: their keys) in the
    order they were granted."""
    gate = asyncio.Event()
    order: list[str] = []
    started: list[asyncio.Task[None]] = []

    def parker(label: str) -> Start:
        async def work(held: Held) -> None:
            order.append(label)
            await asyncio.sleep(0)
            held.release()

        def start(held: Held) -> bool:
            started.append(asyncio.get_running_loop().create_task(work(held)))
            return True

        return start

    async def block() -> None:
        async with limiter.slot("blocker"):
            await gate.wait()

    async def wait(key: str, label: str) -> None:
        async with limiter.slot(key):
            order.append(label)
            await asyncio.sleep(0)

    held = [asyncio.create_task(block()) for _ in range(limiter.limit)]
    await settle()
    assert limiter.held == limiter.limit
    waiters = []
    for key, label, park in zip(keys, labels or keys, parked or [False] * len(keys), strict=True):
        if park:
            limiter.park(key, label, parker(label))
        else:
            waiters.append(asyncio.create_task(wait(key, label)))
        await asyncio.sleep(0)  # arrivals in this order
    await settle()
    assert limiter.waiting == len(keys)
    gate.set()
    await asyncio.wait_for(asyncio.gather(*held, *waiters), LEAK)
    for _ in range(20 * len(keys)):  # each parked grant's task is made by a release
        if len(started) == sum(parked or []):
            break
        await asyncio.sleep(0)
    assert len(started) == sum(parked or [])
    await asyncio.wait_for(asyncio.gather(*started), LEAK)
    assert_empty(limiter)
    return order


# -- order ----------------------------------------------------------------------------------


async def test_free_slots_are_taken_at_once() -> None:
    limiter = FairLimiter[str](2)
    await limiter.acquire("a")
    await limiter.acquire("a")
    assert (limiter.held, limiter.waiting) == (2, 0)
    limiter.release()
    limiter.release()
    assert_empty(limiter)


async def test_keys_are_served_round_robin_fifo_within_a_key() -> None:
    limiter = FairLimiter[str](1)
    keys = ["a1", "a2", "a3", "b1", "b2", "c1"]
    order = await granted_in_order(limiter, [k[0] for k in keys])
    assert order == ["a", "b", "c", "a", "b", "a"]


@pytest.mark.parametrize("limit", [1, 2, 8])
async def test_one_waiter_is_not_delayed_by_a_thousand_of_another_key(limit: int) -> None:
    """Namespace a queues 1,000 submits, then b queues one: b is the second grant once a
    slot frees (the ring is a, b), whatever the limit: at most one grant per other waiting
    key comes first, not a's backlog (a FIFO would make b the 1,001st)."""
    limiter = FairLimiter[str](limit)
    order = await granted_in_order(limiter, ["a"] * 1000 + ["b"])
    assert order.index("b") == 1
    assert order.count("a") == 1000


async def test_a_slot_given_back_early_goes_to_the_next_waiter_and_is_not_freed_twice() -> None:
    """A submit gives its slot back once its POST is answered and confirms after: the
    waiter gets the slot while the holder's body still runs, and the body's end frees
    nothing more (a second release would let a third holder in beyond the limit)."""
    limiter = FairLimiter[str](1)
    confirming = asyncio.Event()
    done = asyncio.Event()

    async def submit() -> None:
        async with limiter.slot("a") as held:
            assert held.held
            held.release()
            held.release()
            assert not held.held
            confirming.set()
            await done.wait()

    holder = asyncio.create_task(submit())
    await confirming.wait()
    assert limiter.held == 0
    await limiter.acquire("b")
    third = asyncio.create_task(limiter.acquire("c"))
    await settle()
    done.set()
    await holder
    await settle()
    assert (limiter.held, limiter.waiting) == (1, 1)
    assert not third.done()
    limiter.release()
    await third
    limiter.release()
    assert_empty(limiter)


async def test_a_newcomer_does_not_take_a_slot_freed_for_a_waiter() -> None:
    limiter = FairLimiter[str](1)
    await limiter.acquire("a")
    first = asyncio.create_task(limiter.acquire("b"))
    await settle()
    limiter.release()  # handed to b: still held
    assert (limiter.held, limiter.waiting) == (1, 0)
    late = asyncio.create_task(limiter.acquire("c"))
    await settle()
    assert first.done()
    assert not late.done()
    assert limiter.waiting_for("c") == 1
    limiter.release()
    await late
    limiter.release()
    assert_empty(limiter)


# -- cancellation ---------------------------------------------------------------------------


async def test_a_cancelled_waiter_leaves_no_ghost() -> None:
    limiter = FairLimiter[str](1)
    await limiter.acquire("holder")
    gone = asyncio.create_task(limiter.acquire("a"))
    other = asyncio.create_task(limiter.acquire("b"))
    await settle()
    assert limiter.waiting == 2
    gone.cancel()
    await settle()
    assert gone.cancelled()
    assert (limiter.waiting, limiter.waiting_for("a")) == (1, 0)
    assert "a" not in limiter._ring
    limiter.release()  # straight to b: a's key is not in the ring any more
    await settle()
    assert other.done()
    assert (limiter.held, limiter.waiting) == (1, 0)
    limiter.release()
    assert_empty(limiter)


async def test_a_waiter_cancelled_once_granted_passes_the_slot_on() -> None:
    limiter = FairLimiter[str](1)
    await limiter.acquire("holder")
    granted = asyncio.create_task(limiter.acquire("a"))
    after = asyncio.create_task(limiter.acquire("b"))
    await settle()
    limiter.release()  # a's future resolved; a has not resumed yet
    granted.cancel()
    await settle()
    assert granted.cancelled()
    assert after.done(), "the slot a was handed went on to b"
    assert (limiter.held, limiter.waiting) == (1, 0)
    limiter.release()
    assert_empty(limiter)


async def test_a_waiter_cancelled_while_another_release_skips_it() -> None:
    """Cancelled (its future too) but not yet resumed when a release comes: skipped."""
    limiter = FairLimiter[str](1)
    await limiter.acquire("holder")
    gone = asyncio.create_task(limiter.acquire("a"))
    other = asyncio.create_task(limiter.acquire("b"))
    await settle()
    gone.cancel()  # its future is cancelled now; its handler runs on the next turn
    limiter.release()
    await settle()
    assert gone.cancelled()
    assert other.done()
    assert (limiter.held, limiter.waiting) == (1, 0)
    limiter.release()
    assert_empty(limiter)


async def test_a_cancelled_holder_releases_its_slot() -> None:
    limiter = FairLimiter[str](1)
    forever = asyncio.Event()

    async def hold() -> None:
        async with limiter.slot("a"):
            await forever.wait()

    holder = asyncio.create_task(hold())
    await settle()
    waiter = asyncio.create_task(limiter.acquire("b"))
    await settle()
    assert limiter.waiting == 1
    holder.cancel()
    await settle()
    assert holder.cancelled()
    assert waiter.done()
    limiter.release()
    assert_empty(limiter)


async def test_a_timeout_while_waiting_is_a_cancellation() -> None:
    limiter = FairLimiter[str](1)
    await limiter.acquire("a")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(limiter.acquire("b"), 0.01)
    assert limiter.waiting == 0
    limiter.release()
    assert_empty(limiter)


async def test_waiters_are_reported() -> None:
    seen: list[int] = []
    limiter = FairLimiter[str](1, on_waiting=seen.append)
    order = await granted_in_order(limiter, ["a", "b", "a"])
    assert order == ["a", "b", "a"]
    assert seen == [1, 2, 3, 2, 1, 0]


# -- parked waiters ---------------------------------------------------------------------------


def recording(log: list[tuple[str, Held]], label: str, *, takes: bool = True) -> Start:
    def start(held: Held) -> bool:
        log.append((label, held))
        return takes

    return start


async def test_a_parked_waiter_starts_at_once_when_a_slot_is_free() -> None:
    limiter = FairLimiter[str](1)
    log: list[tuple[str, Held]] = []
    limiter.park("a", "x", recording(log, "x"))
    assert [label for label, _ in log] == ["x"]
    assert (limiter.held, limiter.waiting) == (1, 0)
    log[0][1].release()
    assert_empty(limiter)


async def test_a_token_parked_again_keeps_its_place_and_takes_the_newer_start() -> None:
    limiter = FairLimiter[str](1)
    first = limiter.try_slot()
    assert first is not None
    assert limiter.try_slot() is None
    log: list[tuple[str, Held]] = []
    limiter.park("a", "x", recording(log, "x-old"))
    limiter.park("a", "y", recording(log, "y"))
    limiter.park("a", "x", recording(log, "x-new"))
    assert limiter.waiting == 2
    first.release()
    assert [label for label, _ in log] == ["x-new"]
    log[-1][1].release()
    assert [label for label, _ in log] == ["x-new", "y"]
    log[-1][1].release()
    assert_empty(limiter)


async def test_a_start_that_cannot_run_passes_the_slot_on() -> None:
    """Its owner closed (a wake service stopped): the next waiter gets the slot, and with no
    other waiter the slot is free again; none is held twice or lost."""
    limiter = FairLimiter[str](1)
    first = limiter.try_slot()
    assert first is not None
    log: list[tuple[str, Held]] = []
    limiter.park("a", "gone", recording(log, "gone", takes=False))
    limiter.park("b", "next", recording(log, "next"))
    limiter.park("a", "gone-too", recording(log, "gone-too", takes=False))
    first.release()
    assert [label for label, _ in log] == ["gone", "next"]
    assert limiter.held == 1
    log[-1][1].release()
    assert [label for label, _ in log] == ["gone", "next", "gone-too"]
    assert_empty(limiter)
    limiter.park("a", "closed", recording(log, "closed", takes=False))
    assert_empty(limiter)


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairLimiter[str](0)
    with pytest.raises(RuntimeError, match="not held"):
        FairLimiter[str](1).release()


# -- properties -----------------------------------------------------------------------------

# One task: its key, how many turns it holds the slot, and whether it is cancelled (after how
# many turns of the whole run): while it waits or while it holds, whichever it is doing then.
TASKS = st.lists(
    st.tuples(
        st.sampled_from("abcd"),
        st.integers(0, 3),
        st.one_of(st.none(), st.integers(0, 12)),
    ),
    min_size=1,
    max_size=40,
)


async def _run(limit: int, tasks: list[tuple[str, int, int | None]]) -> None:
    reported: list[int] = []
    limiter = FairLimiter[str](limit, on_waiting=reported.append)
    active = 0
    peak = 0
    done: list[int] = []

    async def work(index: int, key: str, turns: int) -> None:
        nonlocal active, peak
        async with limiter.slot(key):
            active += 1
            peak = max(peak, active)
            assert active <= limit
            try:
                for _ in range(turns):
                    await asyncio.sleep(0)
            finally:
                active -= 1
        done.append(index)

    running: list[asyncio.Task[None]] = []
    cancels: dict[int, list[asyncio.Task[None]]] = {}
    for index, (key, turns, cancel_at) in enumerate(tasks):
        task = asyncio.create_task(work(index, key, turns))
        running.append(task)
        if cancel_at is not None:
            cancels.setdefault(cancel_at, []).append(task)
    for turn in range(50):
        for task in cancels.pop(turn, []):
            task.cancel()
        # Work conserving: a slot is never idle while someone waits.
        assert limiter.waiting == 0 or limiter.held == limit
        assert limiter.held <= limit
        assert active <= limiter.held
        assert reported[-1:] in ([], [limiter.waiting])
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), LEAK)
    assert peak <= limit
    for index, task in enumerate(running):
        assert task.cancelled() or index in done
    assert_empty(limiter)
    assert reported[-1:] in ([], [0])


@settings(max_examples=150, deadline=None)
@given(limit=st.integers(1, 4), tasks=TASKS)
def test_never_more_than_limit_holders_and_nothing_left_behind(
    limit: int, tasks: list[tuple[str, int, int | None]]
) -> None:
    asyncio.run(_run(limit, tasks))


def round_robin(arrivals: list[str]) -> list[int]:
    """The reference: rounds over the keys in the order they first arrived, one waiter of
    each key per round, oldest first; the arrival indexes in grant order."""
    queues: dict[str, list[int]] = {}
    for index, key in enumerate(arrivals):
        queues.setdefault(key, []).append(index)
    order: list[int] = []
    while any(queues.values()):
        for queue in queues.values():
            if queue:
                order.append(queue.pop(0))
    return order


@settings(max_examples=100, deadline=None)
@given(
    limit=st.integers(1, 4),
    arrivals=st.lists(st.tuples(st.sampled_from("abcde"), st.booleans()), min_size=1, max_size=60),
)
def test_grants_follow_the_round_robin_reference(
    limit: int, arrivals: list[tuple[str, bool]]
) -> None:
    """Whatever the arrivals, the limit and which waiters are parked (no task), the grants
    are the reference's rounds: a key that starts waiting is served after at most one grant
    to each key already waiting."""
    keys = [key for key, _ in arrivals]

    async def run() -> list[str]:
        labels = [str(i) for i in range(len(arrivals))]
        parked = [park for _, park in arrivals]
        return await granted_in_order(FairLimiter[str](limit), keys, labels, parked)

    order = asyncio.run(run())
    assert [int(label) for label in order] == round_robin(keys)
