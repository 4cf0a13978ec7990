"""Nodes, partitions, accounts and QOS: read by site checks (`doctor`) and by the limits a
submission is checked against before anything is staged (`core.limits`).

The shapes barely differ between versions: features are a comma string on v0.0.38 and a list
on v0.0.40+, states a string or a list, limits plain integers (INFINITE as 0xFFFFFFFF) on
v0.0.38 and `{set, infinite, number}` on v0.0.40+. Parsing is lenient (a value it cannot
read is "unknown", never a limit): these answers only ever stop a job whose request they
show cannot fit, and Slurm enforces its limits itself anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict


class NodeInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    features: frozenset[str]
    states: frozenset[str]
    gres: str = ""
    partitions: frozenset[str] = frozenset()
    cpus: int | None = None
    memory_mb: int | None = None
    """Configured RealMemory."""

    @property
    def gpus(self) -> int:
        return gpu_count(self.gres)


class PartitionInfo(BaseModel):
    """What a submission is checked against. None: unlimited, or not said."""

    model_config = ConfigDict(frozen=True)

    name: str
    states: frozenset[str] = frozenset()
    is_default: bool = False
    max_time_minutes: int | None = None
    max_nodes: int | None = None
    max_cpus_per_node: int | None = None

    @property
    def is_up(self) -> bool | None:
        """True when UP, False when DOWN, DRAIN or INACTIVE, None when the state is unknown."""
        if "UP" in self.states:
            return True
        if self.states & {"DOWN", "DRAIN", "INACTIVE"}:
            return False
        return None


#: Slurm's INFINITE and NO_VAL (uint32), as v0.0.38 writes them in plain integers.
_UINT32_SENTINELS = (0xFFFFFFFF, 0xFFFFFFFE)
_MAX_LIMIT = 1 << 40


def _limit(value: Any) -> int | None:
    """A limit: a non-negative integer, or None for unlimited, unset or unreadable."""
    if isinstance(value, Mapping):
        if value.get("infinite") or not value.get("set", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    if value < 0 or value in _UINT32_SENTINELS or value > _MAX_LIMIT:
        return None
    return value


def gpu_count(gres: str) -> int:
    """GPUs in a node's gres string: `gpu:4`, `gpu:a100:4(S:0-1)`, `gpu:a100:2,gpu:h100:2`."""
    total = 0
    for item in gres[:4096].split(","):
        words = item.split("(", 1)[0].strip().split(":")
        if words[0] != "gpu" or len(words) < 2:
            continue
        last = words[-1]
        if last.isdigit() and len(last) <= 6:
            total += int(last)
        elif len(words) == 2:
            total += 1  # `gpu:a100`: one of that type
    return total


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
                cpus=_limit(raw.get("cpus")),
                memory_mb=_limit(raw.get("real_memory")),
            )
        )
    return nodes


def _partition_states(raw: Mapping[str, Any]) -> frozenset[str]:
    inner = raw.get("partition")
    state = inner.get("state") if isinstance(inner, Mapping) else raw.get("state")
    names = _names(state) if isinstance(state, list) else _names(str(state or ""))
    return frozenset(n.upper() for n in names)


def parse_partitions(payload: Mapping[str, Any]) -> list[PartitionInfo]:
    """Every partition with its state and limits (v0.0.38's flat fields or v0.0.40+'s)."""
    found: list[PartitionInfo] = []
    for raw in payload.get("partitions") or []:
        if not isinstance(raw, Mapping) or not raw.get("name"):
            continue
        maxima = raw.get("maximums")
        if isinstance(maxima, Mapping):
            time, nodes, cpus = maxima.get("time"), maxima.get("nodes"), maxima.get("cpus_per_node")
        else:
            time = raw.get("max_time_limit")
            nodes = raw.get("maximum_nodes_per_job")
            cpus = raw.get("maximum_cpus_per_node")
        found.append(
            PartitionInfo(
                name=str(raw["name"]),
                states=_partition_states(raw),
                is_default="DEFAULT" in {f.upper() for f in _names(raw.get("flags"))},
                max_time_minutes=_limit(time),
                max_nodes=_limit(nodes),
                max_cpus_per_node=_limit(cpus),
            )
        )
    return found


def parse_names(key: str) -> Callable[[Mapping[str, Any]], frozenset[str]]:
    """The `name` of every entry of `payload[key]` (slurmdb accounts, QOS), lower-cased as
    Slurm compares them."""

    def parse(payload: Mapping[str, Any]) -> frozenset[str]:
        return frozenset(
            str(item["name"]).lower()
            for item in payload.get(key) or []
            if isinstance(item, Mapping) and item.get("name")
        )

    return parse


class ConfFacts(BaseModel):
    """Words of slurm.conf (lower-cased) that decide what may be checked before submit."""

    model_config = ConfigDict(frozen=True)

    enforce: frozenset[str] = frozenset()
    """AccountingStorageEnforce."""
    private_data: frozenset[str] = frozenset()
    """PrivateData: what a non-admin user cannot list (accounts, ...)."""
    dependency_parameters: frozenset[str] = frozenset()
    """DependencyParameters (kill_invalid_depend, ...)."""


def _conf_words(conf: Mapping[str, Any], key: str) -> frozenset[str]:
    return frozenset(n.lower() for n in _names(conf.get(key)))


def parse_conf(payload: Mapping[str, Any]) -> ConfFacts:
    """`GET /conf`'s words of interest (a list, or a comma string as slurm.conf writes it)."""
    conf = payload.get("slurm_conf")
    if not isinstance(conf, Mapping):
        return ConfFacts()
    return ConfFacts(
        enforce=_conf_words(conf, "AccountingStorageEnforce"),
        private_data=_conf_words(conf, "PrivateData"),
        dependency_parameters=_conf_words(conf, "DependencyParameters"),
    )


def parse_dbd_queue(payload: Mapping[str, Any]) -> int | None:
    """`statistics.dbd_agent_queue_size` of `GET /slurm/V/diag`: the records slurmctld still
    has to send to slurmdbd (None when the answer does not say, or says nonsense)."""
    stats = payload.get("statistics")
    value = stats.get("dbd_agent_queue_size") if isinstance(stats, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
