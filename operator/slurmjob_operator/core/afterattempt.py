"""The one decision point after an attempt ends: what comes next for the SlurmJob.

An ended attempt is shown to each rule of `RULES` in turn; the first that answers decides what
is written (a retry scheduled: Pending until its due time; an attempt not retried, and why),
and with no answer the attempt's own ending stands. A new way to go on after an attempt (a
walltime segment continued, a probe's new attempt) is one module with one rule and one line
here, ahead of or after the retry rules as it must win or yield.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import Phase
from slurmjob_operator.core.claims import probe_of, segment_of
from slurmjob_operator.core.following import not_retried, retry_scheduled
from slurmjob_operator.core.probe import after_failed_probe
from slurmjob_operator.core.retries import decide
from slurmjob_operator.core.segments import after_segment, segment_end
from slurmjob_operator.core.states import Observation
from slurmjob_operator.core.transition import WARNING, Transition


@dataclass(frozen=True)
class AttemptEnd:
    """An attempt Slurm shows ended: the transition that says so, the spec, what Slurm said,
    the log tails read with it (the text the rules search), the generation and the time."""

    ended: Transition
    spec: SlurmJobSpec
    observation: Observation
    logs: str
    generation: int | None
    now: datetime
    probe_attempts: int = 0
    """The site's most new attempts after probes that failed (SLURMJOB_PROBE_ATTEMPTS)."""
    checkpoint: str | None = None
    """A walltime chain's checkpoint directory as the attempt left it (its digest, or
    `core.segments.UNKNOWN_CHECKPOINT`); None: not read."""


#: A rule: the transition to write instead of `end.ended`, or None when it has no say.
Rule = Callable[[AttemptEnd], Transition | None]


def retry_rules(end: AttemptEnd) -> Transition | None:
    """spec.retry: a failed attempt is retried (Pending until `nextAttemptAt`) or not (its
    `retryAction` says why)."""
    if end.observation.phase is not Phase.FAILED:
        return None
    status = end.ended.status
    decision = decide(end.spec.retry, end.observation, end.logs, status.attempts[:-1])
    if not decision.retries:
        return Transition(not_retried(status, decision), end.ended.events)
    scheduled = retry_scheduled(status, decision, end.generation, end.now)
    return Transition(scheduled.status, end.ended.events + scheduled.events)


def probe_rules(end: AttemptEnd) -> Transition | None:
    """A probe that failed on every rung (as the attempt's record says, never an exit code):
    decided before the retry rules, on a counter of its own."""
    attempt = end.ended.status.current_attempt
    probe = probe_of(attempt) if attempt is not None else None
    if probe is None or probe.outcome != "Failed":
        return None
    if end.observation.phase is not Phase.FAILED:
        return None  # the script ends a failed probe with a failure: anything else is not it
    decided = after_failed_probe(end.ended.status, end.probe_attempts, end.generation, end.now)
    return Transition(decided.status, end.ended.events + decided.events)


def segment_rules(end: AttemptEnd) -> Transition | None:
    """spec.walltime: a segment that ended by its time limit, with continueExitCode, by
    preemption or a lost node goes on to the next segment at once (before the user's retry
    rules, outside their budget); exit 0 and every other end are left to the rules after."""
    walltime = end.spec.walltime
    attempt = end.ended.status.current_attempt
    if walltime is None or attempt is None or segment_of(attempt) is None:
        return None
    how = segment_end(end.observation, walltime)
    if how is None:
        return None
    decided = after_segment(
        end.ended.status, walltime, how, end.checkpoint, end.generation, end.now
    )
    events = end.ended.events
    if decided.status.phase is Phase.PENDING:
        # A segment's end is the chain going on, not a failure: no Warning for its state.
        events = tuple(e for e in events if e.type != WARNING)
    return Transition(decided.status, events + decided.events)


RULES: tuple[Rule, ...] = (probe_rules, segment_rules, retry_rules)


def after_attempt(end: AttemptEnd, rules: tuple[Rule, ...] = RULES) -> Transition:
    """What to write once an attempt has ended: the first rule's answer, else its ending."""
    for rule in rules:
        answer = rule(end)
        if answer is not None:
            return answer
    return end.ended
