"""The suite runner's plan (tests/lanes.py): which module runs alone, which lane takes the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests import lanes
from tests.timing import load_budgets

REPO = Path(__file__).resolve().parents[2]

BUDGETS = {
    "tests/integration/test_a.py": 100.0,
    "tests/integration/test_b.py": 60.0,
    "tests/integration/test_c.py": 50.0,
    "tests/integration/test_d.py": 40.0,
    "tests/unit/test_x.py": 5.0,
    "tests/unit/test_y.py": 7.0,
}
PARTS = [*sorted(m for m in BUDGETS if "integration" in m), lanes.UNIT]


A, B, C, D = (f"tests/integration/test_{x}.py" for x in "abcd")


def rules(
    exclusive: list[str] | None = None, together: list[list[str]] | None = None
) -> lanes.Rules:
    return lanes.Rules(exclusive or [], together or [])


def test_exclusive_modules_run_alone_in_path_order_with_the_unit_tier_beside() -> None:
    plan = lanes.plan(PARTS, rules([C, A]), BUDGETS, 2)
    assert plan.exclusive == [A, C]
    assert plan.beside == [lanes.UNIT]
    assert [lane.modules for lane in plan.lanes] == [[B], [D]]


def test_without_exclusive_modules_the_unit_tier_takes_a_lane() -> None:
    plan = lanes.plan(PARTS, rules(), BUDGETS, 2)
    assert plan.exclusive == plan.beside == []
    assert lanes.UNIT in [m for lane in plan.lanes for m in lane.modules]


def test_a_group_shares_one_lane_and_is_budgeted_whole() -> None:
    plan = lanes.plan(PARTS, rules([], [[C, D]]), BUDGETS, 2)
    assert [lane.modules for lane in plan.lanes] == [[A, lanes.UNIT], [C, D, B]]
    assert [lane.budget for lane in plan.lanes] == [112.0, 150.0]


def test_longest_first_each_to_the_least_loaded_lane() -> None:
    plan = lanes.plan(PARTS, rules(), BUDGETS, 2)
    assert [lane.modules for lane in plan.lanes] == [[A, D], [B, C, lanes.UNIT]]
    assert [lane.budget for lane in plan.lanes] == [140.0, 122.0]


def test_the_unit_tier_is_one_part_budgeted_as_the_sum_of_its_modules() -> None:
    assert lanes.budget_of(lanes.UNIT, BUDGETS) == 12.0
    assert lanes.budget_of("tests/integration/test_new.py", BUDGETS) == lanes.DEFAULT_BUDGET


def test_no_empty_lane_and_at_least_one() -> None:
    plan = lanes.plan([A], rules(), BUDGETS, 3)
    assert [lane.modules for lane in plan.lanes] == [[A]]
    with pytest.raises(ValueError, match="at least one lane"):
        lanes.plan(PARTS, rules(), BUDGETS, 0)


@given(
    st.dictionaries(
        st.from_regex(r"tests/integration/test_[a-z]{1,6}\.py", fullmatch=True),
        st.floats(min_value=0.5, max_value=500),
        max_size=30,
    ),
    st.integers(min_value=1, max_value=4),
    st.data(),
)
def test_every_module_runs_exactly_once(
    budgets: dict[str, float], n: int, data: st.DataObject
) -> None:
    parts = sorted(budgets)
    picked = st.lists(st.sampled_from(parts), unique=True) if parts else st.just([])
    exclusive = data.draw(picked)
    group = [m for m in data.draw(picked) if m not in exclusive]
    plan = lanes.plan(parts, rules(exclusive, [group]), budgets, n)
    laned = [m for lane in plan.lanes for m in lane.modules]
    assert sorted(plan.exclusive + laned) == parts
    assert set(plan.exclusive) == set(exclusive)
    assert len(plan.lanes) <= n
    homes = {i for i, lane in enumerate(plan.lanes) for m in lane.modules if m in group}
    assert len(homes) <= 1  # a group never splits
    if plan.lanes and not group:  # greedy: lanes differ by at most the longest module
        loads = [lane.budget for lane in plan.lanes]
        biggest = max(budgets[m] for m in laned)
        assert max(loads) - min(loads) <= biggest + 1e-6 or len(plan.lanes) < n


def test_the_rules_are_read_from_the_budget_file() -> None:
    text = f'[budgets]\n"a" = 1\n[lanes]\nexclusive = ["{A}"]\ntogether = [["{B}", "{C}"]]\n'
    assert lanes.parse_rules(text) == rules([A], [[B, C]])
    assert lanes.parse_rules("[budgets]\n") == rules()
    for bad in (
        "[lanes]\nexclusive = 3\n",
        "[lanes]\ntogether = [1]\n",
        f'[lanes]\ntogether = [["{A}"], ["{A}"]]\n',
        f'[lanes]\nexclusive = ["{A}"]\ntogether = [["{A}"]]\n',
        "[lanes]\nown = 3\n",
        f'[lanes]\nexclusive = ["{A}"]\nown = ["{A}"]\n',
        "lanes = 3\n",
        "not toml [",
    ):
        with pytest.raises(ValueError, match=r"lanes|TOML"):
            lanes.parse_rules(bad)


def test_a_module_of_its_own_gets_a_lane_beside_the_others() -> None:
    the_rules = lanes.Rules([], [], [C])
    plan = lanes.plan([A, B, C], the_rules, {A: 10, B: 20, C: 300}, 2)
    assert [(lane.name, lane.modules) for lane in plan.lanes] == [
        ("lane-1", [B]),
        ("lane-2", [A]),
        ("own-1", [C]),
    ]


def test_the_repositorys_plan_names_real_modules_and_runs_each_once() -> None:
    path = REPO / "tests/budgets.toml"
    the_rules = lanes.parse_rules(path.read_text(encoding="utf-8"))
    parts = lanes.modules(REPO)
    assert "tests/integration/test_clusters_e2e.py" in the_rules.exclusive  # stops slurmctld
    named = set(the_rules.exclusive) | {m for g in the_rules.together for m in g}
    assert named <= set(parts), named - set(parts)
    budgets, problem = load_budgets(path)
    assert problem is None
    plan = lanes.plan(parts, the_rules, budgets, 2)
    laned = [m for lane in plan.lanes for m in lane.modules]
    assert sorted(plan.exclusive + plan.beside + laned) == sorted(parts)
    assert plan.beside == [lanes.UNIT]
