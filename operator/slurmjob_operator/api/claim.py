"""The mark of a status field the operator decides on.

Anyone who may write `slurmjobs/status` writes these, so a decision reads them only through
`core.claims`, which recomputes or clamps each one. `tests/unit/test_claims_scan.py` collects
every field carrying the mark from the models and fails on a read of one anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """`why`: the decision the field feeds (said in the scan's failure)."""

    why: str
