"""What entering a container costs a step (issue 43): from srun's start to the program's first
line, for each runtime and mode, against a plain step without a container measured in the same
job.

One batch job on a test cluster (tests/testbed/slurm.py; as the test bed's job user) runs
``--rounds`` rounds; each round starts, one after the other on the same node:

* ``plain``: ``srun -- sh -c 'date +%s.%N'`` on the node itself (the baseline: srun, slurmstepd
  and a process, no container);
* ``pyxis-squashfuse``: ``srun --container-image=IMAGE.sqsh`` through Pyxis configured as the
  test bed configures it (``use_squashfuse=1``: the squashfs mounted with squashfuse, no copy);
* ``enroot-create``: what Pyxis does without ``use_squashfuse``: ``enroot create`` (the whole
  image unpacked into the user's data directory), ``enroot start``, ``enroot remove``, inside
  one plain step;
* ``apptainer``: ``srun -- apptainer exec --no-home --contain IMAGE.sif`` as the templates run it.

Each figure is the time from just before ``srun`` to the program's first line (one clock: all
steps run on this machine). The report gives each mode's median and the median overhead over
``plain`` in the same round, for each image (``base`` 40 MB, ``ray`` 157 MB), as JSON.

    .venv/bin/python -m bench.container_start --cluster 22.05 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests.integration.sitefiles import image_on_storage
from tests.testbed import slurm as testbed_slurm

MODES = ("plain", "pyxis-squashfuse", "enroot-create", "apptainer")


def _script(sqsh: Path, sif: Path, rounds: int) -> str:
    stamp = "date +%s.%N"
    first = stamp  # the program: its first (and only) line is the time it started
    lines = ["#!/bin/bash", "set -u", "cd /tmp"]
    for r in range(rounds):
        steps = {
            "plain": f"srun -- {first}",
            "pyxis-squashfuse": (
                f"srun --container-image={sqsh} --no-container-mount-home -- {first}"
            ),
            "enroot-create": (
                "srun -- bash -c 'n=bench-$$; enroot create --name $n "
                f"{sqsh} >/dev/null 2>&1 && enroot start $n {first}; enroot remove -f $n "
                ">/dev/null 2>&1'"
            ),
            "apptainer": f"srun -- apptainer exec --no-home --contain {sif} {first} 2>/dev/null",
        }
        for mode in MODES:
            lines.append(f't0=$({stamp}); t1=$({steps[mode]}); echo "{r} {mode} $t0 $t1"')
    return "\n".join(lines) + "\n"


def _run_job(tb: testbed_slurm.SlurmTestbed, script: str, within: float) -> str:
    wd = tb.storage_root / f"bench-start-{uuid.uuid4().hex[:8]}"
    wd.mkdir()
    os.chown(wd, tb.uid, tb.gid)
    (wd / "job.sh").write_text(script)
    (wd / "job.sh").chmod(0o755)
    argv = [
        "runuser", "-u", tb.user, "--", "env", "-i", f"PATH={tb.job_path}",
        f"SLURM_CONF={tb.slurm_conf}", "sbatch", "--wait", "-D", str(wd),
        "-o", str(wd / "out.txt"), "-e", str(wd / "err.txt"), "-t", "20", str(wd / "job.sh"),
    ]  # fmt: skip
    if tb.chroot is not None:
        argv = ["chroot", str(tb.chroot), *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=within, check=False)
    out = (wd / "out.txt").read_text() if (wd / "out.txt").exists() else ""
    if proc.returncode != 0:
        err = (wd / "err.txt").read_text() if (wd / "err.txt").exists() else proc.stderr
        raise RuntimeError(f"the bench job failed ({proc.returncode}): {err[-2000:]}")
    return out


def measure(tb: testbed_slurm.SlurmTestbed, image: str, rounds: int) -> dict[str, Any]:
    """One job of ``rounds`` rounds on ``tb`` with ``image``: per mode, the median seconds to
    the first line and the median overhead over ``plain`` in the same round."""
    sqsh = image_on_storage(tb, image, "sqsh")
    sif = image_on_storage(tb, image, "sif")
    out = _run_job(tb, _script(sqsh, sif, rounds), within=120 + 60 * rounds)
    times: dict[int, dict[str, float]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[1] in MODES:
            times.setdefault(int(parts[0]), {})[parts[1]] = float(parts[3]) - float(parts[2])
    complete = [t for t in times.values() if set(t) == set(MODES)]
    if len(complete) != rounds:
        raise RuntimeError(f"{rounds - len(complete)} rounds without every mode: {out[-2000:]}")
    figures: dict[str, Any] = {"image": image, "cluster": tb.name, "rounds": rounds}
    for mode in MODES:
        figures[mode] = {
            "median_s": round(statistics.median(t[mode] for t in complete), 3),
            "overhead_s": round(statistics.median(t[mode] - t["plain"] for t in complete), 3),
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default="22.05", choices=sorted(testbed_slurm.SPECS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", default="base,ray")
    args = parser.parse_args(argv)
    tb = testbed_slurm.start_cluster(args.cluster, reuse=True)
    started = time.monotonic()
    report = [measure(tb, image, args.rounds) for image in args.images.split(",")]
    json.dump(
        {"figures": report, "wall_s": round(time.monotonic() - started, 1)}, sys.stdout, indent=2
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
