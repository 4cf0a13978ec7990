"""One dialect per REST API family: v0.0.38, and v0.0.40 - v0.0.45 (parametrised by version)."""

from __future__ import annotations

from slurmjob_operator.slurm.dialects.common import (
    CancelResult,
    ControllerPing,
    Dialect,
    Envelope,
    PingResult,
    SubmitReceipt,
    parse_envelope,
)
from slurmjob_operator.slurm.dialects.kill import BulkCancelResult
from slurmjob_operator.slurm.dialects.records import Records
from slurmjob_operator.slurm.dialects.v0038 import VERSION as V0038
from slurmjob_operator.slurm.dialects.v0038 import Dialect38
from slurmjob_operator.slurm.dialects.v004x import VERSIONS as DATA_PARSER_VERSIONS
from slurmjob_operator.slurm.dialects.v004x import Dialect4x

__all__ = [
    "BulkCancelResult",
    "CancelResult",
    "ControllerPing",
    "Dialect",
    "Envelope",
    "PingResult",
    "Records",
    "SubmitReceipt",
    "dialect_for",
    "parse_envelope",
]


def dialect_for(version: str) -> Dialect:
    """The dialect for a concrete version string such as "v0.0.45"."""
    if version == V0038:
        return Dialect38()
    if version in DATA_PARSER_VERSIONS:
        return Dialect4x(version)
    raise ValueError(f"no dialect for REST API version {version!r}")
