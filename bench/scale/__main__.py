"""`python -m bench.scale` (`make bench-scale`): both operators, both shapes, each N.

    PYTHONPATH=operator:. .venv/bin/python -m bench.scale --sizes 1000,5000,10000

Starts (or re-uses) the dev stack as `make dev-up` does, runs the baseline and the operator
`--repeats` times for each N and shape (never at the same time; the order swapped in every
second repeat), writes the JSON results, the plots and the "Scale" section of
docs/benchmarks.md. `--report-only` redoes the last two from a JSON, or from several
invocations' JSONs of the same code (`--merge`, `merging`): a full run in parts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.sitefiles import site_env  # noqa: E402
from tests.k8s import kube as kubebed  # noqa: E402
from tests.testbed import slurm as slurmbed  # noqa: E402

from bench.scale import logtail, merging, report, scenario  # noqa: E402
from bench.scale.kubeapi import Kube  # noqa: E402
from bench.scale.requests import RequestLog  # noqa: E402
from slurmjob_operator.config import Settings  # noqa: E402

DEFAULT_JSON = ROOT / "docs" / "benchmarks" / "scale.json"
CRD = ROOT / "crds" / "slurmjob.io_slurmjobs.yaml"
ETCD_URL = f"http://{kubebed.HOST}:{kubebed.ETCD_PORT}"


def start_proxy(upstream: str, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.scale.proxy", "--upstream", upstream, "--log", str(log_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"},
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().decode().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise RuntimeError("the counting proxy did not start")
    return proc, url


def machine() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem / 1024:.0f} GiB RAM; Linux {platform.release()}; "
        f"Python {platform.python_version()}"
    )


async def bench(
    args: argparse.Namespace,
    log_dir: Path,
    tb: slurmbed.SlurmTestbed | None = None,
    kb: kubebed.KubeTestbed | None = None,
) -> dict[str, Any]:
    """The whole bench on the given test clusters (started, or re-used, when not given)."""
    tb = tb or slurmbed.start_cluster("26.05", reuse=True)
    kb = kb or kubebed.start_testbed(reuse=True)
    kb.apply(CRD)
    kb.wait_established("slurmjobs.slurmjob.io")
    site = site_env(tb, "apptainer", log_dir)
    workdir = tb.storage_root / "bench-scale-baseline"
    workdir.mkdir(exist_ok=True)
    os.chown(workdir, tb.uid, tb.gid)
    proxy, proxy_url = start_proxy(tb.rest_url, log_dir / "requests.jsonl")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(log_dir),
        **kb.env(),
        **site,
        "SLURMJOB_SLURM_REST_URL": proxy_url,
        "SLURMJOB_POLL_INTERVAL": f"{args.interval:g}",
        "SLURMJOB_METRICS_PORT": "0",
        # Leader election as in a pod: a Lease of the bench's own, and an identity kept across
        # the restart phase's SIGKILL (a container restarted in its pod keeps its name).
        "SLURMJOB_LEASE_NAME": "slurmjob-bench",
        "SLURMJOB_LEASE_IDENTITY": "bench-operator",
        # The operator of this checkout, whatever venv runs the bench.
        "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}",
        **dict(args.operator_env),
    }
    settings = Settings(
        slurm_rest_url=tb.rest_url,
        slurm_rest_api_version=tb.api_version,
        slurm_rest_user=tb.user,
        slurm_jwt_key_file=tb.jwt_key_file,
        slurm_rest_timeout=300.0,
    )
    opts = scenario.Options(
        interval=args.interval,
        steady_intervals=args.steady_intervals,
        change_rounds=args.change_rounds,
        submit_timeout=args.submit_timeout,
        delete_timeout=args.delete_timeout,
        restart_window=args.restart_window,
    )
    started = datetime.now(tz=UTC)
    results: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m bench.scale", *args.argv]),
        "machine": machine(),
        "slurm": tb.name,
        "interval": args.interval,
        "options": vars(args),
        # What a merge of several invocations checks (`merging`): the same code in each.
        "source": merging.provenance(ROOT),
        "runs": [],
    }
    pki = kubebed.PKI_DIR
    try:
        async with Kube(kb.server, pki / "ca.crt", pki / "admin.crt", pki / "admin.key") as kube:
            await kube.ensure_namespace(scenario.NAMESPACE)
            slurm = await scenario.slurm_client(settings, tb.user, tb.jwt_key_file)
            ping = await slurm.ping()
            results["slurm"] = f"{ping.release or tb.name} ({slurm.version})"
            ctx = scenario.Context(
                kube, slurm, tb.user, RequestLog(log_dir / "requests.jsonl"), env, ETCD_URL, log_dir
            )
            for n in args.sizes:
                for shape in args.shapes:
                    for repeat in range(args.repeats):
                        for kind in order(args.operators, repeat):
                            t0 = time.time()
                            scenario.log(f"== {kind} {shape} N={n} (run {repeat + 1})")
                            run = await scenario.run(ctx, kind, shape, n, opts)
                            run["wall_seconds"] = time.time() - t0
                            run["repeat"] = repeat
                            results["runs"].append(run)
                            if args.json:
                                write_json(args.json, results)
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        if proxy.stdout is not None:
            proxy.stdout.close()
    if args.logtail:
        results["logtail"] = logtail.measure()
    return results


def order(operators: list[str], repeat: int) -> list[str]:
    """The operators in the order of one repeat: reversed in every second one, so that neither
    always runs first (on a Slurm and an apiserver the other just left) in a median of three."""
    return list(reversed(operators)) if repeat % 2 else list(operators)


def write_json(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale")
    sizes = os.environ.get("BENCH_SIZES") or "1000,5000,10000"
    p.add_argument("--sizes", default=sizes, type=lambda s: [int(x) for x in s.split(",") if x])
    p.add_argument("--operators", default="baseline,operator", type=lambda s: s.split(","))
    p.add_argument("--shapes", default="live,backlog", type=lambda s: s.split(","))
    repeats = int(os.environ.get("BENCH_REPEATS") or "3")
    p.add_argument(
        "--repeats",
        type=int,
        default=repeats,
        help="runs of each operator at each N and shape; the report gives their medians",
    )
    p.add_argument("--interval", type=float, default=10.0)
    p.add_argument("--steady-intervals", type=int, default=3)
    p.add_argument("--change-rounds", type=int, default=2)
    p.add_argument("--submit-timeout", type=float, default=1800.0)
    p.add_argument("--delete-timeout", type=float, default=900.0)
    p.add_argument("--restart-window", type=float, default=6.0)
    p.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="SLURMJOB_X=V",
        type=lambda s: tuple(s.split("=", 1)),
        help="a setting for both operators under test (repeatable), e.g. for a what-if run",
    )
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--log-dir", type=Path, default=None)
    p.add_argument("--no-logtail", dest="logtail", action="store_false")
    p.add_argument("--no-report", dest="report", action="store_false")
    p.add_argument("--report-only", action="store_true", help="plots and doc from --json")
    p.add_argument(
        "--merge",
        action="append",
        default=[],
        type=Path,
        metavar="JSON",
        help="with --report-only: the results of several invocations of the same code "
        "(repeatable), merged into --json, then reported",
    )
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.merge and not args.report_only:
        p.error("--merge goes with --report-only")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the record in the results
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.report_only and args.merge:
        parts = [(str(path), json.loads(path.read_text())) for path in args.merge]
        try:
            results = merging.merge(parts)
        except merging.MergeRefused as exc:
            raise SystemExit(f"not merged: {exc}") from exc
        write_json(args.json, results)
    elif args.report_only:
        results = json.loads(args.json.read_text())
    else:
        log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="slurmjob-bench-scale-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        scenario.log(f"logs in {log_dir}")
        results = asyncio.run(bench(args, log_dir))
        write_json(args.json, results)
    if args.report:
        report.write(results, ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
