"""The share rule (core/shares.py): one owner's flood evicts its own entries only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmjob_operator.core.shares import Held, evictions, share


def held(owner: str, n: int, size: int, start: float = 0.0) -> list[Held]:
    return [Held(f"{owner}-{i}", owner, size, start + i) for i in range(n)]


@pytest.mark.parametrize(
    ("capacity", "floor", "owners", "expected"),
    [
        (1000, 100, 2, 500.0),  # capacity / owners above the floor
        (1000, 100, 10, 100.0),
        (1000, 100, 20, 50.0),  # the floors add up to 2,000 > 1,000: the floor shrinks
        (1000, 0, 4, 250.0),
        (1000, 100, 0, 1000.0),
    ],
)
def test_share(capacity: int, floor: int, owners: int, expected: float) -> None:
    assert share(capacity, floor, owners) == expected


def test_nothing_goes_while_the_total_fits() -> None:
    assert evictions(held("a", 5, 10) + held("b", 5, 10), capacity=100, floor=10) == []


def test_a_flood_evicts_only_the_flooders_entries_oldest_first() -> None:
    quiet = held("b", 3, 10) + held("c", 2, 10)
    flood = held("a", 20, 10, start=100)
    gone = evictions(quiet + flood, capacity=100, floor=10)
    assert gone == [f"a-{i}" for i in range(len(gone))]
    assert len(gone) == 15  # 250 -> 100: a keeps 5


def test_the_owner_furthest_over_its_share_goes_first() -> None:
    entries = held("a", 6, 10) + held("b", 9, 10) + held("c", 1, 10)
    gone = evictions(entries, capacity=120, floor=0)
    # Share 40 each: b is 50 over, a 20; b loses until both are as far over.
    assert gone[0] == "b-0"
    assert set(gone) <= {f"a-{i}" for i in range(6)} | {f"b-{i}" for i in range(9)}
    assert "c-0" not in gone


def test_the_entry_being_written_is_never_chosen() -> None:
    entries = [Held("new", "a", 50, 100.0), *held("a", 2, 30)]
    assert evictions(entries, capacity=60, floor=0, keep="new") == ["a-0", "a-1"]


def test_one_entry_each_then_a_new_owner_evicts_the_largest_owners_oldest() -> None:
    # 1,000 owners, each with one entry of 6 KiB, in 1 MiB: about 170 fit.
    size, capacity = 6 * 1024, 1024 * 1024
    entries = [Held(f"o{i}", f"o{i}", size, float(i)) for i in range(169)]
    assert evictions(entries, capacity, floor=4 * size) == []
    # The largest owner holds two entries: a new owner evicts its oldest, nobody else's.
    entries.append(Held("o0-second", "o0", size, 500.0))
    entries.append(Held("new", "new", size, 501.0))
    gone = evictions(entries, capacity, floor=4 * size, keep="new")
    assert gone == ["o0"]
    # Everyone down to one entry and still over: the oldest entry of the largest owner goes.
    ones = [Held(f"p{i}", f"p{i}", size + (i == 7), float(i)) for i in range(171)]
    assert evictions(ones, capacity, floor=size, keep="p170") == ["p7"]


def test_a_thousand_owners_each_keep_one_entry_while_others_hold_more() -> None:
    size = 100
    capacity = 1000 * size
    entries = [Held(f"o{i}", f"o{i}", size, float(i)) for i in range(999)]
    entries += held("big", 50, size, start=2000)
    gone = evictions(entries, capacity, floor=10 * size)
    assert all(str(k).startswith("big-") for k in gone)
    assert len(gone) == 49


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.sampled_from("abcdef"), st.integers(min_value=1, max_value=50)),
        min_size=1,
        max_size=80,
    ),
    capacity=st.integers(min_value=50, max_value=2000),
    floor=st.integers(min_value=0, max_value=500),
)
def test_what_stays_fits_and_nobody_under_its_share_loses_while_another_is_over(
    sizes: list[tuple[str, int]], capacity: int, floor: int
) -> None:
    entries = [Held(i, owner, size, float(i)) for i, (owner, size) in enumerate(sizes)]
    gone = evictions(entries, capacity, floor)
    kept = [e for e in entries if e.key not in gone]
    assert sum(e.size for e in kept) <= capacity
    assert len(gone) == len(set(gone))
    # Each owner loses its oldest entries first.
    for owner in {e.owner for e in entries}:
        mine = [e.key for e in entries if e.owner == owner]
        lost = [k for k in mine if k in gone]
        assert lost == mine[: len(lost)]
    # Nothing is evicted once the total fits: removing the last victim would leave it over.
    if gone:
        last = next(e for e in entries if e.key == gone[-1])
        assert sum(e.size for e in kept) + last.size > capacity
