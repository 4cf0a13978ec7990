"""The controller and hostile shared storage (issue 9, findings 1, 2, 7 and redaction): the
log tails it publishes, how long a read may hold it up, which directory it trusts, and which
secret values it hides. The controller against the in-memory store and Slurm, real files."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.status import Phase, SlurmJobStatus, get_condition
from slurmjob_operator.controller import Controller, RetryLater, Tracked
from slurmjob_operator.controller import following as following_module
from slurmjob_operator.controller.poller import Poller
from slurmjob_operator.core import naming
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.storage.logs import read_attempt_logs, tail_signatures

from .controller_fakes import Bed, StubToken, cpu_spec, make_bed

MARKER = "OPERATOR-ONLY-MARKER-77a1"
ME = os.geteuid()
JOB = 4242
SECRET_ENV = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


async def submit(bed: Bed, name: str = "train", **spec: Any) -> Any:
    ref = bed.store.create(name, cpu_spec(**spec))
    with contextlib.suppress(RetryLater):
        await bed.controller.reconcile(ref)
    return ref


def tracked(bed: Bed, ref: Any) -> Tracked:
    [item] = [t for t in bed.controller.followed() if t.ref == ref]
    return item


async def refresh(bed: Bed, ref: Any, controller: Controller | None = None) -> None:
    item = tracked(bed, ref)
    views = await bed.slurm.get_job(item.job_id)
    await (controller or bed.controller).refresh(item, views)


def staging(bed: Bed, ref: Any, attempt: int = 1) -> Path:
    return naming.staging_dir(bed.settings.storage_root, ref.namespace, ref.name, ref.uid, attempt)


def stdout_tail(bed: Bed, ref: Any) -> str | None:
    logs = bed.store.status(ref).logs
    return logs.stdout.tail if logs is not None and logs.stdout is not None else None


async def test_a_symlinked_log_is_never_published(bed: Bed, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(MARKER + "\n")
    secret.chmod(0o600)
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").write_text("epoch 1\n")
    await refresh(bed, ref)
    assert stdout_tail(bed, ref) == "epoch 1\n"
    (staging(bed, ref) / "stdout.log").unlink()
    (staging(bed, ref) / "stdout.log").symlink_to(secret)
    bed.slurm.set_state(100, "COMPLETED", 0)
    await refresh(bed, ref)
    body = repr(bed.store.body(ref))
    assert MARKER not in body
    status = bed.store.status(ref)
    assert status.phase is Phase.SUCCEEDED, "the state is still folded"
    assert stdout_tail(bed, ref) == "epoch 1\n", "the tail is kept as it was"


@pytest.mark.timeout(20)
async def test_a_fifo_at_the_log_holds_up_no_other_job(bed: Bed) -> None:
    blocked = await submit(bed, "blocked")
    other = await submit(bed, "other")
    for job_id in (100, 101):
        bed.slurm.set_state(job_id, "RUNNING")
    os.mkfifo(staging(bed, blocked) / "stdout.log")
    (staging(bed, other) / "stdout.log").write_text("still followed\n")
    started = time.monotonic()
    await refresh(bed, blocked)
    await refresh(bed, other)
    assert time.monotonic() - started < 2.0
    assert bed.store.status(blocked).phase is Phase.RUNNING
    assert stdout_tail(bed, other) == "still followed\n"


@pytest.mark.timeout(20)
async def test_a_read_that_hangs_is_given_up_and_the_tail_kept(
    bed: Bed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever makes a read hang (a stuck filesystem), one job's storage must not stall the
    others: the read is bounded by READ_TIMEOUT and the status keeps its tails."""
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").write_text("epoch 1\n")
    await refresh(bed, ref)
    release = threading.Event()
    real = read_attempt_logs

    def hang(*args: Any, **kwargs: Any) -> Any:
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(following_module, "read_attempt_logs", hang)
    monkeypatch.setattr(following_module, "READ_TIMEOUT", 0.2)
    (staging(bed, ref) / "stdout.log").write_text("epoch 1\nepoch 2\n")
    bed.slurm.set_state(100, "COMPLETED", 0)
    started = time.monotonic()
    try:
        await refresh(bed, ref)
    finally:
        release.set()
    assert time.monotonic() - started < 2.0
    assert bed.store.status(ref).phase is Phase.SUCCEEDED
    assert stdout_tail(bed, ref) == "epoch 1\n"
    assert "took over 0.2 s" in caplog.text


