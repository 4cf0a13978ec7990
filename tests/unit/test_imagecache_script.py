"""The import script (templates/image/import.sh.j2) run by bash against a stand-in `enroot`
on its PATH: the entry is published read-only under its digest's name, the result file says
what `stat` sees, a second import of a published digest pulls nothing, and each failure ends
with the exit code of its class (imagecache/decide.py). The real registry and the real Enroot
and Apptainer run it in tests/integration/test_image_cache_e2e.py."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.unit.test_render_support import SYSTEM_PATH

from slurmjob_operator.config import Settings
from slurmjob_operator.imagecache.decide import new_record
from slurmjob_operator.imagecache.exits import (
    EXIT_DATA,
    EXIT_DENIED,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
)
from slurmjob_operator.imagecache.layout import import_job_name
from slurmjob_operator.imagecache.record import ImportAttempt, parse_result
from slurmjob_operator.imagecache.reference import parse_reference
from slurmjob_operator.imagecache.request import ImageRequest
from slurmjob_operator.imagecache.script import layout_for, render_import
from slurmjob_operator.site.catalogs import ArtifactFormat

DIGEST = "sha256:" + "ab" * 32
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
_ENROOT_ERROR = "[ERROR] URL https://r/v2/a/b/manifests/1 returned error code: "

FAKE_ENROOT = r"""#!/bin/bash
# Stand-in enroot: `import -o FILE` writes FAKE_CONTENT or fails with FAKE_ERROR; every call is
# appended to $FAKE_CALLS.
printf 'enroot %s\n' "$*" >>"$FAKE_CALLS"
case $1 in
import)
  if [[ -n ${FAKE_ERROR:-} ]]; then echo "$FAKE_ERROR" >&2; exit 1; fi
  while [[ $1 != -o ]]; do shift; done
  printf '%s' "${FAKE_CONTENT:-hsqs-image-bytes}" >"$2"
  ;;
esac
"""

FAKE_CURL = r"""#!/bin/bash
# Stand-in curl for a registry's manifest: answers $FAKE_HTTP (200 by default) with a Docker
# manifest whose digest header is $FAKE_DIGEST; every call is appended to $FAKE_CALLS.
printf 'curl %s\n' "$*" >>"$FAKE_CALLS"
body= headers= format=
while [[ $# -gt 0 ]]; do
  case $1 in
  -o) body=$2; shift ;;
  -D) headers=$2; shift ;;
  -w) format=$2; shift ;;
  esac
  shift
