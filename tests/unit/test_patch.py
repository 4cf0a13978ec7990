"""RFC 7386 merge patches: the diff the operator sends and the patch LocalStore applies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api import patch


@pytest.mark.parametrize(
    ("target", "change", "result"),
    [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_follows_rfc7386(target: Any, change: Any, result: Any) -> None:
    before = json.dumps(target)
    assert patch.apply(target, change) == result
    assert json.dumps(target) == before, "the target is not modified"


def test_diff_removes_what_the_new_document_lacks() -> None:
    old = {"phase": "Running", "slurmJobId": 1, "logs": {"stdout": {"tail": "a"}, "stderr": {}}}
    new = {"phase": "Running", "logs": {"stdout": {"tail": "b"}}, "message": "x"}
    assert patch.diff(old, new) == {
        "slurmJobId": None,
        "logs": {"stdout": {"tail": "b"}, "stderr": None},
        "message": "x",
    }
    assert patch.diff(new, new) == {}


# JSON documents without nulls: a status dump never holds one (`exclude_none`), and a null in
# the patch means "remove".
_scalars = st.one_of(st.booleans(), st.integers(), st.text(max_size=5))
_docs = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
_objects = st.dictionaries(st.text(max_size=3), _docs, max_size=4)


@given(_objects, _objects)
def test_applying_the_diff_gives_the_new_document(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert patch.apply(old, patch.diff(old, new)) == new
