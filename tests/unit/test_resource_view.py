"""The resource view reads a hostile raw spec without raising or crossing a namespace."""

from __future__ import annotations

from typing import Any

import pytest

from slurmjob_operator.api.resource import ResourceView, SecretRef


def view(spec: Any) -> ResourceView:
    meta = {"name": "a", "namespace": "team-a", "uid": "u", "generation": 1}
    return ResourceView.of({"metadata": meta, "spec": spec})


@pytest.mark.parametrize(
    "env",
    [
        "PATH=/x",
        7,
        [1, None, "x"],
        [{"valueFrom": 5}],
        [{"name": 3, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "", "key": "k"}}}],
        [{"name": "T", "valueFrom": {"secretKeyRef": ["s", "k"]}}],
    ],
)
def test_a_malformed_env_names_no_secret(env: Any) -> None:
    assert view({"env": env}).secret_refs == ()


def test_an_invalid_spec_still_names_its_secret_refs() -> None:
    spec = {
        "env": [
            {"name": "LD_PRELOAD", "value": "/x.so"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        ]
    }
    got = view(spec)
    assert got.spec is None
    assert got.secret_refs == (SecretRef("TOKEN", "hf", "token"),)


@pytest.mark.parametrize("spec", [None, "x", 5, [], {"suspend": "yes"}])
def test_a_spec_that_is_not_an_object_parses_to_an_error(spec: Any) -> None:
    got = view(spec)
    assert got.spec is None
    assert got.spec_error is not None
    assert got.suspend in (True, False)
