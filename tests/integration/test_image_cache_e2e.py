"""The image cache end to end (issue 44): SlurmJobs that name `spec.framework.image` against a
real kube-apiserver, the operator as its own process, real Slurm 22.05 (Enroot + Pyxis,
`use_squashfuse=1`: the mode that starts from the squashfs without unpacking it) and the
test bed's OCI registry (tests/testbed/registry.py).

The import jobs are real Slurm jobs of the cache user (`slurmimg`) on the `debug` partition,
running the operator's import script with the real `enroot digest` and `enroot import`; the
SlurmJobs then run in that very squashfs through Pyxis, checked on the node by what the import
recorded (no hash of the image on the job's node).

The tenants' part runs on Slurm 26.05 with Apptainer (SIF, `apptainer build`, the digest found
through the registry's API with curl) and the private registry: team-a's credentials (a
Secret in the operator's namespace) import an entry only team-a's uid may read; team-b naming
the same reference gets its own import, refused by the registry, never team-a's file.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.helpers import cpu_spec
from tests.integration.test_operator_e2e import Operator, _operator
from tests.k8s.kube import KubeTestbed
from tests.testbed.registry import Registries
from tests.testbed.slurm import SlurmTestbed

pytestmark = [pytest.mark.integration]

CACHE_USER = "slurmimg"
CACHE_PARENT = Path("/srv/slurmjob-testbed/imagecache")
MARKER = "/etc/slurmjob-testbed-image"
IMPORT_WITHIN = 240


def new_cache_root(prefix: str) -> Iterator[Path]:
    """A cache root of a module's own, the cache user's, with its `logs/` (what the site
    prepares: docs/images.md); removed after."""
    user = pwd.getpwnam(CACHE_USER)
    root = CACHE_PARENT / f"{prefix}-{uuid.uuid4().hex[:8]}"
    for path in (root, root / "logs"):
        path.mkdir(mode=0o755)
        os.chown(path, user.pw_uid, user.pw_gid)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def cache_user_env(testbed: SlurmTestbed, cache_root: Path) -> dict[str, str]:
    """The cache user's settings as the test bed provides them: its own partition, small
    jobs; records in `default`."""
    return {
        "SLURMJOB_IMAGE_CACHE_ROOT": str(cache_root),
        "SLURMJOB_IMAGE_CACHE_USER": CACHE_USER,
        "SLURMJOB_IMAGE_CACHE_UID": str(pwd.getpwnam(CACHE_USER).pw_uid),
        "SLURMJOB_IMAGE_IMPORT_PARTITION": testbed.partition,
        "SLURMJOB_IMAGE_IMPORT_CPUS": "1",
        "SLURMJOB_IMAGE_IMPORT_MEMORY_MB": "512",
        "SLURMJOB_IMAGE_IMPORT_TIME_MINUTES": "10",
        "SLURMJOB_POD_NAMESPACE": "default",
    }


@pytest.fixture(scope="module")
def cache_root() -> Iterator[Path]:
    yield from new_cache_root("e2e")


@pytest.fixture(scope="module")
def op(
    kube: KubeTestbed,
    crd: None,
    slurm_2205: SlurmTestbed,
    registry: Registries,
    cache_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    yield from _operator(
        kube,
        slurm_2205,
        tmp_path_factory.mktemp("images"),
        "enroot-pyxis",
        SLURMJOB_IMAGE_REGISTRIES=registry.image("base").host,
        **_image_env(slurm_2205, registry, cache_root),
    )


def _image_env(testbed: SlurmTestbed, registry: Registries, cache_root: Path) -> dict[str, str]:
    """The image cache on, the cache user's settings and the registries' CA."""
    return {
        "SLURMJOB_IMAGES_ENABLED": "1",
        **cache_user_env(testbed, cache_root),
        "SLURMJOB_IMAGE_IMPORT_CA_FILE": str(registry.ca_bundle),
    }


def _image_spec(image: str, command: list[str], profile: str = "enroot-pyxis") -> dict[str, Any]:
    spec = cpu_spec(command, profile)
    spec["framework"] = {"kind": "custom", "name": "custom", "image": image}
    return spec


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    return {}


def _records(op: Operator, reference: str) -> list[dict[str, Any]]:
    """The operator's image records of `reference` (its ConfigMaps in its namespace)."""
    proc = op.kube.kubectl("get", "configmaps", "-n", "default", "-o", "json")
    found = []
    for item in json.loads(proc.stdout)["items"]:
        if not item["metadata"]["name"].startswith("slurmjob-image-"):
            continue
        record = json.loads((item.get("data") or {}).get("record", "{}"))
        if record.get("reference") == reference:
            found.append(record)
    return found


