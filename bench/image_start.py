"""Idle allocation seconds at a job's start, by image size and by how the batch script checks
its image (issue 44): from the allocation's start (Slurm's start time of the job) to the
user command's first line, with a 100 MB and a 2 GB squashfs, the page cache dropped before
each job.

* ``full``: a runtime-registry artifact (`runtimeId`): the script hashes the whole file on the
  node before anything starts (TunePlane's rule, the default);
* ``recorded``: an image-cache entry (`spec.framework.image`): the script compares what the
  import job recorded (type, owner, mode, size, inode, ctime), the same cost for any size.

The jobs are the operator's own: prepared, staged and submitted by its pipeline
(`controller.pipeline.prepare_attempt`, `stage`, the `SlurmClient`), one after the other on
Slurm 22.05 with Enroot + Pyxis ``use_squashfuse=1`` (the mode that mounts the squashfs in
place, unpacking nothing). The command prints the time it started (``date +%s.%N``); Slurm's
start time has whole seconds, so each figure is the mean over ``--rounds`` jobs. The report
gives each figure and the ratio 2 GB / 100 MB per mode, as JSON.

    PYTHONPATH=. .venv/bin/python -m bench.image_start --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tests.integration.sitefiles import image_on_storage, site_env
from tests.testbed import slurm as testbed_slurm

from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.pipeline import Site, prepare_attempt, stage
from slurmjob_operator.site.artifacts import CachedImage
from slurmjob_operator.site.catalogs import ArtifactFormat
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport

MB = 1024 * 1024
SIZES = {"100MB": 100 * MB, "2GB": 2048 * MB, "1MB": MB, "8MB": 8 * MB}  # the last two: smoke
MODES = ("full", "recorded")
CACHE_USER = "slurmimg"
BENCH_DIR = "bench-images"


@dataclass(frozen=True)
class BenchImage:
    name: str
    path: Path  # under the storage root
    sha256: str


def _build(tb: testbed_slurm.SlurmTestbed, name: str, size: int) -> BenchImage:
    """The test bed's base image plus `size` bytes of random data, as an uncompressed squashfs
    on the storage root (kept: built once per size)."""
    out_dir = tb.storage_root / BENCH_DIR
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"{name}.sqsh"
    digest_file = out_dir / f"{name}.sha256"
    if not (path.exists() and digest_file.exists()):
        base = image_on_storage(tb, "base", "sqsh")
        with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
            tree = Path(work) / "tree"
            subprocess.run(["unsquashfs", "-q", "-d", str(tree), str(base)], check=True)
            with (tree / "padding").open("wb") as handle:
                left = size
                while left > 0:
                    chunk = os.urandom(min(left, 8 * MB))
                    handle.write(chunk)
                    left -= len(chunk)
            tmp = path.with_suffix(".tmp")
            tmp.unlink(missing_ok=True)
            subprocess.run(
                ["mksquashfs", str(tree), str(tmp), "-noI", "-noD", "-noF", "-noX", "-quiet"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        digest = hashlib.sha256()
        with tmp.open("rb") as handle:
            while block := handle.read(8 * MB):
                digest.update(block)
        tmp.chmod(0o444)
        tmp.rename(path)
        digest_file.write_text(digest.hexdigest())
    return BenchImage(name, path, digest_file.read_text().strip())


def _cache_entry(image: BenchImage, cache: Path) -> CachedImage:
    """The image as an import job leaves it: the cache user's, read-only, recorded."""
    user = pwd.getpwnam(CACHE_USER)
    entry = cache / f"{image.name}.sqsh"
    if not entry.exists():
        shutil.copyfile(image.path, entry)
        os.chown(entry, user.pw_uid, user.pw_gid)
        entry.chmod(0o444)
    info = entry.lstat()
    return CachedImage(
        id=f"bench/{image.name}",
        format=ArtifactFormat.SQSH,
        node_path=PurePosixPath(entry),
        operator_path=entry,
        sha256=image.sha256,
        size=info.st_size,
        inode=info.st_ino,
        ctime_ns=info.st_ctime_ns,
        owner_uid=user.pw_uid,
    )


def _spec(framework: dict[str, str]) -> SlurmJobSpec:
    return SlurmJobSpec.model_validate(
        {
            "framework": {"kind": "custom", "name": "custom", **framework},
            "command": ["date", "+%s.%N"],
            "pools": [{"name": "main", "nodes": 1, "gpusPerNode": 0, "cpus": 1, "memoryGb": 1}],
            "timeLimit": "10m",
        }
    )


