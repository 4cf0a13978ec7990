"""The `slurmjob-operator` command line.

Exit codes: 0 ok, 2 invalid input (the message on stderr names the offending field or
setting), 1 anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from slurmjob_operator import GROUP, KIND, VERSION
from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.catalogs import CatalogError
from slurmjob_operator.config import ConfigError
from slurmjob_operator.render import RenderError
from slurmjob_operator.slurm.versions import NEWEST, SUPPORTED_VERSIONS

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INVALID = 2


class InputError(ValueError):
    """Invalid input from the user: reported with exit code 2."""


def _load_manifest(path: str, stdin: TextIO) -> Mapping[str, Any]:
    try:
        text = stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from exc
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise InputError(f"{path}: expected exactly one {KIND} manifest")
    manifest: dict[str, Any] = docs[0]
    if manifest.get("kind") != KIND:
        raise InputError(f"kind: expected {KIND}, got {manifest.get('kind')!r}")
    api_version = manifest.get("apiVersion")
    if api_version != f"{GROUP}/{VERSION}":
        raise InputError(f"apiVersion: expected {GROUP}/{VERSION}, got {api_version!r}")
    if not isinstance(manifest.get("spec"), dict):
        raise InputError("spec: missing or not an object")
    return manifest


def _cmd_render(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from slurmjob_operator.pipeline import render_manifest

    manifest = _load_manifest(args.file, stdin)
    body = render_manifest(
        manifest, api_version=args.api_version, uid=args.uid, attempt=args.attempt
    )
    out.write(json.dumps(body, indent=2, sort_keys=False) + "\n")
    return EXIT_OK


def _cmd_crd(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from slurmjob_operator.api.crd import build_crd, to_yaml

    out.write(to_yaml(build_crd()))
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from slurmjob_operator.doctor import run_doctor

    report = asyncio.run(run_doctor())
    out.write(report.render(json_output=args.json))
    return EXIT_OK if report.ok else EXIT_ERROR


class _QuietWatchHandler(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Handler 'watched' succeeded" not in record.getMessage()


def _cmd_run(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    import kopf

    from slurmjob_operator.config import Settings

    Settings.from_env()  # refuse bad settings before kopf starts (exit 2 names the variable)
    import slurmjob_operator.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
    )
    # kopf logs every successful handler call; the watch-event handler runs on every status
    # write, so its "succeeded" lines would drown the log.
    logging.getLogger("kopf.objects").addFilter(_QuietWatchHandler())
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness,
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmjob-operator",
        description="Run Slurm jobs from Kubernetes through slurmrestd.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    render = sub.add_parser(
        "render",
        help="print the JSON body that would be POSTed to /slurm/V/job/submit",
        description=(
            "Validate a SlurmJob manifest against the site catalogs (SLURMJOB_* settings) and "
            "print exactly the JSON body the operator would POST to slurmrestd."
        ),
    )
    render.add_argument("-f", "--file", required=True, help="SlurmJob manifest, or - for stdin")
    render.add_argument(
        "--api-version",
        default=NEWEST,
        choices=SUPPORTED_VERSIONS,
        help=f"slurmrestd API version (default: {NEWEST})",
    )
    render.add_argument(
        "--uid",
        default=None,
        help="resource uid to render with (default: metadata.uid, else a fixed placeholder)",
    )
    render.add_argument("--attempt", type=int, default=1, help="attempt number (default: 1)")
    render.set_defaults(handler=_cmd_render)

    crd = sub.add_parser("crd", help="print the SlurmJob CustomResourceDefinition")
    crd.set_defaults(handler=_cmd_crd)

    doctor = sub.add_parser(
        "doctor",
        help="check a site: slurmrestd, auth, partition, GPU series, storage, runtimes",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(handler=_cmd_doctor)

    run = sub.add_parser(
        "run",
        help="run the operator: reconcile SlurmJobs in all namespaces or the ones named",
    )
    run.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    run.add_argument(
        "--liveness",
        default=None,
        metavar="URL",
        help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    run.add_argument("--log-format", choices=("plain", "json"), default="plain")
    run.add_argument("-v", "--verbose", action="store_true", help="log more")
    run.set_defaults(handler=_cmd_run)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    stdin = stdin or sys.stdin
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_INVALID if exc.code not in (0, None) else EXIT_OK
    handler: Callable[[argparse.Namespace, TextIO, TextIO], int] = args.handler
    try:
        return handler(args, out, stdin)
    except SpecError as exc:
        for message in exc.messages:
            err.write(f"error: {message}\n")
        return EXIT_INVALID
    except (InputError, ConfigError, CatalogError, RenderError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_INVALID
    except KeyboardInterrupt:
        return EXIT_ERROR
    except Exception as exc:  # the CLI's last line of defence: one line, exit 1
        err.write(f"error: {type(exc).__name__}: {exc}\n")
        return EXIT_ERROR