@pytest.mark.slurm2205
def test_two_slurmjobs_naming_one_tag_share_one_import_and_run_in_it(
    op: Operator, registry: Registries, cache_root: Path
) -> None:
    image = registry.image("base")
    command = ["sh", "-c", f"cat {MARKER}; echo ran-in-the-image"]
    for name in ("img-a", "img-b"):
        op.apply(name, _image_spec(image.ref, command))
    pulling = op.wait_for(
        "img-a",
        lambda o: condition(o, "ImageReady").get("reason") in ("ImagePulling", "ImageCached"),
        within=60,
        what="ImageReady",
    )
    assert (pulling.get("status") or {}).get("phase") in (
        "Pending",
        "Submitting",
        "Queued",
        "Running",
        "Succeeded",
    )
    done = {
        name: op.wait_phase(name, "Succeeded", "Failed", within=IMPORT_WITHIN)
        for name in ("img-a", "img-b")
    }
    for obj in done.values():
        status = obj["status"]
        assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
        ready = condition(obj, "ImageReady")
        assert (ready["status"], ready["reason"]) == ("True", "ImageCached"), ready
        assert ready["message"] == f"runs {image.ref}@{image.digest}"
        stdout = (status.get("logs") or {}).get("stdout") or {}
        assert "ran-in-the-image" in json.dumps(stdout)
    # One import for both, a job of the cache user on the CPU partition.
    records = _records(op, image.ref)
    assert len(records) == 1, records
    record = records[0]
    assert record["attempt"]["number"] == 1
    assert record["entry"]["digest"] == image.digest
    job = op.slurm_job(int(record["attempt"]["jobId"]))
    assert job, record
    assert job[0].user == CACHE_USER
    assert {u["uid"] for u in record["users"]} == {
        done["img-a"]["metadata"]["uid"],
        done["img-b"]["metadata"]["uid"],
    }
    # Published read-only under its digest, nothing partial left.
    entry = Path(record["entry"]["path"])
    assert entry.is_relative_to(cache_root)
    info = entry.lstat()
    assert (info.st_mode & 0o777, info.st_uid) == (0o444, pwd.getpwnam(CACHE_USER).pw_uid)
    assert entry.read_bytes()[:4] == b"hsqs"
    assert list((cache_root / "tmp").iterdir()) == []
    # What the job ran names the entry, and no registry: nothing is pulled in its allocation.
    for obj in done.values():
        script = (Path(obj["status"]["attempts"][0]["stagingDir"]) / "job.sh").read_text()
        assert str(entry) in script
        assert image.host not in script


@pytest.mark.slurm2205
def test_a_corrupted_blob_fails_the_slurmjob_with_nothing_of_it_submitted(
    op: Operator, registry: Registries
) -> None:
    image = registry.image("corruptible")
    with registry.corrupted("corruptible"):
        op.apply("img-bad", _image_spec(image.ref, ["true"]))
        obj = op.wait_phase("img-bad", "Failed", "Succeeded", within=IMPORT_WITHIN)
    status = obj["status"]
    assert status["phase"] == "Failed", json.dumps(status, indent=1)
    ready = condition(obj, "ImageReady")
    assert (ready["status"], ready["reason"]) == ("False", "ImagePullFailed"), ready
    assert "BadImage" in ready["message"], ready
    assert not status.get("attempts")  # no job of its own was ever submitted


REGISTRY_SECRET = "e2e-image-registry"
TEAM_A_UID = 2101


def _tenants(path: Path, namespace: str, private_host: str) -> None:
    def tenant(name: str, ns: str, uid: int, secret: str | None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": name,
            "namespaces": [ns],
            "accounts": [name],
            "partitions": ["debug"],
            "slurmUser": name,
            "uid": uid,
            "imageRegistries": [private_host],
        }
        if secret is not None:
            entry["imageCredentialsSecret"] = secret
        return entry

    tenants = [
        tenant("team-a", namespace, TEAM_A_UID, REGISTRY_SECRET),
        tenant("team-b", f"{namespace}-b", TEAM_A_UID + 1, None),
    ]
    path.write_text(yaml.safe_dump({"tenants": tenants}))