done
status=${FAKE_HTTP:-200}
printf '{"mediaType": "application/vnd.docker.distribution.manifest.v2+json"}' >"$body"
printf 'HTTP/1.1 %s\r\nDocker-Content-Digest: %s\r\n\r\n' "$status" "$FAKE_DIGEST" >"$headers"
[[ -n $format ]] && printf '%s' "$status"
exit 0
"""


def _settings(tmp_path: Path) -> Settings:
    cache = tmp_path / "cache"
    (cache / "logs").mkdir(parents=True)
    (tmp_path / "bin").mkdir()
    (tmp_path / "nodetmp").mkdir()
    return Settings(
        storage_root=tmp_path,
        slurm_job_path=f"{tmp_path / 'bin'}:{SYSTEM_PATH}",
        images_enabled=True,
        image_cache_root=cache,
        image_cache_user="imagecache",
        image_cache_uid=os.getuid() or 1,
        image_import_partition="cpu",
        image_import_tmp=str(tmp_path / "nodetmp"),
    )


def _script(settings: Settings, image: str, attempt_number: int = 1) -> str:
    request = ImageRequest("public", parse_reference(image), ArtifactFormat.SQSH)
    record = new_record(request, NOW)
    attempt = ImportAttempt(
        number=attempt_number,
        job_name=import_job_name(record.key, record.epoch, attempt_number),
        submitted_at=NOW,
    )
    return render_import(settings, record, attempt).launch.script


def _run(
    tmp_path: Path, settings: Settings, script: str, **env: str
) -> subprocess.CompletedProcess[str]:
    for name, text in (("enroot", FAKE_ENROOT), ("curl", FAKE_CURL)):
        fake = tmp_path / "bin" / name
        fake.write_text(text)
        fake.chmod(0o755)
    return _run_again(tmp_path, settings, script, **env)


def _run_again(
    tmp_path: Path, settings: Settings, script: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `script` with the stand-ins as they are now."""
    path = tmp_path / "import.sh"
    path.write_text(script)
    return subprocess.run(
        ["bash", str(path)],
        env={
            "PATH": settings.slurm_job_path,
            "FAKE_CALLS": str(tmp_path / "calls"),
            "FAKE_DIGEST": DIGEST,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_import_publishes_a_read_only_entry_and_its_result(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    run = _run(tmp_path, settings, _script(settings, "127.0.0.1:5000/slurmjob/base:1"))
    assert run.returncode == 0, run.stderr
    layout = layout_for(settings)
    entry = Path(str(layout.entry_path("public", DIGEST, ArtifactFormat.SQSH)))
    assert entry.read_bytes() == b"hsqs-image-bytes"
    info = entry.lstat()
    assert info.st_mode & 0o777 == 0o444
    results = list((settings.image_cache_root / "results").iterdir())  # type: ignore[operator]
    assert len(results) == 1
    result = parse_result(results[0].read_bytes())
    assert (result.digest, result.size, result.inode) == (DIGEST, info.st_size, info.st_ino)
    assert result.ctime_ns == info.st_ctime_ns
    assert result.reference == "127.0.0.1:5000/slurmjob/base:1"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].startswith("curl ")
    assert calls[0].endswith("-- https://127.0.0.1:5000/v2/slurmjob/base/manifests/1")
    assert calls[1] == f"enroot import --arch x86_64 -o {calls[1].split()[5]} -- " + (
        f"docker://127.0.0.1:5000#slurmjob/base@{DIGEST}"
    )
    # Nothing of the import is left but the entry, its lock and its result.
    assert list((settings.image_cache_root / "tmp").iterdir()) == []  # type: ignore[operator]
    assert list((tmp_path / "nodetmp").iterdir()) == []
    assert Path(str(layout.lock_path("public", DIGEST, ArtifactFormat.SQSH))).exists()


def test_a_published_digest_is_not_pulled_again(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert _run(tmp_path, settings, _script(settings, "127.0.0.1:5000/a/b:1")).returncode == 0
    again = _run(tmp_path, settings, _script(settings, "127.0.0.1:5000/a/b:1", 2))
    assert again.returncode == 0, again.stderr
    assert "already in the cache" in again.stdout
    imports = [c for c in (tmp_path / "calls").read_text().splitlines() if " import " in c]
    assert len(imports) == 1


def test_a_digest_reference_is_not_resolved(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    run = _run(tmp_path, settings, _script(settings, f"127.0.0.1:5000/a/b@{DIGEST}"))
    assert run.returncode == 0, run.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[:2] for c in calls] == [["enroot", "import"]]


@pytest.mark.parametrize(
    ("env", "code"),
    [
        (
            {"FAKE_ERROR": _ENROOT_ERROR + "404 Not Found"},
            EXIT_NOT_FOUND,
        ),
        (
            {"FAKE_ERROR": _ENROOT_ERROR + "401 Unauthorized"},
            EXIT_DENIED,
        ),
        (
            {"FAKE_ERROR": _ENROOT_ERROR + "503 Service Unavailable"},
            EXIT_UNAVAILABLE,
        ),
        ({"FAKE_ERROR": "Checksum mismatch: 0123"}, EXIT_DATA),
        ({"FAKE_CONTENT": "not-a-squashfs"}, EXIT_DATA),
        ({"FAKE_DIGEST": "sha256:short"}, EXIT_DATA),
        ({"FAKE_HTTP": "404"}, EXIT_NOT_FOUND),
        ({"FAKE_HTTP": "403"}, EXIT_DENIED),
        ({"FAKE_HTTP": "502"}, EXIT_UNAVAILABLE),
    ],
)
def test_each_failure_ends_with_its_class(tmp_path: Path, env: dict[str, str], code: int) -> None:
    settings = _settings(tmp_path)
    run = _run(tmp_path, settings, _script(settings, "127.0.0.1:5000/a/b:1"), **env)
    assert run.returncode == code, run.stderr
    cache = settings.image_cache_root
    assert cache is not None
    assert not list((cache / "entries").rglob("*.sqsh"))
    assert not (cache / "results").exists() or not list((cache / "results").iterdir())
    assert list((tmp_path / "nodetmp").iterdir()) == []


def test_a_private_image_is_readable_by_its_tenants_uid_only(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    request = ImageRequest(
        "tenant-team-a", parse_reference("127.0.0.1:5000/a/b:1"), ArtifactFormat.SQSH
    )
    record = new_record(request, NOW)
    attempt = ImportAttempt(
        number=1, job_name=import_job_name(record.key, record.epoch, 1), submitted_at=NOW
    )
    script = render_import(settings, record, attempt, reader_uid=4242).launch.script
    run = _run(tmp_path, settings, script)
    assert run.returncode == 0, run.stderr
    entry = Path(str(layout_for(settings).entry_path("tenant-team-a", DIGEST, ArtifactFormat.SQSH)))
    assert entry.lstat().st_mode & 0o777 == 0o440  # 0400 and the ACL's mask
    acl = subprocess.run(["getfacl", "-cp", str(entry)], capture_output=True, text=True, check=True)
    assert "user:4242:r--" in acl.stdout.splitlines()


def test_a_registry_the_node_does_not_trust_is_a_configuration_failure(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    script = _script(settings, "127.0.0.1:5000/a/b:1")
    fake = tmp_path / "bin" / "curl"
    run = _run(tmp_path, settings, script)  # writes the stand-ins
    assert run.returncode == 0
    fake.write_text("#!/bin/bash\necho 'curl: (60) SSL certificate problem' >&2\nexit 60\n")
    run = _run_again(tmp_path, settings, _script(settings, "127.0.0.1:5000/c/d:1"))
    assert run.returncode == 78, run.stderr
    assert "cannot verify" in run.stderr
