"""Site files for a test cluster: runtime artifacts on the shared storage, the two catalogs,
and the SLURMJOB_* settings that point the operator at that cluster."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tests.testbed.slurm import SlurmTestbed

SIF_BYTES = b"#!/usr/bin/env run-singularity\n\0" + b"SIF_MAGIC\0" + b"testbed runtime" * 64
# A SquashFS 4.0 superblock: magic, then major/minor version at offset 28.
SQSH_BYTES = b"hsqs" + b"\0" * 24 + (4).to_bytes(2, "little") + b"\0" * 66 + b"testbed runtime" * 64
SERIES = [
    {"name": "h100", "slurmConstraint": "h100", "gpusPerNode": 2},
    {"name": "a100", "slurmConstraint": "a100", "gpusPerNode": 2},
    {"name": "l40s", "gpusPerNode": 2},  # no constraint: refused in heterogeneous jobs
]


def _write_runtime(root: Path, name: str, content: bytes, owner: tuple[int, int]) -> str:
    path = root / "runtimes" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != content:
        # A module in the other lane (tests/lanes.py) may be reading it: never half-written.
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_bytes(content)
        tmp.replace(path)
    os.chown(path.parent, *owner)
    path.chmod(0o644)
    return hashlib.sha256(content).hexdigest()


def site_env(testbed: SlurmTestbed, profile: str, workdir: Path) -> dict[str, str]:
    """Write the runtimes and catalogs; return the settings for `testbed` and `profile`."""
    root = testbed.storage_root
    owner = (testbed.uid, testbed.gid)
    sif = _write_runtime(root, "testbed.sif", SIF_BYTES, owner)
    sqsh = _write_runtime(root, "testbed.sqsh", SQSH_BYTES, owner)
    registry = workdir / "runtimes.yaml"
    registry.write_text(
        json.dumps(
            {
                "runtimes": [
                    {
                        "id": "custom-sif",
                        "format": "sif",
                        "path": "runtimes/testbed.sif",
                        "sha256": sif,
                    },
                    {
                        "id": "custom-sqsh",
                        "format": "sqsh",
                        "path": "runtimes/testbed.sqsh",
                        "sha256": sqsh,
                    },
                ]
            }
        )
    )
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


def runtime_id(profile: str) -> str:
    return "custom-sif" if profile == "apptainer" else "custom-sqsh"
