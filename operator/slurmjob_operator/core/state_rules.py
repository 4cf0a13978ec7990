"""The tables of `core.states`: one rule per Slurm base state, and the flags that change the
outcome (each for the base states it applies to, `FLAG_PRECEDENCE` deciding between several).
`docs/states.md` documents every row and `tests/unit/test_states.py` checks the two agree."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from slurmjob_operator.api.status import Phase
from slurmjob_operator.core.jobview import ACTIVE_STATES, BaseState

B = BaseState


@dataclass(frozen=True)
class BaseRule:
    """What a base state means when no flag in `FLAG_RULES` overrides it."""

    phase: Phase
    reason: str
    text: str
    """How the message describes the state, e.g. "reached its time limit"."""
    infrastructure: bool = False


@dataclass(frozen=True)
class FlagRule:
    """What a state flag means while the base state is one of `applies_to`."""

    phase: Phase
    reason: str
    applies_to: frozenset[BaseState]
    text: str
    infrastructure: bool = False


_FINAL_BASES = frozenset(BaseState) - ACTIVE_STATES
# Bases on which a job holds (or held) an allocation that COMPLETING etc. can still occupy.
_ALLOCATED_BASES = _FINAL_BASES | {B.RUNNING}

BASE_STATE_RULES: Mapping[BaseState, BaseRule] = MappingProxyType(
    {
        B.PENDING: BaseRule(Phase.QUEUED, "Pending", "is PENDING"),
        B.RUNNING: BaseRule(Phase.RUNNING, "Running", "is RUNNING"),
        B.SUSPENDED: BaseRule(
            Phase.RUNNING, "Suspended", "is SUSPENDED (still owns its allocation)"
        ),
        B.COMPLETED: BaseRule(Phase.SUCCEEDED, "Completed", "COMPLETED"),
        B.CANCELLED: BaseRule(Phase.CANCELLED, "Cancelled", "was CANCELLED"),
        B.FAILED: BaseRule(Phase.FAILED, "NonZeroExitCode", "FAILED"),
        B.TIMEOUT: BaseRule(Phase.FAILED, "Timeout", "reached its time limit (TIMEOUT)"),
        B.NODE_FAIL: BaseRule(
            Phase.FAILED, "NodeFail", "lost a node (NODE_FAIL)", infrastructure=True
        ),
        B.PREEMPTED: BaseRule(Phase.CANCELLED, "Preempted", "was PREEMPTED"),
        B.BOOT_FAIL: BaseRule(
            Phase.FAILED, "BootFail", "could not boot its nodes (BOOT_FAIL)", infrastructure=True
        ),
        B.DEADLINE: BaseRule(Phase.FAILED, "Deadline", "passed its deadline (DEADLINE)"),
        B.OUT_OF_MEMORY: BaseRule(Phase.FAILED, "OutOfMemory", "ran out of memory (OUT_OF_MEMORY)"),
    }
)

FLAG_RULES: Mapping[str, FlagRule] = MappingProxyType(
    {
        # Still occupying the allocation: never final, shown as Running.
        "COMPLETING": FlagRule(
            Phase.RUNNING, "Completing", _ALLOCATED_BASES, "epilog still running"
        ),
        "STAGE_OUT": FlagRule(
            Phase.RUNNING, "StageOut", _ALLOCATED_BASES, "burst buffer stage-out still running"
        ),
        "CONFIGURING": FlagRule(
            Phase.RUNNING, "Configuring", _ALLOCATED_BASES, "nodes still being configured"
        ),
        # Running variants.
        "STOPPED": FlagRule(
            Phase.RUNNING,
            "Stopped",
            frozenset({B.RUNNING, B.SUSPENDED}),
            "is STOPPED (SIGSTOP; still owns its allocation)",
        ),
        "RESIZING": FlagRule(
            Phase.RUNNING, "Resizing", frozenset({B.RUNNING}), "is RUNNING and being resized"
        ),
        "SIGNALING": FlagRule(
            Phase.RUNNING,
            "Signaling",
            frozenset({B.RUNNING}),
            "is RUNNING, a signal is being delivered",
        ),
        # Back in the queue under the same job id.
        "SPECIAL_EXIT": FlagRule(
            Phase.QUEUED,
            "SpecialExit",
            frozenset({B.PENDING}),
            "is PENDING, requeued and held after a special exit (SPECIAL_EXIT)",
        ),
        "REQUEUE_HOLD": FlagRule(
            Phase.QUEUED,
            "RequeueHold",
            frozenset({B.PENDING}),
            "is PENDING, requeued and held (REQUEUE_HOLD)",
        ),
        "RESV_DEL_HOLD": FlagRule(
            Phase.QUEUED,
            "ReservationDeleted",
            frozenset({B.PENDING}),
            "is PENDING, held because its reservation was deleted (RESV_DEL_HOLD)",
        ),
        "REQUEUE_FED": FlagRule(
            Phase.QUEUED,
            "RequeueFed",
            frozenset({B.PENDING}),
            "is PENDING, requeued by the federation (REQUEUE_FED)",
        ),
        "REQUEUED": FlagRule(
            Phase.QUEUED, "Requeued", frozenset({B.PENDING}), "is PENDING, requeued (REQUEUED)"
        ),
        # Final outcomes that a flag refines.
        "REVOKED": FlagRule(
            Phase.CANCELLED,
            "Revoked",
            _FINAL_BASES,
            "was REVOKED (a federation sibling runs it)",
        ),
        "LAUNCH_FAILED": FlagRule(
            Phase.FAILED,
            "LaunchFailed",
            frozenset({B.FAILED}),
            "FAILED to launch (LAUNCH_FAILED)",
            infrastructure=True,
        ),
    }
)

#: The first flag in this order that is set and applies to the base state decides.
FLAG_PRECEDENCE: tuple[str, ...] = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "STOPPED",
    "RESIZING",
    "SIGNALING",
    "SPECIAL_EXIT",
    "REQUEUE_HOLD",
    "RESV_DEL_HOLD",
    "REQUEUE_FED",
    "REQUEUED",
    "REVOKED",
    "LAUNCH_FAILED",
)
