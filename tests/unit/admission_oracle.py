"""The chart's admission policy against the reconciler's own word, on one table of manifests
(no tests here): tests/unit/test_admission.py evaluates the policy's CEL with cel-python,
tests/integration/test_admission_e2e.py applies the same manifests through the real
apiserver; both compare with `reconciler_refusal`.

`reconciler_refusal` runs the reconciler's own functions in its own order (the gate of a
required queue, `Tenants.scope`, `Clusters.refusal`, `requested_image`, `prepare_attempt`,
which resolves the site and plans the walltime), classified as the sender classifies them:
what the SlurmJob would end `Failed` with, as reason and message, with no admission policy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.gates.queue import required_queue_refusal
from slurmjob_operator.controller.pipeline import Site, prepare_attempt
from slurmjob_operator.controller.sender import PREPARE_ERRORS, classify
from slurmjob_operator.core.decisions import FAILURES
from slurmjob_operator.core.limits import PartitionUnavailable
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.gen.admissioncel import OPERATOR, REFUSE, SITE
from slurmjob_operator.imagecache.gate import requested_image
from slurmjob_operator.site.admission import admission_params, literal
from slurmjob_operator.site.tenants import Tenants, load_tenants

from .controller_fakes import cpu_spec, make_settings

#: The clusters of the table's site, the default first.
CLUSTERS = ("default", "west", "east")
QUEUE = "kueue.x-k8s.io/queue-name"
#: What `prepare_attempt` says of an image spec whose rules pass (the cache has no entry).
NO_ENTRY = "spec.framework.image: the image cache has no entry for it yet"


def tenants(ns: Mapping[str, str]) -> list[dict[str, Any]]:
    """The table's tenants file; `ns` names the namespaces of roles alpha, queued, beta."""
    return [
        {
            "name": "alpha",
            "namespaces": [ns["alpha"]],
            "accounts": ["acct-a", "acct-a2"],
            "partitions": ["debug", "gpu"],
            "qos": ["normal", "low"],
            "mountSources": ["datasets/alpha", "./datasets//shared/"],
            "maxTimeLimit": "2h",
            "maxTotalTime": "3d",
            "imageRegistries": ["registry.example/alpha"],
            "clusters": {
                "default": {},
                "west": {"partitions": ["a100"], "maxTimeLimit": 60, "mountSources": None},
            },
        },
        {
            "name": "queued",
            "namespaces": [ns["queued"]],
            "accounts": ["acct-q"],
            "partitions": ["debug"],
            "requireQueue": True,
        },
        {
            "name": "beta",
            "namespaces": [ns["beta"]],
            "accounts": ["acct-b"],
            "partitions": ["debug"],
            "mountSources": ["datasets/shared", "datasets/beta", "datasets/alpha/beta-only"],
        },
    ]


#: The site's settings that feed rules (besides make_settings' storage root and runtime).
SITE_SETTINGS: dict[str, Any] = {
    "max_total_time": "5d",
    "images_enabled": True,
    "image_cache_root": "/var/lib/slurmjob-images",
    "image_cache_user": "imgcache",
    "image_cache_uid": 2999,
    "image_import_partition": "debug",
    "slurm_rest_user": "slurmjob",
    "mpi_plugins": "pmi2",
}

#: The chart values that set the same site (tests/integration/test_admission_e2e.py).
CHART_SITE: dict[str, Any] = {
    "clusterName": "default",
    "clusters": [{"name": "west"}, {"name": "east"}],
    "walltime": {"maxTotalTime": "5d"},
    "mpiPlugins": ["pmi2"],
    "slurm": {"user": "slurmjob", "auth": {"mode": "signingKey"}},
    "images": {
        "enabled": True,
        "cacheUser": "imgcache",
        "cacheUid": 2999,
        "import": {"partition": "debug"},
        "cache": {"hostPath": "/var/lib/slurmjob-images"},
    },
}


@dataclass(frozen=True)
class Case:
    id: str
    role: str  # alpha, queued, beta, or none (a namespace of no tenant)
    spec: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    refused: bool = True


def _mount(source: str, read_only: bool = False) -> dict[str, Any]:
    return {"source": source, "target": "/data", "readOnly": read_only}


def _walltime(total: str, segment: str) -> dict[str, Any]:
    return {"walltime": {"totalTime": total, "segmentTime": segment}, "timeLimit": None}


