"""What the status keeps of an attempt's collective probe (`core.probe` decides it)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from slurmjob_operator.api.model import Model

__all__ = ["MAX_PROBE_NODES", "NODE_NAME_RE", "AttemptProbe"]


class _Model(Model):
    # As every status model: fields a newer release wrote are left out, not refused.
    model_config = ConfigDict(**{**Model.model_config, "extra": "ignore"})


#: Nodes one probe record may blame, and an attempt exclude.
MAX_PROBE_NODES = 64
NODE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class AttemptProbe(_Model):
    """The collective probe of one attempt: what was planned at submit, what the batch
    script recorded."""

    key: str = Field(
        pattern=r"^probe-[0-9a-f]{40}$",
        description=(
            "The probe cache's key of this attempt (tenant, cluster, partition, runtime, series)."
        ),
    )
    avoid: str = Field(
        pattern=r"^avoid-[0-9a-f]{40}$",
        description="The key of its tenant's avoid list on its cluster.",
    )
    ladder: int = Field(
        ge=1, le=9, description="Rungs of the site's ladder, the plain run included."
    )
    cached_rung: int | None = Field(
        default=None,
        ge=0,
        description="The rung a fresh cache entry named: the probe was skipped, its settings used.",
    )
    excluded: list[str] = Field(
        default_factory=list,
        max_length=MAX_PROBE_NODES,
        description="Nodes this attempt excluded (the tenant's avoid list on its cluster).",
    )
    outcome: Literal["Passed", "Failed", "Skipped"] | None = Field(
        default=None, description="What the batch script recorded, once it has."
    )
    rung: int | None = Field(default=None, ge=0, description="The rung that passed (0: plain).")
    bus_bandwidth: float | None = Field(
        default=None, ge=0, description="The bus bandwidth the passing probe printed, in GB/s."
    )
    rungs: str | None = Field(
        default=None,
        max_length=512,
        description="Each rung tried and how it ended, e.g. `0:hung 1:passed`.",
    )
    blamed: list[str] = Field(
        default_factory=list,
        max_length=MAX_PROBE_NODES,
        description="Nodes on which the probe failed.",
    )
