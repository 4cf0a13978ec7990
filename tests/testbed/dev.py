"""`make dev-up` / `make dev-down`: the test clusters for a person, outside pytest.

``up`` starts (or re-uses) one real Slurm test cluster (26.05 by default, ``--slurm 22.05``
for the other) and the local etcd + kube-apiserver, installs the CRD, and writes under
``.dev/`` in the repository:

* ``env``: ``source .dev/env`` sets KUBECONFIG, every SLURMJOB_* setting and a PATH that
  starts with ``.dev/bin`` (kubectl, helm, slurmjob-operator and the cluster's squeue, sinfo,
  scontrol, scancel);
* ``site/``: the site catalogs (runtime registry and GPU series); the runtime artifacts are
  written to the cluster's storage root;
* ``examples/``: copies of ``examples/*.yaml`` adapted to the dev cluster;
* ``state.json``: what ``up`` started, so that ``down`` stops only that (daemons that were
  already running, e.g. for a test run, are re-used and left alone).

CLI::

    python -m tests.testbed.dev up [--slurm 26.05|22.05] [--profile apptainer|enroot-pyxis]
    python -m tests.testbed.dev down
    python -m tests.testbed.dev status
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from tests.integration.sitefiles import runtime_id, site_env
from tests.k8s.kube import KubeTestbed, start_testbed, stop_testbed, testbed_status
from tests.k8s.kube import TestbedError as KubeTestbedError
from tests.testbed.slurm import (
    SPECS,
    SYSTEM_PATH,
    SlurmTestbed,
    TestbedError,
    cluster_status,
    start_cluster,
    stop_cluster,
)

REPO = Path(__file__).resolve().parents[2]
DEV = REPO / ".dev"
STATE = DEV / "state.json"
CRD = REPO / "crds" / "slurmjob.io_slurmjobs.yaml"
CRD_NAME = "slurmjobs.slurmjob.io"
DEFAULT_SLURM = "26.05"
DEFAULT_PROFILE = "apptainer"
#: Namespaces the examples use, and the Secret the single-pool GPU example reads.
NAMESPACES = ("team-a",)
DEV_SECRET = {"namespace": "team-a", "name": "hf", "key": "token", "value": "dev-token"}
#: Mount sources the examples name (relative to the storage root).
MOUNT_SOURCES = (
    "datasets/mnist",
    "datasets/imagenet",
    "datasets/prompts",
    "datasets/alpaca",
    "checkpoints/team-a",
)
#: Runtime ids of the examples, mapped to the test artifact of the chosen profile.
EXAMPLE_RUNTIMES = ("custom-python", "custom-trainer")
SLURM_CLIENTS = ("squeue", "sinfo", "scontrol", "scancel")
#: Commands the dev nodes can run, replacing the examples' (train.py does not exist there).
DEV_COMMANDS: dict[str, list[str]] = {
    "gpu-single-pool.yaml": [
        "bash",
        "-c",
        'echo "epochs=$EPOCHS nodes=$WORLD_SIZE gpus/node=$NUM_GPU_PER_NODE"; '
        'test -n "$HF_TOKEN" && echo "HF_TOKEN is set"; sleep 5; echo done',
    ],
    "gpu-heterogeneous.yaml": [
        "bash",
        "-c",
        'echo "rl on $WORLD_SIZE nodes, master $MASTER_ADDR"; sleep 5; echo done',
    ],
    # torchrun's script and its arguments (the test bed's torchrun stand-in runs them).
    "gpu-torchrun-probed.yaml": [
        "bash",
        "-c",
        'echo "rank $RANK of $WORLD_SIZE on $SLURMD_NODENAME, P2P ${NCCL_P2P_DISABLE:-on}"; '
        "sleep 3; echo done",
    ],
    # One segment that finishes: the chain ends Succeeded in its first segment.
    "walltime-segments.yaml": [
        "bash",
        "-c",
        'echo "segment $SLURMJOB_SEGMENT (resume $SLURMJOB_RESUME), checkpoints in '
        '$SLURMJOB_CHECKPOINT_DIR"; sleep 3; echo done',
    ],
}
#: The collective probe of the examples' training runtime on the dev cluster: the test bed's
#: stand-in (tests/testbed/standins/collective-probe), which passes in a second.
DEV_PROBE = {
    "command": ["collective-probe", "--sleep", "1"],
    "timeoutSeconds": 30,
    "ladder": [{"NCCL_P2P_DISABLE": "1"}],
}


def _log(msg: str) -> None:
    print(f"[dev] {msg}", file=sys.stderr, flush=True)


def _healthy(status: str) -> bool:
    return "=down" not in status


def _read_state() -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(STATE.read_text())
    except (OSError, ValueError):
        return {}
    return state


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


def _symlink(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(target)
    tmp.replace(link)


# -- site files -------------------------------------------------------------------------


def write_site(testbed: SlurmTestbed, profile: str) -> dict[str, str]:
    """Artifacts on the storage root, catalogs in .dev/site; the SLURMJOB_* settings."""
    site = DEV / "site"
    site.mkdir(parents=True, exist_ok=True)
    env = site_env(testbed, profile, site)  # writes runtimes.yaml and series.yaml there
    registry_file = Path(env["SLURMJOB_RUNTIME_REGISTRY_FILE"])
    runtimes: list[dict[str, Any]] = json.loads(registry_file.read_text())["runtimes"]
    fmt = "sif" if profile == "apptainer" else "sqsh"
    # The examples' GPU jobs run the Ray shape: their runtime ids map to the image with Ray.
    artifact = next(r for r in runtimes if r["id"] == runtime_id(profile, ray=True))
    runtimes += [{**artifact, "id": rid} for rid in EXAMPLE_RUNTIMES]
    for runtime in runtimes:
        if runtime["id"] == "custom-trainer":
            runtime["probe"] = DEV_PROBE
    _write(
        registry_file,
        "# Written by `make dev-up`: the test artifacts on the dev cluster's storage root; the\n"
        f"# examples' runtime ids map to the {fmt} image with Ray ({profile} profile).\n"
        + yaml.safe_dump({"runtimes": runtimes}, sort_keys=False),
    )
    series_file = Path(env["SLURMJOB_GPU_SERIES_FILE"])
    series = json.loads(series_file.read_text())
    _write(
        series_file,
        "# Written by `make dev-up`: n1 has 2 (fake) h100, n2 has 2 (fake) a100.\n"
        + yaml.safe_dump(series, sort_keys=False),
    )
    for source in MOUNT_SOURCES:  # owned by the job user, like everything jobs write
        path = testbed.storage_root
        for part in Path(source).parts:
            path /= part
            path.mkdir(exist_ok=True)
            os.chown(path, testbed.uid, testbed.gid)
    return env


def adapt_example(name: str, manifest: dict[str, Any], partition: str) -> dict[str, Any]:
    """An example resized to the dev cluster: two nodes of 2 CPUs, 2 fake GPUs each."""
    spec = manifest["spec"]
    spec["partition"] = partition
    for field in ("account", "qos"):  # the dev cluster has no accounting
        spec.pop(field, None)
    for pool in spec["pools"]:
        pool["cpus"] = 1
        pool["memoryGb"] = 1
        if pool.get("gpusPerNode", 0) > 0:
            pool["nodes"] = 1
            pool["gpusPerNode"] = 2
    if name in DEV_COMMANDS:
        spec["command"] = DEV_COMMANDS[name]
    return manifest


def write_examples(partition: str) -> list[Path]:
    out = DEV / "examples"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sorted((REPO / "examples").glob("*.yaml")):
        manifest = yaml.safe_load(source.read_text())
        if not isinstance(manifest, dict) or manifest.get("kind") != "SlurmJob":
            continue
        adapted = adapt_example(source.name, manifest, partition)
        target = out / source.name
        _write(
            target,
            f"# examples/{source.name} adapted to the dev cluster by `make dev-up`: partition "
            f"{partition},\n# pools sized to its nodes (2 CPUs, 2 fake GPUs each), a command "
            "its nodes can run.\n" + yaml.safe_dump(adapted, sort_keys=False),
        )
        written.append(target)
    return written


def write_bin(kube: KubeTestbed, testbed: SlurmTestbed) -> Path:
    bin_dir = DEV / "bin"
    _symlink(bin_dir / "kubectl", kube.kubectl_bin)
    _symlink(bin_dir / "helm", kube.helm_bin)
    _symlink(bin_dir / "slurmjob-operator", REPO / ".venv" / "bin" / "slurmjob-operator")
    for client in SLURM_CLIENTS:
        if testbed.chroot is not None:
            argv = ["chroot", str(testbed.chroot), "env", "-i", f"PATH={SYSTEM_PATH}"]
            argv += [f"SLURM_CONF={testbed.slurm_conf}", client]
        else:
            argv = ["env", f"SLURM_CONF={testbed.slurm_conf}", f"/usr/bin/{client}"]
        _write(
            bin_dir / client,
            f"#!/bin/sh\n# Slurm {testbed.name} test cluster (written by `make dev-up`)\n"
            f'exec {shlex.join(argv)} "$@"\n',
            mode=0o755,
        )
    return bin_dir


def write_env(
    kube: KubeTestbed, testbed: SlurmTestbed, site: dict[str, str], bin_dir: Path
) -> Path:
    values = {
        **kube.env(),
        **site,
        "SLURMJOB_POLL_INTERVAL": "2",
        "SLURMJOB_METRICS_PORT": "9090",
    }
    stamp = datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [
        f"# Written by `make dev-up` at {stamp}: Slurm {testbed.name} "
        f"({testbed.rest_url}, {testbed.api_version}) and kube-apiserver {kube.server}.",
        "# Use it in a shell: source .dev/env",
        f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"',
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(values.items())]
    path = DEV / "env"
    _write(path, "\n".join(lines) + "\n")
    return path


# -- Kubernetes objects -----------------------------------------------------------------


def install_crd(kube: KubeTestbed) -> None:
    kube.apply(CRD)
    kube.wait_established(CRD_NAME)
    for namespace in NAMESPACES:
        kube.apply(
            yaml.safe_dump(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": DEV_SECRET["name"], "namespace": DEV_SECRET["namespace"]},
        "stringData": {DEV_SECRET["key"]: DEV_SECRET["value"]},
    }
    kube.apply(yaml.safe_dump(secret))


# -- commands ---------------------------------------------------------------------------


def up(slurm: str, profile: str) -> int:
    if slurm not in SPECS:
        _log(f"unknown Slurm {slurm!r}; use one of {', '.join(SPECS)}")
        return 2
    state = _read_state()
    started: dict[str, Any] = state.get("started", {})
    slurm_started: dict[str, bool] = dict(started.get("slurm", {}))
    kube_running = _healthy(testbed_status())
    slurm_running = _healthy(cluster_status(slurm))
    testbed = start_cluster(slurm, reuse=True)
    kube = start_testbed(reuse=True)
    # Started by dev-up now, or by an earlier dev-up whose daemons are still the ones running.
    slurm_started[slurm] = slurm_started.get(slurm, False) or not slurm_running
    kube_started = bool(started.get("kube", False)) or not kube_running
    _write(
        STATE,
        json.dumps(
            {"slurm": slurm, "started": {"slurm": slurm_started, "kube": kube_started}}, indent=2
        )
        + "\n",
    )
    _log(
        f"Slurm {slurm}: {'started' if not slurm_running else 're-used'}; "
        f"kube-apiserver: {'started' if not kube_running else 're-used'}"
    )
    install_crd(kube)
    site = write_site(testbed, profile)
    examples = write_examples(testbed.partition)
    bin_dir = write_bin(kube, testbed)
    env_file = write_env(kube, testbed, site, bin_dir)
    rel = env_file.relative_to(REPO)
    names = "\n".join(f"    kubectl apply -f {p.relative_to(REPO)}" for p in examples)
    print(
        f"""
