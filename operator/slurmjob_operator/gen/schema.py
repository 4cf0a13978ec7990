"""pydantic JSON schema -> Kubernetes structural schema, for `gen.crd`.

The apiserver only accepts structural schemas: every node typed, no `$ref`, no `anyOf` that
changes the type. `structural_schema()` inlines `$ref`s, collapses Optional to the plain type,
maps `int | str` to `x-kubernetes-int-or-string` and lays the CEL rules and list-map keys the
caller passes onto the nodes of the models they belong to. Which rules exist is `gen.crd`'s
business, so this module knows no model of `api`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import BaseModel

_DROP = frozenset({"title", "additionalProperties", "$defs"})


@dataclass(frozen=True)
class Rule:
    """One CEL rule; `self` is the schema node it is attached to."""

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


ModelRules = Mapping[type[BaseModel], Sequence[Rule]]
FieldRules = Mapping[tuple[type[BaseModel], str], Sequence[Rule]]
ListMapKeys = Mapping[tuple[type[BaseModel], str], Sequence[str]]


class SchemaError(ValueError):
    """A model produced JSON schema that has no structural equivalent."""


def structural_schema(
    root: type[BaseModel],
    *,
    defaults: bool,
    model_rules: ModelRules,
    field_rules: FieldRules,
    list_map_keys: ListMapKeys,
) -> dict[str, Any]:
    """The structural schema of `root`, with the given CEL rules and list-map keys on it."""
    return _Converter(
        root,
        defaults=defaults,
        model_rules=model_rules,
        field_rules=field_rules,
        list_map_keys=list_map_keys,
    ).convert()


class _Converter:
    """pydantic JSON schema -> Kubernetes structural schema, for one model tree."""

    def __init__(
        self,
        root: type[BaseModel],
        *,
        defaults: bool,
        model_rules: ModelRules,
        field_rules: FieldRules,
        list_map_keys: ListMapKeys,
    ) -> None:
        raw = root.model_json_schema(by_alias=True, mode="validation")
        self.defs: dict[str, Any] = raw.pop("$defs", {})
        self.raw = raw
        self.defaults = defaults
        self.models = {m.__name__: m for m in _model_tree(root)}
        self.root = root
        self.model_rules = model_rules
        self.field_rules = field_rules
        self.list_map_keys = list_map_keys

    def convert(self) -> dict[str, Any]:
        return self._node(self.raw, self.root, "")

    def _annotations(self, node: dict[str, Any]) -> dict[str, Any]:
        """The keys of a `$ref`/`anyOf` node that describe it rather than its type."""
        out = {
            k: copy.deepcopy(v)
            for k, v in node.items()
            if k not in _DROP and k not in ("$ref", "anyOf", "default")
        }
        if self.defaults and node.get("default") is not None:
            out["default"] = copy.deepcopy(node["default"])
        return out

    def _node(self, node: dict[str, Any], model: type[BaseModel] | None, at: str) -> dict[str, Any]:
        if "$ref" in node:
            name = str(node["$ref"]).rsplit("/", 1)[-1]
            target = self._node(self.defs[name], self.models.get(name), at)
            return _merge(target, self._annotations(node))
        if "anyOf" in node:
            return self._any_of(node, at)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROP or key in ("properties", "items", "required", "default"):
                continue
            out[key] = copy.deepcopy(value)
        if self.defaults and node.get("default") is not None:
            out["default"] = copy.deepcopy(node["default"])
        kind = node.get("type")
        if "enum" in node and kind is None:
            out["type"] = "string"
        elif kind == "object":
            self._object(node, out, model, at)
        elif kind == "array":
            items = node.get("items")
            if not isinstance(items, dict):
                raise SchemaError(f"{at or '.'}: arrays need an items schema")
            out["items"] = self._node(items, None, f"{at}[]")
        elif kind not in ("string", "integer", "number", "boolean"):
            raise SchemaError(f"{at or '.'}: no structural equivalent for {node}")
        if model is not None and model in self.model_rules:
            out["x-kubernetes-validations"] = [r.to_dict() for r in self.model_rules[model]]
        return out

    def _object(
        self, node: dict[str, Any], out: dict[str, Any], model: type[BaseModel] | None, at: str
    ) -> None:
        props: dict[str, Any] = node.get("properties", {})
        extra = node.get("additionalProperties")
        if props:
            converted: dict[str, Any] = {}
            for name, sub in props.items():
                prop = self._node(sub, None, f"{at}.{name}")
                if model is not None:
                    keys = self.list_map_keys.get((model, name))
                    if keys:
                        prop["x-kubernetes-list-type"] = "map"
                        prop["x-kubernetes-list-map-keys"] = list(keys)
                    rules = self.field_rules.get((model, name), ())
                    if rules:
                        prop.setdefault("x-kubernetes-validations", []).extend(
                            r.to_dict() for r in rules
                        )
                converted[name] = prop
            out["properties"] = converted
            if node.get("required"):
                out["required"] = list(node["required"])
        elif isinstance(extra, dict) and extra:
            # dict[str, X]: a real map.
            out["additionalProperties"] = self._node(extra, None, f"{at}.*")
        else:
            # dict[str, Any]: a free-form object, kept as the user wrote it.
            out["x-kubernetes-preserve-unknown-fields"] = True

    def _any_of(self, node: dict[str, Any], at: str) -> dict[str, Any]:
        branches: list[dict[str, Any]] = []
        notes: dict[str, Any] = {}
        pending = list(node["anyOf"])
        while pending:
            branch = pending.pop(0)
            if branch.get("type") == "null":
                continue
            if "anyOf" in branch:  # a union inside Optional: flatten it, keep its description
                pending.extend(branch["anyOf"])
                notes.update(self._annotations(branch))
            else:
                branches.append(branch)
        outer = {**notes, **self._annotations(node)}
        if len(branches) == 1:
            return _merge(self._node(branches[0], None, at), outer)
        kinds = sorted(str(b.get("type")) for b in branches)
        if kinds == ["integer", "string"] and all(set(b) <= {"type"} for b in branches):
            return _merge({"x-kubernetes-int-or-string": True}, outer)
        raise SchemaError(f"{at or '.'}: a union of {kinds} has no structural schema")


def _merge(inner: dict[str, Any], outer: dict[str, Any]) -> dict[str, Any]:
    """`inner` with the annotations of the node that referenced it laid over it."""
    merged = dict(inner)
    for key, value in outer.items():
        if key == "x-kubernetes-validations":
            merged[key] = [*merged.get(key, []), *value]
        else:
            merged[key] = value
    return merged


def _model_tree(root: type[BaseModel]) -> list[type[BaseModel]]:
    """Every model class reachable from `root` through its fields."""
    seen: list[type[BaseModel]] = []

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp not in seen:
                seen.append(tp)
                for info in tp.model_fields.values():
                    visit(info.annotation)
            return
        for arg in get_args(tp):
            visit(arg)

    visit(root)
    return seen
