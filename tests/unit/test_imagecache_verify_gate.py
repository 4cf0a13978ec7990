"""Verified registry artifacts end to end in one process (imagecache/verifygate.py with a
stand-in verifier and an in-memory ConfigMap store, real files on a tmp storage root): one
verification job per artifact, written ahead before its submit and adopted by name after a
lost answer; a verified artifact that changed is verified again, never passed; the batch
script of a verified artifact compares the recorded stat line and carries no sha256 (its node
cannot hash it), and with the setting off it hashes in full as before. The real jobs run in
tests/integration/test_artifact_verify_e2e.py."""

from __future__ import annotations

import asyncio
import hashlib
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.unit.imagecache_fakes import Clock, ConfigMaps, FakeJobs
from tests.unit.test_render_cached_image import _chmod, _replace
from tests.unit.test_render_support import (
    make_context,
    make_spec,
    run_attempt,
    stand_in_settings,
    write_artifact,
)

from slurmjob_operator.config import Settings
from slurmjob_operator.imagecache.record import ImportAttempt
from slurmjob_operator.imagecache.verifygate import (
    ArtifactGate,
    ArtifactNotVerified,
    ArtifactVerifyFailed,
    artifact_gate,
)
from slurmjob_operator.imagecache.verifyjob import observe
from slurmjob_operator.imagecache.verifyrecord import ArtifactRecord, VerifyResult
from slurmjob_operator.imagecache.verifystore import ArtifactRecordStore
from slurmjob_operator.site.artifacts import (
    ArtifactChanged,
    RuntimeArtifact,
    VerifiedArtifact,
    verify_verified,
)
from slurmjob_operator.site.catalogs import ArtifactFormat
from slurmjob_operator.site.render import render_attempt

CACHE_UID = 990


class ArtifactMaps(ConfigMaps):
    def records(self) -> list[ArtifactRecord]:
        return [
            ArtifactRecord.from_json(m["record"])
            for name, m in self.maps.items()
            if name.startswith("slurmjob-artifact-")
        ]


class FakeVerifier(FakeJobs[VerifyResult]):
    """Submits into a dict of jobs; `finish` ends one as the real script would, with a result
    of what `lstat` sees of the file now."""

    def __init__(self, maps: ArtifactMaps) -> None:
        super().__init__()
        self.maps = maps
        self.submitted: list[str] = []
        self.seen_at_submit: list[list[ArtifactRecord]] = []

    async def submit(self, record: ArtifactRecord, attempt: ImportAttempt) -> int:
        self.seen_at_submit.append(self.maps.records())
        self.submitted.append(attempt.job_name)
        return self.send(attempt.job_name)

    def log_tail(self, attempt: ImportAttempt) -> str:
        return self.log

    def finish(self, name: str, path: Path, sha256: str, code: int = 0) -> None:
        self.end(name, code)
        if code == 0:
            info = path.lstat()
            self.results[name] = VerifyResult(
                job=name,
                format=ArtifactFormat.SQSH,
                sha256=sha256,
                size=info.st_size,
                inode=info.st_ino,
                ctime_ns=info.st_ctime_ns,
                uid=info.st_uid,
                mode=info.st_mode & 0o7777,
            )


def _settings(tmp_path: Path, **extra: Any) -> Settings:
    key = tmp_path / "jwt.key"
    key.write_bytes(b"k" * 32)
    values: dict[str, Any] = {
        "storage_root": tmp_path / "root",
        "slurm_jwt_key_file": key,
        "artifact_verify_jobs": True,
        "image_cache_root": tmp_path / "cache",
        "image_cache_user": "imagecache",
        # The cache user: the test's own uid where it is not root (the files are then its).
        "image_cache_uid": os.getuid() or CACHE_UID,
        "image_import_partition": "cpu",
        **extra,
    }
    return Settings(**values)


def _runtime(settings: Settings) -> tuple[RuntimeArtifact, Path]:
    runtime = write_artifact(settings, ArtifactFormat.SQSH)
    path = settings.storage_root / runtime.path
    path.chmod(0o444)
    path.parent.chmod(0o755)
    return runtime, path


def _gate(settings: Settings) -> tuple[ArtifactGate, FakeVerifier, Clock, ArtifactMaps]:
    clock = Clock()
    maps = ArtifactMaps()
    verifier = FakeVerifier(maps)
    store = ArtifactRecordStore(maps, "ops")  # type: ignore[arg-type]
    gate = ArtifactGate(settings, store, verifier, clock=clock)  # type: ignore[arg-type]
    return gate, verifier, clock, maps


