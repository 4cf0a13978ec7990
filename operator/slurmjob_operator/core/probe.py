"""The collective probe (issue 26): which jobs get one, what the batch script's record says,
how that shows in the status, and what follows a probe that failed on every rung.

The record is written by the batch script (never by the container, which sees the attempt
directory read-only), but it lives in a directory the job user owns: it is read as hostile
text. Every line must match its pattern, a node it names must be one the record says the job
got, and whatever it says only ever reaches this job's status and its own tenant's cache and
avoid list. Pure functions, `now` passed in.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from slurmjob_operator.api.probestatus import MAX_PROBE_NODES, NODE_NAME_RE, AttemptProbe
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import ConditionStatus, SlurmJobStatus
from slurmjob_operator.core.claims import action_of, probe_of
from slurmjob_operator.core.reasons import ConditionType, Reason
from slurmjob_operator.core.shares import share_owner
from slurmjob_operator.core.transition import (
    NORMAL,
    WARNING,
    Event,
    Transition,
    next_attempt_due,
    replace_attempt,
    with_conditions,
)

PROBE_PASSED = ConditionType.PROBE_PASSED
#: The `retryAction` of an attempt the probe ended: counted apart from spec.retry's.
PROBE_RETRY_ACTION = "ProbeRetry"
#: A record is a few dozen short lines: anything longer is not the script's.
MAX_RECORD_BYTES = 4096
MAX_RECORD_LINES = 48

Outcome = Literal["Passed", "Failed", "Skipped"]

_NODE = NODE_NAME_RE.strip("^$")
_BANDWIDTH = r"[0-9]{1,7}(\.[0-9]{1,6})?"
_LINES = {
    "nodes": re.compile(rf"nodes( {_NODE}){{1,{MAX_PROBE_NODES}}}"),
    "rung": re.compile(
        rf"rung ([0-9]) (passed ({_BANDWIDTH}|-)|hung|slow {_BANDWIDTH}|failed( {_NODE})*)"
    ),
    "result": re.compile(r"result (passed ([0-9]) (" + _BANDWIDTH + r"|-)|failed|skipped ([0-9]))"),
}


@dataclass(frozen=True)
class ProbePlan:
    """What the operator knows before a submit: the rung a fresh cache entry names (the
    probe is skipped and that rung's settings used) and the nodes the tenant avoids."""

    cached_rung: int | None = None
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeRecord:
    """What the batch script recorded of the probe."""

    outcome: Outcome
    rung: int | None = None
    bandwidth: float | None = None
    rungs: tuple[str, ...] = ()
    """Each rung tried and its end, as `rung:word` (`0:hung`)."""
    blamed: tuple[str, ...] = ()


def wants_probe(spec: SlurmJobSpec) -> bool:
    """A GPU job on several nodes, or on one node with 2+ GPUs (TAO's rule); arrays are left
    out (every task would probe, and their records would share one file)."""
    if spec.is_cpu_only or spec.array is not None:
        return False
    return sum(p.nodes for p in spec.pools) > 1 or max(p.gpus_per_node for p in spec.pools) > 1


def parse_record(data: bytes, rungs: int) -> ProbeRecord:
    """The record the batch script wrote; ValueError when it is not one (any line off, a rung
    the ladder does not have, a node the job did not get)."""
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError("the probe record is too long")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ValueError("the probe record is not ASCII") from exc
    lines = text.splitlines()
    if len(lines) > MAX_RECORD_LINES:
        raise ValueError("the probe record has too many lines")
    nodes: set[str] = set()
    tried: list[str] = []
    blamed: list[str] = []
    result: ProbeRecord | None = None
    for line in lines:
        kind = line.split(" ", 1)[0]
        pattern = _LINES.get(kind)
        if pattern is None or pattern.fullmatch(line) is None or result is not None:
            raise ValueError(f"the probe record has a line that is not the script's: {line[:80]!r}")
        words = line.split(" ")
        if kind == "nodes":
            nodes.update(words[1:])
            continue
        # "rung K ...", "result passed K ...", "result skipped K"; "result failed" has none.
        rung = int(words[1]) if kind == "rung" else int(words[2]) if len(words) > 2 else None
        if rung is not None and rung >= rungs:
            raise ValueError(f"the probe record names rung {rung}; the ladder has {rungs}")
        if kind == "rung":
            tried.append(f"{rung}:{words[2]}")
            if words[2] == "failed":
                unknown = [n for n in words[3:] if n not in nodes]
                if unknown:
                    raise ValueError(f"the probe record blames {unknown[0]}, not the job's node")
                blamed.extend(n for n in words[3:] if n not in blamed)
        elif words[1] == "passed":
            bandwidth = None if words[3] == "-" else float(words[3])
            result = ProbeRecord("Passed", rung, bandwidth, tuple(tried))
        elif words[1] == "skipped":
            result = ProbeRecord("Skipped", rung, None, tuple(tried))
        else:
            result = ProbeRecord("Failed", None, None, tuple(tried), tuple(blamed))
    if result is None:
        raise ValueError("the probe record has no result yet")
    return result


class ProbeLookup(Protocol):
    """The probe cache and the avoid lists as the operator holds them (in memory)."""

    def cached_rung(self, key: str) -> int | None: ...

    def avoided(self, key: str) -> tuple[str, ...]: ...


def probe_owner(namespace: str, tenant: str | None, own_user: bool) -> str:
    """Whose probe results these are: the tenant's when its jobs run as a Unix user of its
    own, else the namespace's (tenants sharing one user must not steer each other)."""
    return f"tenant:{tenant}" if tenant is not None and own_user else f"namespace:{namespace}"


def _key(*parts: str) -> str:
    # ConfigMap keys allow [-._a-zA-Z0-9]; the parts are names and digests of any spelling.
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]


