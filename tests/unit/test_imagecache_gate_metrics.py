"""What the image gate counts (issue 44, section 3): a hit is a SlurmJob's pass given an entry
(bound or Ready) without sending an import, a miss an import sent (once, however many
SlurmJobs wait on it), and an import's seconds are observed once, when its end is written.
The stand-ins are imagecache_fakes.py's, the spec and settings test_imagecache_gate.py's."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import pytest

from slurmjob_operator.imagecache.gate import ImageGate, ImageNotReady, ImagePullFailed
from slurmjob_operator.imagecache.store import RecordStore
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.tenants import TenantScope

from .imagecache_fakes import IMAGE, Clock, ConfigMaps, FakeImporter, InstantImporter
from .test_imagecache_gate import _run, _scope, _settings, _spec

PRIVATE = "127.0.0.1:5001/private/base:1"


class FlakyConfigMaps(ConfigMaps):
    """Refuses the next write when `fail` is set (an apiserver that did not answer)."""

    fail = False

    async def merge_configmap(
        self, namespace: str, name: str, data: Mapping[str, str | None]
    ) -> None:
        if self.fail:
            self.fail = False
            raise RuntimeError("the apiserver did not answer")
        await super().merge_configmap(namespace, name, data)


def _gate(
    tmp_path: Path,
    importer_type: type[FakeImporter] = FakeImporter,
    **extra: object,
) -> tuple[ImageGate, FakeImporter, Clock, FlakyConfigMaps, Metrics]:
    settings = _settings(tmp_path, **extra)
    clock, maps, metrics = Clock(), FlakyConfigMaps(), Metrics()
    importer = importer_type(settings)
    secret = {
        ".dockerconfigjson": b'{"auths": {"127.0.0.1:5001": '
        b'{"username": "team-a", "password": "s3cret-pass"}}}'
    }

    async def read_secret(namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        return (secret, "1") if name == "team-a-registry" else None

    gate = ImageGate(
        settings,
        RecordStore(maps, "ops"),
        importer,  # type: ignore[arg-type]
        read_secret,
        "ops",
        clock=clock,
        metrics=metrics,
    )
    return gate, importer, clock, maps, metrics


def _counts(metrics: Metrics, scope: str = "public") -> tuple[float, float]:
    hits = metrics.sample("slurmjob_operator_image_cache_hits_total", {"scope": scope})
    misses = metrics.sample("slurmjob_operator_image_cache_misses_total", {"scope": scope})
    return hits or 0.0, misses or 0.0


def _imports(metrics: Metrics, outcome: str) -> tuple[float | None, float | None]:
    labels = {"outcome": outcome}
    return (
        metrics.sample("slurmjob_operator_image_import_seconds_count", labels),
        metrics.sample("slurmjob_operator_image_import_seconds_sum", labels),
    )


def _tenant() -> TenantScope:
    return _scope(
        imageRegistries=["127.0.0.1:5001"],
        imageCredentialsSecret="team-a-registry",
        slurmUser="team-a",
        uid=20001,
    )


def test_one_miss_per_import_then_hits_for_every_slurmjob_given_the_entry(
    tmp_path: Path,
) -> None:
    gate, importer, clock, _, metrics = _gate(tmp_path)
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    assert _counts(metrics) == (0, 1)
    with pytest.raises(ImageNotReady):  # another SlurmJob waits on the same import
        _run(gate.entry_for(_spec(), None, "uid-2"))
    with pytest.raises(ImageNotReady):  # and the first looks again
        _run(gate.entry_for(_spec(), None, "uid-1"))
    assert _counts(metrics) == (0, 1)
    assert _imports(metrics, "ready") == (0, 0)
    clock.now += timedelta(seconds=90)
    importer.finish(importer.submitted[0][0])
    _run(gate.entry_for(_spec(), None, "uid-1"))  # finds the import ended: Ready
    _run(gate.entry_for(_spec(), None, "uid-2"))  # Ready from the record
    _run(gate.entry_for(_spec(), None, "uid-1"))  # its next attempt: bound to its digest
    _run(gate.entry_for(_spec(), None, "uid-3"))  # a SlurmJob that never waited
    assert _counts(metrics) == (4, 1)
    assert _imports(metrics, "ready") == (1, 90)  # observed once, by the pass that ended it
    assert _imports(metrics, "failed") == (0, 0)


def test_a_pass_that_sends_the_import_and_gets_its_entry_is_a_miss_only(
    tmp_path: Path,
) -> None:
    gate, importer, _, _, metrics = _gate(tmp_path, InstantImporter)
    entry = _run(gate.entry_for(_spec(), None, "uid-1"))
    assert entry.id.startswith(IMAGE)
    assert len(importer.submitted) == 1
    assert _counts(metrics) == (0, 1)
    assert _imports(metrics, "ready") == (1, 0)
    _run(gate.entry_for(_spec(), None, "uid-2"))
    assert _counts(metrics) == (1, 1)


def test_a_tenants_import_counts_in_its_scope_and_a_failure_once(tmp_path: Path) -> None:
    gate, importer, clock, _, metrics = _gate(tmp_path)
    scope = _tenant()
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(PRIVATE), scope, "uid-1"))
    assert _counts(metrics, "tenant-team-a") == (0, 1)
    assert _counts(metrics, "public") == (0, 0)
    clock.now += timedelta(seconds=40)
    importer.finish(importer.submitted[0][0], code=77)  # access denied: permanent
    with pytest.raises(ImagePullFailed):
        _run(gate.entry_for(_spec(PRIVATE), scope, "uid-1"))
    with pytest.raises(ImagePullFailed):  # fails at once from the record: nothing more
        _run(gate.entry_for(_spec(PRIVATE), scope, "uid-2"))
    assert _imports(metrics, "failed") == (1, 40)
    assert _counts(metrics, "tenant-team-a") == (0, 1)


def test_a_retried_import_is_a_second_miss_and_a_failed_import_observed(
    tmp_path: Path,
) -> None:
    gate, importer, clock, _, metrics = _gate(tmp_path)
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    importer.finish(importer.submitted[0][0], code=69)  # the registry unavailable: transient
    with pytest.raises(ImageNotReady, match="tried again"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    with pytest.raises(ImageNotReady, match="tried again"):  # the backoff: no import
        _run(gate.entry_for(_spec(), None, "uid-1"))
    assert _imports(metrics, "failed") == (1, 0)
    assert _counts(metrics) == (0, 1)
    clock.now += timedelta(hours=1)
    with pytest.raises(ImageNotReady, match="job 101"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    assert _counts(metrics) == (0, 2)


def test_no_miss_without_an_import_sent_and_one_for_a_lost_answer(tmp_path: Path) -> None:
    gate, importer, _, _, metrics = _gate(tmp_path, image_imports_per_tenant=1)
    with pytest.raises(ImageNotReady, match="job 100"):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    with pytest.raises(ImageNotReady, match="waits for an import"):  # no slot: nothing sent
        _run(gate.entry_for(_spec("127.0.0.1:5000/slurmjob/other:1"), None, "uid-2"))
    assert _counts(metrics) == (0, 1)
    importer.lose_answer = True
    importer.finish(importer.submitted[0][0])
    _run(gate.entry_for(_spec(), None, "uid-1"))
    with pytest.raises(ImageNotReady, match="unconfirmed"):  # sent, its answer lost
        _run(gate.entry_for(_spec("127.0.0.1:5000/slurmjob/other:1"), None, "uid-2"))
    importer.lose_answer = False
    with pytest.raises(ImageNotReady, match="job 101"):  # adopted by its name: no new miss
        _run(gate.entry_for(_spec("127.0.0.1:5000/slurmjob/other:1"), None, "uid-2"))
    assert _counts(metrics) == (1, 2)


def test_nothing_is_counted_for_an_end_whose_write_failed(tmp_path: Path) -> None:
    gate, importer, clock, maps, metrics = _gate(tmp_path)
    with pytest.raises(ImageNotReady):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    clock.now += timedelta(seconds=30)
    importer.finish(importer.submitted[0][0])
    maps.fail = True
    with pytest.raises(RuntimeError):
        _run(gate.entry_for(_spec(), None, "uid-1"))
    assert _imports(metrics, "ready") == (0, 0)
    assert _counts(metrics) == (0, 1)
    _run(gate.entry_for(_spec(), None, "uid-1"))  # decided again, written this time
    assert _imports(metrics, "ready") == (1, 30)
    assert _counts(metrics) == (1, 1)
