"""Submit bodies per version: exact shapes, schema validation against the served OpenAPI
documents, and comparison with requests that real Slurm 26.05 accepted."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import jsonschema
import pytest

from slurmjob_operator.core.launch import LaunchRequest
from slurmjob_operator.slurm.dialects import dialect_for
from slurmjob_operator.versions import SUPPORTED_VERSIONS

from .slurm_fakes import (
    S2205,
    S2605,
    capture,
    cpu_request,
    gpu_request,
    het_request,
    sample,
)

SERVED_2605 = ("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
NO_DOCUMENT = ("v0.0.40", "v0.0.41")


def array_request() -> LaunchRequest:
    return cpu_request(
        array="0-19%3",
        standard_output="/shared/jobs/abc/stdout-%a.log",
        standard_error="/shared/jobs/abc/stderr-%a.log",
    )


def _after(make: Any) -> Any:
    """The request with a Slurm dependency (spec.dependsOn): on the leader only."""
    return lambda: make().model_copy(update={"dependency": "afterok:12,afterok:13"})


REQUESTS = {
    "cpu": cpu_request,
    "gpu": gpu_request,
    "het": het_request,
    "array": array_request,
    "cpu-after": _after(cpu_request),
    "het-after": _after(het_request),
}

# Where the 22.05 document disagrees with the 22.05 parser (see dialects/v0038.py): the body
# follows the parser. Each entry is asserted to be a real disagreement below.
V38_SCHEMA_OVERRIDES: dict[str, dict[str, Any]] = {
    "nodes": {"type": "integer", "minimum": 1},
    "exclusive": {"type": "string", "enum": ["exclusive"]},
}


def _nullable(node: Any) -> Any:
    """OpenAPI 3.0 `nullable: true` as JSON Schema `type: [T, "null"]`."""
    if isinstance(node, dict):
        out = {k: _nullable(v) for k, v in node.items() if k != "nullable"}
        if node.get("nullable") is True and isinstance(node.get("type"), str):
            out["type"] = [node["type"], "null"]
        return out
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    return node


@functools.cache
def _document(name: str) -> dict[str, Any]:
    path = S2205 / "openapi.json" if name == "22.05" else S2605 / "openapi_v3.json"
    doc: dict[str, Any] = _nullable(json.loads(path.read_text(encoding="utf-8")))
    return doc


def _validator(version: str, overrides: bool = True) -> jsonschema.Draft7Validator:
    if version == "v0.0.38":
        components = copy.deepcopy(_document("22.05")["components"])
        if overrides:
            props = components["schemas"]["v0.0.38_job_properties"]["properties"]
            props.update(V38_SCHEMA_OVERRIDES)
        ref = "#/components/schemas/v0.0.38_job_submission"
    else:
        components = _document("26.05")["components"]
        ref = f"#/components/schemas/{version}_job_submit_req"
    return jsonschema.Draft7Validator({"$ref": ref, "components": components})


def body(version: str, req: LaunchRequest) -> dict[str, Any]:
    return dialect_for(version).submit_body(req)


@pytest.mark.parametrize("kind", sorted(REQUESTS))
@pytest.mark.parametrize("version", ["v0.0.38", *SERVED_2605])
def test_body_matches_served_schema(version: str, kind: str) -> None:
    errors = sorted(
        _validator(version).iter_errors(body(version, REQUESTS[kind]())), key=lambda e: e.path
    )
    assert [f"{list(e.path)}: {e.message}" for e in errors] == []


@pytest.mark.parametrize("version", NO_DOCUMENT)
def test_versions_without_a_document(version: str) -> None:
    pytest.skip(
        f"{version}: no served OpenAPI document in the samples; body follows the fact sheet"
    )


@pytest.mark.parametrize("version", NO_DOCUMENT)
def test_unserved_versions_build_the_v042_shape(version: str) -> None:
    for make in REQUESTS.values():
        assert body(version, make()) == body("v0.0.42", make())


def test_v38_overrides_are_real_disagreements() -> None:
    strict = _validator("v0.0.38", overrides=False)
    failing = {
        str(e.path[-1]) for e in strict.iter_errors(body("v0.0.38", gpu_request())) if e.path
    }
    assert failing == set(V38_SCHEMA_OVERRIDES)


def test_v38_cpu_body_exact() -> None:
    assert body("v0.0.38", cpu_request()) == {
        "script": "#!/bin/bash\nsrun hostname\n",
        "job": {
            "name": "sj-default-train-abc123",
            "comment": "slurmjob-uid=abc-123",
            "environment": {"PATH": "/usr/bin:/bin", "SLURMJOB_UID": "abc-123"},
            "current_working_directory": "/shared/jobs/abc",
            "standard_output": "/shared/jobs/abc/out-%j.log",
            "standard_error": "/shared/jobs/abc/err-%j.log",
            "nodes": 1,
            "tasks": 1,
            "tasks_per_node": 1,
            "cpus_per_task": 2,
            "memory_per_node": 2048,
            "no_requeue": True,
            "partition": "debug",
            "time_limit": 30,
        },
    }


def test_v38_gpu_and_het_bodies() -> None:
    gpu = body("v0.0.38", gpu_request())["job"]
    assert gpu["gpus_per_node"] == "4"
    assert gpu["exclusive"] == "exclusive"
    assert (gpu["nodes"], gpu["tasks"], gpu["tasks_per_node"]) == (2, 8, 4)
    assert (gpu["account"], gpu["qos"], gpu["constraints"]) == ("ml", "high", "h100")
    assert "requeue" not in gpu  # any value would turn requeue on
    het = body("v0.0.38", het_request())
    assert set(het) == {"script", "jobs"}
    assert len(het["jobs"]) == 2
    for component in het["jobs"]:
        assert component["environment"]["PATH"] == "/usr/bin:/bin"
        assert component["current_working_directory"] == "/shared/jobs/abc"
        assert "partition" not in component
        assert "time_limit" not in component
    assert "gpus_per_node" not in het["jobs"][0]
    assert het["jobs"][1]["gpus_per_node"] == "2"


@pytest.mark.parametrize("version", [v for v in SUPPORTED_VERSIONS if v != "v0.0.38"])
def test_v4x_cpu_body_exact(version: str) -> None:
    assert body(version, cpu_request()) == {
        "job": {
            "script": "#!/bin/bash\nsrun hostname\n",
            "name": "sj-default-train-abc123",
            "comment": "slurmjob-uid=abc-123",
            "environment": ["PATH=/usr/bin:/bin", "SLURMJOB_UID=abc-123"],
            "current_working_directory": "/shared/jobs/abc",
            "standard_output": "/shared/jobs/abc/out-%j.log",
            "standard_error": "/shared/jobs/abc/err-%j.log",
            "nodes": "1",
            "tasks": 1,
            "tasks_per_node": 1,
            "cpus_per_task": 2,
            "memory_per_node": {"set": True, "infinite": False, "number": 2048},
            "requeue": False,
            "partition": "debug",
            "time_limit": {"set": True, "infinite": False, "number": 30},
        }
    }


@pytest.mark.parametrize("version", [v for v in SUPPORTED_VERSIONS if v != "v0.0.38"])
def test_v4x_gpu_and_het_bodies(version: str) -> None:
    gpu = body(version, gpu_request())["job"]
    assert gpu["tres_per_node"] == "gres/gpu:4"
    assert gpu["shared"] == ["none"]
    assert "exclusive" not in gpu
    assert "gpus_per_node" not in gpu
    het = body(version, het_request())
    assert set(het) == {"jobs"}
    first, second = het["jobs"]
    assert first["script"].startswith("#!/bin/bash")
    assert "script" not in second
    for component in (first, second):
        assert component["current_working_directory"] == "/shared/jobs/abc"
        assert component["environment"] == ["PATH=/usr/bin:/bin", "SLURMJOB_UID=abc-123"]
        assert component["requeue"] is False
        assert component["name"] == "sj-default-train-abc123"
    assert "tres_per_node" not in first
    assert second["tres_per_node"] == "gres/gpu:2"


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_empty_environment_refused(version: str) -> None:
    with pytest.raises(ValueError, match="environment"):
        body(version, cpu_request(environment={}))


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_bad_environment_name_refused(version: str) -> None:
    with pytest.raises(ValueError, match="environment variable"):
        body(version, cpu_request(environment={"A=B": "x"}))


# -- comparison with the requests a real 26.05 accepted -------------------------------------


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [type(value[0]).__name__] if value else []
    return type(value).__name__


@pytest.mark.parametrize(
    "file",
    [
        "req_submit.json",
        "req_submit_failing.json",
        "req_submit_held.json",
        "req_submit_quick.json",
        "req_submit_rejected.json",
        "req_submit_het.json",
        "req_submit_het_missing_cwd.json",
    ],
)
def test_captured_requests_validate_and_match_shapes(file: str) -> None:
    captured = sample(f"slurm-26.05/{file}")
    assert list(_validator("v0.0.45").iter_errors(captured)) == []
    ours = body("v0.0.45", het_request() if "het" in file else cpu_request())
    key = "jobs" if "het" in file else "job"
    assert set(captured) - {"script"} == set(ours)  # script moves into the first component
    theirs_first = captured[key][0] if key == "jobs" else captured[key]
    ours_first = ours[key][0] if key == "jobs" else ours[key]
    for field, shape in _shape(theirs_first).items():
        if field in ours_first:
            assert _shape(ours_first[field]) == shape or field in ("time_limit", "memory_per_node")
    for field in ("time_limit", "memory_per_node"):
        if field in theirs_first and field in ours_first:
            assert {"set", "number"} <= set(ours_first[field])


@pytest.mark.parametrize("version", ["v0.0.38", *SERVED_2605])
def test_an_array_is_asked_for_on_the_first_component(version: str) -> None:
    sent = body(version, array_request())
    assert sent["job"]["array"] == "0-19%3"
    assert "array" not in body(version, cpu_request())["job"]


def test_v45_array_body_has_what_the_testbed_took() -> None:
    """The captured submit that Slurm 26.05.5 ran as an array: `job.array` as a string, the
    output path with %A/%a expanded by Slurm."""
    taken = capture("req_submit_array.json")
    sent = body("v0.0.45", array_request())
    assert isinstance(taken["job"]["array"], str)
    assert set(taken["job"]) - {"script", "time_limit"} <= set(sent["job"])


@pytest.mark.parametrize("version", ["v0.0.38", *SERVED_2605])
def test_a_dependency_is_the_leaders_and_holds_for_the_whole_job(version: str) -> None:
    het = body(version, REQUESTS["het-after"]())
    assert [c.get("dependency") for c in het["jobs"]] == ["afterok:12,afterok:13", None]
    assert body(version, REQUESTS["cpu-after"]())["job"]["dependency"] == "afterok:12,afterok:13"
    assert "dependency" not in body(version, cpu_request())["job"]