def cache_key(owner: str, cluster: str, partition: str | None, runtime: str, series: str) -> str:
    """The probe cache's key: whose jobs (tenant, or namespace), where (cluster and
    partition), in what (the runtime's digest) on which GPUs (the series)."""
    return "probe-" + _key(owner, cluster, partition or "", runtime, series)


def avoid_key(owner: str, cluster: str) -> str:
    """The avoid list's key: one per tenant (or namespace) and cluster."""
    return "avoid-" + _key(owner, cluster)


@dataclass(frozen=True)
class ProbeKeys:
    """Where a job's probe outcome is looked up and remembered, made by the operator from the
    resource's namespace, its tenant's entry and the cluster at the time of use (never read
    back from a status: anyone can write another tenant's key there)."""

    cache: str
    avoid: str
    ladder: int
    """The rungs the site's ladder has (the plain run included)."""
    owner: str
    """Whose share of the ConfigMap its entries count against (`share_owner`)."""


def probe_keys(
    namespace: str,
    tenant: str | None,
    own_user: bool,
    where: tuple[str, str | None],
    runtime: str,
    series: str,
    ladder: int,
) -> ProbeKeys:
    """The keys of a job of `namespace` (of `tenant`, whose jobs run as a user of their own
    when `own_user`) on `where` (cluster, partition), in `runtime` on GPU `series`."""
    owner = probe_owner(namespace, tenant, own_user)
    cluster, partition = where
    return ProbeKeys(
        cache_key(owner, cluster, partition, runtime, series),
        avoid_key(owner, cluster),
        ladder,
        share_owner(namespace, tenant),
    )


