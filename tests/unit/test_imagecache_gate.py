"""The image gate (imagecache/gate.py) against an in-memory ConfigMap store and a stand-in
importer: who may name an image, one import per reference and scope, the write-ahead and the
adoption of a lost submit, the SlurmJob bound to its digest, failures told apart, and the
import slots. The real import jobs run in tests/integration/test_image_cache_e2e.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.unit.imagecache_fakes import (
    DIGEST,
    IMAGE,
    Clock,
    ConfigMaps,
    FakeImporter,
    ListedConfigMaps,
)
from tests.unit.test_spec import cpu_spec

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.config import Settings
from slurmjob_operator.imagecache.gate import ImageGate, ImageNotReady, ImagePullFailed
from slurmjob_operator.imagecache.script import layout_for
from slurmjob_operator.imagecache.store import RecordStore
from slurmjob_operator.site.catalogs import ArtifactFormat
from slurmjob_operator.site.tenantentry import Tenant
from slurmjob_operator.site.tenants import Tenants, TenantScope

OTHER = "sha256:" + "ef" * 32


def _settings(tmp_path: Path, **extra: Any) -> Settings:
    key = tmp_path / "jwt.key"
    key.write_bytes(b"k" * 32)
    values: dict[str, Any] = {
        "storage_root": tmp_path,
        "slurm_jwt_key_file": key,
        "slurm_rest_user": "slurm",
        "images_enabled": True,
        "image_registries": "127.0.0.1:5000",
        "image_cache_root": tmp_path / "cache",
        "image_cache_user": "imagecache",
        "image_cache_uid": 990,
        "image_import_partition": "cpu",
        **extra,
    }
    return Settings(**values)


def _gate(settings: Settings) -> tuple[ImageGate, FakeImporter, Clock, ConfigMaps]:
    clock = Clock()
    maps = ListedConfigMaps()
    importer = FakeImporter(settings)
    secrets: dict[str, dict[str, bytes]] = {
        "team-a-registry": {
            ".dockerconfigjson": b'{"auths": {"127.0.0.1:5001": '
            b'{"username": "team-a", "password": "s3cret-pass"}}}'
        }
    }

    async def read_secret(namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        return (secrets[name], "1") if name in secrets else None

    gate = ImageGate(settings, RecordStore(maps, "ops"), importer, read_secret, "ops", clock=clock)  # type: ignore[arg-type]
    return gate, importer, clock, maps


def _spec(image: str = IMAGE) -> SlurmJobSpec:
    raw = cpu_spec()
    raw["framework"] = {"kind": "custom", "name": "custom", "image": image}
    return SlurmJobSpec.model_validate(raw)


def _scope(**tenant: Any) -> TenantScope:
    entry = Tenant.model_validate(
        {"name": "team-a", "namespaces": ["a"], "accounts": ["a"], "partitions": ["p"], **tenant}
    )
    tenants = Tenants(tenants=[entry])
    return tenants.scope("a")


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_site_without_images_refuses_naming_the_setting(tmp_path: Path) -> None:
    gate, *_ = _gate(_settings(tmp_path, images_enabled=False))
    with pytest.raises(SpecError, match="SLURMJOB_IMAGES_ENABLED"):
        _run(gate.entry_for(_spec(), None, "uid-1"))


def test_a_token_file_site_refuses_images(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("x")
    gate, *_ = _gate(_settings(tmp_path, slurm_jwt_key_file=None, slurm_jwt_file=token))
    with pytest.raises(SpecError, match="one user"):
        _run(gate.entry_for(_spec(), None, "uid-1"))


@pytest.mark.parametrize(
    ("image", "tenant", "message"),
    [
        ("docker.io/library/python:3", {"imageRegistries": ["127.0.0.1:5000"]}, "not among"),
        (IMAGE, {}, "lists no registry"),
    ],
)
def test_a_registry_the_tenant_does_not_list_is_refused(
    tmp_path: Path, image: str, tenant: dict[str, Any], message: str
) -> None:
    gate, importer, *_ = _gate(_settings(tmp_path))
    with pytest.raises(SpecError, match=message):
        _run(gate.entry_for(_spec(image), _scope(**tenant), "uid-1"))
    assert importer.submitted == []


def test_two_slurmjobs_share_one_import_and_run_its_digest(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    gate, importer, *_ = _gate(settings)
    with pytest.raises(ImageNotReady, match="job 100"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    with pytest.raises(ImageNotReady, match="job 100"):
        _run(gate.entry_for(_spec(), None, "uid-2"))
    assert len(importer.submitted) == 1
    importer.finish(importer.submitted[0][0])
    first = _run(gate.entry_for(_spec(), None, "uid-1"))
    second = _run(gate.entry_for(_spec(), None, "uid-2"))
    layout = layout_for(settings)
    assert str(first.node_path) == str(layout.entry_path("public", DIGEST, ArtifactFormat.SQSH))
    assert first == second
    assert (first.size, first.inode, first.recorded.split()[-1], first.owner_uid) == (
        4096,
        77,
        "1796000000.123456789",
        990,
    )
    assert first.id == f"{IMAGE}@{DIGEST}"
    assert len(importer.submitted) == 1
    assert importer.cleaned == [importer.submitted[0][0]]


def test_a_slurmjob_keeps_its_digest_when_the_tag_moves(tmp_path: Path) -> None:
    gate, importer, clock, _ = _gate(_settings(tmp_path, image_tag_reuse_seconds=60))
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    importer.finish(importer.submitted[0][0])
    assert _run(gate.entry_for(_spec(), None, "uid-1")).id.endswith(DIGEST)
    clock.now += timedelta(seconds=120)  # the tag's answer is stale: a new SlurmJob re-resolves
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(), None, "uid-2"))
    importer.finish(importer.submitted[1][0], digest=OTHER)
    assert _run(gate.entry_for(_spec(), None, "uid-2")).id.endswith(OTHER)
    # The first SlurmJob's next attempt still runs the digest it started with.
    assert _run(gate.entry_for(_spec(), None, "uid-1")).id.endswith(DIGEST)


def test_a_lost_submit_answer_is_adopted_by_name_never_sent_twice(tmp_path: Path) -> None:
    gate, importer, *_ = _gate(_settings(tmp_path))
    importer.lose_answer = True
    with pytest.raises(ImageNotReady, match="unconfirmed"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    importer.lose_answer = False
    with pytest.raises(ImageNotReady, match="job 100"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    assert len(importer.submitted) == 1


def test_a_permanent_failure_fails_with_the_logs_end_and_no_retry(tmp_path: Path) -> None:
    gate, importer, *_ = _gate(_settings(tmp_path))
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    importer.log = "slurmjob-import: the import of x is not a squashfs image\n"
    importer.finish(importer.submitted[0][0], code=65)
    with pytest.raises(ImagePullFailed, match=r"BadImage.*not a squashfs image"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    with pytest.raises(ImagePullFailed):  # another SlurmJob fails at once, no new import
        _run(gate.entry_for(_spec(), None, "uid-2"))
    assert len(importer.submitted) == 1


def test_a_transient_failure_is_retried_later(tmp_path: Path) -> None:
    gate, importer, clock, _ = _gate(_settings(tmp_path))
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    importer.finish(importer.submitted[0][0], code=69)
    with pytest.raises(ImageNotReady, match=r"tried again at .*RegistryUnavailable"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    clock.now += timedelta(hours=1)
    with pytest.raises(ImageNotReady, match="job 101"):
        _run(gate.entry_for(_spec(), None, "uid-1"))


def test_a_private_image_is_the_tenants_own_and_its_password_never_shown(
    tmp_path: Path,
) -> None:
    gate, importer, *_ = _gate(_settings(tmp_path))
    scope = _scope(
        imageRegistries=["127.0.0.1:5001"],
        imageCredentialsSecret="team-a-registry",
        slurmUser="team-a",
        uid=20001,
    )
    private = "127.0.0.1:5001/private/base:1"
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(private), scope, "uid-1"))
    name, credentials = importer.submitted[0]
    assert credentials == b"machine 127.0.0.1 login team-a password s3cret-pass\n"
    assert importer.readers == [20001]  # readable by team-a's uid alone
    importer.log = "401 for team-a with s3cret-pass\n"
    importer.finish(name, code=77)
    with pytest.raises(ImagePullFailed) as failed:
        _run(gate.entry_for(_spec(private), scope, "uid-1"))
    assert "s3cret-pass" not in str(failed.value)
    assert "AccessDenied" in str(failed.value)


def test_imports_wait_for_a_slot_of_their_scope(tmp_path: Path) -> None:
    gate, importer, *_ = _gate(_settings(tmp_path, image_imports_per_tenant=1))
    with pytest.raises(ImageNotReady, match="job 100"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    with pytest.raises(ImageNotReady, match="waits for an import"):
        _run(gate.entry_for(_spec("127.0.0.1:5000/slurmjob/other:1"), None, "uid-2"))
    assert len(importer.submitted) == 1


def test_a_lost_submit_whose_import_already_ended_is_adopted_with_its_result(
    tmp_path: Path,
) -> None:
    gate, importer, *_ = _gate(_settings(tmp_path))
    importer.lose_answer = True
    with pytest.raises(ImageNotReady, match="unconfirmed"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    importer.finish(importer.submitted[0][0])
    assert _run(gate.entry_for(_spec(), None, "uid-1")).id.endswith(DIGEST)
    assert len(importer.submitted) == 1


def test_a_missing_registry_secret_waits_without_an_import_in_flight(tmp_path: Path) -> None:
    gate, importer, _, maps = _gate(_settings(tmp_path))
    scope = _scope(
        imageRegistries=["127.0.0.1:5001"],
        imageCredentialsSecret="no-such-secret",
        slurmUser="team-a",
        uid=20001,
    )
    with pytest.raises(ImageNotReady, match="no-such-secret is missing"):
        _run(gate.entry_for(_spec("127.0.0.1:5001/private/base:1"), scope, "uid-1"))
    assert importer.submitted == []
    assert maps.maps == {}  # no write-ahead: nothing to adopt or clean later


def test_an_entry_gone_from_the_cache_is_forgotten_and_imported_again(tmp_path: Path) -> None:
    gate, importer, _, maps = _gate(_settings(tmp_path))
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    importer.finish(importer.submitted[0][0])
    entry = _run(gate.entry_for(_spec(), None, "uid-1"))
    assert len(maps.maps) == 1
    _run(gate.forget(_spec(), None, "uid-1", str(entry.node_path), "evicted"))
    assert maps.maps == {}  # the record went with its only entry
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    assert len(importer.submitted) == 2  # imported again, not failed
