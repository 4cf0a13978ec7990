"""The image cache's layout (imagecache/layout.py): paths, record keys and import job names,
every derived word safe whatever reference a tenant wrote."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_imagecache_reference import references

from slurmjob_operator.imagecache.layout import (
    CacheLayout,
    entry_file_name,
    import_job_name,
    is_dns_label,
    is_safe_word,
    record_key,
    runtime_uri,
    scope_tenant,
    scope_word,
)
from slurmjob_operator.imagecache.reference import ImageReference, parse_reference
from slurmjob_operator.site.catalogs import ArtifactFormat

HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"
LAYOUT = CacheLayout(PurePosixPath("/gpfs/image-cache"))
SQSH, SIF = ArtifactFormat.SQSH, ArtifactFormat.SIF


def test_paths() -> None:
    assert str(LAYOUT.entry_path("public", DIGEST, SQSH)) == (
        f"/gpfs/image-cache/entries/public/sha256-{HEX}.sqsh"
    )
    assert str(LAYOUT.entry_path("tenant-a", DIGEST, SIF)) == (
        f"/gpfs/image-cache/entries/tenant-a/sha256-{HEX}.sif"
    )
    assert str(LAYOUT.lock_path("tenant-a", DIGEST, SIF)) == (
        f"/gpfs/image-cache/locks/tenant-a/sha256-{HEX}.sif.lock"
    )
    job = "slurmjob-import-0123456789ab-1"
    assert str(LAYOUT.temp_dir(job)) == f"/gpfs/image-cache/tmp/{job}"
    assert str(LAYOUT.result_path(job)) == f"/gpfs/image-cache/results/{job}.result"
    assert str(LAYOUT.log_path(job)) == f"/gpfs/image-cache/logs/{job}.log"
    assert LAYOUT.is_entry_path(str(LAYOUT.entry_path("tenant-a", DIGEST, SIF)))


@pytest.mark.parametrize(
    "path",
    [
        f"/gpfs/image-cache/entries/public/sha256-{HEX}.tar",
        f"/gpfs/image-cache/entries/other/sha256-{HEX}.sqsh",
        f"/gpfs/image-cache/locks/public/sha256-{HEX}.sqsh",
        f"/gpfs/image-cache/entries/tenant-a/../tenant-b/sha256-{HEX}.sqsh",
        f"/gpfs/image-cache/entries/public/sha256-{HEX[:-1]}.sqsh",
        "/etc/passwd",
    ],
)
def test_not_entry_paths(path: str) -> None:
    assert not LAYOUT.is_entry_path(path)


@pytest.mark.parametrize("root", ["relative/cache", "/a/../b", "/a b/c", "/a/-x", "/a/.hidden"])
def test_unsafe_roots_are_refused(root: str) -> None:
    with pytest.raises(ValueError, match="image cache root"):
        CacheLayout(PurePosixPath(root))


def test_scopes() -> None:
    assert scope_word(None) == "public"
    assert scope_word("team-a") == "tenant-team-a"
    assert scope_tenant("tenant-team-a") == "team-a"
    assert scope_tenant("public") is None
    for bad in ("tenant-", "tenant-A", "namespace-a", "", "tenant-a/b", "tenant--a"):
        with pytest.raises(ValueError, match="scope"):
            scope_tenant(bad)
    with pytest.raises(ValueError, match="DNS label"):
        scope_word("Team_A")
    with pytest.raises(ValueError, match="scope"):
        LAYOUT.entry_path("../etc", DIGEST, SQSH)


def test_record_key_and_job_name() -> None:
    ref = parse_reference("nvcr.io/nvidia/pytorch:24.01-py3")
    key = record_key("public", ref)
    assert key.startswith("image-pytorch-")
    assert len(key) == len("image-pytorch-") + 16
    assert record_key("tenant-a", ref) != key  # scopes never share a record
    assert record_key("public", parse_reference("nvcr.io/nvidia/pytorch:24.02-py3")) != key
    name = import_job_name(key, 1_700_000_000, 3)
    assert name.startswith("slurmjob-import-")
    assert name.endswith("-3")
    assert import_job_name(key, 1_700_000_001, 3) != name  # a new record's jobs are new
    assert import_job_name(key, 1_700_000_000, 4) != name
    with pytest.raises(ValueError, match="attempts count from 1"):
        import_job_name(key, 1_700_000_000, 0)
    with pytest.raises(ValueError, match="not a DNS label"):
        import_job_name("Not A Key", 1, 1)
    long_name = parse_reference("r.io/" + "a_b." * 50 + "c:t")
    assert is_dns_label(record_key("public", long_name))


def test_digest_words_and_uris() -> None:
    assert entry_file_name(DIGEST, SQSH) == f"sha256-{HEX}.sqsh"
    for bad in ("sha256:" + "G" * 64, "sha512:" + HEX, HEX, "sha256:../x"):
        with pytest.raises(ValueError, match="not a sha256 digest"):
            entry_file_name(bad, SQSH)
    ref = parse_reference("nvcr.io/nvidia/pytorch:1")
    assert runtime_uri(ref, SQSH) == "docker://nvcr.io#nvidia/pytorch:1"
    assert runtime_uri(ref, SIF) == "docker://nvcr.io/nvidia/pytorch:1"


@pytest.mark.parametrize(
    ("word", "safe"),
    [
        ("a", True),
        ("a.b-c_d", True),
        ("..", False),
        (".a", False),
        ("-rf", False),
        ("a b", False),
        ("a'b", False),
        ("", False),
        ("a/b", False),
        ("x" * 256, False),
    ],
)
def test_safe_words(word: str, safe: bool) -> None:
    assert is_safe_word(word) is safe


_tenants = st.one_of(
    st.none(), st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
)


@settings(max_examples=200, deadline=None)
@given(
    ref=references,
    tenant=_tenants,
    fmt=st.sampled_from(list(ArtifactFormat)),
    epoch=st.integers(0, 2**40),
    attempt=st.integers(1, 10**6),
)
def test_no_accepted_reference_yields_an_unsafe_word(
    ref: ImageReference, tenant: str | None, fmt: ArtifactFormat, epoch: int, attempt: int
) -> None:
    scope = scope_word(tenant)
    key = record_key(scope, ref)
    assert is_dns_label(key)
    assert len(key) <= 63
    job = import_job_name(key, epoch, attempt)
    assert is_safe_word(job)
    assert len(job) <= 64
    digest = ref.digest or DIGEST
    for path in (
        LAYOUT.entry_path(scope, digest, fmt),
        LAYOUT.lock_path(scope, digest, fmt),
        LAYOUT.temp_dir(job),
        LAYOUT.result_path(job),
        LAYOUT.log_path(job),
    ):
        assert path.is_relative_to(LAYOUT.root)
        assert all(is_safe_word(part) for part in path.parts[1:])
    assert LAYOUT.is_entry_path(str(LAYOUT.entry_path(scope, digest, fmt)))
    # The URI carries only the reference's characters: nothing a shell would expand.
    uri = runtime_uri(ref, fmt)
    assert set(uri) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/@#")
