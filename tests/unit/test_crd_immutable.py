"""A SlurmJob's spec is immutable once created (issue 45, "Immutable once created"), as a
batch/v1 Job's pod template, but for the fields of `MUTABLE_AFTER_CREATION`: the CRD's
transition rules, evaluated here on updates as the apiserver does (`test_crd`'s model of it,
with cel-python). The real kube-apiserver's own refusal is an integration test.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slurmjob_operator.api.spec import MUTABLE_AFTER_CREATION, SlurmJobSpec
from slurmjob_operator.gen import docs
from slurmjob_operator.gen.crd import MODEL_RULES, immutable_rules

from .test_crd import apiserver_errors, crd_schema, is_transition_rule, manifest
from .test_spec import gpu_spec

pytestmark = pytest.mark.usefixtures("_celpy")


@pytest.fixture
def _celpy() -> None:
    pytest.importorskip("celpy")


def _with_every_field() -> dict[str, Any]:
    """A valid spec that sets every optional field (walltime aside: not with timeLimit)."""
    spec = gpu_spec()
    spec.update(
        cluster="west",
        partition="gpu",
        account="team-a",
        qos="normal",
        timeLimit="4h",
        launch={"shape": "torchrun", "masterPort": 29500},
        retry={"limit": 2},
        array={"count": 4, "parallelism": 2},
        data={},
        mode="Batch",
        dependsOn=[{"name": "prep"}],
        suspend=False,
        ttlSecondsAfterFinished=600,
    )
    return spec


def _with_walltime() -> dict[str, Any]:
    spec = gpu_spec()
    del spec["timeLimit"]
    spec["walltime"] = {"totalTime": "3d", "segmentTime": "4h"}
    return spec


#: For each immutable field: the spec it is set in, and a valid other value for it.
CHANGES: dict[str, tuple[dict[str, Any], Any]] = {
    "framework": (
        _with_every_field(),
        {"kind": "custom", "name": "custom", "runtimeId": "custom-b"},
    ),
    "command": (_with_every_field(), ["torchrun", "other.py"]),
    "workingDir": (_with_every_field(), "/elsewhere"),
    "env": (_with_every_field(), [{"name": "EPOCHS", "value": "4"}]),
    "mounts": (_with_every_field(), [{"source": "datasets/other", "target": "/data"}]),
    "pools": (
        _with_every_field(),
        [{"name": "train", "gpuSeries": "h100", "gpusPerNode": 8, "cpus": 32, "memoryGb": 512}],
    ),
    "cluster": (_with_every_field(), "east"),
    "partition": (_with_every_field(), "gpu-long"),
    "account": (_with_every_field(), "team-b"),
    "qos": (_with_every_field(), "high"),
    "timeLimit": (_with_every_field(), 240),  # the same 4 h, said another way: still a change
    "launch": (_with_every_field(), {"shape": "torchrun", "masterPort": 29501}),
    "retry": (_with_every_field(), {"limit": 3}),
    "array": (_with_every_field(), {"count": 5, "parallelism": 2}),
    "walltime": (_with_walltime(), {"totalTime": "4d", "segmentTime": "4h"}),
    "data": (_with_every_field(), {"volumes": []}),
    "mode": (_with_every_field(), "Playground"),  # refused on its own too
    "dependsOn": (_with_every_field(), [{"name": "prep", "condition": "Finished"}]),
}


def _immutable_fields() -> list[str]:
    return [str(rule.field_path).removeprefix(".") for rule in immutable_rules()]


def _refusal(field: str) -> str:
    return f".spec.{field}: spec.{field} is immutable: create a new SlurmJob"


def _update(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return apiserver_errors(manifest(new), manifest(old))


def test_every_spec_field_but_the_mutable_ones_is_immutable() -> None:
    spec = crd_schema()["properties"]["spec"]
    fields = set(spec["properties"])
    assert set(MUTABLE_AFTER_CREATION) == {"suspend", "ttlSecondsAfterFinished"}
    assert set(MUTABLE_AFTER_CREATION) <= fields
    assert _immutable_fields() == [f for f in spec["properties"] if f not in MUTABLE_AFTER_CREATION]
    # On the spec's own node (a field added or removed is seen), reported at the field.
    transitions = [r for r in spec["x-kubernetes-validations"] if is_transition_rule(r)]
    assert [r["fieldPath"] for r in transitions] == [f".{f}" for f in _immutable_fields()]
    assert all(r["reason"] == "FieldValueInvalid" for r in transitions)
    assert set(MODEL_RULES[SlurmJobSpec]) >= set(immutable_rules())
    # No other node has a transition rule, and no rule reads the status.
    for name, sub in spec["properties"].items():
        assert not any(is_transition_rule(r) for r in sub.get("x-kubernetes-validations", [])), name
    assert not any("status" in r["rule"] for r in transitions)
    assert set(CHANGES) == set(_immutable_fields()), "a change to try for every immutable field"


def test_the_message_says_what_to_do() -> None:
    [rule] = [r for r in immutable_rules() if r.field_path == ".command"]
    assert rule.message == (
        "spec.command is immutable: create a new SlurmJob (a SlurmJob's spec cannot change "
        "once created; only suspend and ttlSecondsAfterFinished can)"
    )


@pytest.mark.parametrize("spec", [_with_every_field(), _with_walltime(), gpu_spec()])
def test_the_specs_here_are_valid_and_unchanged_is_allowed(spec: dict[str, Any]) -> None:
    assert apiserver_errors(manifest(spec)) == []
    assert _update(spec, copy.deepcopy(spec)) == []


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_a_changed_field_is_refused_naming_it(field: str) -> None:
    old, value = CHANGES[field]
    new = {**old, field: value}
    # As a creation the new spec is valid (mode aside): no transition rule judges a creation.
    assert apiserver_errors(manifest(new)) == [] or field == "mode"
    errors = _update(old, new)
    assert any(e.startswith(_refusal(field)) for e in errors), errors
    others = [e for e in errors if "is immutable" in e and not e.startswith(_refusal(field))]
    assert others == []


_OPTIONAL = sorted(set(CHANGES) - {"framework", "command", "pools"})  # the required ones aside


@pytest.mark.parametrize("field", _OPTIONAL)
def test_a_field_added_or_removed_is_a_change(field: str) -> None:
    with_it, _ = CHANGES[field]
    without = {k: v for k, v in with_it.items() if k != field}
    if field == "mode":  # a default: put back at once, so no change at all
        assert _update(with_it, without) == []
        assert _update(without, with_it) == []
        return
    for old, new in ((with_it, without), (without, with_it)):
        errors = _update(old, new)
        assert [e for e in errors if "is immutable" in e] == [
            f"{_refusal(field)} (a SlurmJob's spec cannot change once created; only suspend "
            "and ttlSecondsAfterFinished can)"
        ], errors


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({}, {"suspend": True}),
        ({"suspend": False}, {"suspend": True}),
        ({"suspend": True}, {"suspend": False}),
        ({"suspend": True}, {}),
        ({}, {"ttlSecondsAfterFinished": 0}),
        ({"ttlSecondsAfterFinished": 600}, {"ttlSecondsAfterFinished": 60}),
        ({"ttlSecondsAfterFinished": 600}, {}),
        ({"suspend": True}, {"ttlSecondsAfterFinished": 60}),
    ],
    ids=repr,
)
def test_suspend_and_the_ttl_can_change(old: dict[str, Any], new: dict[str, Any]) -> None:
    base = {k: v for k, v in _with_every_field().items() if k not in MUTABLE_AFTER_CREATION}
    assert _update({**base, **old}, {**base, **new}) == []


def test_metadata_and_status_edits_leave_the_spec_alone() -> None:
    spec = _with_every_field()
    new = manifest(copy.deepcopy(spec))
    new["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    new["status"] = {"phase": "Running"}
    assert apiserver_errors(new, manifest(spec)) == []


def test_the_reference_says_what_can_change_and_why() -> None:
    text = docs.render()
    section = text.split("## What can change after creation\n", 1)[1].split("\n## ", 1)[0]
    for name, why in MUTABLE_AFTER_CREATION.items():
        assert f"| `{name}` | {why} |" in section
    for name in _immutable_fields():
        assert f"| `{name}` | `" in section
    assert "no status is consulted" in section
    # The spec's own table leaves the transition rules to that section.
    spec_part = text.split("### `spec`\n", 1)[1].split("\n### ", 1)[0]
    assert "oldSelf" not in spec_part
    assert "(#what-can-change-after-creation)" in spec_part
