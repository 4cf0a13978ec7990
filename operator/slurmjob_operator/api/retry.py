"""spec.retry: the ordered rules that decide whether a failed attempt gets another one
(evaluated by `core.retries`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, field_validator, model_validator

from slurmjob_operator.api.model import Model as _Model
from slurmjob_operator.api.patterns import MAX_PATTERN_LENGTH, MAX_PROGRAM_SIZE, compile_pattern


class RetryAction(StrEnum):
    RETRY = "Retry"
    FAIL = "Fail"
    IGNORE = "Ignore"


class ExitCodes(_Model):
    operator: Literal["In", "NotIn"] = Field(description="In or NotIn.")
    values: list[int] = Field(
        min_length=1, max_length=64, description="Exit codes (0-255) of the batch script."
    )

    @field_validator("values")
    @classmethod
    def _byte(cls, value: list[int]) -> list[int]:
        if any(v < 0 or v > 255 for v in value):
            raise ValueError("exit codes are 0 to 255")
        return value


class RetryRule(_Model):
    """Matches a failed attempt when every criterion given matches; the first match decides."""

    action: RetryAction = Field(
        description=(
            "Retry (a new attempt, counted against limit), Fail (fail now) or Ignore (a new "
            "attempt not counted against limit)."
        )
    )
    on_states: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Slurm base states or flags, e.g. NODE_FAIL, BOOT_FAIL, LAUNCH_FAILED.",
    )
    on_reasons: list[str] = Field(
        default_factory=list, max_length=32, description="Slurm state reasons, e.g. NodeDown."
    )
    on_exit_codes: ExitCodes | None = Field(default=None, description="Exit codes to match.")
    on_log_pattern: str | None = Field(
        default=None,
        max_length=MAX_PATTERN_LENGTH,
        description="Regular expression searched in the attempt's stdout and stderr tails.",
    )

    @field_validator("on_log_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        # The apiserver cannot run RE2, so this is where a pattern the operator cannot match in
        # linear time is refused (InvalidSpec, with the field named).
        if value is not None:
            compile_pattern(value)  # its PatternError is a ValueError: pydantic reports it
        return value

    @model_validator(mode="after")
    def _some_criterion(self) -> RetryRule:
        if not (self.on_states or self.on_reasons or self.on_exit_codes or self.on_log_pattern):
            raise ValueError(
                "a retry rule needs at least one of onStates, onReasons, onExitCodes, onLogPattern"
            )
        return self


class RetrySpec(_Model):
    limit: int = Field(
        default=0, ge=0, le=20, description="Retries of infrastructure failures (new attempts)."
    )
    backoff_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="Delay before the first retry; doubled for each further one (at most 1 h).",
    )
    rules: list[RetryRule] = Field(
        default_factory=list,
        max_length=32,
        description="Ordered rules, tried before the default infrastructure rules.",
    )
    default_rules: bool = Field(
        default=True,
        description=(
            "Append the default rules: NODE_FAIL, BOOT_FAIL, LAUNCH_FAILED and log patterns of "
            "NCCL timeouts, CUDA driver init failures, Xid errors, GPU/IB link down and OOM-killer "
            "node reaping are retried."
        ),
    )

    @field_validator("rules")
    @classmethod
    def _bounded_together(cls, rules: list[RetryRule]) -> list[RetryRule]:
        # Each pattern is bounded alone; a failed attempt runs all of them over the same logs.
        total = 0
        for i, rule in enumerate(rules):
            if rule.on_log_pattern is not None:
                total += compile_pattern(rule.on_log_pattern).program_size
                if total > MAX_PROGRAM_SIZE:
                    raise ValueError(
                        f"the onLogPatterns up to rules[{i}] compile to {total} RE2 "
                        f"instructions together, more than the {MAX_PROGRAM_SIZE} allowed"
                    )
        return rules