@pytest.fixture(scope="module")
def tenant_op(
    kube: KubeTestbed,
    crd: None,
    slurm_2605: SlurmTestbed,
    registry: Registries,
    cache_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    private = registry.image("private")
    tmp = tmp_path_factory.mktemp("images-tenants")
    path = tmp / "tenants.yaml"
    _tenants(path, "placeholder", private.host)
    creds = registry.apptainer_credentials()
    kube.kubectl("delete", "secret", REGISTRY_SECRET, "-n", "default", check=False)
    kube.kubectl(
        "create", "secret", "docker-registry", REGISTRY_SECRET, "-n", "default",
        f"--docker-server={private.host}",
        f"--docker-username={creds['APPTAINER_DOCKER_USERNAME']}",
        f"--docker-password={creds['APPTAINER_DOCKER_PASSWORD']}",
    )  # fmt: skip
    for op in _operator(
        kube,
        slurm_2605,
        tmp,
        "apptainer",
        SLURMJOB_TENANTS_FILE=str(path),
        **_image_env(slurm_2605, registry, cache_root),
    ):
        op.stop()
        _tenants(path, op.namespace, private.host)
        kube.kubectl("create", "namespace", f"{op.namespace}-b")
        op.also_watched = (f"{op.namespace}-b",)
        op.start()
        try:
            yield op
        finally:
            kube.kubectl("delete", "namespace", f"{op.namespace}-b", "--wait=false", check=False)
    kube.kubectl("delete", "secret", REGISTRY_SECRET, "-n", "default", check=False)


@pytest.mark.slurm2605
def test_a_private_image_is_its_tenants_alone(
    tenant_op: Operator, registry: Registries, cache_root: Path
) -> None:
    op = tenant_op
    private = registry.image("private")
    command = ["sh", "-c", f"cat {MARKER}; echo ran-in-the-private-image"]
    op.apply("img-team-a", _image_spec(private.ref, command, "apptainer"))
    obj = op.wait_phase("img-team-a", "Succeeded", "Failed", within=IMPORT_WITHIN)
    assert obj["status"]["phase"] == "Succeeded", json.dumps(obj["status"], indent=1)
    ready = condition(obj, "ImageReady")
    assert ready["message"] == f"runs {private.ref}@{private.digest}"
    (record,) = _records(op, private.ref)
    assert record["scope"] == "tenant-team-a"
    entry = Path(record["entry"]["path"])
    assert entry.parent == cache_root / "entries" / "tenant-team-a"
    assert entry.suffix == ".sif"
    assert entry.lstat().st_mode & 0o777 == 0o440
    # team-b lists the same registry but has no credentials: an import of its own, refused.
    namespace_b = f"{op.namespace}-b"
    manifest = {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": {"name": "img-team-b", "namespace": namespace_b},
        "spec": _image_spec(private.ref, ["true"], "apptainer"),
    }
    op.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    failed = _wait_in(op, namespace_b, "img-team-b")
    ready_b = condition(failed, "ImageReady")
    assert (ready_b["status"], ready_b["reason"]) == ("False", "ImagePullFailed"), ready_b
    assert "AccessDenied" in ready_b["message"], ready_b
    assert not failed["status"].get("attempts")


def _wait_in(op: Operator, namespace: str, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + IMPORT_WITHIN
    obj: dict[str, Any] = {}
    while time.monotonic() < deadline:
        proc = op.kube.kubectl("get", "slurmjob", name, "-n", namespace, "-o", "json", check=False)
        if proc.returncode == 0:
            obj = json.loads(proc.stdout)
            if (obj.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                return obj
        time.sleep(1)
    raise AssertionError(
        f"{namespace}/{name} did not end: {json.dumps(obj.get('status'))}\n{op.log_tail()}"
    )


@pytest.mark.slurm2205
def test_image_start_bench_smoke(slurm_2205: SlurmTestbed) -> None:
    """One round of bench/image_start.py with two small images: the figures are measured
    (a job started and its command's first line came after), for both ways of checking."""
    from bench.image_start import MODES, measure

    figures = measure(slurm_2205, {"1MB": 1024**2, "8MB": 8 * 1024**2}, rounds=1)
    for mode in MODES:
        for size in ("1MB", "8MB"):
            assert 0 < figures[mode][size]["mean_s"] < 60, figures
        assert figures[mode]["ratio"] is not None, figures


@pytest.mark.slurm2205
def test_an_operator_killed_during_an_import_finds_it_again(
    op: Operator, registry: Registries, cache_root: Path
) -> None:
    """The operator dies while its import is recorded (write-ahead or submitted): the next
    one adopts that import, never sends another, and no partial file is left."""
    image = registry.image("base")
    by_digest = image.digest_ref  # a record of its own: a new import
    op.apply("img-killed", _image_spec(by_digest, ["true"]))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _records(op, by_digest):
        time.sleep(0.2)
    (record,) = _records(op, by_digest)
    assert record["attempt"]["number"] == 1
    op.kill()
    time.sleep(1.0)
    op.start()
    obj = op.wait_phase("img-killed", "Succeeded", "Failed", within=IMPORT_WITHIN)
    assert obj["status"]["phase"] == "Succeeded", json.dumps(obj["status"], indent=1)
    (record,) = _records(op, by_digest)
    assert record["attempt"]["number"] == 1, record  # one import, adopted or waited for
    name = record["attempt"]["jobName"]
    jobs = op.slurm_jobs_named(name)
    assert [j.job_id for j in jobs] == [record["attempt"]["jobId"]], jobs
    assert list((cache_root / "tmp").iterdir()) == []
    assert not [p for p in (cache_root / "entries").rglob("*") if p.name.startswith(".")]


def _sweep_state(op: Operator) -> dict[str, Any]:
    proc = op.kube.kubectl(
        "get",
        "configmap",
        "-n",
        "default",
        "slurmjob-imagecache-sweep",
        "-o",
        "json",
        check=False,
    )
    if proc.returncode != 0:
        return {}
    return dict(json.loads(json.loads(proc.stdout)["data"]["state"]))


@pytest.mark.slurm2205
def test_eviction_under_the_cap_keeps_the_entry_a_running_slurmjob_uses(
    op: Operator, registry: Registries, cache_root: Path
) -> None:
    """Over the cap, the sweep evicts the entry no non-final SlurmJob uses (though it was used
    last) and keeps the one a running SlurmJob runs in; the file goes by a job of the cache
    user, the record with it."""
    base, spare = registry.image("base"), registry.image("corruptible")
    saved = dict(op.env)
    try:
        op.stop()
        op.env["SLURMJOB_IMAGE_CACHE_SWEEP_SECONDS"] = "2"
        op.start()
        op.apply("evict-keep", _image_spec(base.ref, ["sh", "-c", f"cat {MARKER}; sleep 300"]))
        op.wait_phase("evict-keep", "Running", "Failed", "Succeeded", within=IMPORT_WITHIN)
        op.apply("evict-spare", _image_spec(spare.digest_ref, ["true"]))
        done = op.wait_phase("evict-spare", "Succeeded", "Failed", within=IMPORT_WITHIN)
        assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)
        (kept_record,) = _records(op, base.ref)
        (spare_record,) = _records(op, spare.digest_ref)
        kept = Path(kept_record["entry"]["path"])
        evicted = Path(spare_record["entry"]["path"])
        assert kept.is_file()
        assert evicted.is_file()
        # A cap the two entries do not fit: one must go, and it is not the one in use.
        op.stop()
        op.env["SLURMJOB_IMAGE_CACHE_MAX_BYTES"] = str(max(kept.stat().st_size, 1024**2))
        op.start()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and evicted.exists():
            time.sleep(0.5)
        assert not evicted.exists(), op.log_tail()
        assert kept.is_file()
        assert _records(op, spare.digest_ref) == []
        keep = op.get("evict-keep")
        assert keep is not None
        assert keep["status"]["phase"] == "Running", json.dumps(keep["status"], indent=1)
        state = _sweep_state(op)
        name = state.get("jobName") or (state.get("report") or {}).get("job")
        assert name, state
        (job,) = op.slurm_jobs_named(name)
        assert job.user == CACHE_USER
        # Its job still runs from the kept file (the node's check passed at its start).
        assert keep["status"]["attempts"][-1].get("jobId"), keep["status"]
    finally:
        # Deleted while an operator runs: its finalizer cancels the job, which must not hold
        # 22.05's node for the other modules.
        if op.proc is None or op.proc.poll() is not None:
            op.start()
        op.kube.kubectl(
            "delete",
            "slurmjob",
            "evict-keep",
            "-n",
            op.namespace,
            "--timeout=90s",
            check=False,
            timeout=100,
        )
        op.stop()
        op.env.clear()
        op.env.update(saved)
        op.start()