CASES: tuple[Case, ...] = (
    Case("admitted", "alpha", refused=False),
    Case("admitted-defaults", "beta", refused=False),
    Case("tenant-unknown", "none"),
    Case("queue-required", "queued"),
    Case("queue-given", "queued", labels={QUEUE: "team-q"}, refused=False),
    Case("cluster-of-another-tenant", "alpha", {"cluster": "east"}),
    Case("cluster-unknown", "alpha", {"cluster": "nowhere"}),
    Case("account", "alpha", {"account": "acct-b"}),
    Case("account-quoted", "alpha", {"account": "it's"}),
    Case("partition-list", "alpha", {"partition": "debug,gpu"}),
    Case("partition", "alpha", {"partition": "batch"}),
    Case("qos", "alpha", {"qos": "high"}),
    Case("qos-unlimited", "beta", {"qos": "high"}, refused=False),
    Case("time-limit", "alpha", {"timeLimit": "3h"}),
    Case("time-limit-minutes", "alpha", {"timeLimit": 121}),
    Case("time-limit-at-most", "alpha", {"timeLimit": "1h60m"}, refused=False),
    Case("section-partition", "alpha", {"cluster": "west", "partition": "debug"}),
    Case("section-time-limit", "alpha", {"cluster": "west", "partition": "a100", "timeLimit": 90}),
    Case("section-no-mounts", "alpha", {"cluster": "west", "mounts": [_mount("datasets/alpha")]}),
    Case("mount-not-listed", "alpha", {"mounts": [_mount("datasets/other")]}),
    Case("mount-prefix-not-a-component", "alpha", {"mounts": [_mount("datasets/alphabet")]}),
    Case("mount-shared-read-write", "alpha", {"mounts": [_mount("datasets/shared/x")]}),
    Case(
        "mount-shared-read-only", "alpha", {"mounts": [_mount("datasets/shared", True)]}, {}, False
    ),
    Case("mount-over-another-tenant", "alpha", {"mounts": [_mount("datasets/alpha", True)]}),
    Case("mount-into-another-tenant", "alpha", {"mounts": [_mount("datasets/alpha/beta-only/x")]}),
    Case("mount-own-read-write", "alpha", {"mounts": [_mount("datasets/alpha/own")]}, {}, False),
    Case(
        "mount-second-of-two",
        "alpha",
        {"mounts": [_mount("datasets/alpha/own"), {**_mount("datasets/x"), "target": "/x"}]},
    ),
    Case("mount-staging-tree", "beta", {"mounts": [_mount("@beta/x")]}),
    Case(
        "image-admitted",
        "alpha",
        {
            "framework": {
                "kind": "custom",
                "name": "custom",
                "image": "registry.example/alpha/train:1",
            }
        },
        refused=False,
    ),
    Case(
        "image-registry",
        "alpha",
        {
            "framework": {
                "kind": "custom",
                "name": "custom",
                "image": "registry.example/other/train:1",
            }
        },
    ),
    Case(
        "image-no-registry",
        "beta",
        {"framework": {"kind": "custom", "name": "custom", "image": "registry.example/beta/x:1"}},
    ),
    Case("mpi", "beta", {"launch": {"shape": "tasks", "mpi": "pmix"}}),
    Case("total-time-tenant", "alpha", _walltime("4d", "1h")),
    Case("total-time-site", "beta", _walltime("6d", "1h")),
    Case("segment-time", "alpha", _walltime("2d", "3h")),
    Case("two-at-once", "alpha", {"account": "acct-b", "qos": "high", "timeLimit": "3h"}),
)


def namespace_of(case: Case, ns: Mapping[str, str]) -> str:
    return ns[case.role]


def manifest(case: Case, ns: Mapping[str, str], name: str | None = None) -> dict[str, Any]:
    """The case's SlurmJob (`@<role>` in a mount source is that role's namespace)."""
    spec = cpu_spec()
    for key, value in case.spec.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    text = json.dumps(spec)
    for role, namespace in ns.items():
        text = text.replace(f"@{role}", namespace)
    metadata: dict[str, Any] = {"name": name or case.id, "namespace": namespace_of(case, ns)}
    if case.labels:
        metadata["labels"] = dict(case.labels)
    return {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": metadata,
        "spec": json.loads(text),
    }


# -- the reconciler's word --------------------------------------------------------------------