Slurm {slurm} ({testbed.rest_url}, REST {testbed.api_version}, partition {testbed.partition},
nodes n1 [h100 x2] and n2 [a100 x2]) and kube-apiserver {kube.server} are up; the CRD is
installed, namespace team-a and its Secret hf exist. Settings: {rel}.

Terminal 1, the operator:
    source {rel} && slurmjob-operator run

Terminal 2, the examples adapted to this cluster:
    source {rel}
{names}
    kubectl get slurmjobs -A -w
    kubectl describe slurmjob cpu-hello

Without Kubernetes:
    source {rel} && slurmjob-operator submit -f .dev/examples/cpu-job.yaml --wait

Slurm's view: squeue, sinfo, scontrol (from .dev/bin). Stop: make dev-down
"""
    )
    return 0


def down() -> int:
    state = _read_state()
    if not state:
        _log("nothing recorded in .dev/state.json: dev-up started nothing (or dev-down ran)")
        return 0
    started = state.get("started", {})
    for name, mine in sorted(started.get("slurm", {}).items()):
        if mine:
            _log(f"stopping Slurm {name}")
            stop_cluster(name)
        else:
            _log(f"Slurm {name} was running before dev-up: left running")
    if started.get("kube"):
        _log("stopping kube-apiserver and etcd")
        stop_testbed()
    else:
        _log("kube-apiserver was running before dev-up: left running")
    STATE.unlink(missing_ok=True)
    return 0


def status() -> int:
    for name in SPECS:
        print(f"slurm {name}: {cluster_status(name)}")
    print(f"kubernetes: {testbed_status()}")
    state = _read_state()
    print(f"started by dev-up: {json.dumps(state.get('started', {}))}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed.dev")
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser("up")
    up_parser.add_argument(
        "--slurm", default=os.environ.get("SLURM") or DEFAULT_SLURM, choices=sorted(SPECS)
    )
    up_parser.add_argument(
        "--profile", default=DEFAULT_PROFILE, choices=("apptainer", "enroot-pyxis")
    )
    sub.add_parser("down")
    sub.add_parser("status")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            return up(args.slurm, args.profile)
        if args.command == "down":
            return down()
        return status()
    except (TestbedError, KubeTestbedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