def probe_summary(probe: AttemptProbe) -> str:
    """One line for a condition, an Event and `kubectl describe`."""
    if probe.outcome == "Skipped":
        return f"skipped: the cache names rung {probe.rung} for this job's key"
    tried = f" (rungs tried: {probe.rungs})" if probe.rungs else ""
    if probe.outcome == "Passed":
        speed = f", bus bandwidth {probe.bus_bandwidth:g} GB/s" if probe.bus_bandwidth else ""
        return f"passed on rung {probe.rung}{speed}{tried}"
    blamed = f"; nodes blamed: {', '.join(probe.blamed)}" if probe.blamed else "; no node blamed"
    return f"failed on every rung{tried}{blamed}"


def with_probe(
    status: SlurmJobStatus, record: ProbeRecord, generation: int | None, now: datetime
) -> Transition:
    """The current attempt's probe as recorded, and the ProbePassed condition; nothing new
    (no Event) when the attempt already holds this outcome."""
    attempt = status.current_attempt
    if attempt is None:
        return Transition(status)
    before = probe_of(attempt)
    if before is None:
        return Transition(status)  # no probe was planned: a record is not this attempt's
    probe = before.model_copy(
        update={
            "outcome": record.outcome,
            "rung": record.rung,
            "bus_bandwidth": record.bandwidth,
            "rungs": " ".join(record.rungs) or None,
            "blamed": list(record.blamed),
        }
    )
    if probe == before:
        return Transition(status)
    text = f"collective probe {probe_summary(probe)}"
    value: ConditionStatus = "False" if record.outcome == "Failed" else "True"
    reason = {
        "Passed": Reason.PROBE_PASSED,
        "Skipped": Reason.PROBE_CACHED,
        "Failed": Reason.PROBE_FAILED,
    }[record.outcome]
    attempt = attempt.model_copy(update={"probe": probe})
    new = with_conditions(status, [(PROBE_PASSED, value, reason, text)], generation, now)
    new = new.model_copy(update={"attempts": replace_attempt(new, attempt)})
    return Transition(new, (Event(WARNING if value == "False" else NORMAL, reason, text),))


def probe_retries(status: SlurmJobStatus) -> int:
    """New attempts the probe has made so far (its own counter, apart from spec.retry's)."""
    return sum(1 for a in status.attempts if action_of(a) == PROBE_RETRY_ACTION)


def after_failed_probe(
    status: SlurmJobStatus, most: int, generation: int | None, now: datetime
) -> Transition:
    """The probe failed on every rung: a new attempt at once that excludes the nodes it blamed
    (up to `most` of them), else Failed with reason ProbeFailed."""
    attempt = status.current_attempt
    assert attempt is not None
    probe = probe_of(attempt)
    assert probe is not None
    done = probe_retries(status)
    summary = probe_summary(probe)
    if probe.blamed and done < most:
        text = (
            f"the collective probe {summary}: attempt {attempt.number + 1} excludes "
            f"{', '.join(probe.blamed)} (probe attempt {done + 1} of {most})"
        )
        return next_attempt_due(
            status,
            PROBE_RETRY_ACTION,
            Reason.PROBE_RETRY,
            text,
            now,
            (ConditionType.READY, ConditionType.RUNNING, ConditionType.FAILED),
            generation,
            now,
        )
    why = "no node was blamed" if not probe.blamed else f"{done} probe attempt(s) of {most} made"
    text = f"the collective probe {summary}; {why}: the command never ran"
    attempt = attempt.model_copy(update={"retry_action": "Fail"})
    failed: list[tuple[str, ConditionStatus, str, str]] = [
        (ConditionType.RUNNING, "False", Reason.PROBE_FAILED, text),
        (ConditionType.READY, "False", Reason.PROBE_FAILED, text),
        (ConditionType.SUCCEEDED, "False", Reason.PROBE_FAILED, text),
        (ConditionType.FAILED, "True", Reason.PROBE_FAILED, text),
    ]
    new = with_conditions(status, failed, generation, now)
    new = new.model_copy(update={"attempts": replace_attempt(new, attempt), "message": text})
    return Transition(new, (Event(WARNING, Reason.PROBE_FAILED, text),))
