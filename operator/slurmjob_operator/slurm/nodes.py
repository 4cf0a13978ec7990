"""Nodes and partitions, read only by site checks (`doctor`).

The shapes barely differ between versions: features are a comma string on v0.0.38 and a list
on v0.0.40+, states a string or a list. Parsing is lenient because nothing here drives a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict


class NodeInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    features: frozenset[str]
    states: frozenset[str]
    gres: str = ""
    partitions: frozenset[str] = frozenset()


def _names(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list):
        items = [str(v) for v in value]
    else:
        items = []
    return frozenset(i.strip() for i in items if i and i.strip())


def parse_nodes(payload: Mapping[str, Any]) -> list[NodeInfo]:
    nodes: list[NodeInfo] = []
    for raw in payload.get("nodes") or []:
        if not isinstance(raw, Mapping) or not raw.get("name"):
            continue
        features = _names(raw.get("active_features")) | _names(raw.get("features"))
        state = raw.get("state")
        states = _names(state) if isinstance(state, list) else _names(str(state or ""))
        nodes.append(
            NodeInfo(
                name=str(raw["name"]),
                features=features,
                states=frozenset(s.upper() for s in states),
                gres=str(raw.get("gres") or ""),
                partitions=_names(raw.get("partitions")),
            )
        )
    return nodes


def parse_partition_names(payload: Mapping[str, Any]) -> list[str]:
    return [
        str(p["name"])
        for p in payload.get("partitions") or []
        if isinstance(p, Mapping) and p.get("name")
    ]


def parse_dbd_queue(payload: Mapping[str, Any]) -> int | None:
    """`statistics.dbd_agent_queue_size` of `GET /slurm/V/diag`: the records slurmctld still
    has to send to slurmdbd (None when the answer does not say, or says nonsense)."""
    stats = payload.get("statistics")
    value = stats.get("dbd_agent_queue_size") if isinstance(stats, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
