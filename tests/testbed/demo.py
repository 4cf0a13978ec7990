"""`make demo`: the whole product in one command on a fresh machine.

Brings up the local Slurm and kube-apiserver (as `make dev-up` does), starts the operator in the
background, applies the example SlurmJobs (adapted to the local cluster), shows their phases
changing, and ends by printing each job's final status and log tail. Idempotent: a previous
demo's operator is stopped and its resources are replaced. `make demo-down` stops the operator
and everything `dev-up` started.

CLI::

    python -m tests.testbed.demo up [--slurm 26.05|22.05] [--timeout 300]
    python -m tests.testbed.demo down
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from tests.testbed import dev

DEMO_LOG = dev.DEV / "operator.log"
DEMO_PID = dev.DEV / "operator.pid"
FINAL = ("Succeeded", "Failed", "Cancelled")


def _say(text: str) -> None:
    print(text, flush=True)


def _env() -> dict[str, str]:
    """The settings `dev-up` wrote into .dev/env, on top of this process's environment."""
    env = dict(os.environ)
    for line in (dev.DEV / "env").read_text().splitlines():
        if not line.startswith("export "):
            continue
        key, _, value = line[len("export ") :].partition("=")
        if key == "PATH":
            env["PATH"] = f"{dev.DEV / 'bin'}:{env.get('PATH', '')}"
            continue
        env[key] = shlex.split(value)[0] if value else ""
    return env


def _kubectl(
    env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(dev.DEV / "bin" / "kubectl"), *args],
        env=env,
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


def _stop_operator() -> None:
    if not DEMO_PID.exists():
        return
    try:
        pid = int(DEMO_PID.read_text().strip())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.2)
            os.killpg(pid, signal.SIGKILL)
    except (ValueError, ProcessLookupError, PermissionError):
        pass
    DEMO_PID.unlink(missing_ok=True)


def _start_operator(env: dict[str, str], namespaces: Sequence[str]) -> subprocess.Popen[bytes]:
    operator = Path(sys.executable).parent / "slurmjob-operator"
    # A Lease of the demo's own, under a name kept across demo runs: a demo started again takes
    # it back at once instead of waiting for the last run's to expire.
    env = {"SLURMJOB_LEASE_NAME": "slurmjob-demo", "SLURMJOB_LEASE_IDENTITY": "demo", **env}
    with DEMO_LOG.open("ab") as log:
        proc = subprocess.Popen(
            [str(operator), "run", *(a for ns in namespaces for a in ("-n", ns))],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    DEMO_PID.write_text(f"{proc.pid}\n")
    return proc


def _jobs(env: dict[str, str], wanted: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The demo's own SlurmJobs (others may share the apiserver, e.g. a test run)."""
    proc = _kubectl(env, "get", "slurmjobs", "-A", "-o", "json")
    items: list[dict[str, Any]] = json.loads(proc.stdout)["items"]
    return [o for o in items if (o["metadata"]["namespace"], o["metadata"]["name"]) in wanted]


def _identities(paths: Sequence[Path]) -> set[tuple[str, str]]:
    out = set()
    for path in paths:
        meta = (yaml.safe_load(path.read_text()) or {}).get("metadata") or {}
        out.add((str(meta.get("namespace") or "default"), str(meta.get("name"))))
    return out


def _row(obj: dict[str, Any]) -> str:
    meta, status = obj["metadata"], obj.get("status") or {}
    return (
        f"{meta['namespace'] + '/' + meta['name']:<28} {status.get('phase', '-'):<11} "
        f"job={status.get('slurmJobId', '-')!s:<6} nodes={status.get('nodes', '-')}"
    )


def up(slurm: str, timeout: float) -> int:
    if dev.up(slurm, "apptainer") != 0:
        return 1
    env = _env()
    _stop_operator()
    examples = sorted((dev.DEV / "examples").glob("*.yaml"))
    wanted = _identities(examples)
    namespaces = sorted({namespace for namespace, _ in wanted})
    proc = _start_operator(env, namespaces)
    _say(
        f"\n== operator started for namespaces {', '.join(namespaces)} "
        f"(pid {proc.pid}, log {DEMO_LOG.relative_to(dev.REPO)})"
    )
    for path in examples:  # a previous demo's resources: replaced (the operator finalizes them)
        _kubectl(env, "delete", "-f", str(path), "--ignore-not-found", "--timeout=120s")
    for path in examples:
        _say(f"$ kubectl apply -f {path.relative_to(dev.REPO)}")
        _say(_kubectl(env, "apply", "-f", str(path)).stdout.strip())
    _say("\n== phases as they change")
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    jobs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _say(
                f"the operator exited ({proc.returncode}); its log:\n{DEMO_LOG.read_text()[-4000:]}"
            )
            return 1
        jobs = _jobs(env, wanted)
        for obj in jobs:
            key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            row = _row(obj)
            if seen.get(key) != row:
                seen[key] = row
                _say(f"{time.strftime('%H:%M:%S')}  {row}")
        if jobs and all((o.get("status") or {}).get("phase") in FINAL for o in jobs):
            break
        time.sleep(1)
    _say("\n== final status and log tails")
    ok = bool(jobs)
    for obj in jobs:
        status = obj.get("status") or {}
        attempt = (status.get("attempts") or [{}])[-1]
        _say(
            f"\n--- {obj['metadata']['namespace']}/{obj['metadata']['name']}: {status.get('phase')}"
        )
        _say(
            f"Slurm job {attempt.get('jobId')} (SLUID {attempt.get('sluid', '-')}), "
            f"state {attempt.get('nativeState')}, exit code {attempt.get('exitCode')}, "
            f"nodes {status.get('nodes')}"
        )
        _say(f"message: {status.get('message')}")
        logs = status.get("logs") or {}
        for stream in ("stdout", "stderr"):
            tail = ((logs.get(stream) or {}).get("tail") or "").rstrip()
            if tail:
                _say(f"{stream} tail:\n  " + "\n  ".join(tail.splitlines()[-10:]))
        ok = ok and status.get("phase") == "Succeeded"
    _say(
        "\nThe operator keeps running in the background; `source .dev/env` and use kubectl, "
        "or `make demo-down` to stop everything."
    )
    return 0 if ok else 1


def down() -> int:
    env = _env() if (dev.DEV / "env").exists() else None
    if env is not None:
        for path in sorted((dev.DEV / "examples").glob("*.yaml")):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                _kubectl(
                    env,
                    "delete",
                    "-f",
                    str(path),
                    "--ignore-not-found",
                    "--timeout=60s",
                    check=False,
                )
    _stop_operator()
    return dev.down()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed.demo")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up")
    start.add_argument("--slurm", default="26.05")
    start.add_argument("--timeout", type=float, default=300)
    sub.add_parser("down")
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(args.slurm, args.timeout)
    return down()


if __name__ == "__main__":
    raise SystemExit(main())