async def test_the_staging_directory_comes_from_the_resource_not_the_status(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    """A status patched to name another tenant's attempt: its logs are not published here and
    its secrets are not removed; the attempt's own directory is used, with a warning."""
    other_ns = bed.store.create("victim", cpu_spec(), namespace="team-b")
    await bed.controller.reconcile(other_ns)
    victim_dir = staging(bed, other_ns)
    (victim_dir / "stdout.log").write_text(MARKER + "\n")
    (victim_dir / "secrets.env").write_text("TOKEN=victim-secret\0")
    ref = await submit(bed)
    (staging(bed, ref) / "stdout.log").write_text("mine\n")
    bed.store.body(ref)["status"]["attempts"][0]["stagingDir"] = str(victim_dir)
    bed.controller.observe_body(bed.store.body(ref))
    bed.slurm.set_state(tracked(bed, ref).job_id, "COMPLETED", 0)  # final: secrets removed
    await refresh(bed, ref)
    assert bed.store.status(ref).phase is Phase.SUCCEEDED
    assert MARKER not in repr(bed.store.body(ref))
    assert stdout_tail(bed, ref) == "mine\n"
    assert (victim_dir / "secrets.env").exists(), "another attempt's files are left alone"
    assert "names the staging directory" in caplog.text


async def test_the_poller_signs_the_derived_directory(bed: Bed) -> None:
    ref = await submit(bed)
    (staging(bed, ref) / "stdout.log").write_text("x\n")
    forged = Tracked(ref, 100, None, "/etc", 1)
    poller = Poller(bed.controller)
    expected = tail_signatures(
        bed.settings.storage_root, staging(bed, ref), ("stdout.log", "stderr.log"), ME
    )
    assert poller._signature(forged) == expected
    assert expected[0] is not None


async def test_a_secret_too_short_to_hide_is_refused_naming_the_variable(bed: Bed) -> None:
    bed.store.secrets[("team-a", "hf")] = {"token": "abc"}
    ref = await submit(bed, env=SECRET_ENV)
    status = bed.store.status(ref)
    ready = get_condition(status.conditions, "Ready")
    assert ready is not None
    assert (ready.status, ready.reason) == ("False", "SecretNotFound")
    assert "env TOKEN" in ready.message
    assert "shorter than 4 characters" in ready.message
    assert "abc" not in ready.message
    assert status.attempts == []
    assert bed.slurm.calls == []
    bed.store.secrets[("team-a", "hf")] = {"token": "abcd"}
    await bed.controller.reconcile(ref)
    assert bed.store.status(ref).phase is Phase.QUEUED


async def test_an_empty_secret_is_taken(bed: Bed) -> None:
    bed.store.secrets[("team-a", "hf")] = {"token": ""}
    ref = await submit(bed, env=SECRET_ENV)
    assert bed.store.status(ref).phase is Phase.QUEUED


def _restarted(bed: Bed) -> Controller:
    """A new operator process on the same cluster: nothing kept in memory."""
    return Controller(
        bed.settings,
        bed.store,
        None,  # type: ignore[arg-type]  # the in-memory Slurm replaces the transport
        Metrics(),
        token=StubToken(),  # type: ignore[arg-type]
        link=bed.slurm,  # type: ignore[arg-type]
    )


@pytest.mark.skipif(ME != 0, reason="needs root (the operator hands the files to the job user)")
async def test_after_a_restart_the_values_the_attempt_was_given_are_hidden(
    tmp_path: Path,
) -> None:
    bed = make_bed(tmp_path, staging_owner=f"{JOB}:{JOB}")
    bed.store.secrets[("team-a", "hf")] = {"token": "first-value-1234"}
    ref = await submit(bed, env=SECRET_ENV)
    bed.slurm.set_state(100, "RUNNING")
    log = staging(bed, ref) / "stdout.log"
    log.write_text("token=first-value-1234\n")
    os.chown(log, JOB, JOB)
    # The Secret is rotated, then the operator restarts.
    bed.store.secrets[("team-a", "hf")] = {"token": "second-value-5678"}
    restarted = _restarted(bed)
    restarted.observe_body(bed.store.body(ref))
    item = next(t for t in restarted.followed() if t.ref == ref)
    await restarted.refresh(item, await bed.slurm.get_job(100))
    assert stdout_tail(bed, ref) == "token=***\n"
    assert "first-value-1234" not in repr(bed.store.body(ref))


async def test_after_a_restart_as_the_job_user_the_current_values_are_hidden(bed: Bed) -> None:
    """No copy is kept when the jobs could read it (the operator is their user): a restarted
    operator knows the Secret's current value only (the documented gap)."""
    bed.store.secrets[("team-a", "hf")] = {"token": "first-value-1234"}
    ref = await submit(bed, env=SECRET_ENV)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").write_text("a=first-value-1234 b=second-value-5678\n")
    bed.store.secrets[("team-a", "hf")] = {"token": "second-value-5678"}
    restarted = _restarted(bed)
    restarted.observe_body(bed.store.body(ref))
    item = next(t for t in restarted.followed() if t.ref == ref)
    await restarted.refresh(item, await bed.slurm.get_job(100))
    assert stdout_tail(bed, ref) == "a=first-value-1234 b=***\n"
    assert not list(staging(bed, ref).parent.glob(".redact-*"))


async def test_the_secret_gone_means_no_tail_without_a_copy(bed: Bed) -> None:
    bed.store.secrets[("team-a", "hf")] = {"token": "first-value-1234"}
    ref = await submit(bed, env=SECRET_ENV)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").write_text("token=first-value-1234\n")
    del bed.store.secrets[("team-a", "hf")]
    restarted = _restarted(bed)
    restarted.observe_body(bed.store.body(ref))
    item = next(t for t in restarted.followed() if t.ref == ref)
    await restarted.refresh(item, await bed.slurm.get_job(100))
    assert stdout_tail(bed, ref) is None


async def test_deletion_archives_through_the_same_reader(bed: Bed, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(MARKER + "\n")
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    (staging(bed, ref) / "stdout.log").symlink_to(secret)
    body = bed.store.body(ref)
    await bed.controller.finalize(body)
    assert MARKER not in repr(bed.store.objects)
    assert not staging(bed, ref).parent.exists()
    assert secret.read_text() == MARKER + "\n"


def test_status_never_carries_secret_values() -> None:
    """The copy lives on the storage, never in the status: the model has no field for it."""
    fields = set(SlurmJobStatus.model_fields)
    assert not {f for f in fields if "redact" in f or "secret" in f}


async def test_nothing_blocks_the_event_loop_while_a_fifo_sits_there(bed: Bed) -> None:
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    os.mkfifo(staging(bed, ref) / "stdout.log")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.get_running_loop().create_task(tick())
    try:
        await asyncio.wait_for(refresh(bed, ref), 5)
    finally:
        ticker.cancel()
    assert bed.store.status(ref).phase is Phase.RUNNING


async def test_an_interrupted_attempt_is_restarted_from_its_own_directory(bed: Bed) -> None:
    """The adoption looks at (and removes) the attempt's derived directory, not the one a
    patched status names: another tenant's attempt stays as it is."""
    victim = bed.store.create("victim", cpu_spec(), namespace="team-b")
    await bed.controller.reconcile(victim)
    victim_dir = staging(bed, victim)
    bed.slurm.faults = ["unsent"]  # the answer is lost, and no job was made
    ref = await submit(bed)
    (staging(bed, ref) / "job.sh").unlink()  # as if the operator stopped before job.sh
    bed.store.body(ref)["status"]["attempts"][0]["stagingDir"] = str(victim_dir)
    with contextlib.suppress(RetryLater):
        await bed.controller.reconcile(ref)
    assert "SubmitInterrupted" in bed.store.reasons()
    assert (victim_dir / "job.sh").exists(), "another attempt's files are left alone"
    assert (staging(bed, ref) / "job.sh").exists(), "its own attempt is staged again"
    assert bed.store.status(ref).phase is Phase.QUEUED
