"""The test bed's OCI registries (tests/testbed/registry.py) with the real runtimes on the host,
no Slurm: Enroot imports and Apptainer builds the pushed image, trusting the registries' CA as
the test bed sets it up (Enroot: ``SSL_CERT_FILE`` in the enroot.conf runtimes.sh writes;
Apptainer: ``SSL_CERT_FILE`` in its environment), the private registry only with its
credentials, and neither from a layer corrupted on disk.

Each runtime gets its own cache directories here (Enroot's per-user paths of the test bed are
the jobs'), and makes its squashfs uncompressed: compressing is most of an import's time and
proves nothing about the registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from tests.testbed import registry as reg
from tests.testbed.registry import Image, Registries

pytestmark = pytest.mark.integration

ENROOT_CONF = Path("/etc/enroot/enroot.conf.d/50-slurmjob-testbed.conf")
#: mksquashfs options: no compression (Enroot's ENROOT_SQUASH_OPTIONS, Apptainer's flag).
NO_COMPRESSION = "-noI -noD -noF -noX"
MARKER = "etc/slurmjob-testbed-image"
TIMEOUT = 240


def _run(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=dict(env), capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def _dirs(root: Path, *names: str) -> dict[str, Path]:
    out = {n: root / n for n in names}
    for d in out.values():
        d.mkdir(parents=True, exist_ok=True)
    return out


def enroot_import(
    work: Path, uri: str, out: Path, *, credentials: str | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """``enroot import`` as root, with paths of its own under ``work`` and no SSL_CERT_FILE
    in its environment (enroot.conf's applies)."""
    d = _dirs(work, "cache", "data", "run", "tmp", "config", "home")
    creds = d["config"] / ".credentials"
    creds.unlink(missing_ok=True)
    if credentials is not None:
        creds.write_text(credentials)
        creds.chmod(0o600)
    env = {
        "PATH": reg.SYSTEM_PATH,
        "HOME": str(d["home"]),
        "ENROOT_CACHE_PATH": str(d["cache"]),
        "ENROOT_DATA_PATH": str(d["data"]),
        "ENROOT_RUNTIME_PATH": str(d["run"]),
        "ENROOT_TEMP_PATH": str(d["tmp"]),
        "ENROOT_CONFIG_PATH": str(d["config"]),
        "ENROOT_SQUASH_OPTIONS": NO_COMPRESSION,
        **extra,
    }
    return _run(["enroot", "import", "-o", str(out), uri], env)


def apptainer_build(
    work: Path, uri: str, out: Path, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    d = _dirs(work, "cache", "tmp", "home")
    base = {
        "PATH": reg.SYSTEM_PATH,
        "HOME": str(d["home"]),
        "APPTAINER_CACHEDIR": str(d["cache"]),
        "APPTAINER_TMPDIR": str(d["tmp"]),
    }
    argv = ["apptainer", "build", "--force", "--mksquashfs-args", NO_COMPRESSION, str(out), uri]
    return _run(argv, {**base, **env})


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"{' '.join(proc.args)} failed:\n{proc.stdout}{proc.stderr}"


def _marker_of_squashfs(path: Path) -> str:
    assert path.read_bytes()[:4] == b"hsqs", f"{path} is no squashfs"
    return subprocess.run(
        ["unsquashfs", "-cat", str(path), MARKER], capture_output=True, text=True, check=True
    ).stdout


def _marker_of_sif(path: Path) -> str:
    """The marker in the SIF's squashfs partition, read in place (``apptainer sif dump`` of
    1.5.3 leaves the partition's last 64 KiB out)."""
    head = path.read_bytes()[:48]
    assert head[32:42] == b"SIF_MAGIC\0", f"{path} is no SIF: {head!r}"
    listing = _run(["apptainer", "sif", "list", str(path)], {"PATH": reg.SYSTEM_PATH})
    _ok(listing)
    # ID |GROUP |LINK |SIF POSITION (start-end) |TYPE, e.g. 4 |1 |NONE |36864-116891648 |FS ...
    rows = [ln.split("|") for ln in listing.stdout.splitlines() if "Squashfs" in ln]
    assert len(rows) == 1, listing.stdout
    offset = rows[0][3].strip().split("-")[0]
    with path.open("rb") as fh:
        fh.seek(int(offset))
        assert fh.read(4) == b"hsqs", f"no squashfs at {offset} in {path}"
    return subprocess.run(
        ["unsquashfs", "-o", offset, "-cat", str(path), MARKER],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The runtimes' directories and outputs: in memory when /dev/shm is there (each build
    writes a 130 MB tree and a 117 MB squashfs; on this disk that is most of its time)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path_factory.mktemp("registry")
        return
    path = Path(tempfile.mkdtemp(prefix="slurmjob-test-registry-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_images_are_docker_v2_schema_2(registry: Registries) -> None:
    """Pushed with the Docker media types (Enroot's manifest probe needs them), at the
    digests the test bed computed; the private one is not readable anonymously."""
    for image in registry.images.values():
        manifest = registry.crane("manifest", image.ref).stdout
        assert '"mediaType": "application/vnd.docker.distribution.manifest.v2+json"' in manifest
        assert "application/vnd.docker.image.rootfs.diff.tar.gzip" in manifest
        assert registry.crane("digest", image.ref).stdout.strip() == image.digest
    private = registry.image("private")
    anonymous = subprocess.run(
        [str(registry.crane_bin), "manifest", private.ref],
        env={"PATH": reg.SYSTEM_PATH, "HOME": "/nonexistent", **registry.tls_env()},
        capture_output=True,
        text=True,
        check=False,
    )
    assert anonymous.returncode != 0
    assert "UNAUTHORIZED" in anonymous.stderr


def test_enroot_imports_by_tag_and_by_digest(registry: Registries, work: Path) -> None:
    assert f"SSL_CERT_FILE       {reg.CA_BUNDLE}" in ENROOT_CONF.read_text(), (
        f"{ENROOT_CONF} does not name the registries' CA bundle: run `make testbed`"
    )
    base = registry.image("base")
    by_tag, by_digest = work / "tag.sqsh", work / "digest.sqsh"
    _ok(enroot_import(work / "enroot", base.enroot_uri(), by_tag))
    assert _marker_of_squashfs(by_tag).startswith("slurmjob-testbed-image name=base ")
    # Enroot 4.1.2 reads a digest in both of its reference forms.
    _ok(enroot_import(work / "enroot", base.docker_uri(by_digest=True), by_digest))
    assert _marker_of_squashfs(by_digest) == _marker_of_squashfs(by_tag)
    # Without the registries' CA (the environment wins over enroot.conf), curl refuses.
    untrusted = enroot_import(
        work / "enroot",
        base.enroot_uri(),
        work / "untrusted.sqsh",
        SSL_CERT_FILE=str(reg.SYSTEM_BUNDLE),
    )
    assert untrusted.returncode != 0
    assert "SSL certificate problem" in untrusted.stderr


def test_apptainer_builds_with_the_ca_in_its_environment(registry: Registries, work: Path) -> None:
    base = registry.image("base")
    sif = work / "base.sif"
    _ok(apptainer_build(work / "apptainer", base.docker_uri(), sif, registry.tls_env()))
    assert _marker_of_sif(sif).startswith("slurmjob-testbed-image name=base ")
    untrusted = apptainer_build(work / "apptainer", base.docker_uri(), work / "x.sif", {})
    assert untrusted.returncode != 0
    assert "certificate signed by unknown authority" in untrusted.stderr


def test_private_registry_needs_credentials(registry: Registries, work: Path) -> None:
    """Basic authentication: Enroot from its .credentials (netrc), Apptainer from
    APPTAINER_DOCKER_USERNAME/PASSWORD. The layer is the open base image's, in the runtimes'
    caches already: the manifest is what needs the credentials."""
    private = registry.image("private")
    out = work / "private.sqsh"
    denied = enroot_import(work / "enroot", private.enroot_uri(), out)
    assert denied.returncode != 0
    assert not out.exists()
    wrong = registry.enroot_credentials().replace(registry.password, "wrong")
    denied = enroot_import(work / "enroot", private.enroot_uri(), out, credentials=wrong)
    assert denied.returncode != 0  # Enroot says nothing more when the registry refuses them
    assert not out.exists()
    creds = registry.enroot_credentials()
    _ok(enroot_import(work / "enroot", private.enroot_uri(), out, credentials=creds))
    assert _marker_of_squashfs(out).startswith("slurmjob-testbed-image name=base ")

    sif = work / "private.sif"
    tls = registry.tls_env()
    denied = apptainer_build(work / "apptainer", private.docker_uri(), sif, tls)
    assert denied.returncode != 0
    assert "authentication required" in denied.stderr
    env = {**tls, **registry.apptainer_credentials()}
    _ok(apptainer_build(work / "apptainer", private.docker_uri(), sif, env))
    assert _marker_of_sif(sif).startswith("slurmjob-testbed-image name=base ")


def test_a_corrupted_layer_fails_both_runtimes(registry: Registries, work: Path) -> None:
    image: Image = registry.image("corruptible")
    with registry.corrupted("corruptible"):
        assert not image.blob_intact()
        enroot = enroot_import(work / "enroot-corrupt", image.enroot_uri(), work / "c.sqsh")
        apptainer = apptainer_build(
            work / "apptainer-corrupt", image.docker_uri(), work / "c.sif", registry.tls_env()
        )
    assert image.blob_intact()  # restored
    assert enroot.returncode != 0, enroot.stderr
    assert "crc32 mismatch" in enroot.stderr or "Checksum mismatch" in enroot.stderr
    assert not (work / "c.sqsh").exists()
    assert apptainer.returncode != 0, apptainer.stderr
    assert "error verifying sha256 checksum" in apptainer.stderr
    assert not (work / "c.sif").exists()
