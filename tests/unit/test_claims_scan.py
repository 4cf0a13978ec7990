"""Every status field marked `api.claim.Claim` in the models is read only in `core.claims`.

The fields come from the models themselves (a field marked tomorrow is scanned tomorrow);
the scan walks every module of the package and fails on a read of one of those names, as an
attribute, through `getattr` or as a key of the raw status (its camelCase name), anywhere but
in `core/claims.py` and the model's own module (its methods carry the value, deciding nothing).
A few attributes of other types share a name with a marked field; each receiver allowed is
listed with the type it is."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from pydantic import BaseModel

import slurmjob_operator
from slurmjob_operator import api
from slurmjob_operator.api.claim import Claim

PACKAGE = Path(slurmjob_operator.__file__).parent
THE_ONE_PLACE = PACKAGE / "core" / "claims.py"

#: Attribute reads of a marked field's name on an object of another type (by the receiver's
#: text as written), with what that object is.
OTHER_TYPES: dict[str, dict[str, str]] = {
    "cluster": {
        "self": "a cluster's controller or identity: its own configured name",
        "job": "core.verified.VerifiedJob (the cluster it was read on)",
        "snapshot": "core.limits.Snapshot (the cluster it was read from)",
        "raw": "a slurmrestd answer's job (slurm.dialects)",
        "env": "a slurmrestd answer's envelope (slurm.dialects)",
        "result": "doctor's slurmrestd result",
        "spec": "spec.cluster (the spec is the user's request, not a claim)",
        "p.spec": "spec.cluster",
    },
    "segment": {
        "prepared": "controller.pipeline.PreparedAttempt (the plan made for this attempt)",
        "ctx": "site.render's context (the plan being rendered)",
    },
    "probe": {
        "runtime": "the runtime registry entry (the site's probe program)",
        "resolution.runtime": "the runtime registry entry",
        "ctx": "site.render's context (the plan being rendered)",
    },
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def claimed_fields() -> dict[str, tuple[type[BaseModel], str]]:
    """Every field of the api models marked as a claim: name -> (model, why)."""
    found: dict[str, tuple[type[BaseModel], str]] = {}
    for info in pkgutil.iter_modules(api.__path__, f"{api.__name__}."):
        module = importlib.import_module(info.name)
        for _, model in inspect.getmembers(module, inspect.isclass):
            if not issubclass(model, BaseModel) or model.__module__ != module.__name__:
                continue
            for name, field in model.model_fields.items():
                for mark in field.metadata:
                    if isinstance(mark, Claim):
                        found[name] = (model, mark.why)
    return found


def reads(source: str, names: dict[str, str], skip_other_types: bool = True) -> list[str]:
    """The reads of `names` (field name -> its camelCase key) in `source`."""
    keys = {camel: name for name, camel in names.items()}
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in names:
            if not isinstance(node.ctx, ast.Load):
                continue
            receiver = ast.unparse(node.value)
            if skip_other_types and receiver in OTHER_TYPES.get(node.attr, {}):
                continue
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in names
        ) or (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value in keys
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_models_mark_the_fields_the_issue_names() -> None:
    # The scan's list comes from the models; this only checks the marks are there at all.
    assert {"cluster", "segment", "probe", "retry_action", "last_transition_time"} <= set(
        claimed_fields()
    )


def test_no_module_but_core_claims_reads_a_claimed_field() -> None:
    fields = claimed_fields()
    names = {name: _camel(name) for name in fields}
    defining = {Path(inspect.getfile(model)) for model, _ in fields.values()}
    problems: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == THE_ONE_PLACE or path in defining:
            continue
        for where in reads(path.read_text(encoding="utf-8"), names):
            problems.append(f"{path.relative_to(PACKAGE)} {where}")
    assert not problems, (
        "a status field marked api.claim.Claim is read outside core/claims.py "
        "(a status is a claim: take it through core.claims, which verifies or recomputes "
        "it):\n" + "\n".join(problems)
    )


@pytest.mark.parametrize(
    "planted",
    [
        "cluster = attempt.cluster",
        "if view.status.current_attempt.segment.index > 3: pass",
        "n = sum(1 for a in attempts if a.retry_action == 'Retry')",
        "key = status.attempts[-1].probe.avoid",
        "when = finished.last_transition_time",
        "x = getattr(attempt, 'cluster')",
        "x = body['status']['attempts'][0]['retryAction']",
        "x = cond['lastTransitionTime']",
        "x = self.job.cluster",  # a receiver not listed as another type
    ],
)
def test_the_scan_finds_a_planted_read(planted: str) -> None:
    names = {name: _camel(name) for name in claimed_fields()}
    assert reads(planted, names), planted


def test_the_receivers_of_other_types_are_exempt_only_where_listed() -> None:
    names = {name: _camel(name) for name in claimed_fields()}
    assert not reads("x = snapshot.cluster\ny = prepared.segment", names)
    assert reads("x = snapshot.segment", names)
