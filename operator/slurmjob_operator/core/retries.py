"""Retries owned by the operator: which failed attempts get a new attempt, and when.

Slurm's own requeue stays off (every job description disables it): a retry here is a new
attempt with a new job name and staging directory. In the spirit of Kubernetes'
podFailurePolicy, ordered rules match the Slurm state, reason, exit code and the log tails;
the first match decides between Retry (counted against `limit`), Ignore (a new attempt that
is not counted) and Fail. The default rules retry what the cluster broke, never what the
program did: a program's own non-zero exit fails at once without spending the budget.

Log patterns are RE2 (`api.patterns`), linear in the text, and see at most the last
`MAX_LOG_BYTES` of it: the logs are the job's own output, so neither the pattern nor the text
may make the search long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurmjob_operator.api.patterns import compile_pattern
from slurmjob_operator.api.retry import ExitCodes, RetryAction, RetryRule, RetrySpec
from slurmjob_operator.api.status import Attempt, Phase
from slurmjob_operator.core.claims import MAX_IGNORED, action_of
from slurmjob_operator.core.states import Observation

MAX_BACKOFF_SECONDS = 3600
#: The stdout and stderr tails (64 KiB each, `storage.logs`) joined by a newline. A tail is
#: decoded with replacement, so its UTF-8 can be longer than the file's bytes were.
MAX_LOG_BYTES = 2 * 64 * 1024 + 1

_INFRA_LOG_PATTERNS: tuple[tuple[str, str], ...] = (
    (
        "NCCL timeout",
        r"NCCL (WARN|ERROR|INFO).*(time(d)? ?out|Timeout)|Watchdog caught collective operation "
        r"timeout|NCCL communicator was aborted",
    ),
    (
        "CUDA driver initialisation failure",
        r"CUDA driver initialization failed|cudaErrorInitializationError|CUDA error: "
        r"initialization error|no CUDA-capable device is detected|CUDA driver version is "
        r"insufficient",
    ),
    ("Xid error", r"NVRM: Xid|\bXid \(PCI:"),
    (
        "GPU or InfiniBand link down",
        r"GPU has fallen off the bus|NVLink.*(down|inactive)|(ib|mlx5)\S*.*[Ll]ink (is )?down|"
        r"port state: DOWN",
    ),
    ("OOM-killer node reaping", r"oom_reaper: reaped process|Out of memory: Killed process"),
)

DEFAULT_RULES: tuple[tuple[str, RetryRule], ...] = (
    (
        "node failure",
        RetryRule(action=RetryAction.RETRY, on_states=["NODE_FAIL", "BOOT_FAIL"]),
    ),
    ("launch failure", RetryRule(action=RetryAction.RETRY, on_states=["LAUNCH_FAILED"])),
    *(
        (name, RetryRule(action=RetryAction.RETRY, on_log_pattern=pattern))
        for name, pattern in _INFRA_LOG_PATTERNS
    ),
)


@dataclass(frozen=True)
class RetryDecision:
    action: RetryAction
    rule: str
    """Which rule decided: `rules[0]`, `default: node failure`, or `no rule matched`."""
    message: str
    delay_seconds: float = 0.0

    @property
    def retries(self) -> bool:
        return self.action is not RetryAction.FAIL


def _exit_matches(codes: ExitCodes, exit_code: int | None) -> bool:
    if exit_code is None:
        return False
    inside = exit_code in codes.values
    return inside if codes.operator == "In" else not inside


def searchable(logs: str) -> bytes:
    """The end of the logs that log patterns are searched in: UTF-8, at most MAX_LOG_BYTES."""
    data = logs.encode("utf-8", "replace")[-MAX_LOG_BYTES:]
    # Not from the middle of a character: skip the continuation bytes the cut left.
    start = 0
    while start < len(data) and start < 3 and 0x80 <= data[start] <= 0xBF:
        start += 1
    return data[start:]


def matches(rule: RetryRule, obs: Observation, logs: bytes) -> bool:
    """Every criterion the rule gives must hold (an absent one holds). `logs` is what
    `searchable` made of the tails."""
    states = {obs.native_state, *obs.native_flags}
    if rule.on_states and not states & set(rule.on_states):
        return False
    reasons = {r for r in (obs.slurm_reason, obs.reason) if r}
    if rule.on_reasons and not reasons & set(rule.on_reasons):
        return False
    if rule.on_exit_codes is not None and not _exit_matches(rule.on_exit_codes, obs.exit_code):
        return False
    return not (rule.on_log_pattern and not compile_pattern(rule.on_log_pattern).search(logs))


def _rules(spec: RetrySpec) -> list[tuple[str, RetryRule]]:
    own = [(f"rules[{i}]", rule) for i, rule in enumerate(spec.rules)]
    defaults = [(f"default: {name}", rule) for name, rule in DEFAULT_RULES]
    return own + (defaults if spec.default_rules else [])


def decide(
    spec: RetrySpec, obs: Observation, logs: str, attempts: Sequence[Attempt]
) -> RetryDecision:
    """What to do about a finished attempt. Only a Failed one is ever retried.

    `attempts` are the resource's earlier attempts (their `retry_action` says what counted;
    `core.claims.over_cap` bounds what a rewritten one can win).
    """
    if obs.phase is not Phase.FAILED or not obs.final:
        return RetryDecision(RetryAction.FAIL, "not failed", "only failed attempts are retried")
    text = searchable(logs)
    chosen: tuple[str, RetryRule] | None = next(
        ((name, rule) for name, rule in _rules(spec) if matches(rule, obs, text)), None
    )
    if chosen is None:
        return RetryDecision(
            RetryAction.FAIL,
            "no rule matched",
            f"{obs.reason}: a failure of the program itself is not retried",
        )
    name, rule = chosen
    counted = sum(1 for a in attempts if action_of(a) == RetryAction.RETRY.value)
    ignored = sum(1 for a in attempts if action_of(a) == RetryAction.IGNORE.value)
    if rule.action is RetryAction.FAIL:
        return RetryDecision(RetryAction.FAIL, name, f"{name} says Fail ({obs.reason})")
    if rule.action is RetryAction.RETRY and counted >= spec.limit:
        return RetryDecision(
            RetryAction.FAIL,
            name,
            f"{obs.reason} matches {name}, but the retry limit ({spec.limit}) is spent",
        )
    if rule.action is RetryAction.IGNORE and ignored >= MAX_IGNORED:
        return RetryDecision(
            RetryAction.FAIL,
            name,
            f"{obs.reason} matches {name} (Ignore), but {MAX_IGNORED} ignored attempts are spent",
        )
    delay = min(float(spec.backoff_seconds) * 2 ** (counted + ignored), MAX_BACKOFF_SECONDS)
    what = "retry" if rule.action is RetryAction.RETRY else "new attempt (not counted)"
    budget = f" {counted + 1}/{spec.limit}" if rule.action is RetryAction.RETRY else ""
    return RetryDecision(
        rule.action,
        name,
        f"{obs.reason} matches {name}: {what}{budget} in {delay:.0f} s",
        delay,
    )
