"""The spec's intrinsic rules (api.spec), their error paths (api.errors) and the status helpers."""

from __future__ import annotations

import copy
import posixpath
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from slurmjob_operator.api.errors import SpecError, field_path, parse_spec
from slurmjob_operator.api.scriptwords import command_problem
from slurmjob_operator.api.spec import Mount, SlurmJobSpec, parse_time_limit
from slurmjob_operator.api.status import (
    Attempt,
    Condition,
    Logs,
    LogTail,
    Phase,
    SlurmJobStatus,
    get_condition,
    rfc3339,
    set_condition,
)

_DELETE = object()


def cpu_spec() -> dict[str, Any]:
    return {
        "framework": {"kind": "custom", "name": "custom", "runtimeId": "custom-python"},
        "command": ["python", "-c", "print(1)"],
        "pools": [{"name": "main", "cpus": 4, "memoryGb": 8}],
    }


def gpu_spec() -> dict[str, Any]:
    return {
        "framework": {"kind": "custom", "name": "custom", "runtimeId": "custom-trainer"},
        "command": ["torchrun", "train.py"],
        "workingDir": "/workspace",
        "env": [
            {"name": "EPOCHS", "value": "3"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        ],
        "mounts": [{"source": "datasets/imagenet", "target": "/data", "readOnly": True}],
        "pools": [
            {
                "name": "train",
                "gpuSeries": "h100",
                "nodes": 2,
                "gpusPerNode": 8,
                "cpus": 32,
                "memoryGb": 512,
            }
        ],
        "partition": "gpu",
        "timeLimit": "4h",
    }


def het_spec() -> dict[str, Any]:
    spec = gpu_spec()
    spec["pools"] = [
        {
            "name": "policy",
            "gpuSeries": "h100",
            "nodes": 2,
            "gpusPerNode": 8,
            "cpus": 32,
            "memoryGb": 512,
        },
        {"name": "rollout", "gpuSeries": "a100", "gpusPerNode": 4, "cpus": 16, "memoryGb": 256},
    ]
    return spec


def changed(base: dict[str, Any], **updates: Any) -> dict[str, Any]:
    """A copy of `base` with dotted paths (`pools__0__nodes`) set, or removed with _DELETE."""
    out = copy.deepcopy(base)
    for dotted, value in updates.items():
        keys: list[Any] = [int(k) if k.isdigit() else k for k in dotted.split("__")]
        node: Any = out
        for key in keys[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return out


@dataclass(frozen=True)
class Case:
    id: str
    spec: dict[str, Any]
    path: str = ""
    text: str = ""
    crd_refuses: bool = True
    """Whether the CRD schema/CEL also refuses it (False: only the operator can tell)."""

    @property
    def valid(self) -> bool:
        return not self.path


VALID: list[Case] = [
    Case("launch-nodes", changed(gpu_spec(), launch={"shape": "nodes", "masterPort": 29600})),
    Case("launch-torchrun-het", changed(het_spec(), launch={"shape": "torchrun"})),
    Case("launch-ray", changed(gpu_spec(), launch={"shape": "ray"})),
    Case("launch-tasks-gpu-default", changed(gpu_spec(), launch={"shape": "tasks"})),
    Case(
        "launch-tasks-mpi",
        changed(gpu_spec(), launch={"shape": "tasks", "mpi": "pmi2"}, pools__0__tasksPerNode=2),
    ),
    Case(
        "launch-tasks-cpu", changed(cpu_spec(), launch={"shape": "tasks"}, pools__0__tasksPerNode=2)
    ),
    Case("cpu-only", cpu_spec()),
    Case("single-pool-gpu", gpu_spec()),
    Case("two-pool-het", het_spec()),
    Case("gpu-partial-node", changed(gpu_spec(), pools__0__gpusPerNode=2)),
    Case("cpu-only-series-ok", changed(cpu_spec(), pools__0__gpuSeries="h100")),
    Case(
        "non-custom-gpu",
        changed(
            gpu_spec(), framework={"kind": "pytorch", "name": "torch", "runtimeId": "torch-2.5"}
        ),
    ),
    Case("time-int", changed(cpu_spec(), timeLimit=90)),
    Case("time-digits", changed(cpu_spec(), timeLimit="90")),
    Case("time-90m", changed(cpu_spec(), timeLimit="90m")),
    Case("time-4h", changed(cpu_spec(), timeLimit="4h")),
    Case("time-1d2h", changed(cpu_spec(), timeLimit="1d2h")),
    Case("time-1d2h30m", changed(cpu_spec(), timeLimit="1d2h30m")),
    Case("time-spaces", changed(cpu_spec(), timeLimit=" 45m ")),
    Case("time-max", changed(cpu_spec(), timeLimit=525600)),
    Case("time-365d", changed(cpu_spec(), timeLimit="365d")),
    Case("mode-batch", changed(cpu_spec(), mode="Batch")),
    Case("volumes-empty", changed(cpu_spec(), data={"volumes": []})),
    Case("mount-dots-in-name", changed(cpu_spec(), mounts=[{"source": "a..b/.x", "target": "/x"}])),
    Case(
        "mount-path-alphabet",
        changed(cpu_spec(), mounts=[{"source": "A-z_0.9+x/y", "target": "/a-b/c_d.e+f"}]),
    ),
    Case("workdir-root", changed(cpu_spec(), workingDir="/")),
    Case("retry", changed(cpu_spec(), retry={"limit": 3})),
    Case("array", changed(cpu_spec(), array={"count": 20, "parallelism": 3})),
    Case("array-one-task", changed(cpu_spec(), array={"count": 1})),
    Case("array-gpu-multi-node", changed(gpu_spec(), array={"count": 10_000})),
    # Only exactly ':' and a first word starting with '-' are srun's; the rest is the command's.
    Case(
        "command-dashes-and-colons-later",
        changed(cpu_spec(), command=["python", "--", "-x", "::", "a:b", " : ", "--jobid=1"]),
    ),
    Case("command-first-word-colon-inside", changed(cpu_spec(), command=["a:b"])),
    Case(
        "env-names-for-the-container",
        changed(
            cpu_spec(),
            env=[
                {"name": n, "value": "1"}
                for n in ("PYTHONPATH", "TERM", "LANG", "OMP_NUM_THREADS", "CUDA_HOME", "path")
            ],
        ),
    ),
]

INVALID: list[Case] = [
    Case(
        "launch-nodes-cpu",
        changed(cpu_spec(), launch={"shape": "nodes"}),
        "spec.launch",
        "takes only tasks",
    ),
    Case(
        "launch-mpi-not-tasks",
        changed(gpu_spec(), launch={"shape": "nodes", "mpi": "pmi2"}),
        "spec.launch",
        "is for launch shape tasks",
    ),
    Case(
        "launch-tasks-per-node-without-tasks",
        changed(gpu_spec(), pools__0__tasksPerNode=2),
        "spec.launch",
        "is for shape tasks",
    ),
    Case(
        "launch-tasks-not-dividing-gpus",
        changed(gpu_spec(), launch={"shape": "tasks"}, pools__0__tasksPerNode=3),
        "spec.launch",
        "must divide gpusPerNode",
    ),
    Case(
        "launch-tasks-not-dividing-cpus",
        changed(cpu_spec(), launch={"shape": "tasks"}, pools__0__tasksPerNode=3),
        "spec.launch",
        "and cpus",
    ),
    Case(
        "launch-mpi-option",
        changed(gpu_spec(), launch={"shape": "tasks", "mpi": "--mpi=x"}),
        "spec.launch.mpi",
        "pattern",
    ),
    Case(
        "launch-port-low",
        changed(gpu_spec(), launch={"shape": "nodes", "masterPort": 80}),
        "spec.launch.masterPort",
        "greater than or equal to 1024",
    ),
    Case(
        "array-of-a-het-job",
        changed(het_spec(), array={"count": 4}),
        "spec.array",
        "an array has exactly one pool",
    ),
    Case(
        "array-empty",
        changed(cpu_spec(), array={"count": 0}),
        "spec.array.count",
        "greater than or equal to 1",
    ),
    Case(
        "array-too-big",
        changed(cpu_spec(), array={"count": 10_001}),
        "spec.array.count",
        "less than or equal to 10000",
    ),
    Case(
        "array-parallelism-zero",
        changed(cpu_spec(), array={"count": 4, "parallelism": 0}),
        "spec.array.parallelism",
        "greater than or equal to 1",
    ),
    Case(
        "array-unknown-field",
        changed(cpu_spec(), array={"count": 4, "tasks": "0-3"}),
        "spec.array.tasks",
        "Extra inputs are not permitted",
    ),
    Case(
        "framework-image-without-registry",
        changed(cpu_spec(), framework__image="python:3.11"),
        "spec.framework.image",
        "should match pattern",
    ),
    Case(
        "framework-image-and-runtime",
        changed(cpu_spec(), framework__image="nvcr.io/nvidia/pytorch:24.01-py3"),
        "spec.framework",
        "set exactly one of runtimeId and image",
    ),
    Case(
        "custom-runtime-prefix",
        changed(cpu_spec(), framework__runtimeId="python"),
        "spec.framework",
        "custom runtimes must have ids starting with 'custom-'",
    ),
    Case(
        "cpu-only-two-pools",
        changed(
            cpu_spec(),
            pools=[
                {"name": "a", "cpus": 1, "memoryGb": 1},
                {"name": "b", "cpus": 1, "memoryGb": 1},
            ],
        ),
        "spec.pools",
        "a CPU-only job has exactly one pool",
    ),
    Case(
        "cpu-only-two-nodes",
        changed(cpu_spec(), pools__0__nodes=2),
        "spec.pools",
        "multi-node CPU jobs are not supported",
    ),
    Case(
        "cpu-only-not-custom",
        changed(cpu_spec(), framework={"kind": "pytorch", "name": "torch", "runtimeId": "t"}),
        "spec",
        "must use framework custom/custom",
    ),
    Case(
        "cpu-only-custom-kind-other-name",
        changed(cpu_spec(), framework__name="other"),
        "spec",
        "must use framework custom/custom",
    ),
    Case(
        "gpu-job-with-cpu-pool",
        changed(het_spec(), pools__1__gpusPerNode=0, pools__1__gpuSeries=_DELETE),
        "spec.pools",
        "pool rollout: gpusPerNode is 0 in a GPU job",
    ),
    Case(
        "scratch",
        changed(cpu_spec(), pools__0__scratchGb=100),
        "spec.pools[0].scratchGb",
        "scratch requests are not supported",
    ),
    Case(
        "mode-playground",
        changed(cpu_spec(), mode="Playground"),
        "spec.mode",
        "Playground is not supported on Slurm",
    ),
    Case(
        "mode-deployment",
        changed(cpu_spec(), mode="Deployment"),
        "spec.mode",
        "Deployment is not supported on Slurm",
    ),
    Case("mode-unknown", changed(cpu_spec(), mode="Interactive"), "spec.mode", "Input should be"),
    Case(
        "data-volumes",
        changed(cpu_spec(), data={"volumes": [{"name": "ds"}]}),
        "spec.data.volumes",
        "volume mounts are not supported on Slurm",
    ),
    Case(
        "mount-dotdot",
        changed(cpu_spec(), mounts=[{"source": "a/../../etc", "target": "/x"}]),
        "spec.mounts[0].source",
        "'..' would leave the storage root",
    ),
    Case(
        "mount-dotdot-only",
        changed(cpu_spec(), mounts=[{"source": "..", "target": "/x"}]),
        "spec.mounts[0].source",
        "'..' would leave the storage root",
    ),
    Case(
        "mount-absolute",
        changed(cpu_spec(), mounts=[{"source": "/etc", "target": "/x"}]),
        "spec.mounts[0].source",
        "not absolute host paths",
    ),
    Case(
        "mount-comma",
        changed(cpu_spec(), mounts=[{"source": "a,b", "target": "/x"}]),
        "spec.mounts[0].source",
        "may only use",
    ),
    *[
        Case(
            f"mount-target-{label}",
            changed(cpu_spec(), mounts=[{"source": "a", "target": target}]),
            "spec.mounts[0].target",
            text,
        )
        for label, target, text in (
            ("command-substitution", "/data$(id>/tmp/x)", "may only use"),
            ("backticks", "/data`id`", "may only use"),
            ("quote", "/data'x", "may only use"),
            ("space", "/da ta", "may only use"),
            ("newline", "/data\nx", "may only use"),
            ("colon", "/data:/etc", "may only use"),
            ("comma", "/a,/b", "may only use"),
            ("unicode", "/dätä", "may only use"),
            ("empty-part", "/a//b", "empty parts"),
            ("trailing-slash", "/data/", "empty parts"),
            ("dot-part", "/a/./b", "'.' or '..' parts"),
        )
    ],
    Case(
        "mount-source-command-substitution",
        changed(cpu_spec(), mounts=[{"source": "d$(id)", "target": "/x"}]),
        "spec.mounts[0].source",
        "may only use",
    ),
    Case(
        "mount-source-dot-part",
        changed(cpu_spec(), mounts=[{"source": "./data", "target": "/x"}]),
        "spec.mounts[0].source",
        "'.' or '..' parts",
    ),
    Case(
        "mount-source-empty-part",
        changed(cpu_spec(), mounts=[{"source": "a//b", "target": "/x"}]),
        "spec.mounts[0].source",
        "empty parts",
    ),
    Case(
        "mount-target-relative",
        changed(cpu_spec(), mounts=[{"source": "a", "target": "xy"}]),
        "spec.mounts[0].target",
        "must be absolute",
    ),
    Case(
        "mount-target-dotdot",
        changed(cpu_spec(), mounts=[{"source": "a", "target": "/a/.."}]),
        "spec.mounts[0].target",
        "cannot contain '..'",
    ),
    Case(
        "mount-targets-duplicate",
        changed(
            cpu_spec(), mounts=[{"source": "a", "target": "/x"}, {"source": "b", "target": "/x"}]
        ),
        "spec.mounts",
        "mount targets must be unique",
    ),
    Case(
        "env-both",
        changed(
            cpu_spec(),
            env=[
                {
                    "name": "A",
                    "value": "1",
                    "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
                }
            ],
        ),
        "spec.env[0]",
        "env A: set exactly one of value and valueFrom",
    ),
    Case(
        "env-neither",
        changed(cpu_spec(), env=[{"name": "A"}]),
        "spec.env[0]",
        "set exactly one of value and valueFrom",
    ),
    Case(
        "env-reserved-slurm",
        changed(cpu_spec(), env=[{"name": "SLURM_JOB_ID", "value": "1"}]),
        "spec.env[0].name",
        "reserved",
    ),
    Case(
        "env-reserved-slurmjob",
        changed(cpu_spec(), env=[{"name": "SLURMJOB_X", "value": "1"}]),
        "spec.env[0].name",
        "reserved",
    ),
    *[
        Case(
            f"env-reserved-{name.lower()}",
            changed(cpu_spec(), env=[{"name": "OK", "value": "1"}, {"name": name, "value": "x"}]),
            "spec.env[1].name",
            "reserved",
        )
        for name in (
            "PATH",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "HOME",
            "TMPDIR",
            "BASH_ENV",
            "ENV",
            "IFS",
            "PS4",
            "SHELLOPTS",
            "BASHOPTS",
            "PROMPT_COMMAND",
            "ENROOT_MOUNT_HOME",
            "PYXIS_CONTAINER_IMAGE",
            "APPTAINER_BIND",
            "APPTAINERENV_PATH",
            "SINGULARITYENV_LD_PRELOAD",
            "SINGULARITY_BIND",
            "XDG_CONFIG_HOME",
            "_SLURM_SPANK_OPTION_pyxis_container_mounts",
            "SLURMD_NODENAME",
            "SRUN_EXPORT_ENV",
            "SPANK_PYXIS",
            "GLIBC_TUNABLES",
            "NVIDIA_VISIBLE_DEVICES",
            "MASTER_ADDR",
            "RAY_ADDRESS",
        )
    ],
    Case(
        "env-reserved-secret",
        changed(
            cpu_spec(),
            env=[{"name": "PATH", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        ),
        "spec.env[0].name",
        "reserved",
    ),
    Case(
        "env-bad-name",
        changed(cpu_spec(), env=[{"name": "1A", "value": "1"}]),
        "spec.env[0].name",
        "String should match pattern",
    ),
    Case(
        "env-duplicate",
        changed(cpu_spec(), env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
        "spec.env",
        "env names must be unique",
    ),
    Case(
        "pools-duplicate",
        changed(het_spec(), pools__1__name="policy"),
        "spec.pools",
        "pool names must be unique",
    ),
    Case("pools-empty", changed(cpu_spec(), pools=[]), "spec.pools", "at least 1 item"),
    Case(
        "pool-bad-name",
        changed(cpu_spec(), pools__0__name="Main"),
        "spec.pools[0].name",
        "String should match pattern",
    ),
    Case(
        "gpus-without-series",
        changed(gpu_spec(), pools__0__gpuSeries=_DELETE),
        "spec.pools[0]",
        "gpusPerNode > 0 needs a gpuSeries",
    ),
    Case(
        "gpus-negative",
        changed(cpu_spec(), pools__0__gpusPerNode=-1),
        "spec.pools[0].gpusPerNode",
        "Input should be greater than or equal to 0",
    ),
    Case(
        "cpus-zero",
        changed(cpu_spec(), pools__0__cpus=0),
        "spec.pools[0].cpus",
        "greater than or equal to 1",
    ),
    Case("time-bad-unit", changed(cpu_spec(), timeLimit="90x"), "spec.timeLimit", "timeLimit"),
    Case("time-empty", changed(cpu_spec(), timeLimit=""), "spec.timeLimit", "timeLimit"),
    Case("time-zero", changed(cpu_spec(), timeLimit=0), "spec.timeLimit", "at least one minute"),
    Case("time-zero-str", changed(cpu_spec(), timeLimit="0"), "spec.timeLimit", "at least one"),
    Case("time-zero-m", changed(cpu_spec(), timeLimit="0m"), "spec.timeLimit", "at least one"),
    Case("time-negative", changed(cpu_spec(), timeLimit=-5), "spec.timeLimit", "at least one"),
    Case("time-fraction", changed(cpu_spec(), timeLimit="1.5h"), "spec.timeLimit", "timeLimit"),
    Case("time-order", changed(cpu_spec(), timeLimit="2h1d"), "spec.timeLimit", "timeLimit"),
    Case("time-unit-only", changed(cpu_spec(), timeLimit="h"), "spec.timeLimit", "timeLimit"),
    Case("time-too-long", changed(cpu_spec(), timeLimit=525601), "spec.timeLimit", "365 days"),
    Case(
        "time-too-long-str",
        changed(cpu_spec(), timeLimit="366d"),
        "spec.timeLimit",
        "365 days",
        crd_refuses=False,
    ),
    Case("time-list", changed(cpu_spec(), timeLimit=[90]), "spec.timeLimit", "valid integer"),
    Case("command-empty", changed(cpu_spec(), command=[]), "spec.command", "at least 1 item"),
    Case(
        "command-empty-arg0",
        changed(cpu_spec(), command=[""]),
        "spec.command",
        "command[0] cannot be empty",
    ),
    Case(
        "command-srun-options",  # issue 9, finding 4: srun would have read these as its own
        changed(
            cpu_spec(),
            command=["--container-mounts=/:/host", "--jobid=4242", "bash", "-c", "ls /host"],
        ),
        "spec.command",
        "command[0] '--container-mounts=/:/host' starts with '-'",
    ),
    Case("command-dash", changed(cpu_spec(), command=["-"]), "spec.command", "starts with '-'"),
    Case(
        "command-colon-word",
        changed(cpu_spec(), command=["bash", "-c", "true", ":", "--jobid=4242", "id"]),
        "spec.command",
        "command[3] is ':'",
    ),
    Case("command-colon-first", changed(cpu_spec(), command=[":"]), "spec.command", "is ':'"),
    Case(
        "command-too-many-words",
        changed(cpu_spec(), command=["x"] * 4097),
        "spec.command",
        "at most 4096 items",
    ),
    Case(
        "workdir-relative",
        changed(cpu_spec(), workingDir="work"),
        "spec.workingDir",
        "absolute path",
    ),
    Case(
        "workdir-shell",
        changed(cpu_spec(), workingDir="/w$(id)"),
        "spec.workingDir",
        "may only use",
    ),
    Case(
        "workdir-dotdot",
        changed(cpu_spec(), workingDir="/w/../etc"),
        "spec.workingDir",
        "'.' or '..' parts",
    ),
    Case(
        "workdir-empty-part",
        changed(cpu_spec(), workingDir="/w//x"),
        "spec.workingDir",
        "empty parts",
    ),
    Case(
        "unknown-field",
        changed(cpu_spec(), replicas=2),
        "spec.replicas",
        "Extra inputs are not permitted",
        crd_refuses=False,
    ),
    Case(
        "missing-framework",
        changed(cpu_spec(), framework=_DELETE),
        "spec.framework",
        "Field required",
    ),
    Case(
        "retry-too-many",
        changed(cpu_spec(), retry={"limit": 21}),
        "spec.retry.limit",
        "less than or equal to 20",
    ),
]
"""`crd_refuses=False`: the apiserver prunes unknown fields (kubectl --validate=strict refuses
them) and cannot compute a duration's range in CEL; the operator refuses both."""

CASES = VALID + INVALID


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.id)
def test_valid_specs_parse(case: Case) -> None:
    spec = parse_spec(case.spec)
    assert isinstance(spec, SlurmJobSpec)


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_specs_name_the_field(case: Case) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(case.spec)
    expected = f"{case.path}: "
    hits = [m for m in caught.value.messages if m.startswith(expected) and case.text in m]
    assert hits, f"no message at {case.path} containing {case.text!r}: {caught.value.messages}"


def test_spec_error_shape() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(changed(cpu_spec(), pools__0__gpusPerNode=-1))
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.field == "spec.pools[0].gpusPerNode"
    assert error.messages == [
        "spec.pools[0].gpusPerNode: Input should be greater than or equal to 0"
    ]
    assert str(error) == error.messages[0]


def test_value_error_prefix_is_stripped() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(changed(cpu_spec(), framework__runtimeId="x"))
    assert caught.value.messages == [
        "spec.framework: runtimeId 'x': custom runtimes must have ids starting with 'custom-'"
    ]


def test_union_member_tags_are_not_in_paths() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(changed(cpu_spec(), timeLimit={"h": 1}))
    assert {m.split(": ")[0] for m in caught.value.messages} == {"spec.timeLimit"}


def test_every_problem_is_reported() -> None:
    spec = changed(cpu_spec(), pools__0__cpus=0, framework__image="x", mode="Playground")
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    fields = {m.split(": ")[0] for m in caught.value.messages}
    assert {"spec.pools[0].cpus", "spec.framework.image", "spec.mode"} <= fields


def test_parse_spec_refuses_non_objects() -> None:
    with pytest.raises(SpecError, match=r"^spec: must be an object"):
        parse_spec(None)


def test_parse_spec_accepts_mapping_views() -> None:
    class View(dict[str, Any]):
        pass

    spec = parse_spec(View(cpu_spec()))
    assert spec.pools[0].name == "main"


def test_field_path_for_snake_case_and_maps() -> None:
    assert field_path(SlurmJobSpec, ("pools", 1, "memory_gb")) == "spec.pools[1].memoryGb"
    assert field_path(SlurmJobSpec, ("data", "volumes", 0, "x")) == "spec.data.volumes[0]['x']"
    assert field_path(SlurmJobSpec, (), root="x") == "x"


def test_spec_properties() -> None:
    cpu = parse_spec(cpu_spec())
    assert cpu.is_cpu_only
    assert not cpu.is_heterogeneous
    assert cpu.time_limit_minutes is None
    het = parse_spec(het_spec())
    assert het.is_heterogeneous
    assert not het.is_cpu_only
    assert het.time_limit_minutes == 240
    assert het.plain_env == {"EPOCHS": "3"}
    assert [e.name for e in het.secret_env] == ["HF_TOKEN"]


def test_spec_defaults() -> None:
    spec = parse_spec(cpu_spec())
    assert spec.pools[0].nodes == 1
    assert spec.pools[0].gpus_per_node == 0
    assert spec.retry.limit == 0
    assert spec.data.volumes == []
    assert spec.mode == "Batch"


# -- timeLimit ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "minutes"),
    [
        (90, 90),
        ("90", 90),
        ("90m", 90),
        ("4h", 240),
        ("1d2h", 1560),
        ("1d2h30m", 1590),
        ("2d", 2880),
        (" 15m ", 15),
        ("0d1m", 1),
    ],
)
def test_time_limit_minutes(value: int | str, minutes: int) -> None:
    assert parse_time_limit(value) == minutes


@pytest.mark.parametrize("value", ["", " ", "m", "90s", "1h90", "1.5h", "-1", "1d 2h", "4H", True])
def test_time_limit_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="timeLimit"):
        parse_time_limit(value)


@given(
    days=st.none() | st.integers(0, 400),
    hours=st.none() | st.integers(0, 100),
    mins=st.none() | st.integers(0, 10_000),
)
def test_time_limit_strings_round_trip(
    days: int | None, hours: int | None, mins: int | None
) -> None:
    text = "".join(f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (mins, "m")) if v is not None)
    expected = (days or 0) * 1440 + (hours or 0) * 60 + (mins or 0)
    if not text or expected < 1 or expected > 365 * 1440:
        with pytest.raises(ValueError, match="timeLimit"):
            parse_time_limit(text)
    else:
        assert parse_time_limit(text) == expected
        assert parse_spec(changed(cpu_spec(), timeLimit=text)).time_limit_minutes == expected


@given(st.integers(-10, 600_000))
def test_time_limit_ints(value: int) -> None:
    if 1 <= value <= 525600:
        assert parse_time_limit(value) == value
        assert parse_time_limit(str(value)) == value
    else:
        with pytest.raises(ValueError, match="timeLimit"):
            parse_time_limit(value)


# -- mount sources never escape the storage root -----------------------------------------------

_SEGMENTS = st.sampled_from(["a", "b", ".", "..", "...", "..a", "", "x.y", "c d"])


@given(st.lists(_SEGMENTS, min_size=1, max_size=6), st.booleans())
def test_mount_sources_stay_under_the_root(segments: list[str], absolute: bool) -> None:
    source = ("/" if absolute else "") + "/".join(segments)
    root = "/storage/root"
    try:
        mount = Mount(source=source, target="/mnt")
    except ValidationError:
        return
    resolved = posixpath.normpath(posixpath.join(root, mount.source))
    assert resolved == root or resolved.startswith(root + "/")


# -- status -------------------------------------------------------------------------------------

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_rfc3339() -> None:
    assert rfc3339(T0) == "2026-01-02T03:04:05Z"
    assert rfc3339(T0.astimezone(UTC).replace(microsecond=5)) == "2026-01-02T03:04:05Z"
    with pytest.raises(ValueError, match="timezone"):
        rfc3339(datetime(2026, 1, 1))  # noqa: DTZ001


def test_set_condition_moves_transition_time_only_on_flips() -> None:
    t1, t2, t3 = T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    conds = set_condition([], "Submitted", "False", "Submitting", "", 1, t1)
    assert conds[0].last_transition_time == rfc3339(t1)
    conds = set_condition(conds, "Submitted", "False", "SubmitRetrying", "503", 2, t2)
    assert conds[0].last_transition_time == rfc3339(t1)
    assert (conds[0].reason, conds[0].message, conds[0].observed_generation) == (
        "SubmitRetrying",
        "503",
        2,
    )
    conds = set_condition(conds, "Submitted", "True", "Submitted", "job 42", 2, t3)
    assert conds[0].last_transition_time == rfc3339(t3)


def test_set_condition_upserts_in_place_and_returns_a_new_list() -> None:
    first = set_condition([], "Submitted", "True", "Submitted", "", 1, T0)
    both = set_condition(first, "Running", "Unknown", "Queued", "", 1, T0)
    again = set_condition(both, "Submitted", "False", "Lost", "", 1, T0)
    assert [c.type for c in again] == ["Submitted", "Running"]
    assert len(first) == 1
    assert both[0].status == "True"
    assert get_condition(again, "Submitted") is not None
    assert get_condition(again, "Ready") is None


def test_condition_reason_must_be_camel_case() -> None:
    with pytest.raises(ValidationError):
        Condition(type="Ready", status="True", reason="not camel", last_transition_time="x")
    with pytest.raises(ValidationError):
        Condition(type="Ready", status="Maybe", reason="Ok", last_transition_time="x")  # type: ignore[arg-type]


def test_status_dump_is_camel_case_without_nulls() -> None:
    status = SlurmJobStatus(
        phase=Phase.QUEUED,
        attempts=[Attempt(number=1, job_name="k8s-abc", job_id=42)],
        slurm_job_id=42,
        logs=Logs(stdout=LogTail(tail="hi\n", bytes=3, lines=1)),
    )
    dumped = status.dump()
    assert dumped["phase"] == "Queued"
    assert dumped["slurmJobId"] == 42
    assert dumped["attempts"] == [
        {
            "number": 1,
            "jobName": "k8s-abc",
            "jobId": 42,
            "nativeFlags": [],
            "confirmed": False,
            "declaredLost": False,
        }
    ]
    assert dumped["logs"] == {
        "stdout": {"tail": "hi\n", "truncated": False, "bytes": 3, "lines": 1}
    }
    assert "message" not in dumped
    assert SlurmJobStatus.parse(dumped) == status
    assert status.current_attempt is not None
    assert status.current_attempt.job_id == 42


def test_status_parse_ignores_unknown_fields() -> None:
    assert (
        SlurmJobStatus.parse({"phase": "Running", "kopf": {"progress": {}}}).phase is Phase.RUNNING
    )
    assert SlurmJobStatus.parse(None) == SlurmJobStatus()


def test_phase_terminal() -> None:
    assert {p for p in Phase if p.is_terminal} == {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}


# -- what reaches the batch script (api.scriptwords) -------------------------------------------

_PATH_TEXT = st.one_of(
    st.text(max_size=16),
    st.lists(
        st.sampled_from(["a", ".", "..", "", "$(id)", "`x`", "'", " ", ",", ":", "\n", "é"])
    ).map("/".join),
)


@given(_PATH_TEXT, st.sampled_from(["source", "target", "workingDir"]))
def test_accepted_paths_use_only_the_safe_alphabet(text: str, field: str) -> None:
    """Whatever a manifest writes, a path that validation lets through is canonical and of
    the safe alphabet: no shell, no list separator, no '.', '..' or empty part."""
    value = text if field == "source" else "/" + text
    spec = changed(cpu_spec(), mounts=[{"source": "a", "target": "/a"}])
    if field == "workingDir":
        spec["workingDir"] = value
    else:
        spec["mounts"][0][field] = value
    messages: list[str] = []
    try:
        parse_spec(spec)
    except SpecError as exc:
        messages = exc.messages
    if messages:
        where = "spec.workingDir" if field == "workingDir" else f"spec.mounts[0].{field}"
        assert all(m.startswith(where) for m in messages), messages
        return
    assert re.fullmatch(r"[/A-Za-z0-9._+-]*", value)
    parts = value.split("/")[1:] if value.startswith("/") else value.split("/")
    assert value == "/" or not {"", ".", ".."} & set(parts)


@given(st.lists(st.one_of(st.sampled_from([":", "-", "--x", "a"]), st.text(max_size=4))))
def test_command_refusals(command: list[str]) -> None:
    """The command is refused, at spec.command, exactly when command_problem says so."""
    spec = changed(cpu_spec(), command=command)
    problem = command_problem(command)
    if problem is None and command:
        assert parse_spec(spec).command == command
        return
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    assert all(m.startswith("spec.command: ") for m in caught.value.messages)
