"""The `slurmjob-operator` command line.

Exit codes: 0 ok, 2 invalid input (the message on stderr names the offending field or
setting), 1 anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from slurmjob_operator import GROUP, KIND, VERSION, __version__
from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.config import ConfigError, Settings
from slurmjob_operator.site.admission import params_from_env, values_yaml
from slurmjob_operator.site.catalogs import CatalogError
from slurmjob_operator.site.templating import RenderError
from slurmjob_operator.versions import NEWEST, SUPPORTED_VERSIONS

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
    from slurmjob_operator.controller.pipeline import render_manifest

    manifest = _load_manifest(args.file, stdin)
    body = render_manifest(
        manifest, api_version=args.api_version, uid=args.uid, attempt=args.attempt
    )
    out.write(json.dumps(body, indent=2, sort_keys=False) + "\n")
    return EXIT_OK


def _cmd_crd(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from slurmjob_operator.gen.crd import build_crd, to_yaml

    out.write(to_yaml(build_crd()))
    return EXIT_OK


def _cmd_admission_params(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    out.write(values_yaml(params_from_env()))
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from slurmjob_operator.doctor import run_doctor

    if not args.no_probe:
        # Said before it happens: the probes are real Slurm jobs, in the site's accounting.
        print(
            "doctor: submits probe jobs to Slurm (a few seconds each, as the configured users) "
            "to check the staging directory is writable by the jobs; --no-probe skips them",
            file=args.err,
        )
    report = asyncio.run(run_doctor(probe=not args.no_probe))
    out.write(report.render(json_output=args.json))
    return EXIT_INVALID if report.invalid else EXIT_OK if report.ok else EXIT_ERROR


class _QuietWatchHandler(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Handler 'watched' succeeded" not in record.getMessage()


def _check_site(settings: Settings) -> None:
    """Every cluster's settings and site files as the operator will load them, before the
    Lease is sought: a bad file stops the process (exit 2 names it) instead of a leader whose
    startup fails over and over."""
    from slurmjob_operator.controller.pipeline import Site
    from slurmjob_operator.site.clusters import cluster_names, load_clusters

    sites = load_clusters(settings)
    names = cluster_names(sites, settings.cluster_name).names
    for site in sites:
        Site.load(site.settings, names).check_tenant_users()


def _cmd_run(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    import kopf

    from slurmjob_operator.config import Settings

    settings = Settings.from_env()  # refuse bad settings before kopf starts (exit 2 names it)
    _check_site(settings)
    import slurmjob_operator.handlers  # noqa: F401  (registers the handlers)

    if settings.kueue:
        from slurmjob_operator.handlers import workloads

        workloads.register()

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
    )
    # kopf logs every successful handler call; the watch-event handler runs on every status
    # write, so its "succeeded" lines would drown the log.
    logging.getLogger("kopf.objects").addFilter(_QuietWatchHandler())
    # One watch stream per namespace (or one for all): the login handler's session keeps a
    # connection for each besides its bounded pool.
    streams = (len(args.namespace) or 1) * (2 if settings.kueue else 1)
    if args.no_leader_election or not settings.leader_election:
        kopf.run(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace or (),
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(watch_streams=streams, namespaces=tuple(args.namespace or ())),
        )
        return EXIT_OK
    from slurmjob_operator.election import run_with_lease

    # A lost Lease ends the process inside (exit status 3): nothing it started may go on.
    asyncio.run(run_with_lease(settings, namespaces=args.namespace, liveness=args.liveness))
    return EXIT_OK


def _cmd_submit(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from slurmjob_operator.api.status import Phase
    from slurmjob_operator.config import Settings
    from slurmjob_operator.controller.pipeline import render_manifest
    from slurmjob_operator.core.limits import PartitionUnavailable
    from slurmjob_operator.local import (
        LocalInputError,
        LocalOptions,
        LocalResult,
        LocalRunner,
        default_state_dir,
        load_secrets_file,
        logging_to,
        object_key,
    )

    err: TextIO = getattr(args, "err", None) or sys.stderr
    if not args.timeout > 0:
        raise InputError(f"--timeout: must be a positive number of seconds, got {args.timeout:g}")
    try:
        if args.secrets_file is not None:
            load_secrets_file(args.secrets_file)  # refuse a malformed file before anything runs
        manifest: Mapping[str, Any] = {}
        if args.file is not None:
            manifest = _load_manifest(args.file, stdin)
            namespace, name = object_key(manifest, args.namespace)
        else:
            namespace = args.namespace or "default"
            name = args.status or args.cancel
            object_key({"metadata": {"name": name}}, namespace)  # the same name rules
        settings = Settings.from_env()
        if args.file is not None:
            # The checks `render` makes (spec, site catalogs, rendering, preflight), so that
            # a bad manifest is refused here with its field named and exit 2.
            meta = {**(manifest.get("metadata") or {}), "name": name, "namespace": namespace}
            # A walltime segment's length from the partition's MaxTime: the runner reads it.
            with contextlib.suppress(PartitionUnavailable):
                render_manifest(
                    {**manifest, "metadata": meta}, api_version=NEWEST, settings=settings
                )
        options = LocalOptions(
            state_dir=args.state_dir or default_state_dir(),
            secrets_file=args.secrets_file,
            wait=args.wait,
            timeout=args.timeout,
            cancel_on_interrupt=args.cancel_on_interrupt,
        )

        async def run() -> LocalResult:
            async with LocalRunner(settings, options, err) as runner:
                if args.file is not None:
                    return await runner.submit(manifest, namespace, name)
                if args.status is not None:
                    return await runner.status(namespace, name)
                return await runner.cancel(namespace, name)

        with logging_to(err, args.verbose):
            result = asyncio.run(run())
    except LocalInputError as exc:
        raise InputError(str(exc)) from exc
    out.write(json.dumps(result.status, indent=2) + "\n")
    if args.cancel is not None:
        return EXIT_OK
    if result.invalid_spec:
        return EXIT_INVALID
    if result.timed_out or result.interrupted:
        return EXIT_ERROR
    if result.phase in (Phase.FAILED, Phase.CANCELLED, Phase.UNKNOWN):
        return EXIT_ERROR
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmjob-operator",
        description="Run Slurm jobs from Kubernetes through slurmrestd.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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

    sub.add_parser(
        "admission-params", help="print the admission policy's rules (chart value admission.params)"
    ).set_defaults(handler=_cmd_admission_params)

    doctor = sub.add_parser(
        "doctor",
        help="check a site: slurmrestd, auth, partition, GPU series, storage, runtimes",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument(
        "--no-probe",
        action="store_true",
        help="do not run the probe job that checks the job users can write the staging root",
    )
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
    run.add_argument(
        "--no-leader-election",
        action="store_true",
        help="run at once, without waiting for the Lease (one process only: two would both act)",
    )
    run.add_argument("--log-format", choices=("plain", "json"), default="plain")
    run.add_argument("-v", "--verbose", action="store_true", help="log more")
    run.set_defaults(handler=_cmd_run)

    submit = sub.add_parser(
        "submit",
        help="submit a SlurmJob without Kubernetes (status kept in a local file)",
        description=(
            "The operator's core without Kubernetes, for trying a site before deploying: "
            "submit a SlurmJob manifest through slurmrestd with the SLURMJOB_* settings, keep "
            "its status in <state dir>/<namespace>/<name>.json, print Events and phase changes "
            "on stderr and the final status as JSON on stdout. Exit codes: 0 Succeeded (or "
            "submitted, without --wait), 1 Failed, Cancelled, Unknown, timed out or "
            "interrupted, 2 invalid input."
        ),
    )
    what = submit.add_mutually_exclusive_group(required=True)
    what.add_argument("-f", "--file", help="SlurmJob manifest to submit, or - for stdin")
    what.add_argument(
        "--status",
        metavar="NAME",
        help="poll a job submitted earlier once (or until final with --wait), print its status",
    )
    what.add_argument(
        "--cancel",
        metavar="NAME",
        help="cancel a job submitted earlier (if not final), remove its staging directory and "
        "its state file",
    )
    submit.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace (default: the manifest's, else default)",
    )
    submit.add_argument(
        "--wait", action="store_true", help="poll until the job is final or --timeout passes"
    )
    submit.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where job states are kept "
        "(default: $XDG_STATE_HOME/slurmjob-operator or ~/.local/state/slurmjob-operator)",
    )
    submit.add_argument(
        "--secrets-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML {secretName: {key: value}} for env valueFrom.secretKeyRef",
    )
    submit.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="S",
        help="seconds the whole command may take (submission retries and --wait; default 3600)",
    )
    submit.add_argument(
        "--cancel-on-interrupt",
        action="store_true",
        help="Ctrl-C while waiting cancels the Slurm job (default: it keeps running)",
    )
    submit.add_argument("-v", "--verbose", action="store_true", help="log more")
    submit.set_defaults(handler=_cmd_submit)
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
    args.err = err  # `submit` reports progress on stderr
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
