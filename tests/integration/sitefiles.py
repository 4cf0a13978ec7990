"""Site files for a test cluster: runtime artifacts on the shared storage (the test bed's real
images, tests/testbed/images.py), the two catalogs, and the SLURMJOB_* settings that point the
operator at that cluster."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tests.testbed import images
from tests.testbed.slurm import SlurmTestbed

#: The image test jobs run in: Debian trixie with bash, coreutils, python3 and the site's probe
#: program (tests/testbed/images.sh). Jobs of the Ray shape run in RAY_IMAGE, the same with
#: real Ray, which costs each job a longer hash of its image (0.56 s against 0.24 s).
IMAGE = "base"
RAY_IMAGE = "ray"
SERIES = [
    {"name": "h100", "slurmConstraint": "h100", "gpusPerNode": 2},
    {"name": "a100", "slurmConstraint": "a100", "gpusPerNode": 2},
    {"name": "l40s", "gpusPerNode": 2},  # no constraint: refused in heterogeneous jobs
]


def _write_runtime(root: Path, name: str, source: Path, owner: tuple[int, int]) -> str:
    """Put the cached image ``source`` at runtimes/``name`` on the storage root: a hard link
    (the cache and the storage root are on one filesystem here), else a copy. The cached file
    is root's and read-only to jobs; a job that replaces the link changes only its own tree."""
    path = root / "runtimes" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if not (path.exists() and os.path.samefile(path, source)):
        # A module in the other lane (tests/lanes.py) may be reading it: never half-written.
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
            tmp.chmod(0o644)
        tmp.replace(path)
    os.chown(path.parent, *owner)
    return images.sha256(source)


def image_on_storage(testbed: SlurmTestbed, image: str, fmt: str) -> Path:
    """The test bed's image ``image`` (format ``sif`` or ``sqsh``) on the cluster's storage
    root, where both clusters' nodes read it."""
    name = f"testbed-{image}.{fmt}"
    _write_runtime(testbed.storage_root, name, images.image(image, fmt), (testbed.uid, testbed.gid))
    return testbed.storage_root / "runtimes" / name


def site_env(testbed: SlurmTestbed, profile: str, workdir: Path) -> dict[str, str]:
    """Write the runtimes and catalogs; return the settings for `testbed` and `profile`."""
    root = testbed.storage_root
    owner = (testbed.uid, testbed.gid)
    runtimes = []
    for image, prefix in ((IMAGE, "custom"), (RAY_IMAGE, "custom-ray")):
        for fmt in ("sif", "sqsh"):
            name = f"testbed-{image}.{fmt}"
            sha = _write_runtime(root, name, images.image(image, fmt), owner)
            runtimes.append(
                {"id": f"{prefix}-{fmt}", "format": fmt, "path": f"runtimes/{name}", "sha256": sha}
            )
    registry = workdir / "runtimes.yaml"
    registry.write_text(json.dumps({"runtimes": runtimes}))
    series = workdir / "series.yaml"
    series.write_text(json.dumps({"series": SERIES}))
    return {
        "SLURMJOB_SLURM_REST_URL": testbed.rest_url,
        "SLURMJOB_SLURM_REST_API_VERSION": "auto",
        "SLURMJOB_SLURM_REST_USER": testbed.user,
        "SLURMJOB_SLURM_JWT_KEY_FILE": str(testbed.jwt_key_file),
        "SLURMJOB_SLURM_PARTITION": testbed.partition,
        "SLURMJOB_SLURM_RUNTIME_PROFILE": profile,
        "SLURMJOB_STORAGE_ROOT": str(root),
        "SLURMJOB_STAGING_OWNER": f"{testbed.uid}:{testbed.gid}",
        "SLURMJOB_SLURM_JOB_PATH": testbed.job_path,
        "SLURMJOB_RUNTIME_REGISTRY_FILE": str(registry),
        "SLURMJOB_GPU_SERIES_FILE": str(series),
    }


def runtime_id(profile: str, *, ray: bool = False) -> str:
    """The registry id of the test image for ``profile``; with ``ray``, the image with Ray."""
    fmt = "sif" if profile == "apptainer" else "sqsh"
    return f"custom-ray-{fmt}" if ray else f"custom-{fmt}"
