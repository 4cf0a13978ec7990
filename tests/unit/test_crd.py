"""The generated CRD: in step with the models, structural, and refusing what the models refuse.

The apiserver's side is approximated in Python: defaults, then the OpenAPI schema (jsonschema,
Kubernetes extensions stripped), list-map keys and the CEL rules (cel-python). The real
kube-apiserver's own checks (CEL cost estimation, admission of the examples) run in the
integration tests.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmjob_operator import GROUP, KIND, PLURAL, VERSION
from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.api.scriptwords import (
    ABSOLUTE_PATH_RE,
    RELATIVE_PATH_RE,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    WORKING_DIR_RE,
    command_problem,
    reserved_env_name,
)
from slurmjob_operator.api.spec import EnvVar, SlurmJobSpec
from slurmjob_operator.gen.crd import FIELD_RULES, MODEL_RULES, build_crd, to_yaml

from .test_spec import CASES, Case, cpu_spec, gpu_spec, het_spec

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "slurmjob.io_slurmjobs.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def crd_schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def manifest(spec: dict[str, Any], name: str = "job") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


INLINE_SAMPLES = {
    "cpu-only": manifest(cpu_spec(), "cpu"),
    "single-pool-gpu": manifest(gpu_spec(), "gpu"),
    "two-pool-het": manifest(het_spec(), "het"),
}


# -- a small model of what the apiserver does with an object ----------------------------------


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}.*")


def strip_extensions(schema: Any) -> Any:
    """A plain JSON schema: int-or-string becomes a type union, x-kubernetes-* keys go."""
    if isinstance(schema, list):
        return [strip_extensions(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strip_extensions(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if schema.get("type") == "object" and "properties" in schema:
        out["additionalProperties"] = False  # stands in for kubectl --validate=strict
    return out


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [apply_defaults(schema["items"], v) for v in value]
    return value


@cache
def _program(rule: str) -> Any:
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    return env.program(env.compile(rule))


#: No old value at a node: a creation, or a node the old object did not have.
NO_OLD: Any = object()


def is_transition_rule(rule: dict[str, str]) -> bool:
    return "oldSelf" in rule["rule"]


def cel_errors(schema: dict[str, Any], value: Any, path: str, old: Any = NO_OLD) -> list[str]:
    """The CEL rules' refusals; a transition rule (one that names `oldSelf`) only where the
    old object has the node too, as the apiserver evaluates them (on an update, for properties
    of an object; list items are not correlated here)."""
    celpy = pytest.importorskip("celpy")
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        bound = {"self": celpy.json_to_cel(value)}
        if is_transition_rule(rule):
            if old is NO_OLD:
                continue
            bound["oldSelf"] = celpy.json_to_cel(old)
        try:
            ok = _program(rule["rule"]).evaluate(bound)
        except Exception as exc:
            ok = False
            rule = {**rule, "message": f"{rule['message']} (evaluation failed: {exc})"}
        if isinstance(ok, Exception) or not bool(ok):
            errors.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}")
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                was = old.get(name, NO_OLD) if isinstance(old, dict) else NO_OLD
                errors += cel_errors(sub, value[name], f"{path}.{name}", was)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{index}]")
    return errors


def list_map_errors(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    errors: list[str] = []
    if isinstance(value, list) and schema.get("x-kubernetes-list-type") == "map":
        keys = schema["x-kubernetes-list-map-keys"]
        seen = [tuple(item.get(k) for k in keys) for item in value]
        if len(set(seen)) != len(seen):
            errors.append(f"{path}: Duplicate value")
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                errors += list_map_errors(sub, value[name], f"{path}.{name}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors += list_map_errors(schema["items"], item, f"{path}[{index}]")
    return errors


def apiserver_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """What the apiserver refuses in a creation of `obj`, or in an update of `old` (as stored,
    defaulted on read) to `obj`."""
    schema = crd_schema()
    obj = apply_defaults(schema, obj)
    validator = jsonschema.Draft7Validator(strip_extensions(schema))
    errors = [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(obj)
    ]
    if errors:  # the apiserver stops before CEL when the object does not fit the schema
        return errors
    was = NO_OLD if old is None else apply_defaults(schema, old)
    return list_map_errors(schema, obj, "") + cel_errors(schema, obj, "", was)


# -- the file and the shape -------------------------------------------------------------------


def test_crd_file_is_generated() -> None:
    assert CRD_FILE.read_text(encoding="utf-8") == to_yaml(build_crd()), (
        "crds/slurmjob.io_slurmjobs.yaml is stale: run `python -m slurmjob_operator.gen.crd`"
    )


def test_module_prints_the_crd() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "slurmjob_operator.gen.crd"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout == to_yaml(build_crd())


def test_yaml_round_trips_and_is_stable() -> None:
    text = to_yaml(build_crd())
    assert yaml.safe_load(text) == build_crd()
    assert to_yaml(yaml.safe_load(text)) == text


def test_names_scope_and_version() -> None:
    crd = build_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    spec = crd["spec"]
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "SlurmJob",
        "listKind": "SlurmJobList",
        "plural": "slurmjobs",
        "singular": "slurmjob",
        "shortNames": ["sj"],
        "categories": ["slurm"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    """What `kubectl get` users need (the wide ones at `-o wide`), each reading a status field
    of its own type: a printer column can neither count the attempts nor subtract times."""
    columns = build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["jsonPath"], c["type"], c.get("priority", 0)) for c in columns] == [
        ("Phase", ".status.phase", "string", 0),
        ("Reason", '.status.conditions[?(@.type=="Ready")].reason', "string", 0),
        ("Slurm Job", ".status.slurmJobId", "integer", 0),
        ("Attempt", ".status.attempt", "integer", 0),
        ("Segment", ".status.segment", "integer", 0),
        ("Queue", ".metadata.labels.kueue\\.x-k8s\\.io/queue-name", "string", 0),
        ("Age", ".metadata.creationTimestamp", "date", 0),
        ("Cluster", ".status.cluster", "string", 1),
        ("Nodes", ".status.nodes", "string", 1),
        ("Started", ".status.startTime", "date", 1),
        ("Duration", ".status.duration", "string", 1),
    ]
    status = crd_schema()["properties"]["status"]["properties"]
    for column in columns:
        field = column["jsonPath"].removeprefix(".status.")
        if column["jsonPath"].startswith(".status.") and "[" not in field:
            kind = {"date": "string"}.get(column["type"], column["type"])
            assert status[field]["type"] == kind, field


def test_schema_is_structural() -> None:
    for path, node in _nodes(crd_schema()):
        for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "nullable"):
            assert key not in node, f"{path or '.'} has {key}"
        special = node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        assert "type" in node or special, f"{path or '.'} has no type"
        if "properties" in node:
            assert "additionalProperties" not in node, path
            assert node["type"] == "object"
            assert set(node.get("required", [])) <= set(node["properties"]), path
        if node.get("type") == "array":
            assert "items" in node, path
        if "default" in node:
            assert not path.startswith(".status"), f"{path}: status has no defaults"


def test_special_nodes() -> None:
    spec = crd_schema()["properties"]["spec"]["properties"]
    assert spec["timeLimit"]["x-kubernetes-int-or-string"] is True
    assert "type" not in spec["timeLimit"]
    assert spec["data"]["properties"]["volumes"]["items"] == {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    assert spec["framework"]["properties"]["image"]["type"] == "string"
    assert spec["mode"]["enum"] == ["Batch", "Playground", "Deployment"]
    assert spec["mode"]["default"] == "Batch"
    assert spec["pools"]["items"]["properties"]["nodes"]["default"] == 1
    assert spec["pools"]["maxItems"] == 16
    assert spec["env"]["x-kubernetes-list-map-keys"] == ["name"]
    status = crd_schema()["properties"]["status"]["properties"]
    assert status["conditions"]["x-kubernetes-list-type"] == "map"
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    condition = status["conditions"]["items"]
    assert condition["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert set(condition["required"]) == {"type", "status", "reason", "lastTransitionTime"}
    assert condition["properties"]["lastTransitionTime"]["format"] == "date-time"
    assert status["phase"]["enum"][0] == "Pending"
    assert set(status["logs"]["properties"]["stdout"]["properties"]) == {
        "tail",
        "truncated",
        "bytes",
        "lines",
    }
    assert crd_schema()["required"] == ["spec"]


def test_descriptions_come_from_the_models() -> None:
    spec = crd_schema()["properties"]["spec"]
    assert spec["description"] == (
        "Desired state of a SlurmJob; only suspend and ttlSecondsAfterFinished change once created."
    )
    assert spec["properties"]["timeLimit"]["description"].startswith("Minutes")
    assert (
        "runtime registry"
        in spec["properties"]["framework"]["properties"]["runtimeId"]["description"]
    )


def test_every_cel_rule_has_a_message() -> None:
    rules = [
        rule
        for _, node in _nodes(crd_schema())
        for rule in node.get("x-kubernetes-validations", [])
    ]
    expected = sum(len(r) for r in MODEL_RULES.values()) + sum(len(r) for r in FIELD_RULES.values())
    assert len(rules) == expected
    for rule in rules:
        assert rule["rule"].strip()
        assert rule["message"].strip()
        assert rule.get("reason", "FieldValueInvalid") in {
            "FieldValueInvalid",
            "FieldValueForbidden",
            "FieldValueRequired",
            "FieldValueDuplicate",
        }


def test_strings_and_lists_used_by_cel_are_bounded() -> None:
    spec = crd_schema()["properties"]["spec"]["properties"]
    assert spec["pools"]["maxItems"] <= 16
    assert spec["env"]["maxItems"] <= 128
    assert spec["mounts"]["maxItems"] <= 128
    for mount_field in ("source", "target"):
        assert spec["mounts"]["items"]["properties"][mount_field]["maxLength"] <= 4096
    assert spec["env"]["items"]["properties"]["name"]["maxLength"] <= 255
    assert spec["workingDir"]["maxLength"] <= 4096
    for pool_field in ("name", "gpuSeries"):
        assert spec["pools"]["items"]["properties"][pool_field]["maxLength"] <= 63


# -- objects against the schema ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(INLINE_SAMPLES))
def test_inline_samples_are_valid(name: str) -> None:
    obj = INLINE_SAMPLES[name]
    assert apiserver_errors(obj) == []
    parse_spec(obj["spec"])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    for doc in docs:
        assert doc["apiVersion"] == f"{GROUP}/{VERSION}"
        assert doc["kind"] == KIND
        assert apiserver_errors(doc) == []
        parse_spec(doc["spec"])


def test_there_may_be_no_examples() -> None:
    if not EXAMPLES:
        pytest.skip("no examples/*.yaml yet")
    assert all(p.suffix == ".yaml" for p in EXAMPLES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_crd_agrees_with_the_models(case: Case) -> None:
    """What pydantic refuses, the apiserver refuses too (bar the documented gaps)."""
    pytest.importorskip("celpy")
    errors = apiserver_errors(manifest(case.spec))
    try:
        parse_spec(case.spec)
        model_refuses = False
    except SpecError:
        model_refuses = True
    assert model_refuses == (not case.valid)
    if case.valid:
        assert errors == []
    elif case.crd_refuses:
        assert errors, f"the CRD lets {case.id} through"
    else:
        assert errors == [] or all("additional" in e.lower() for e in errors)


def test_cel_error_paths_name_the_field() -> None:
    pytest.importorskip("celpy")
    spec = cpu_spec()
    spec["framework"]["image"] = "nvcr.io/nvidia/pytorch:24.01-py3"
    spec["mounts"] = [{"source": "../x", "target": "/x"}]
    errors = apiserver_errors(manifest(spec))
    assert any(
        e.startswith(".spec.framework: set exactly one of runtimeId and image") for e in errors
    )
    assert any(
        e.startswith(".spec.mounts[0].source: mount sources cannot contain '..'") for e in errors
    )


# -- the rules of api.scriptwords in the CRD --------------------------------------------------


def test_path_patterns_come_from_the_models() -> None:
    """The path alphabet reaches the CRD as `pattern` through the models (gen.schema copies
    pydantic's JSON schema), and the patterns mean the same in RE2 (the apiserver's Go regexp
    and CEL) as in Python."""
    re2 = pytest.importorskip("re2")
    spec = crd_schema()["properties"]["spec"]["properties"]
    mount = spec["mounts"]["items"]["properties"]
    assert mount["source"]["pattern"] == RELATIVE_PATH_RE
    assert mount["target"]["pattern"] == ABSOLUTE_PATH_RE
    assert spec["workingDir"]["pattern"] == WORKING_DIR_RE
    samples = ["a", "a/b", "/a", "/a/b", "/", "a,b", "/a:b", "/a b", "/a$(x)", "/a//b", "/a/", "/é"]
    for pattern in (RELATIVE_PATH_RE, ABSOLUTE_PATH_RE, WORKING_DIR_RE):
        compiled = re2.compile(pattern)
        for sample in samples:
            ours = re.fullmatch(pattern, sample) is not None
            assert (compiled.search(sample) is not None) == ours, (pattern, sample)


_ENV_RULES = MODEL_RULES[EnvVar]
_NAME = st.one_of(
    st.sampled_from(sorted(RESERVED_ENV_NAMES)),
    st.tuples(
        st.sampled_from(RESERVED_ENV_PREFIXES), st.from_regex(r"[A-Z0-9_]{0,6}", fullmatch=True)
    ).map("".join),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
)


@settings(max_examples=300, deadline=None)
@given(_NAME)
def test_reserved_env_names_agree(name: str) -> None:
    """The CEL rule refuses exactly the names api.scriptwords reserves."""
    celpy = pytest.importorskip("celpy")
    [rule] = [r for r in _ENV_RULES if r.field_path == ".name"]
    ok = _program(rule.rule).evaluate({"self": celpy.json_to_cel({"name": name, "value": "x"})})
    assert bool(ok) == (not reserved_env_name(name))


_WORD = st.one_of(
    st.sampled_from(["", ":", "-", "--", "-x", "::", "a:b", "x", "--jobid=1"]),
    st.text(max_size=6).filter(lambda w: "\0" not in w),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_WORD, min_size=1, max_size=6))
def test_command_rules_agree(command: list[str]) -> None:
    """The CEL rules on spec.command refuse exactly what api.scriptwords refuses."""
    celpy = pytest.importorskip("celpy")
    rules = FIELD_RULES[(SlurmJobSpec, "command")]
    value = celpy.json_to_cel(command)
    cel_ok = all(bool(_program(r.rule).evaluate({"self": value})) for r in rules)
    assert cel_ok == (command_problem(command) is None)


def test_cel_errors_for_script_words_name_the_field() -> None:
    pytest.importorskip("celpy")
    spec = cpu_spec()
    spec["command"] = ["--jobid=4242", ":", "x"]
    spec["env"] = [{"name": "LD_PRELOAD", "value": "/x.so"}]
    spec["mounts"] = [{"source": "./a", "target": "/a/../b"}]
    spec["workingDir"] = "/w/."
    errors = apiserver_errors(manifest(spec))
    for expected in (
        ".spec.command: command[0] cannot start with '-'",
        ".spec.command: no word of the command can be ':'",
        ".spec.env[0].name: this name is reserved",
        ".spec.mounts[0].source: mount sources cannot contain '..' (it would leave",
        ".spec.mounts[0].target: mount targets cannot contain '..' or '.' parts",
        ".spec.workingDir: workingDir cannot contain '..' or '.' parts",
    ):
        assert any(e.startswith(expected) for e in errors), (expected, errors)
    spec = cpu_spec()
    spec["mounts"] = [{"source": "a", "target": "/data$(id>/tmp/x)"}]
    errors = apiserver_errors(manifest(spec))
    assert errors
    assert all(e.startswith("spec.mounts.0.target: ") for e in errors), errors
