"""Log patterns are RE2 (api.patterns): linear-time matching, refused at validation with the
field named when RE2 cannot compile them or their program is too large."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
import re2
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.api.patterns import (
    MAX_PATTERN_LENGTH,
    MAX_PROGRAM_SIZE,
    PatternError,
    compile_pattern,
)
from slurmjob_operator.api.retry import RetrySpec
from slurmjob_operator.api.status import Phase, get_condition
from slurmjob_operator.core.retries import DEFAULT_RULES, MAX_LOG_BYTES, decide, searchable
from slurmjob_operator.core.states import Observation
from slurmjob_operator.storage.logs import DEFAULT_MAX_BYTES

from .controller_fakes import Bed, cpu_spec, make_bed

DEFAULT_PATTERNS = [
    (name, rule.on_log_pattern) for name, rule in DEFAULT_RULES if rule.on_log_pattern is not None
]


def test_re2_is_google_re2_not_a_fallback_to_re() -> None:
    # The `re2` and `pyre2` packages import under the same name and fall back to Python's re.
    files = importlib.metadata.distribution("google-re2").files or []
    [init] = [f for f in files if str(f) == "re2/__init__.py"]
    assert Path(str(init.locate())).resolve() == Path(re2.__file__).resolve()


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(?=a)", "invalid perl operator: (?="),  # lookahead
        ("(?<=a)b", "invalid perl operator: (?<="),  # lookbehind
        (r"(a)\1", r"invalid escape sequence: \1"),  # backreference
        (r"(?P<x>a)(?P=x)", "invalid perl operator: (?P"),  # named backreference
        ("a++", "bad repetition operator: ++"),  # possessive
        (r"done\Z", r"RE2 writes the end of the text \z"),
        ("(", "missing ): ("),
    ],
)
def test_what_only_a_backtracking_engine_accepts_is_refused(pattern: str, reason: str) -> None:
    if pattern != "(":
        re.compile(pattern)  # Python's re accepts it
    with pytest.raises(PatternError, match="RE2") as caught:
        compile_pattern(pattern)
    assert reason in str(caught.value)


def test_a_short_pattern_with_a_large_program_is_refused() -> None:
    with pytest.raises(
        PatternError, match=rf"compiles to 8005 RE2 instructions.*{MAX_PROGRAM_SIZE}"
    ):
        compile_pattern(r"[^\n]{1000}z")
    assert compile_pattern(r"[A-Z][a-z]+Error: .{0,200}$").program_size <= MAX_PROGRAM_SIZE


def test_length_and_unicode_are_checked() -> None:
    with pytest.raises(PatternError, match="longer than 1024"):
        compile_pattern("a" * (MAX_PATTERN_LENGTH + 1))
    with pytest.raises(PatternError, match="not valid Unicode"):
        compile_pattern("\ud800")


def test_pathological_patterns_and_inputs_give_the_right_answer() -> None:
    # Python's re never returns from the first and takes hours over the second.
    assert not compile_pattern("(a+)+$").search(b"a" * 100_000 + b"!")
    assert compile_pattern("(a+)+$").search(b"!" + b"a" * 100_000)
    [link] = [p for name, p in DEFAULT_PATTERNS if "link down" in name]
    assert not compile_pattern(link).search(b"ib" * 32_768)
    assert compile_pattern(link).search(b"ib" * 32_768 + b" Link is down")


def test_each_pattern_is_compiled_once() -> None:
    assert compile_pattern("flaky (test|node)") is compile_pattern("flaky (test|node)")
    maxsize = compile_pattern.cache_info().maxsize
    assert maxsize is not None
    assert maxsize <= 128


def test_patterns_see_the_end_of_the_logs_and_no_more() -> None:
    # What the controller passes: the stdout and stderr tails joined by a newline.
    assert MAX_LOG_BYTES == 2 * DEFAULT_MAX_BYTES + 1
    failed = Observation(
        phase=Phase.FAILED,
        reason="NonZeroExitCode",
        message="failed",
        native_state="FAILED",
        native_flags=[],
        exit_code=1,
        final=True,
    )
    spec = RetrySpec.model_validate(rules("needle"))
    assert decide(spec, failed, "x" * MAX_LOG_BYTES + "needle", []).rule == "rules[0]"
    assert decide(spec, failed, "needle" + "x" * MAX_LOG_BYTES, []).rule == "no rule matched"
    # A cut inside a character leaves none of it.
    text = searchable("é" * MAX_LOG_BYTES)
    assert len(text) <= MAX_LOG_BYTES
    assert text.decode() == "é" * (len(text) // 2)


# -- the default rules say what they said under Python's re ------------------------------------

SAMPLES = [
    "[rank3]: NCCL WARN Call to ibv_poll_cq timed out; Watchdog caught collective operation",
    "NCCL ERROR Timeout waiting for peer",
    "NCCL INFO comm 0x55 rank 0 nranks 8 - Init COMPLETE",
    "[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout: WorkNCCL",
    "RuntimeError: NCCL communicator was aborted on rank 2.",
    "RuntimeError: CUDA error: initialization error",
    "CUDA driver initialization failed, you might not have a CUDA gpu.",
    "cudaErrorInitializationError",
    "RuntimeError: No CUDA GPUs are available; no CUDA-capable device is detected",
    "CUDA driver version is insufficient for CUDA runtime version",
    "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    "kernel: Xid (PCI:0000:3b:00): 48",
    "MyXid (PCI:0000:3b:00)",
    "GPU has fallen off the bus",
    "NVLink: link 3 is down",
    "NVLink 2 inactive",
    "mlx5_0: Link is down",
    "ib0: link down",
    "ibp65s0 port 1 Link down",
    "mlx5_core 0000:3b:00.0: port state: DOWN",
    "ib0: link is up",
    "kernel: oom_reaper: reaped process 4242 (python), now anon-rss:0kB",
    "Out of memory: Killed process 4242 (python)",
    "Traceback (most recent call last): ValueError: bad config",
    "epoch 3 loss 0.12",
    "",
]


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize(
    ("name", "pattern"), DEFAULT_PATTERNS, ids=[n for n, _ in DEFAULT_PATTERNS]
)
def test_default_patterns_match_what_they_matched_under_re(
    name: str, pattern: str, sample: str
) -> None:
    assert compile_pattern(pattern).search(sample.encode()) == bool(re.search(pattern, sample))


def test_every_sample_is_matched_by_the_default_rule_it_names() -> None:
    hits = [
        s
        for s in SAMPLES
        if any(compile_pattern(p).search(s.encode()) for _, p in DEFAULT_PATTERNS)
    ]
    assert len(hits) == 20  # the last six are near misses and program output


# Short ASCII texts built from the words the patterns look for: Python's re is quick on these.
_TOKENS = st.sampled_from(
    [
        "ib", "mlx5", "_0", "Link", "link", " is ", " ", "down", "DOWN", "up", "NVLink",
        "inactive", "\n", "x", "NCCL ", "WARN ", "INFO ", "timed out", "time out", "Timeout",
        "Xid", " (PCI:", "NVRM: ", "port state: ", "Out of memory: Killed process",
        "oom_reaper: reaped process", "CUDA error: ", "initialization error", "GPU has fallen",
    ]
)  # fmt: skip


@given(st.lists(_TOKENS, max_size=24).map("".join))
def test_default_patterns_agree_with_re_on_generated_lines(text: str) -> None:
    for _, pattern in DEFAULT_PATTERNS:
        assert compile_pattern(pattern).search(text.encode()) == bool(re.search(pattern, text))


# -- validation: the field is named ------------------------------------------------------------


def rules(*patterns: str) -> dict[str, object]:
    return {"limit": 1, "rules": [{"action": "Retry", "onLogPattern": p} for p in patterns]}


@pytest.mark.parametrize(
    ("retry", "field", "text"),
    [
        (rules("(?=a)"), "spec.retry.rules[0].onLogPattern", "invalid perl operator: (?="),
        (rules("ok", r"(a)\1"), "spec.retry.rules[1].onLogPattern", r"invalid escape sequence"),
        (rules(r"[^\n]{1000}z"), "spec.retry.rules[0].onLogPattern", "8005 RE2 instructions"),
        (
            rules(*[r"[A-Z][a-z]+Error: .{0,200}$"] * 2),
            "spec.retry.rules",
            "up to rules[1] compile to 3628 RE2 instructions together",
        ),
    ],
)
def test_a_pattern_re2_refuses_is_an_invalid_spec_naming_the_field(
    retry: dict[str, object], field: str, text: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(cpu_spec(retry=retry))
    [message] = caught.value.messages
    assert message.startswith(f"{field}: ")
    assert text in message


async def test_the_resource_shows_invalid_spec_and_nothing_is_submitted(tmp_path: Path) -> None:
    # The CRD cannot run RE2 (kubectl apply accepts the pattern); the operator is the gate.
    bed = make_bed(tmp_path)
    ref = bed.store.create("train", cpu_spec(retry=rules("error(?! ignored)")))
    await bed.controller.reconcile(ref)
    status = bed.store.status(ref)
    ready = get_condition(status.conditions, "Ready")
    assert status.phase is Phase.FAILED
    assert ready is not None
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert (ready.message or "").startswith("spec.retry.rules[0].onLogPattern: ")
    assert bed.slurm.calls == []


# -- following: hostile logs do not stall the operator ----------------------------------------


async def follow_to_failure(bed: Bed, retry: dict[str, object], stdout: str) -> Phase:
    ref = bed.store.create("train", cpu_spec(retry=retry))
    await bed.controller.reconcile(ref)
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    (staging / "stdout.log").write_text(stdout)
    bed.slurm.set_state(100, "FAILED", 1)
    [item] = [t for t in bed.controller.followed() if t.ref == ref]
    views = await bed.slurm.get_job(bed.slurm.lifecycle_ref(item.job_id, item.sluid))
    await bed.controller.refresh(item, views)
    return bed.store.status(ref).phase


@pytest.mark.timeout(120)  # Python's re took hours on both logs (the test then timed out)
@pytest.mark.parametrize(
    ("stdout", "phase"),
    [
        ("ib" * 20_000 + "\n" + "a" * 5_000, Phase.FAILED),  # neither rule matches
        ("ib" * 20_000 + "\n" + "a" * 5_000 + "b", Phase.PENDING),  # (a+)+b: a retry
    ],
)
async def test_a_failed_attempt_with_hostile_logs_is_decided(
    tmp_path: Path, stdout: str, phase: Phase
) -> None:
    bed = make_bed(tmp_path)
    retry = {
        "limit": 1,
        "backoffSeconds": 3600,
        "rules": [{"action": "Retry", "onLogPattern": "(a+)+b"}],
    }
    assert await follow_to_failure(bed, retry, stdout) is phase