def site_settings(tmp: Path, ns: Mapping[str, str], **overrides: Any) -> Settings:
    """The table's site: make_settings' storage root and runtime, its tenants file."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "tenants.yaml"
    path.write_text(yaml.safe_dump({"tenants": tenants(ns)}))
    key = tmp / "jwt.key"
    key.write_bytes(b"k" * 32)
    values = {**SITE_SETTINGS, "tenants_file": path, "slurm_jwt_key_file": key}
    return make_settings(tmp, **{**values, **overrides})


def reconciler_refusal(
    obj: Mapping[str, Any], settings: Settings, clusters: Sequence[str] = CLUSTERS
) -> tuple[str, str] | None:
    """(reason, message) the reconciler fails this SlurmJob with before anything is staged
    for a static rule; None when those pass (what needs Slurm, a Secret or the image cache
    is not asked)."""
    namespace = obj["metadata"]["namespace"]
    labels = obj["metadata"].get("labels", {})
    spec = parse_spec(obj["spec"])
    names = Clusters(tuple(clusters))
    tenants = load_tenants(settings.tenants_file, clusters)
    default = tenants.default_cluster(namespace) if tenants is not None else None
    placed = names.choose(spec.cluster, default)
    site = Site.load(settings.model_copy(update={"cluster_name": placed}), list(clusters))
    text = required_queue_refusal(site.tenant_of(namespace), namespace, labels)
    if text is not None:
        return "InvalidSpec", text
    try:
        scope = site.scope(namespace)  # TenantUnknown, TenantClusterDenied
        refused = names.refusal(spec.cluster, placed)
        if refused is not None:
            raise SpecError([refused])
        if spec.framework.image is not None:
            requested_image(site.settings, spec, scope)
        prepare_attempt(
            spec,
            site,
            namespace=namespace,
            name=obj["metadata"]["name"],
            uid="00000000-0000-0000-0000-0000000000a1",
            attempt=1,
            api_version="v0.0.45",
            secret_values={},
        )
    except PartitionUnavailable:  # a segment time from a MaxTime not read: not static
        return None
    except SpecError as exc:
        if exc.messages == [NO_ENTRY]:  # an image the cache would import: the rules passed
            return None
        reason = FAILURES[classify(exc, recorded=False)].reason
        return str(reason), "; ".join(exc.messages)
    except PREPARE_ERRORS as exc:
        reason = FAILURES[classify(exc, recorded=False)].reason
        return str(reason), str(exc)
    return None


def cli_params(settings: Settings, clusters: Sequence[str] = CLUSTERS) -> dict[str, str]:
    """What `slurmjob-operator admission-params` prints for these settings."""
    return admission_params(settings, load_tenants(settings.tenants_file, clusters), clusters)


def tenants_model(ns: Mapping[str, str]) -> Tenants:
    return Tenants.model_validate({"tenants": tenants(ns)})


# -- the policy's CEL, in cel-python ------------------------------------------------------------


def _shims() -> dict[str, Callable[..., Any]]:
    """The Kubernetes CEL library functions the policies call (strings, regex, lists) that
    cel-python lacks, with the apiserver's meaning."""
    celtypes = pytest.importorskip("celpy.celtypes")

    def text(value: Any) -> Any:
        return celtypes.StringType(value)

    def find(value: Any, pattern: Any) -> Any:
        found = re.search(str(pattern), str(value))
        return text(found.group(0) if found else "")

    return {
        "split": lambda s, sep: celtypes.ListType([text(p) for p in str(s).split(str(sep))]),
        "join": lambda items, sep="": text(str(sep).join(str(i) for i in items)),
        "trim": lambda s: text(str(s).strip()),
        "replace": lambda s, old, new: text(str(s).replace(str(old), str(new))),
        "find": find,
    }


@cache
def _program(expression: str) -> Any:
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    return env.program(env.compile(expression), functions=_shims())


def evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    """One CEL expression; an evaluation error raises (the apiserver would deny)."""
    celpy = pytest.importorskip("celpy")
    value = _program(expression).evaluate(dict(activation))
    if isinstance(value, celpy.CELEvalError):
        raise AssertionError(f"{expression[:120]}...: {value}")
    return value


def policy_verdict(
    policy: Mapping[str, Any],
    params: Mapping[str, str],
    request: Mapping[str, Any],
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None = None,
    *,
    refuse_unclaimed: bool = True,
    operator: str = "system:serviceaccount:sys:op",
) -> str | None:
    """The policy's denial message for this request, or None when it admits it (or does not
    match it), as the apiserver evaluates it: matchConditions, variables in order, then each
    validation."""
    celpy = pytest.importorskip("celpy")
    plain = {
        "object": obj,
        "oldObject": old,
        "request": dict(request),
    }
    activation: dict[str, Any] = {k: celpy.json_to_cel(v) for k, v in plain.items()}
    for condition in policy.get("matchConditions", []):
        if not bool(evaluate(condition["expression"], activation)):
            return None
    variables: dict[str, Any] = {}
    stand_ins = {
        SITE: literal(params),
        REFUSE: "true" if refuse_unclaimed else "false",
        OPERATOR: json.dumps(operator).replace('"', "'"),
    }
    for variable in policy.get("variables", []):
        expression = stand_ins.get(variable["expression"], variable["expression"])
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(variable["name"])] = evaluate(expression, activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    for validation in policy["validations"]:
        if not bool(evaluate(validation["expression"], activation)):
            return str(evaluate(validation["messageExpression"], activation))
    return None


def create_request(obj: Mapping[str, Any], user: str = "alice") -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "operation": "CREATE",
        "namespace": meta["namespace"],
        "name": meta["name"],
        "userInfo": {"username": user},
    }
