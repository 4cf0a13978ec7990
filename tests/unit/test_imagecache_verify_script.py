"""The verification job of a registry artifact (templates/image/verify.sh.j2, rendered by
imagecache/verifyjob.py) run by bash against real files: a file only root and its owner can
change, with the registry's magic and sha256, gets a result file that says what `stat` sees;
a link, a FIFO, another owner, a group- or world-writable file or directory, a wrong hash or
magic and a missing file each end with the exit code of their class, and no result. Every
value reaches the script quoted; a hostile path stays one word. The real Slurm runs it in
tests/integration/test_artifact_verify_e2e.py."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.unit.test_render_support import SYSTEM_PATH, artifact_bytes

from slurmjob_operator.config import Settings
from slurmjob_operator.imagecache.record import ImportAttempt
from slurmjob_operator.imagecache.verifydecide import VerifyRequest, new_artifact_record
from slurmjob_operator.imagecache.verifyjob import render_verify
from slurmjob_operator.imagecache.verifyrecord import (
    ArtifactRecord,
    parse_verify_result,
    verify_job_name,
)
from slurmjob_operator.site.catalogs import ArtifactFormat

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "image" / "verify.sh.j2"
#: The cache user: the test's own uid where it is not root (then the files are its own).
CACHE_UID = os.getuid() or 990
AS_ROOT = pytest.mark.skipif(os.getuid() != 0, reason="gives files to another owner")
OTHER_UID = 12345


def _settings(tmp_path: Path) -> Settings:
    key = tmp_path / "jwt.key"
    key.write_bytes(b"k" * 32)
    cache = tmp_path / "cache"
    (cache / "logs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "root").mkdir(exist_ok=True)
    return Settings(
        storage_root=tmp_path / "root",
        slurm_job_path=SYSTEM_PATH,
        slurm_jwt_key_file=key,
        artifact_verify_jobs=True,
        image_cache_root=cache,
        image_cache_user="imagecache",
        image_cache_uid=CACHE_UID,
        image_import_partition="cpu",
        image_import_account="infra",
        image_import_cpus=2,
        image_import_memory_mb=1024,
        image_import_time_minutes=15,
    )


def _artifact(
    tmp_path: Path, name: str = "runtimes/pytorch.sqsh", content: bytes | None = None
) -> Path:
    path = tmp_path / "root" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    path.write_bytes(artifact_bytes(ArtifactFormat.SQSH) if content is None else content)
    path.chmod(0o444)
    return path


def _record(path: Path, sha256: str | None = None) -> tuple[ArtifactRecord, ImportAttempt]:
    digest = sha256 or hashlib.sha256(artifact_bytes(ArtifactFormat.SQSH)).hexdigest()
    request = VerifyRequest("pytorch", digest, str(path), ArtifactFormat.SQSH)
    record = new_artifact_record(request, NOW)
    attempt = ImportAttempt(
        number=1, job_name=verify_job_name(record.key, record.epoch, 1), submitted_at=NOW
    )
    return record, attempt


def _run(settings: Settings, script: str, where: Path) -> subprocess.CompletedProcess[str]:
    path = where / "verify.sh"
    path.write_text(script)
    return subprocess.run(
        ["bash", str(path)],
        env={"PATH": settings.slurm_job_path},
        cwd=where,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _verify(
    tmp_path: Path, path: Path, sha256: str | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    settings = _settings(tmp_path)
    record, attempt = _record(path, sha256)
    run = _run(settings, render_verify(settings, record, attempt).script, tmp_path)
    assert settings.image_cache_root is not None
    return run, settings.image_cache_root / "verify" / f"{attempt.job_name}.result"


def test_the_job_is_the_cache_users_on_the_import_partition(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    record, attempt = _record(_artifact(tmp_path))
    launch = render_verify(settings, record, attempt)
    assert launch.job_name == attempt.job_name
    assert launch.comment == f"slurmjob-verify:{record.key}"
    assert (launch.partition, launch.account, launch.time_limit_minutes) == ("cpu", "infra", 15)
    (component,) = launch.components
    assert (component.nodes, component.cpus_per_task, component.memory_mb) == (1, 2, 1024)
    log = str(tmp_path / "cache" / "logs" / f"{attempt.job_name}.log")
    assert launch.standard_output == launch.standard_error == log
    assert launch.environment == {"PATH": SYSTEM_PATH}


def test_every_value_of_the_template_is_quoted() -> None:
    text = TEMPLATE.read_text()
    interpolations = re.findall(r"\{\{(.*?)\}\}", text)
    assert interpolations
    assert all(i.strip().endswith("| shquote") for i in interpolations), interpolations
    assignments = re.findall(r"^(\w+)=\{\{ (\w+) \| shquote \}\}$", text, re.M)
    assert len(assignments) == len(interpolations)
    assert "{%" not in text  # no template logic: the script is the same for every artifact


HOSTILE = 'runtimes/it\'s $(touch pwned) `id` "a";b*'


def test_a_hostile_path_stays_one_quoted_word(tmp_path: Path) -> None:
    path = _artifact(tmp_path, HOSTILE + ".sqsh")
    settings = _settings(tmp_path)
    record, attempt = _record(path)
    script = render_verify(settings, record, attempt).script
    assert f"\nartifact={shlex.quote(str(path))}\n" in script
    assert f"\nartifact_dir={shlex.quote(str(path.parent))}\n" in script
    run = _run(settings, script, tmp_path)
    assert run.returncode == 0, run.stderr
    assert not list(tmp_path.rglob("pwned"))


def test_a_file_only_root_and_its_owner_can_change_passes(tmp_path: Path) -> None:
    path = _artifact(tmp_path)
    run, result = _verify(tmp_path, path)
    assert run.returncode == 0, run.stderr
    info = path.lstat()
    parsed = parse_verify_result(result.read_bytes())
    assert (parsed.size, parsed.inode, parsed.ctime_ns) == (
        info.st_size,
        info.st_ino,
        info.st_ctime_ns,
    )
    assert (parsed.uid, parsed.mode) == (info.st_uid, 0o444)
    assert parsed.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert result.lstat().st_mode & 0o777 == 0o444
    assert [p.name for p in result.parent.iterdir()] == [result.name]  # nothing partial


def _link(path: Path) -> Path:
    real = path.with_name("real.sqsh")
    path.rename(real)
    path.symlink_to(real)
    return path


def _dir_link(path: Path) -> Path:
    linked = path.parent.parent / "linked"
    linked.symlink_to(path.parent)
    return linked / path.name


def _fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)  # a FIFO would block a reader: refused before anything opens it
    return path


def _directory(path: Path) -> Path:
    path.unlink()
    path.mkdir()
    return path


def _group_writable(path: Path) -> Path:
    path.chmod(0o464)
    return path


def _dir_world_writable(path: Path) -> Path:
    path.parent.chmod(0o757)
    return path


def _dir_sticky(path: Path) -> Path:
    path.parent.chmod(0o1777)
    return path


def _other_owner(path: Path) -> Path:
    os.chown(path, OTHER_UID, -1)
    return path


def _dir_other_owner(path: Path) -> Path:
    os.chown(path.parent, OTHER_UID, -1)
    return path


def _empty(path: Path) -> Path:
    path.chmod(0o644)
    path.write_bytes(b"")
    path.chmod(0o444)
    return path


def _no_magic(path: Path) -> Path:
    path.chmod(0o644)
    path.write_bytes(b"hsqz" + path.read_bytes()[4:])
    path.chmod(0o444)
    return path


def _missing(path: Path) -> Path:
    path.unlink()
    return path


@pytest.mark.parametrize(
    ("change", "code", "said"),
    [
        (_link, 77, "is a symbolic link"),
        (_dir_link, 77, "directory"),
        (_fifo, 77, "fifo, not a regular file"),
        (_directory, 77, "directory, not a regular file"),
        (_group_writable, 77, "its group or others may write it"),
        (_dir_world_writable, 77, "its group or others may write it"),
        (_dir_sticky, 77, "its group or others may write it"),
        pytest.param(_other_owner, 77, f"owned by uid {OTHER_UID}", marks=AS_ROOT),
        pytest.param(_dir_other_owner, 77, f"owned by uid {OTHER_UID}", marks=AS_ROOT),
        (_empty, 65, "no hsqs magic"),
        (_no_magic, 65, "no hsqs magic"),
        (_missing, 66, "is missing"),
    ],
)
def test_an_artifact_that_cannot_be_trusted_gets_no_result(
    tmp_path: Path, change: Callable[[Path], Path], code: int, said: str
) -> None:
    path = change(_artifact(tmp_path))
    run, result = _verify(tmp_path, path)
    assert run.returncode == code, run.stderr
    assert said in run.stderr
    assert not result.exists()


def test_another_sha256_than_the_registrys_is_refused(tmp_path: Path) -> None:
    path = _artifact(tmp_path)
    run, result = _verify(tmp_path, path, sha256="0" * 64)
    assert run.returncode == 65
    assert "the registry expects " + "0" * 64 in run.stderr
    assert not result.exists()


@AS_ROOT
def test_a_result_directory_someone_else_could_write_is_refused(tmp_path: Path) -> None:
    path = _artifact(tmp_path)
    verify = tmp_path / "cache" / "verify"
    verify.mkdir(parents=True)
    os.chown(verify, OTHER_UID, -1)
    run, result = _verify(tmp_path, path)
    assert run.returncode == 73
    assert "is not a directory of the cache user" in run.stderr
    os.chown(verify, 0, -1)
    verify.chmod(0o777)
    run, result = _verify(tmp_path, path)
    assert run.returncode == 73
    assert "others may write it" in run.stderr
    assert not result.exists()