def _verified(tmp_path: Path) -> tuple[ArtifactGate, FakeVerifier, Clock, ArtifactMaps, Path]:
    settings = _settings(tmp_path)
    runtime, path = _runtime(settings)
    gate, verifier, clock, maps = _gate(settings)
    with pytest.raises(ArtifactNotVerified, match="being verified by job 100"):
        asyncio.run(gate.verified(runtime))
    verifier.finish(verifier.submitted[0], path, runtime.sha256)
    asyncio.run(gate.verified(runtime))
    return gate, verifier, clock, maps, path


def test_a_runtime_is_verified_by_one_job_written_ahead(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    runtime, path = _runtime(settings)
    gate, verifier, _, maps = _gate(settings)
    with pytest.raises(ArtifactNotVerified, match="of the cache user on partition cpu"):
        asyncio.run(gate.verified(runtime))
    # The record named the job before the job was sent.
    (ahead,) = verifier.seen_at_submit[0]
    assert ahead.attempt is not None
    assert (ahead.attempt.job_name, ahead.attempt.write_ahead) == (verifier.submitted[0], True)
    (record,) = maps.records()
    assert record.attempt is not None
    assert record.attempt.job_id == 100
    with pytest.raises(ArtifactNotVerified, match="job 100"):
        asyncio.run(gate.verified(runtime))  # still running: waits, sends nothing
    verifier.finish(verifier.submitted[0], path, runtime.sha256)
    artifact = asyncio.run(gate.verified(runtime))
    info = path.lstat()
    assert isinstance(artifact, VerifiedArtifact)
    assert (artifact.size, artifact.inode, artifact.ctime_ns) == (
        info.st_size,
        info.st_ino,
        info.st_ctime_ns,
    )
    assert artifact.node_path.as_posix() == str(path)  # no slurm storage root: the same
    assert artifact.verified_by == verifier.submitted[0]
    assert len(verifier.submitted) == 1


def test_a_second_slurmjob_runs_from_the_record_alone(tmp_path: Path) -> None:
    gate, verifier, clock, maps, path = _verified(tmp_path)
    writes = maps.writes
    runtime = _same_runtime(gate.settings, path)
    clock.now += timedelta(days=3)
    for _ in range(3):
        assert isinstance(asyncio.run(gate.verified(runtime)), VerifiedArtifact)
    assert len(verifier.submitted) == 1
    assert maps.writes == writes


def _same_runtime(settings: Settings, path: Path) -> RuntimeArtifact:
    return RuntimeArtifact(
        id="custom-test",
        format=ArtifactFormat.SQSH,
        path=str(path.relative_to(settings.storage_root)),
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
    )


def _hard_link(path: Path) -> None:
    os.link(path, path.with_name("another-name.sqsh"))  # a new link changes the ctime too


def _symlink(path: Path) -> None:
    real = path.with_name("real.sqsh")
    path.rename(real)
    path.symlink_to(real)


@pytest.mark.parametrize("change", [_chmod, _replace, _hard_link, _symlink, Path.unlink])
def test_a_changed_artifact_is_verified_again_never_passed(tmp_path: Path, change: Any) -> None:
    gate, verifier, _, maps, path = _verified(tmp_path)
    runtime = _same_runtime(gate.settings, path)
    change(path)
    with pytest.raises(ArtifactNotVerified, match="being verified by job 101"):
        asyncio.run(gate.verified(runtime))
    assert len(verifier.submitted) == 2
    (record,) = maps.records()
    assert record.verified is None
    assert record.attempt is not None
    assert record.attempt.number == 2


def test_a_lost_submit_is_adopted_by_its_name(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    runtime, path = _runtime(settings)
    gate, verifier, _, maps = _gate(settings)
    verifier.lose_answer = True
    with pytest.raises(ArtifactNotVerified, match="unconfirmed"):
        asyncio.run(gate.verified(runtime))
    (record,) = maps.records()
    assert record.attempt is not None
    assert record.attempt.write_ahead
    verifier.lose_answer = False
    with pytest.raises(ArtifactNotVerified, match="job 100"):
        asyncio.run(gate.verified(runtime))
    assert len(verifier.submitted) == 1  # found by its name, not sent again
    verifier.finish(verifier.submitted[0], path, runtime.sha256)
    assert isinstance(asyncio.run(gate.verified(runtime)), VerifiedArtifact)


def test_a_failed_verification_fails_with_its_reason_and_log(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    runtime, _ = _runtime(settings)
    gate, verifier, clock, _ = _gate(settings)
    with pytest.raises(ArtifactNotVerified):
        asyncio.run(gate.verified(runtime))
    verifier.log = "slurmjob-verify: ... has mode 664: its group or others may write it"
    verifier.finish(verifier.submitted[0], Path(), runtime.sha256, code=77)
    with pytest.raises(ArtifactVerifyFailed, match="ArtifactUnsafe") as failed:
        asyncio.run(gate.verified(runtime))
    assert "the verification's log ends: slurmjob-verify: ... has mode 664" in str(failed.value)
    clock.now += timedelta(seconds=60)
    with pytest.raises(ArtifactVerifyFailed):  # fails new SlurmJobs at once for a while
        asyncio.run(gate.verified(runtime))
    assert len(verifier.submitted) == 1


def test_the_gate_is_there_only_where_the_site_says_so(tmp_path: Path) -> None:
    async def slurm_as(user: str | None) -> Any:
        raise AssertionError("no job is sent here")

    on = _settings(tmp_path)
    assert isinstance(artifact_gate(on, ConfigMaps(), slurm_as), ArtifactGate)
    off = _settings(tmp_path, artifact_verify_jobs=False)
    assert artifact_gate(off, ConfigMaps(), slurm_as) is None
    assert artifact_gate(on, object(), slurm_as) is None  # no records kept: full hash


# -- the batch script ---------------------------------------------------------------------


def _verified_artifact(settings: Settings, runtime: RuntimeArtifact) -> VerifiedArtifact:
    path = settings.storage_root / runtime.path
    seen = observe(path)
    assert seen is not None
    return VerifiedArtifact(
        runtime=runtime,
        node_path=settings.to_cluster_path(path),  # type: ignore[arg-type]
        operator_path=path,
        size=seen.size,
        inode=seen.inode,
        ctime_ns=seen.ctime_ns,
        owner_uid=seen.uid,
        mode=seen.mode,
        verified_by="slurmjob-verify-0123456789ab-1",
    )


def test_a_verified_artifact_is_checked_by_its_stat_line_not_hashed(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    runtime, _ = _runtime(settings)
    artifact = _verified_artifact(settings, runtime)
    spec = make_spec("cpu")
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    script = rendered.files["job.sh"].content.decode()
    assert f"artifact_recorded='{artifact.recorded}'" in script
    assert artifact.recorded.startswith(f"regular file {artifact.owner_uid} 444 ")
    # No hash to compare: a node that hashed it would refuse it (the run below passes).
    assert "artifact_sha256=''" in script
    assert runtime.sha256 not in script
    run = run_attempt(rendered, settings, tmp_path / "w")
    assert run.returncode == 0, run.stderr
    assert run.steps


def test_a_verified_artifact_touched_since_fails_on_its_node(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    runtime, path = _runtime(settings)
    artifact = _verified_artifact(settings, runtime)
    _chmod(path)
    spec = make_spec("cpu")
    run = run_attempt(
        render_attempt(spec, make_context(spec, settings, artifact)), settings, tmp_path / "w"
    )
    assert run.returncode == 97
    assert "is not the file its import recorded" in run.stderr
    assert run.steps == []


def test_with_the_setting_off_the_node_hashes_in_full(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    runtime, path = _runtime(settings)
    spec = make_spec("cpu", env=[])  # no secrets.env: the script may run twice
    rendered = render_attempt(spec, make_context(spec, settings, runtime))
    script = rendered.files["job.sh"].content.decode()
    assert "artifact_recorded=''" in script
    assert f"artifact_sha256={runtime.sha256}" in script
    assert run_attempt(rendered, settings, tmp_path / "w").returncode == 0
    # The same file with other content of the same size: only a hash can tell.
    path.chmod(0o644)
    path.write_bytes(b"hsqs" + b"x" * (path.stat().st_size - 4))
    run = run_attempt(rendered, settings, tmp_path / "w2", stage=False)
    assert run.returncode == 97
    assert f"expected {runtime.sha256}" in run.stderr


@pytest.mark.parametrize("change", [_chmod, _replace, _hard_link, _symlink, Path.unlink])
def test_the_operator_refuses_a_verified_artifact_that_changed(tmp_path: Path, change: Any) -> None:
    settings = stand_in_settings(tmp_path)
    runtime, path = _runtime(settings)
    artifact = _verified_artifact(settings, runtime)
    verify_verified(artifact)  # unchanged: no hash
    change(path)
    with pytest.raises(ArtifactChanged, match=f"runtime {runtime.id}"):
        verify_verified(artifact)