def _drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


async def _one_job(
    client: SlurmClient, site: Site, spec: SlurmJobSpec, image: CachedImage | None, n: int
) -> float:
    """Submit one job as the operator does; the seconds from its start to the first line."""
    uid = str(uuid.uuid4())
    prepared = prepare_attempt(
        spec,
        site,
        namespace="bench",
        name=f"img-{n}",
        uid=uid,
        attempt=1,
        api_version=client.version,
        secret_values={},
        image=image,
    )
    stage(prepared, site.settings)
    _drop_page_cache()
    receipt = await client.submit(prepared.rendered.launch)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        views = await client.get_job(int(receipt.job_id))
        if views and views[0].is_final:
            break
        await asyncio.sleep(0.5)
    else:
        raise RuntimeError(f"job {receipt.job_id} did not end")
    view = views[0]
    out = prepared.rendered.staging_dir / "stdout.log"
    first = out.read_text().split("\n", 1)[0].strip() if out.exists() else ""
    if view.start_time is None or not first:
        err = prepared.rendered.staging_dir / "stderr.log"
        raise RuntimeError(f"job {view.job_id}: {view.raw_state} {err.read_text()[-1500:]}")
    return float(first) - view.start_time.timestamp()


def _site(
    tb: testbed_slurm.SlurmTestbed, sizes: dict[str, int], work: Path
) -> tuple[Site, dict[str, CachedImage]]:
    """The operator's site with the bench images in its runtime registry, and the same images
    as image-cache entries."""
    env = site_env(tb, "enroot-pyxis", work)
    images = {name: _build(tb, name, size) for name, size in sizes.items()}
    registry_file = Path(env["SLURMJOB_RUNTIME_REGISTRY_FILE"])
    registry = json.loads(registry_file.read_text())
    for image in images.values():
        registry["runtimes"].append(
            {
                "id": f"custom-bench-{image.name}",
                "format": "sqsh",
                "path": str(image.path.relative_to(tb.storage_root)),
                "sha256": image.sha256,
            }
        )
    registry_file.write_text(json.dumps(registry))
    settings = Settings.from_env(env)
    cache = tb.storage_root / BENCH_DIR / "cache"
    cache.mkdir(exist_ok=True)
    entries = {name: _cache_entry(image, cache) for name, image in images.items()}
    return Site.load(settings, (settings.cluster_name,)), entries


async def _rounds(
    site: Site, entries: dict[str, CachedImage], rounds: int
) -> dict[tuple[str, str], list[float]]:
    client = await connect(site.settings, open_transport(site.settings))
    idle: dict[tuple[str, str], list[float]] = {}
    n = 0
    for _ in range(rounds):
        for name, entry in entries.items():
            for mode in MODES:
                n += 1
                if mode == "full":
                    spec = _spec({"runtimeId": f"custom-bench-{name}"})
                    seconds = await _one_job(client, site, spec, None, n)
                else:
                    spec = _spec({"image": f"127.0.0.1:25000/bench/{name.lower()}:1"})
                    seconds = await _one_job(client, site, spec, entry, n)
                idle.setdefault((name, mode), []).append(seconds)
    return idle


def measure(tb: testbed_slurm.SlurmTestbed, sizes: dict[str, int], rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-image-start-") as work:
        site, entries = _site(tb, sizes, Path(work))
        idle = asyncio.run(_rounds(site, entries, rounds))
    small, large = next(iter(sizes)), list(sizes)[-1]
    figures: dict[str, Any] = {"cluster": tb.name, "rounds": rounds, "sizes": sizes}
    for mode in MODES:
        per = {
            name: {
                "mean_s": round(statistics.fmean(idle[(name, mode)]), 3),
                "median_s": round(statistics.median(idle[(name, mode)]), 3),
            }
            for name in sizes
        }
        ratio = per[large]["mean_s"] / per[small]["mean_s"] if per[small]["mean_s"] > 0 else None
        figures[mode] = {**per, "ratio": round(ratio, 2) if ratio is not None else None}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="100MB,2GB", help="two of " + ",".join(SIZES))
    args = parser.parse_args(argv)
    tb = testbed_slurm.start_cluster("22.05", reuse=True)
    sizes = {name: SIZES[name] for name in args.sizes.split(",")}
    started = time.monotonic()
    figures = measure(tb, sizes, args.rounds)
    figures["wall_s"] = round(time.monotonic() - started, 1)
    json.dump(figures, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
